"""The life of a launched rank process, from both ends (used by :mod:`perflab.distributed.launch`).

In each rank, :func:`rank_entry` (what the elastic agent spawns) sets the threads and
device, pins the rank to its own cores (:func:`pin_to_cores`), initialises the process
group and calls the user's function, guarded by a watchdog (:func:`start_watchdog`: dump
every thread's stack and exit with :data:`TIMEOUT_EXIT_CODE` after ``timeout_s``) and a
heartbeat on the launching process (:func:`exit_with_parent`); an exception is written to
``rank<N>.err`` before the group is torn down, a rank leaves ``rank<N>.started`` on
entry and ``rank<N>.done`` when finished.
In the launching process: the rank processes started by a launch
(:func:`ranks_started_since`, :func:`kill_new_children`), the signal handlers the agent
replaces (:func:`save_signals`, :func:`restore_signals`), and the cgroup's
out-of-memory-kill count (:func:`oom_kills`) that tells an OOM kill from other deaths.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import threading
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import psutil
import torch

__all__ = ["TIMEOUT_EXIT_CODE", "PARENT_POLL_S", "rank_entry", "start_watchdog",
           "exit_with_parent", "pin_to_cores", "ranks_started_since", "kill_new_children",
           "save_signals", "restore_signals", "oom_kills"]

#: Exit code of a rank stopped by its watchdog (like coreutils' ``timeout``).
TIMEOUT_EXIT_CODE = 124
#: How often a rank checks that the process that launched it is still alive (seconds).
PARENT_POLL_S = 0.5


def start_watchdog(timeout_s: float, rank: int, err_path: Path) -> threading.Timer:
    """Exit this rank with TIMEOUT_EXIT_CODE after ``timeout_s``, leaving its stacks."""

    def fire() -> None:
        with open(err_path, "w") as f:
            f.write(f"TimeoutError: rank {rank} still running after timeout_s={timeout_s:g} s"
                    "; stacks of its threads:\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        os._exit(TIMEOUT_EXIT_CODE)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def exit_with_parent(parent_pid: int) -> threading.Thread:
    """Exit this rank (``os._exit``) once ``parent_pid`` is gone.

    A rank is a child of the launching process (spawn) or of its forkserver, which exits
    with it; when that dies (a notebook kernel killed or restarted) the rank is
    re-parented, so ``os.getppid()`` changes. Polled by a daemon thread (a heartbeat)
    because Linux's PR_SET_PDEATHSIG fires when the *thread* that spawned the rank ends,
    and is Linux-only.
    """
    born_of = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != born_of or not psutil.pid_exists(parent_pid):
                os._exit(TIMEOUT_EXIT_CODE)
            threading.Event().wait(PARENT_POLL_S)

    t = threading.Thread(target=watch, name="perflab-parent-watch", daemon=True)
    t.start()
    return t


def pin_to_cores(local_rank: int, threads_per_rank: int) -> None:
    """Bind this rank to its own block of ``threads_per_rank`` allowed cores (round-robin
    when there are more ranks than blocks: 4 ranks on 2 cores -> 2 per core).

    Without it the scheduler moves ranks between cores and one rank can run ~1.5x
    slower than another for a whole run on a small VM (measured here), which looks
    exactly like a straggler. Linux only (``os.sched_setaffinity``); elsewhere a no-op.
    """
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    blocks = max(1, len(cores) // threads_per_rank)
    first = (local_rank % blocks) * threads_per_rank
    os.sched_setaffinity(0, cores[first:first + threads_per_rank] or cores)


def rank_entry(fn: Callable[..., Any], args: tuple, backend: str, timeout_s: float,
                threads_per_rank: int, err_dir: str, pin_cores: bool = False,
                parent_pid: int | None = None, destroy_group: bool = True) -> Any:
    """What each rank runs: set threads and device, init the group, call fn.

    ``destroy_group=False`` (ranks forked from launch_fn's forkserver, which end with
    ``os._exit``: no destructor runs) leaves the process group to the exit: destroying it
    while gloo's threads still drop their last references to it (a DDP communication
    hook's futures) can abort the rank ("Resource deadlock avoided", a C++ thread
    joining itself), seen in Lab 06's ranks."""
    import torch.distributed as dist

    if parent_pid is not None:
        exit_with_parent(parent_pid)
    rank = int(os.environ["RANK"])
    # the launcher tells a rank that died here or later from one that never got here
    # (multiprocessing's set-up failed: a script launching without a __main__ guard)
    (Path(err_dir) / f"rank{rank}.started").touch()
    err_path = Path(err_dir) / f"rank{rank}.err"
    watchdog = start_watchdog(timeout_s, rank, err_path)
    # torch 2.13 renamed these two collectives (reduce_scatter_single, all_gather_single)
    # and warns on every rank; the labs teach the names of the ZeRO/FSDP literature and
    # say so, and a warning per rank would land in whatever notebook cell is running
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*torch\.distributed\.(reduce_scatter_tensor|"
                                    r"all_gather_into_tensor)` is deprecated")
    try:
        torch.set_num_threads(threads_per_rank)
        if pin_cores:
            pin_to_cores(int(os.environ["LOCAL_RANK"]), threads_per_rank)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        # collectives may wait longer than the watchdog, so a hung rank is reported as a
        # timeout of every rank (with where each was), not as a gloo error on its peers
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s + 60))
        try:
            out = fn(*args)
            (Path(err_dir) / f"rank{rank}.done").touch()
            return out
        except BaseException as e:
            # written before the group is torn down, so the failing rank's file is older
            # than the "connection closed" errors its exit causes on the other ranks
            err_path.write_text(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
            raise
        finally:
            if destroy_group:
                dist.destroy_process_group()
    except BaseException as e:
        if not err_path.exists():
            err_path.write_text(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
        raise
    finally:
        watchdog.cancel()


def ranks_started_since(before: set[int]) -> list[psutil.Process]:
    """Spawned rank processes (and their children) under this one, not in ``before``.

    Only ``multiprocessing.spawn`` children count: the resource tracker that
    multiprocessing starts once and keeps for the life of the process is left alone.
    """
    found: list[psutil.Process] = []
    try:
        for p in psutil.Process().children(recursive=False):
            if p.pid in before or "spawn_main" not in " ".join(p.cmdline()):
                continue
            found += [p, *p.children(recursive=True)]
    except psutil.Error:
        pass
    return found


def save_signals(names: str) -> dict[Any, Any]:
    """The current handlers of ``names`` ("SIGTERM,SIGINT,..."), and the agent's env var."""
    saved: dict[Any, Any] = {"env": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")}
    if threading.current_thread() is threading.main_thread():
        for name in names.split(","):
            sig = getattr(signal, name.strip(), None)
            if sig is not None:
                saved[sig] = signal.getsignal(sig)
    return saved


def restore_signals(saved: dict[Any, Any]) -> None:
    """Put back what :func:`save_signals` saved (the handlers and the agent's env var)."""
    env = saved.pop("env")
    if env is None:
        os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
    else:
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = env
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


def kill_new_children(before: set[int]) -> None:
    """Kill rank processes started since ``before`` (pids), children first."""
    for p in reversed(ranks_started_since(before)):
        try:
            p.kill()
        except psutil.Error:
            pass


def oom_kills() -> int | None:
    """The out-of-memory killer's count for this cgroup (cgroup v2 ``memory.events``),
    or None where the kernel does not expose it."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[-1]
        text = Path(f"/sys/fs/cgroup{cgroup}/memory.events").read_text()
    except (OSError, IndexError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None
