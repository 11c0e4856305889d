"""What Lab 09's ranks watch for while the student's own sharding code runs: torch's
sharding APIs (:data:`ZERO_FORBIDDEN`), seen by :func:`perflab.labs.checking.watch_calls`
on the rank. Used by :func:`perflab.labs.lab09.sharding_rank` (ZeRO-1 and ZeRO-2) and
:func:`perflab.labs.lab09.fsdp.my_fsdp_rank` (FSDP by hand)."""
from __future__ import annotations

from typing import Any

__all__: list[str] = []   # re-exported by perflab.labs.lab09

#: What Exercises 2, 2b and 2c ask the student to write themselves: torch's sharded optimizers.
#: ``sharding_rank`` records any of them that runs while the student's ``MyZero1`` /
#: ``MyZero2`` / ``MyFSDP`` is built and stepped (``"delegated"``); the checks fail such a run.
ZERO_FORBIDDEN = ("torch.distributed.optim.ZeroRedundancyOptimizer",
                  "torch.distributed.fsdp.fully_shard",
                  "torch.distributed.fsdp.FullyShardedDataParallel")


def _watch_student(student_code: bool) -> Any:
    """A context manager yielding the names of :data:`ZERO_FORBIDDEN` that run inside it
    (however reached: :func:`perflab.labs.checking.watch_calls`) when ``student_code``;
    otherwise nothing is watched (DDP, FSDP2 and torch's ZeRO-1 are perflab's own runs)."""
    import contextlib

    from perflab.labs.checking import resolve, watch_calls

    if not student_code:
        return contextlib.nullcontext([])
    return watch_calls({name: resolve(name) for name in ZERO_FORBIDDEN})
