"""Lab 06's measurements: the student's data-parallel wrapper and DDP side by side on the
simulated link, and what a communication hook sends and does to the loss.

:func:`measure_rank` is a rank body (module level, so ``launch_fn`` starts it). Timings
are shown in the lab, never graded: on a shared CPU they move with the load.

Why the link is patched in here: DDP takes a communication hook
(:func:`perflab.distributed.link_hook.register_link_hook`), but a hand-written wrapper calls
``dist.all_reduce`` itself, so :func:`perflab.labs.lab06.checks.record_allreduces` books those
calls on the same alpha-beta link model and delays their ``wait()`` the same way.
"""
from __future__ import annotations

import importlib
import math
import statistics
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from perflab.labs.lab06.checks import compare_rank, record_allreduces
from perflab.distributed.ddp import register_comm_hook
from perflab.core.simulated import SimulatedLink
from perflab.distributed.link_hook import register_link_hook
from perflab.analysis.overlap import ideal_step_s, overlap_efficiency
from perflab.models import mlp, mlp_batches
from perflab.core.timing import PerfCounterClock

__all__ = ["measure_rank", "lab06_rank", "benchmark_rank", "wrapper_table", "WRAPPERS", "HOOKS"]

#: The data-parallel variants timed on the link, in the order the lab shows them.
WRAPPERS = ("compute only", "per-parameter allreduce (yours)", "bucketed MyDDP (yours)",
            "DistributedDataParallel")
#: The communication hooks compared on loss and bytes.
HOOKS = ("allreduce (torch)", "fp16 (yours)", "PowerSGD rank 1 (torch)")


def _failed(e: Exception) -> dict[str, Any]:
    return {"error": f"{type(e).__name__}: {e}", "step_s": [], "comm_s": math.nan,
            "messages": 0}


def _time_steps(step: Callable[[torch.Tensor, torch.Tensor], Any], data, warmup: int
                ) -> list[float]:
    clock = PerfCounterClock()
    times = []
    for i, (x, y) in enumerate(data):
        t0 = clock.now()
        step(x, y)
        if i >= warmup:
            times.append(clock.now() - t0)
    return times


def _timed_wrappers(student: Any, sizes: Sequence[int], batch: int, link: SimulatedLink,
                    bucket_cap_mb: float, steps: int, warmup: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    data = mlp_batches(sizes, batch, warmup + steps, dist.get_rank(), seed=1)
    loss_fn = torch.nn.functional.cross_entropy
    out: dict[str, Any] = {}
    model = mlp(sizes, 1)

    def forward(x, y):
        with torch.no_grad():
            loss_fn(model(x), y)
    out["forward_s"] = _time_steps(forward, data, warmup)

    def compute(x, y):
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    out[WRAPPERS[0]] = {"step_s": _time_steps(compute, data, warmup), "comm_s": 0.0,
                        "messages": 0}

    def linked(name: str, body: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
        comm = []

        def step(x, y):
            with record_allreduces(link) as calls:
                body(x, y)
            comm.append((sum(c["duration_s"] for c in calls), len(calls)))
        try:
            times = _time_steps(step, data, warmup)
        except Exception as e:  # noqa: BLE001 - the student's code: shown, not raised
            out[name] = _failed(e)
            return
        out[name] = {"step_s": times, "comm_s": comm[-1][0], "messages": comm[-1][1]}

    def per_param(x, y):
        compute(x, y)
        student.allreduce_gradients(model)
    linked(WRAPPERS[1], per_param)

    inner = mlp(sizes, 1)

    def bucketed(x, y):
        inner.zero_grad(set_to_none=True)
        loss_fn(wrapper(x), y).backward()
        wrapper.finish_gradient_sync()
    try:
        wrapper = student.MyDDP(inner, bucket_cap_mb=bucket_cap_mb)
    except Exception as e:  # noqa: BLE001 - the student's code: shown, not raised
        out[WRAPPERS[2]] = _failed(e)
    else:
        linked(WRAPPERS[2], bucketed)

    ddp = DDP(mlp(sizes, 1), bucket_cap_mb=bucket_cap_mb)
    state = register_link_hook(ddp, link)
    comm = []

    def ddp_step(x, y):
        state.reset()
        ddp.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        comm.append((sum(state.model.duration_s(r.nbytes) for r in state.records),
                     len(state.records)))
    times = _time_steps(ddp_step, data, warmup)
    out[WRAPPERS[3]] = {"step_s": times, "comm_s": comm[-1][0], "messages": comm[-1][1]}

    for key, skip_first in (("no_sync", True), ("sync_every_micro_batch", False)):
        def accumulate(x, y, skip_first=skip_first):  # 2 micro-batches, half the batch each
            state.reset()
            ddp.zero_grad(set_to_none=True)
            half = x.shape[0] // 2
            if skip_first:
                with ddp.no_sync():  # gradients accumulate locally, nothing is sent
                    loss_fn(ddp(x[:half]), y[:half]).backward()
            else:
                loss_fn(ddp(x[:half]), y[:half]).backward()
            loss_fn(ddp(x[half:]), y[half:]).backward()
            comm.append((sum(state.model.duration_s(r.nbytes) for r in state.records),
                         len(state.records)))
        times = _time_steps(accumulate, data, warmup)
        out[key] = {"step_s": times, "median_s": statistics.median(times),
                    "comm_s": comm[-1][0], "messages": comm[-1][1], "micro_batches": 2}
    for v in WRAPPERS:
        out[v]["median_s"] = statistics.median(out[v]["step_s"]) if out[v]["step_s"] else math.nan
    out["forward_median_s"] = statistics.median(out["forward_s"])
    return out


def _hooked_losses(student: Any, sizes: Sequence[int], batch: int, steps: int
                   ) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    data = mlp_batches(sizes, batch, 1, dist.get_rank(), seed=2) * steps  # one batch: loss falls
    out: dict[str, Any] = {}
    for name in HOOKS:
        ddp = DDP(mlp(sizes, 2))
        if name == HOOKS[0]:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif name == HOOKS[1]:
            ddp.register_comm_hook(None, student.my_fp16_hook)
        else:
            register_comm_hook(ddp, "powersgd", None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses, sent = [], []
        try:
            for x, y in data:
                opt.zero_grad(set_to_none=True)
                with record_allreduces() as calls:
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                    loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                sent.append(sum(c["nbytes"] for c in calls))
        except Exception as e:  # noqa: BLE001 - the student's hook: shown, not raised
            out[name] = {"error": f"{type(e).__name__}: {e}", "losses": [], "bytes_per_step": []}
            continue
        out[name] = {"losses": losses, "bytes_per_step": sent}
    return out


def measure_rank(student_module: str, sizes: Sequence[int], batch: int,
                 link: SimulatedLink, bucket_cap_mb: float, steps: int = 4,
                 warmup: int = 1, hook_sizes: Sequence[int] = (32, 256, 256, 10),
                 hook_steps: int = 20) -> dict[str, Any]:
    """Rank body: Lab 06's side-by-side timing and communication-hook comparison.

    Args:
        student_module: the module the lab wrote (``allreduce_gradients``, ``MyDDP``,
            ``my_fp16_hook``), imported on this rank.
        sizes: widths of the timed ``perflab.models.mlp`` (fp32); batch: rows per rank.
        link: the simulated link every variant's allreduces go through.
        bucket_cap_mb: MiB, for MyDDP and DDP alike.
        steps, warmup: timed steps per variant and untimed ones before them.
        hook_sizes, hook_steps: the MLP and its SGD steps (lr 0.05, batch 16 per rank, one
            fixed batch so the loss falls) of the hook comparison.

    Returns:
        ``{"timed": {variant: {"step_s": [...], "median_s", "comm_s" (the link's time
        for one step's messages sent back to back), "messages"} (or with "error": "Type:
        message" and no times, where the student's code raised), "forward_s": [...],
        "forward_median_s"}, "hooks": {hook: {"losses", "bytes_per_step"}}}``.
    """
    student = importlib.import_module(student_module)
    return {"timed": _timed_wrappers(student, sizes, batch, link, bucket_cap_mb, steps,
                                     warmup),
            "hooks": _hooked_losses(student, hook_sizes, 16, hook_steps)}


def lab06_rank(student_module: str, check_args: Sequence[Any], measure_args: Sequence[Any],
               more_checks: Sequence[Sequence[Any]] = ()) -> dict[str, Any]:
    """Rank body of Lab 06's one launch (process start-up costs seconds, so it happens
    once): ``{"check": compare_rank(student_module, *check_args), "measure":
    measure_rank(student_module, *measure_args)}``. See :func:`perflab.labs.lab06.checks.compare_rank`
    and :func:`measure_rank`.

    ``more_checks``: more :func:`~perflab.labs.lab06.checks.compare_rank` argument tuples
    (other models and bucket caps), run in the same launch; their results come back as
    ``"more_checks": [compare_rank(student_module, *args), ...]``, in order."""
    return {"check": compare_rank(student_module, *check_args),
            "more_checks": [compare_rank(student_module, *args) for args in more_checks],
            "measure": measure_rank(student_module, *measure_args)}


def benchmark_rank(student_module: str, sizes_bytes: Sequence[int], iters: int,
                   warmup: int) -> dict[str, Any]:
    """Rank body of Lab 06's all-reduce benchmark: the student's
    ``allreduce_benchmark(sizes_bytes, iters, warmup)`` with every ``dist.all_reduce`` and
    ``dist.barrier`` it makes recorded, in order
    (:func:`~perflab.labs.lab06.checks.record_allreduces` with ``barriers=True``: however
    the function is reached through ``torch.distributed``; the collectives still run).

    Args:
        student_module: the module the lab wrote, imported on this rank.
        sizes_bytes: message sizes (bytes; a float32 tensor of ``n // 4`` elements each).
        iters, warmup: timed and untimed all-reduces per size.

    Returns:
        ``{"rows": [[size_bytes, seconds per all-reduce], ...] as the student's function
        returned them, "calls": [["all_reduce", numel, dtype] or ["barrier", 0, ""], ...]}``.

    Raises:
        whatever the student's function raises.
    """
    student = importlib.import_module(student_module)
    with record_allreduces(barriers=True) as calls:
        rows = student.allreduce_benchmark(list(sizes_bytes), iters, warmup)
    return {"rows": [[int(n), float(t)] for n, t in rows],
            "calls": [["barrier", 0, ""] if c.get("barrier") else
                      ["all_reduce", int(c["numel"]), c["dtype"]] for c in calls]}


def wrapper_table(measured: Sequence[dict[str, Any]], link: SimulatedLink) -> pd.DataFrame:
    """One row per rank per :data:`WRAPPERS` variant of :func:`measure_rank`'s ``"timed"``
    results, in ms, with the columns :func:`perflab.analysis.overlap.plot_overlap` reads.

    compute = the "compute only" step (forward + backward, no communication); comm = the
    link's time for the variant's messages sent back to back (the alpha-beta model of
    what it sent: a modelled figure); step = the variant's measured step; exposed comm =
    step - compute; overlap efficiency against ``max(compute, comm)`` (textbook) and
    ``max(compute, forward + comm)`` (the bound a wrapper that starts allreduces in
    backward can reach), NaN where undefined. A variant whose code raised (its record
    holds ``"error"``) has no row. ``attrs["title"]`` names the link.

    Raises:
        ValueError: an entry lacks the "timed" results.
    """
    rows = []
    for rank, m in enumerate(measured):
        if "timed" not in m:
            raise ValueError("wrapper_table needs measure_rank results (with 'timed'), one "
                             "per rank")
        t = m["timed"]
        compute, fwd = t[WRAPPERS[0]]["median_s"], t["forward_median_s"]
        for v in WRAPPERS[1:]:
            if "error" in t[v]:  # the student's code raised on this rank: nothing measured
                continue
            comm, step = t[v]["comm_s"], t[v]["median_s"]
            row = {"variant": v, "rank": rank, "messages": t[v]["messages"],
                   "forward_ms": fwd * 1e3, "compute_ms": compute * 1e3,
                   "comm_ms": comm * 1e3, "step_ms": step * 1e3,
                   "exposed_comm_ms": (step - compute) * 1e3}
            for name, ideal in (("textbook", ideal_step_s(compute, comm)),
                                ("ddp", ideal_step_s(compute, comm, fwd))):
                row[f"ideal_{name}_ms"] = ideal * 1e3
                try:
                    row[f"overlap_eff_{name}"] = overlap_efficiency(compute, comm, step, ideal)
                except ValueError:
                    row[f"overlap_eff_{name}"] = float("nan")
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["title"] = link.describe()
    return df
