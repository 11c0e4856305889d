"""Lab 07's rank body: data-parallel training with a slow rank, the student's straggler
detector running *inside* the training loop, and a rebalanced micro-batch.

:func:`straggler_rank` is what :func:`perflab.distributed.launch_fn` runs on every rank.
Each step a rank times its own compute (forward + backward, plus an injected delay),
sums the gradients of the ranks' weighted losses with one explicit ``all_reduce`` (so
the time spent waiting for the slowest rank is measured apart from the compute), steps
the optimizer, then calls the student's module -- a file the notebook writes with ``%%writefile`` and every
spawned rank imports by name:

* ``all_gather_times(local_s) -> list[float]``: every rank's value, in rank order;
* ``my_detect(per_rank_times) -> list[int]``: the slow ranks (ranks x steps input);
* ``rebalance(batch_sizes, compute_s) -> list[int]``: new per-rank micro-batch sizes;
* ``rank_loss(logits, targets, global_batch, world_size) -> tensor``: the scalar this
  rank back-propagates, so that the SUM of the ranks' gradients (the ``all_reduce``) is
  the gradient of the mean loss over the global batch, whatever the split.

The injected slowness is proportional: a rank slowed by ``frac`` sleeps ``frac`` x its
own forward + backward time of that step (a device ``1 + frac`` times slower per
sample), so moving samples off it helps -- a fixed sleep would not shrink with its batch.

Why our own loop instead of DDP: DDP launches its allreduce from inside ``backward``, so
a rank's compute and its wait for the others cannot be told apart; here the gradients
are summed after backward, once. With unequal micro-batches the sum is the global-batch
gradient only if rank r's loss is weighted b_r / B (the mean of per-rank means, DDP's
divide-by-world-size, is biased toward the smaller micro-batch): the student's
``rank_loss`` does it. Recording runs (``benchmarks/record_stragglers.py``) pass the
grader-only :mod:`perflab.course.references.lab07` as the module; without a module, or
with one without a working ``rank_loss``, the run uses DDP's 1 / world_size weighting
(biased for unequal micro-batches; a failure is recorded as an error).

:func:`detector_rank` runs the same gather-then-detect step of the loop on compute times
it is given instead of measured ones (no training): the in-loop detector's graded launch,
on times the grader drew, so every verdict can be recomputed from them.

:func:`debug_rank` is the rank body of the lab's debug-output section: a few collectives
under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` with one rank issuing a different one, the
rank's own stderr (the C++ log) captured and returned.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch

from perflab.models import mlp
from perflab.core.timing import Stopwatch

__all__ = ["straggler_rank", "detector_rank", "launch_detector", "debug_rank",
           "ThreadCpuClock"]


class ThreadCpuClock:
    """CPU seconds of the calling thread (``time.thread_time``): a
    :class:`perflab.core.timing.Clock` for ``Stopwatch(clock=ThreadCpuClock())``.

    With one torch thread per rank the forward and backward run on this thread, so
    wall time minus CPU time is the time the rank was not on a core (waiting for one, or
    sleeping)."""

    def now(self) -> float:
        return time.thread_time()


def debug_rank(odd_rank: int, odd_op: str, shapes: Sequence[int] = (4, 3, 4),
               log_path: str | None = None) -> dict[str, Any]:
    """Rank body: all_reduce, broadcast, all_reduce (1-D float32 tensors of ``shapes``)
    with rank ``odd_rank`` issuing ``odd_op`` ("broadcast", or "all_reduce" of one more
    element) as its third collective; this rank's stderr captured meanwhile.

    Run under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (set before the launch, so the ranks
    inherit it) the process group is wrapped in a ``ProcessGroupWrapper`` that checks each
    collective's fingerprint (op, shapes, dtypes) on every rank first and raises on a
    mismatch; with ``TORCH_CPP_LOG_LEVEL=INFO`` it logs every collective it runs
    (torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp).

    Returns ``{"rank", "log": this rank's stderr during the collectives (str), "error":
    the exception's text or None}``.

    Raises:
        ValueError: ``odd_op`` is not "broadcast" or "all_reduce".
    """
    import tempfile
    import torch.distributed as dist

    if odd_op not in ("broadcast", "all_reduce"):
        raise ValueError(f"odd_op must be 'broadcast' or 'all_reduce', got {odd_op!r}")
    rank = dist.get_rank()
    path = log_path or tempfile.mkstemp(prefix=f"perflab-debug-rank{rank}-")[1]
    saved = os.dup(2)
    error = None
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)          # the C++ log writes to file descriptor 2
        try:
            dist.all_reduce(torch.ones(shapes[0]))
            dist.broadcast(torch.zeros(shapes[1]), src=0)
            last = torch.zeros(shapes[2] + (rank == odd_rank and odd_op == "all_reduce"))
            if rank == odd_rank and odd_op == "broadcast":
                dist.broadcast(last, src=0)
            else:
                dist.all_reduce(last)
        except RuntimeError as e:      # DETAIL's check raised on this rank
            error = f"{type(e).__name__}: {e}"
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    with open(path) as f:
        log = f.read()
    if log_path is None:
        os.unlink(path)
    return {"rank": rank, "log": log, "error": error}


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


def _rank_loss(student: Any, logits: torch.Tensor, y: torch.Tensor, global_batch: int,
               ws: int, errors: list) -> torch.Tensor:
    """The student module's ``rank_loss``; without a module, or a module without a
    working one, DDP's weighting (the mean over this rank's micro-batch divided by
    ``world_size``, biased toward the smaller micro-batch; a failure is recorded in
    ``errors`` and the run goes on)."""
    fn = getattr(student, "rank_loss", None) if student is not None else None
    if fn is not None:
        got = _call(errors, "rank_loss", fn, logits, y, global_batch, ws)
        if isinstance(got, torch.Tensor) and got.dim() == 0 and got.requires_grad:
            return got
        if got is not None:
            errors.append(f"rank_loss returned {got!r}: not a 0-d tensor with a gradient; "
                          "used DDP's 1 / world_size weighting")
    return torch.nn.functional.cross_entropy(logits, y) / ws


def _rebalanced(student: Any, prev: dict | None, gathered: list, ws: int, global_batch: int,
                errors: list) -> list[int]:
    """The student's rebalance of the previous phase's sizes by its measured medians."""
    keep = prev["batch_sizes"] if prev else [global_batch // ws + (r < global_batch % ws)
                                             for r in range(ws)]
    if student is None or not hasattr(student, "rebalance") or not gathered \
            or any(g is None or len(g) != ws for g in gathered):
        return list(keep)
    med = np.median(np.asarray(gathered, dtype=float), axis=0).tolist()
    new = _call(errors, "rebalance", student.rebalance, list(keep), med)
    ok = (isinstance(new, (list, tuple)) and len(new) == ws
          and all(isinstance(b, (int, np.integer)) and b >= 1 for b in new)
          and sum(new) == global_batch)
    if new is not None and not ok:
        errors.append(f"rebalance returned {new!r}: not {ws} ints >= 1 summing to "
                      f"{global_batch}; kept {keep}")
    return [int(b) for b in new] if ok else list(keep)


def _verdict(student: Any, gathered: list, ws: int, errors: list) -> list[int] | None:
    """The student's ``my_detect`` on every row ``gathered`` so far (steps x ranks, as
    the gather returned them), called as ``my_detect(ranks x steps)`` with its defaults;
    None when a row is missing or short (the gather failed) or the detector fails (its
    error recorded in ``errors``)."""
    history = [g for g in gathered if g is not None and len(g) == ws]
    if student is None or not hasattr(student, "my_detect") or not history \
            or len(history) != len(gathered):
        return None
    per_rank = np.asarray(history, dtype=float).T.tolist()   # ranks x steps
    v = _call(errors, "my_detect", student.my_detect, per_rank)
    if not isinstance(v, (list, tuple)):
        return None
    try:
        return [int(r) for r in v]
    except (TypeError, ValueError) as e:
        errors.append(f"my_detect returned {v!r}: not rank numbers ({e})"[:300])
        return None


def _run_group(group: list[int], phases: Sequence[dict], recs: list[dict], warmup: int,
               model: torch.nn.Module, params: list, opt: torch.optim.Optimizer,
               pool_x: torch.Tensor, pool_y: torch.Tensor, global_batch: int, rank: int,
               ws: int, gather: Any, student: Any, errors: list) -> None:
    """Train the phases of ``group`` interleaved (warm-up rounds first); fill ``recs``."""
    import torch.distributed as dist

    for s in range(warmup + max(int(phases[i]["steps"]) for i in group)):
        for i in group:
            ph = phases[i]
            step = s - warmup
            if step >= int(ph["steps"]):
                continue
            rec = recs[i]
            lo = sum(rec["batch_sizes"][:rank])
            x, y = pool_x[lo:lo + rec["batch_sizes"][rank]], pool_y[lo:lo + rec["batch_sizes"][rank]]
            frac = _delay(ph.get("slow", {}), rank, max(step, 0))
            with Stopwatch() as step_sw:
                with Stopwatch() as wall, Stopwatch(clock=ThreadCpuClock()) as cpu:
                    logits = model(x)
                    mine = _rank_loss(student, logits, y, global_batch, ws, errors)
                    mine.backward()         # summed over ranks below: the global gradient
                    loss = torch.nn.functional.cross_entropy(logits.detach(), y)
                    if frac > 0:
                        time.sleep(frac * wall.elapsed_s)   # the injected straggler
                with Stopwatch() as wait:
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    dist.all_reduce(flat)                 # waits for the slowest rank
                    torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
                opt.step()
                opt.zero_grad(set_to_none=False)
            got = _call(errors, "all_gather_times", gather, wall.elapsed_s) if gather else None
            got = [float(v) for v in got] if isinstance(got, (list, tuple)) else None
            if step < 0:
                continue
            for key, sw in (("compute_s", wall), ("cpu_s", cpu), ("wait_s", wait),
                            ("step_s", step_sw)):
                rec[key].append(sw.elapsed_s)
            rec["loss"].append(float(loss.detach()))
            rec["gathered"].append(got)
            rec["verdicts"].append(_verdict(student, rec["gathered"], ws, errors))


def straggler_rank(phases: Sequence[dict], student_module: str | None = None, *,
                   sizes: Sequence[int] = (128, 256, 256, 10), global_batch: int = 2048,
                   warmup: int = 3, seed: int = 0) -> dict[str, Any]:
    """Rank body: train :func:`perflab.models.mlp` ``(sizes)`` through ``phases``; measure
    this rank.

    Args:
        phases: each a dict with ``name`` (str), ``steps`` (>= 1, measured steps),
            ``slow`` ({rank: frac} or {rank: [frac per step]}: that rank sleeps frac x
            its forward + backward time, warm-up included) and ``batch``: "even"
            (``global_batch`` split evenly), "rebalance" (the student's ``rebalance`` of
            the previous phase's sizes and its per-rank median gathered compute seconds)
            or a list of per-rank sizes. Phases run interleaved, one step of each per
            round, so drift in the machine's speed shifts them alike; a "rebalance"
            phase starts a new interleaved group (it needs the previous phase's
            measurements), e.g. [none, slow, rebalanced, slow again] runs as
            (none | slow), then (rebalanced | slow again).
        student_module: module name of the student's file (``straggler_student`` for
            ``straggler_student.py`` in the working folder; recording runs pass the
            grader-only ``perflab.course.references.lab07``), or None: no gather, DDP's
            1 / world_size loss weighting, no detector.
        sizes: the MLP's widths; input ``(b, sizes[0])`` float32, ``b`` = this rank's
            micro-batch.
        global_batch: samples per step over all ranks (>= world_size).
        warmup: unmeasured rounds (one step of each phase of a group) before its measured ones.
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

    if not phases:
        raise ValueError("phases must list at least one phase, e.g. [{'name': 'even', "
                         "'steps': 10, 'slow': {}, 'batch': 'even'}]")
    for ph in phases:
        if not isinstance(ph.get("steps"), int) or ph["steps"] < 1:
            raise ValueError(f"phase {ph.get('name')!r}: steps must be an int >= 1, "
                             f"got {ph.get('steps')!r}")
    rank, ws = dist.get_rank(), dist.get_world_size()
    if global_batch < ws:
        raise ValueError(f"global_batch must be >= world_size={ws}, got {global_batch}")
    if student_module and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module) if student_module else None
    gather = getattr(student, "all_gather_times", None) if student else None
    errors: list[str] = []
    fixed = _call(errors, "all_gather_times", gather, 0.1 * (rank + 1)) if gather else None

    model = mlp(sizes, seed)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(seed)
    pool_x = torch.randn(global_batch, sizes[0], generator=gen)
    pool_y = torch.randint(0, sizes[-1], (global_batch,), generator=gen)
    even = [global_batch // ws + (r < global_batch % ws) for r in range(ws)]
    recs: list[dict[str, Any]] = []
    for ph in phases:
        batch = ph.get("batch", "even")
        if batch not in ("even", "rebalance") and not (
                isinstance(batch, (list, tuple)) and len(batch) == ws and sum(batch) == global_batch):
            raise ValueError(f"phase {ph.get('name')!r}: batch must be 'even', 'rebalance' or "
                             f"{ws} sizes summing to {global_batch}, got {batch!r}")
        recs.append({"name": ph.get("name", ""),
                     "batch_sizes": [int(b) for b in batch] if isinstance(batch, (list, tuple)) else even,
                     "slow": {str(k): v for k, v in ph.get("slow", {}).items()},
                     **{k: [] for k in ("compute_s", "cpu_s", "wait_s", "step_s", "gathered",
                                        "verdicts", "loss")}})
    # Phases run interleaved, one step of each per round, so a machine whose speed drifts
    # (other programs starting and stopping) shifts every phase alike. A "rebalance" phase
    # starts a new group of interleaved phases: it needs the previous phase's measurements.
    starts = [i for i, ph in enumerate(phases) if i == 0 or ph.get("batch") == "rebalance"]
    for first, stop in zip(starts, starts[1:] + [len(phases)]):
        group = list(range(first, stop))
        if phases[first].get("batch") == "rebalance":
            prev = recs[first - 1] if first else None
            recs[first]["batch_sizes"] = _rebalanced(
                student, prev, prev["gathered"] if prev else [], ws, global_batch, errors)
        _run_group(group, phases, recs, warmup, model, params, opt, pool_x, pool_y,
                   global_batch, rank, ws, gather, student, errors)
    out_phases = recs
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"rank": rank, "world_size": ws, "cores": cores, "fixed_gather": fixed,
            "errors": errors[:20], "phases": out_phases}


def detector_rank(schedules: Sequence[Sequence[Sequence[float]]],
                  student_module: str) -> dict[str, Any]:
    """Rank body of Lab 07's in-loop detector on given compute times: no training.

    For each schedule (ranks x steps seconds, one row per rank of this launch), step by
    step, this rank hands the student's ``all_gather_times`` its own time of that step
    (``schedule[rank][step]``) instead of a measured one, then calls the student's
    ``my_detect`` on every row gathered so far in that schedule, as
    :func:`straggler_rank` does after each training step. Grading draws the schedules
    (hidden compute times), so every verdict can be recomputed from them.

    Args:
        schedules: each a list of ``world_size`` lists of floats (seconds), all of one
            length (>= 1 step).
        student_module: the student's module name (``straggler_student``).

    Returns:
        ``{"rank", "world_size", "errors": [str], "runs": [{"gathered": [what the gather
        returned at each step, or None], "verdicts": [the detector's answer after each
        step, or None]}]}``.

    Raises:
        ValueError: a schedule without one row per rank, or rows of different lengths.
    """
    import torch.distributed as dist

    rank, ws = dist.get_rank(), dist.get_world_size()
    for k, times in enumerate(schedules):
        if len(times) != ws or len({len(row) for row in times}) != 1 or not times[0]:
            raise ValueError(f"schedule {k}: one row of >= 1 step per rank ({ws}) and rows of "
                             f"one length, got {[len(row) for row in times]}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module)
    gather = getattr(student, "all_gather_times", None)
    errors: list[str] = []
    runs = []
    for times in schedules:
        gathered: list = []
        verdicts: list = []
        for step in range(len(times[0])):
            got = _call(errors, "all_gather_times", gather, float(times[rank][step])) \
                if gather else None
            try:
                got = [float(v) for v in got] if isinstance(got, (list, tuple)) else None
            except (TypeError, ValueError):
                got = None
            gathered.append(got)
            verdicts.append(_verdict(student, gathered, ws, errors))
        runs.append({"gathered": gathered, "verdicts": verdicts})
    return {"rank": rank, "world_size": ws, "errors": errors[:20], "runs": runs}


def launch_detector(schedules: Sequence[Sequence[Sequence[float]]], student_module: str, *,
                    world_size: int = 2, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """:func:`detector_rank` on ``world_size`` CPU ranks (gloo), each rank's result in rank
    order: the in-loop detector's graded launch.

    The ranks are spawned (``PERFLAB_START_METHOD=spawn`` for this call), not forked from
    a forkserver: one started here would outlive the call with this environment, and the
    lab's later debug launch (``TORCH_DISTRIBUTED_DEBUG`` set) would then have to spawn
    its three ranks instead of starting a forkserver of its own; the same start-up, paid
    once instead of twice.

    Raises:
        perflab.distributed.launch.RankFailedError: a rank raised (a malformed schedule:
            :func:`detector_rank`'s ValueError).
        ValueError: a bad ``world_size`` or ``timeout_s`` (:func:`launch_fn`'s).
    """
    from perflab.distributed import launch_fn

    saved = os.environ.get("PERFLAB_START_METHOD")
    os.environ["PERFLAB_START_METHOD"] = "spawn"
    try:
        return launch_fn(detector_rank, world_size, device="cpu", timeout_s=timeout_s,
                         args=([[list(row) for row in t] for t in schedules], student_module))
    finally:
        if saved is None:
            os.environ.pop("PERFLAB_START_METHOD", None)
        else:
            os.environ["PERFLAB_START_METHOD"] = saved
