"""Deliberate faults for testing the launcher (STYLE: faults are injected on purpose).

Module-level functions so spawned ranks can import them; used by
``tests/distributed/test_distributed.py`` and usable by hand to see what a failure looks like.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

__all__ = ["rank_and_sum", "raise_on_rank", "hang_on_rank", "exit_on_rank", "sigkill_on_rank",
           "sleep_on_every_rank", "segfault_once"]


def rank_and_sum() -> tuple[int, int, float]:
    """(rank, world_size, allreduced sum of ranks): a healthy worker."""
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), float(t)


def raise_on_rank(bad_rank: int, message: str = "deliberate fault") -> int:
    """Rank ``bad_rank`` raises ``ZeroDivisionError(message)``; the others wait in a
    collective that never completes (as real ranks would)."""
    if dist.get_rank() == bad_rank:
        raise ZeroDivisionError(message)
    dist.barrier()
    return dist.get_rank()


def hang_on_rank(bad_rank: int, hang_s: float = 3600.0) -> int:
    """Rank ``bad_rank`` sleeps ``hang_s`` seconds (a hung rank); the others wait for it
    in a barrier."""
    if dist.get_rank() == bad_rank:
        time.sleep(hang_s)
    dist.barrier()
    return dist.get_rank()


def exit_on_rank(bad_rank: int, code: int = 3) -> int:
    """Rank ``bad_rank`` exits at once with ``code`` (no Python exception: a crash)."""
    import os

    if dist.get_rank() == bad_rank:
        os._exit(code)
    dist.barrier()
    return dist.get_rank()


def sigkill_on_rank(bad_rank: int) -> int:
    """Rank ``bad_rank`` is killed with SIGKILL (as the out-of-memory killer does: no
    Python exception, no clean-up); the others wait in a barrier and lose their peer."""
    import os
    import signal

    if dist.get_rank() == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return dist.get_rank()


def sleep_on_every_rank(seconds: float, ready_dir: str | None = None) -> int:
    """Every rank sleeps ``seconds`` (long-running ranks whose launcher can be killed);
    with ``ready_dir`` each first touches ``<ready_dir>/rank<r>.ready``."""
    if ready_dir is not None:
        from pathlib import Path

        (Path(ready_dir) / f"rank{dist.get_rank()}.ready").touch()
    time.sleep(seconds)
    return dist.get_rank()


def segfault_once(flag: str) -> int:
    """Rank 0 dies of SIGSEGV the first time (it creates the file ``flag`` first); every
    later call returns the rank: a crash a relaunch gets past (how ``launch_fn`` treats
    a forked rank that crashed)."""
    import os
    import signal

    if dist.get_rank() == 0 and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()
    return dist.get_rank()
