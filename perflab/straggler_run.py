"""Lab 07's rank body: data-parallel training with a slow rank, the student's straggler
detector running *inside* the training loop, and a rebalanced micro-batch.

:func:`straggler_rank` is what :func:`perflab.distributed.launch_fn` runs on every rank.
Each step a rank times its own compute (forward + backward, plus an injected delay),
averages the gradients with one explicit ``all_reduce`` (so the time spent waiting for
the slowest rank is measured apart from the compute), steps the optimizer, then calls
the student's module -- a file the notebook writes with ``%%writefile`` and every
spawned rank imports by name:

* ``all_gather_times(local_s) -> list[float]``: every rank's value, in rank order;
* ``my_detect(per_rank_times) -> list[int]``: the slow ranks (ranks x steps input);
* ``rebalance(batch_sizes, compute_s) -> list[int]``: new per-rank micro-batch sizes.

The injected slowness is proportional: a rank slowed by ``frac`` sleeps ``frac`` x its
own forward + backward time of that step (a device ``1 + frac`` times slower per
sample), so moving samples off it helps -- a fixed sleep would not shrink with its batch.

Why our own loop instead of DDP: DDP launches its allreduce from inside ``backward``, so
a rank's compute and its wait for the others cannot be told apart; here the gradients
are averaged after backward, once, weighted by each rank's share of the global batch.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch

from perflab.sharding_run import mlp
from perflab.timing import Stopwatch

__all__ = ["straggler_rank", "reference_gather", "ThreadCpuClock"]


class ThreadCpuClock:
    """CPU seconds of the calling thread (``time.thread_time``): a
    :class:`perflab.timing.Clock` for ``Stopwatch(clock=ThreadCpuClock())``.

    With one torch thread per rank the forward and backward run on this thread, so
    wall time minus CPU time is the time the rank was not on a core (waiting for one, or
    sleeping)."""

    def now(self) -> float:
        return time.thread_time()


def reference_gather(local_s: float) -> list[float]:
    """Every rank's ``local_s`` in rank order (``dist.all_gather`` of a float64 tensor).

    Used when no student module is given (recording runs). Call on every rank."""
    import torch.distributed as dist

    mine = torch.tensor([float(local_s)], dtype=torch.float64)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [float(t) for t in out]


def _delay(slow: dict, rank: int, step: int) -> float:
    frac = slow.get(rank, slow.get(str(rank), 0.0))
    if isinstance(frac, (list, tuple)):
        return float(frac[step]) if step < len(frac) else 0.0
    return float(frac)


def _call(errors: list, what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - a student's bug is recorded, the run goes on
        errors.append(f"{what}: {type(e).__name__}: {e}"[:300])
        return None


def straggler_rank(phases: Sequence[dict], student_module: str | None = None, *,
                   sizes: Sequence[int] = (128, 256, 256, 10), global_batch: int = 2048,
                   warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """Rank body: train :func:`perflab.mlp` ``(sizes)`` through ``phases``; measure this rank.

    Args:
        phases: each a dict with ``name`` (str), ``steps`` (>= 1, measured steps),
            ``slow`` ({rank: frac} or {rank: [frac per step]}: that rank sleeps frac x
            its forward + backward time) and ``batch``: "even" (``global_batch`` split
            evenly), "rebalance" (the student's ``rebalance`` of the previous phase's
            sizes and per-rank median compute seconds) or a list of per-rank sizes.
        student_module: module name of the student's file (``straggler_student`` for
            ``straggler_student.py`` in the working folder), or None: perflab's own
            gather, no detector.
        sizes: the MLP's widths; input ``(b, sizes[0])`` float32, ``b`` = this rank's
            micro-batch.
        global_batch: samples per step over all ranks (>= world_size).
        warmup: unmeasured steps at the start of each phase.
        seed: model and data seed (the same on every rank).

    Returns:
        ``{"rank", "world_size", "cores": [allowed cores], "fixed_gather": the student's
        gather of 0.1 x (rank + 1), "errors": [str], "phases": [{"name", "batch_sizes",
        "slow", "compute_s", "cpu_s", "wait_s", "step_s" (this rank, per measured step,
        seconds), "gathered" (steps x ranks, as the student's gather returned),
        "verdicts" (the detector's answer after each step), "loss"}]}``.

    Raises:
        ValueError: no phases, a phase with steps < 1 or an unknown batch, or
            global_batch < world_size.
    """
    import torch.distributed as dist

    rank, ws = dist.get_rank(), dist.get_world_size()
    if not phases:
        raise ValueError("phases must list at least one phase, e.g. [{'name': 'even', "
                         "'steps': 10, 'slow': {}, 'batch': 'even'}]")
    if global_batch < ws:
        raise ValueError(f"global_batch must be >= world_size={ws}, got {global_batch}")
    if student_module and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module) if student_module else None
    gather = getattr(student, "all_gather_times", None) if student else reference_gather
    errors: list[str] = []
    fixed = _call(errors, "all_gather_times", gather, 0.1 * (rank + 1)) if gather else None

    model = mlp(sizes, seed)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(seed)
    pool_x = torch.randn(global_batch, sizes[0], generator=gen)
    pool_y = torch.randint(0, sizes[-1], (global_batch,), generator=gen)
    sizes_now = [global_batch // ws + (r < global_batch % ws) for r in range(ws)]
    out_phases: list[dict] = []
    for ph in phases:
        if int(ph.get("steps", 0)) < 1:
            raise ValueError(f"phase {ph.get('name')!r}: steps must be >= 1, got {ph.get('steps')!r}")
        batch = ph.get("batch", "even")
        if batch == "even":
            sizes_now = [global_batch // ws + (r < global_batch % ws) for r in range(ws)]
        elif batch == "rebalance":
            prev = out_phases[-1] if out_phases else None
            med = (np.median(np.asarray(prev["gathered"], dtype=float), axis=0).tolist()
                   if prev and prev["gathered"] and None not in prev["gathered"] else None)
            new = _call(errors, "rebalance", student.rebalance, list(sizes_now), med) \
                if student is not None and hasattr(student, "rebalance") and med else None
            ok = (isinstance(new, (list, tuple)) and len(new) == ws
                  and all(isinstance(b, (int, np.integer)) and 1 <= b for b in new)
                  and sum(new) == global_batch)
            if new is not None and not ok:
                errors.append(f"rebalance returned {new!r}: not {ws} ints >= 1 summing to "
                              f"{global_batch}; kept {sizes_now}")
            sizes_now = [int(b) for b in new] if ok else sizes_now
        elif isinstance(batch, (list, tuple)) and len(batch) == ws and sum(batch) == global_batch:
            sizes_now = [int(b) for b in batch]
        else:
            raise ValueError(f"phase {ph.get('name')!r}: batch must be 'even', 'rebalance' or "
                             f"{ws} sizes summing to {global_batch}, got {batch!r}")
        lo = sum(sizes_now[:rank])
        x, y = pool_x[lo:lo + sizes_now[rank]], pool_y[lo:lo + sizes_now[rank]]
        weight = sizes_now[rank] / global_batch    # this rank's share of the global mean
        rec: dict[str, Any] = {"name": ph.get("name", ""), "batch_sizes": list(sizes_now),
                               "slow": {str(k): v for k, v in ph.get("slow", {}).items()},
                               **{k: [] for k in ("compute_s", "cpu_s", "wait_s", "step_s",
                                                  "gathered", "verdicts", "loss")}}
        history: list[list[float]] = []
        for s in range(warmup + int(ph["steps"])):
            measured = s >= warmup
            with Stopwatch() as step_sw:
                with Stopwatch() as wall, Stopwatch(clock=ThreadCpuClock()) as cpu:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    (loss * weight).backward()
                    frac = _delay(ph.get("slow", {}), rank, s - warmup) if measured else 0.0
                    if frac > 0:
                        time.sleep(frac * wall.elapsed_s)   # the injected straggler
                with Stopwatch() as wait:
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    dist.all_reduce(flat)                 # waits for the slowest rank
                    torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
                opt.step()
                opt.zero_grad(set_to_none=False)
            if not measured:
                continue
            for key, sw in (("compute_s", wall), ("cpu_s", cpu), ("wait_s", wait),
                            ("step_s", step_sw)):
                rec[key].append(sw.elapsed_s)
            rec["loss"].append(float(loss.detach()))
            got = _call(errors, "all_gather_times", gather, rec["compute_s"][-1]) if gather else None
            rec["gathered"].append([float(v) for v in got] if isinstance(got, (list, tuple))
                                   else None)
            if got is not None:
                history.append([float(v) for v in got])
            verdict = None
            if student is not None and hasattr(student, "my_detect") and history \
                    and all(len(h) == ws for h in history):
                per_rank = np.asarray(history, dtype=float).T.tolist()   # ranks x steps
                v = _call(errors, "my_detect", student.my_detect, per_rank)
                verdict = [int(r) for r in v] if isinstance(v, (list, tuple)) else None
            rec["verdicts"].append(verdict)
        out_phases.append(rec)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"rank": rank, "world_size": ws, "cores": cores, "fixed_gather": fixed,
            "errors": errors[:20], "phases": out_phases}
