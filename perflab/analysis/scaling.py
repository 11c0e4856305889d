"""Scaling curves (Lab 09): throughput at world_size 1, 2, 4, weak and strong, with CIs.

* **weak scaling**: the per-rank batch stays fixed, so the global batch grows with the
  ranks; ideal throughput grows N-fold.
* **strong scaling**: the global batch stays fixed and is split over the ranks; each
  rank's share shrinks, and so does its compute per allreduce.

Scaling efficiency at N ranks is ``E(N) = X(N) / (N * X(1))`` with X the throughput in
samples/s (global batch / step time); 1.0 is perfect scaling. (Hennessy & Patterson's
parallel efficiency, speedup / N; the weak/strong distinction is Gustafson 1988,
"Reevaluating Amdahl's law".) Its 95 % confidence interval comes from a seeded percentile
bootstrap over the measured steps (Efron & Tibshirani 1993, ch. 13).

On a machine with fewer cores than ranks, ranks share cores: :func:`core_label` names
those runs "oversubscribed" so no plot or table hides it. Such a machine can still run
many ranks without sharing a core for compute: with **simulated compute**
(``compute_s_per_sample``, :func:`scaling_rank`) each rank sleeps its batch's modelled
forward+backward time and computes only one sample, while DDP still all-reduces real
gradients of the real sizes through the (simulated) link; such runs are labelled
"simulated compute" in :func:`core_label`, :func:`scaling_table` and the plots, and still
"oversubscribed" when ranks outnumber cores: their real all-reduces share the cores.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab.core.simulated import SimulatedLink
from perflab.core.timing import PhaseTimer
from perflab.distributed import launch_fn
from perflab.models import mlp, mlp_batches

__all__ = ["scaling_efficiency", "core_label", "scaling_configs", "scaling_table",
           "scaling_curve", "SCALING_MODES", "scaling_rank"]

#: "weak": fixed per-rank batch; "strong": fixed global batch.
SCALING_MODES = ("weak", "strong")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def core_label(world_size: int, threads_per_rank: int = 1, cores: int | None = None, *,
               simulated_compute: bool = False) -> str:
    """"2 ranks on 2 cores", "4 ranks on 2 cores (oversubscribed)" or, with
    ``simulated_compute``, "8 ranks on 2 cores, simulated compute (oversubscribed)": the
    ranks sleep their compute, but more processes than cores still share the cores for
    everything else (the real all-reduces, the optimizer step), so such a run is labelled
    oversubscribed whatever is simulated.

    Raises:
        ValueError: world_size or threads_per_rank < 1.
    """
    if world_size < 1 or threads_per_rank < 1:
        raise ValueError(f"world_size and threads_per_rank must be >= 1, got {world_size}, "
                         f"{threads_per_rank}")
    cores = _cores() if cores is None else cores
    text = f"{world_size} rank{'s' * (world_size > 1)} on {cores} cores"
    if simulated_compute:
        return text + ", simulated compute" + (" (oversubscribed)" if world_size > cores else "")
    return text + (" (oversubscribed)" if world_size * threads_per_rank > cores else "")


def scaling_efficiency(step_s_1: Sequence[float], step_s_n: Sequence[float], n: int,
                       global_batch_1: int, global_batch_n: int, *, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float, float]:
    """Scaling efficiency ``X(n) / (n * X(1))`` and its 95 % bootstrap CI.

    X = global batch / median step time (samples/s). The CI resamples each run's step
    times with replacement (``resamples`` times, seeded) and takes the 2.5 and 97.5
    percentiles of the efficiency.

    Args:
        step_s_1: step times (s) at 1 rank; step_s_n: at ``n`` ranks (>= 1 each).
        n: ranks of the second run (>= 1).
        global_batch_1, global_batch_n: samples per step over all ranks of each run.

    Returns:
        ``(efficiency, ci_low, ci_high)``.

    Raises:
        ValueError: empty or non-positive times, n < 1, or a batch < 1.
    """
    a, b = np.asarray(step_s_1, float), np.asarray(step_s_n, float)
    if a.size < 1 or b.size < 1 or (a <= 0).any() or (b <= 0).any():
        raise ValueError("step_s_1 and step_s_n must be non-empty lists of positive seconds")
    if n < 1 or global_batch_1 < 1 or global_batch_n < 1:
        raise ValueError(f"n and the global batches must be >= 1, got n={n}, "
                         f"global_batch_1={global_batch_1}, global_batch_n={global_batch_n}")

    def eff(t1: np.ndarray, tn: np.ndarray) -> np.ndarray:
        return (global_batch_n / tn) / (n * global_batch_1 / t1)

    rng = np.random.default_rng(seed)
    m1 = np.median(rng.choice(a, (resamples, a.size)), axis=1)
    mn = np.median(rng.choice(b, (resamples, b.size)), axis=1)
    lo, hi = np.percentile(eff(m1, mn), [2.5, 97.5])
    return float(eff(np.median(a), np.median(b))), float(lo), float(hi)


def scaling_configs(world_size: int, *, links: Sequence[SimulatedLink | None] = (None,),
                    per_rank_batch: int = 32, global_batch: int = 64, steps: int = 6,
                    warmup: int = 2, compute_s_per_sample: float | None = None) -> list[dict]:
    """The configs :func:`perflab.analysis.scaling.scaling_rank` runs at one world size: for
    each mode (weak: ``per_rank_batch`` per rank; strong: ``global_batch // world_size``)
    and each link. Each config names its ``ranks`` (= ``world_size``), so a launch of
    more ranks can run it on its first ``world_size`` ranks: world size 1 and 2 in one
    2-rank launch (``scaling_configs(1, ...) + scaling_configs(2, ...)``).
    ``compute_s_per_sample`` (seconds per sample, or None for real compute) selects
    simulated compute (:func:`scaling_rank`).

    Raises:
        ValueError: ``global_batch`` not divisible by ``world_size``, batches < 1,
            steps < 2 / warmup < 0, or a ``compute_s_per_sample`` that is not > 0.
    """
    if world_size < 1 or global_batch % world_size or per_rank_batch < 1:
        raise ValueError(f"global_batch={global_batch} must be divisible by world_size="
                         f"{world_size} (strong scaling splits it evenly), and "
                         f"per_rank_batch={per_rank_batch} >= 1")
    if steps < 2 or warmup < 0:
        raise ValueError(f"steps must be >= 2 and warmup >= 0, got {steps}, {warmup}")
    _check_compute(compute_s_per_sample)
    batches = {"weak": per_rank_batch, "strong": global_batch // world_size}
    return [{"mode": mode, "batch": batches[mode], "steps": steps, "warmup": warmup,
             "link": lk, "ranks": world_size, "compute_s_per_sample": compute_s_per_sample}
            for mode in SCALING_MODES for lk in links]


def _check_compute(compute_s_per_sample: Any) -> None:
    if compute_s_per_sample is not None and (
            not isinstance(compute_s_per_sample, (int, float))
            or isinstance(compute_s_per_sample, bool) or not compute_s_per_sample > 0):
        raise ValueError("compute_s_per_sample must be None (real compute) or seconds per "
                         f"sample > 0 (simulated compute), got {compute_s_per_sample!r}")


def scaling_table(launches: Sequence[Sequence[Sequence[dict]]]) -> pd.DataFrame:
    """Weak and strong scaling from the results of one launch per world size.

    Args:
        launches: per launch, ``launch_fn(scaling_rank, ...)``'s result (per rank, the
            list of per-config dicts); one launch must have world_size 1.

    Returns:
        One row per (mode, link, world_size): ``mode, link, world_size, cores ("...,
        simulated compute" where compute was slept, " (oversubscribed)" where ranks
        outnumber cores, whatever is simulated), oversubscribed (bool), compute
        ("measured" or "simulated"), global_batch, step_ms (median over steps of the
        slowest rank's step), samples_per_s, efficiency, ci_low, ci_high`` (world_size 1:
        efficiency 1).

    Raises:
        ValueError: no world_size-1 run of a (mode, link) that a larger run has.
    """
    runs: dict[tuple[str, str, int], tuple[int, list[float], bool]] = {}
    for per_rank in launches:
        for i, cfg in enumerate(per_rank[0]):
            w = cfg["world_size"]  # the ranks that trained: the first w of the launch
            step = list(np.max([per_rank[r][i]["step_s"] for r in range(w)], axis=0))
            runs[cfg["mode"], cfg["link"], w] = (
                cfg["batch"] * w, step, cfg.get("compute_s_per_sample") is not None)
    rows = []
    for (mode, link, w), (gb, step, sim) in sorted(runs.items(), key=lambda kv: (
            SCALING_MODES.index(kv[0][0]), kv[0][1], kv[0][2])):
        if (mode, link, 1) not in runs:
            raise ValueError(f"no world_size 1 run for mode={mode!r}, link={link!r}: "
                             "launch world_size 1 too (the baseline)")
        gb1, step1, _ = runs[mode, link, 1]
        e, lo, hi = (1.0, 1.0, 1.0) if w == 1 else scaling_efficiency(step1, step, w, gb1, gb)
        med = float(np.median(step))
        rows.append({"mode": mode, "link": link, "world_size": w,
                     "cores": core_label(w, simulated_compute=sim),
                     "oversubscribed": w > _cores(),   # whatever is simulated
                     "compute": "simulated" if sim else "measured", "global_batch": gb,
                     "step_ms": med * 1e3, "samples_per_s": gb / med, "efficiency": e,
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def scaling_curve(world_sizes: Sequence[int] = (1, 2, 4), *,
                  links: Sequence[SimulatedLink | None] = (None,),
                  sizes: Sequence[int] = (256, 512, 512, 10), per_rank_batch: int = 32,
                  global_batch: int = 64, steps: int = 6, warmup: int = 2,
                  compute_s_per_sample: float | None = None,
                  timeout_s: float = 300) -> pd.DataFrame:
    """Measure weak and strong scaling: one launch per world size (every link and both
    modes inside it) of :func:`perflab.analysis.scaling.scaling_rank`, then
    :func:`scaling_table`.

    Args:
        world_sizes: ranks per launch; must include 1 (the baseline).
        links: simulated links under DDP's allreduce (None = the real gloo loopback).
        sizes: the MLP (:func:`perflab.models.mlp`).
        per_rank_batch, global_batch, steps, warmup: as :func:`scaling_configs`.
        compute_s_per_sample: None (real compute) or simulated compute, seconds per
            sample (:func:`scaling_rank`).
        timeout_s: per launch.

    Raises:
        ValueError: as :func:`scaling_configs`, or no world size 1.
    """
    ws = [int(w) for w in world_sizes]
    if 1 not in ws:
        raise ValueError(f"world_sizes must include 1 (the baseline), got {ws}")
    configs = {w: scaling_configs(w, links=links, per_rank_batch=per_rank_batch,
                                  global_batch=global_batch, steps=steps, warmup=warmup,
                                  compute_s_per_sample=compute_s_per_sample)
               for w in ws}
    # world sizes up to the cores share one launch (process start-up costs seconds)
    small = [w for w in ws if w <= max(2, _cores())]
    launches = [launch_fn(scaling_rank, max(small), device="cpu", timeout_s=timeout_s,
                          args=([c for w in small for c in configs[w]], list(sizes)))]
    launches += [launch_fn(scaling_rank, w, args=(configs[w], list(sizes)), device="cpu",
                           timeout_s=timeout_s) for w in ws if w not in small]
    return scaling_table(launches)


def scaling_rank(configs: Sequence[dict[str, Any]], sizes: Sequence[int], seed: int = 0
                 ) -> list[dict[str, Any]]:
    """Rank body: DDP + SGD step times for each config: a dict with ``batch`` (per rank),
    ``steps``, ``warmup``, ``link`` (a :class:`~perflab.core.simulated.SimulatedLink` or None),
    optionally ``ranks`` (train on the first ``ranks`` ranks only, in their own process
    group, while the others wait: a smaller world size without another launch),
    optionally ``compute_s_per_sample`` and any labels (``mode``...), which are passed
    through.

    ``compute_s_per_sample`` (seconds per sample; None or absent: real compute) selects
    **simulated compute**: each step the rank sleeps ``compute_s_per_sample * batch``
    seconds, the modelled forward+backward of its batch, then runs forward+backward of
    the batch's first sample only, so DDP all-reduces real gradients of the real sizes
    (through the link, when one is given) while the cores stay free for compute; ranks
    that outnumber the cores still share them for the all-reduces and the optimizer step
    (real), so such runs are labelled oversubscribed.

    Returns:
        Per config, the config's labels (``link`` as its name) with ``world_size`` (the
        ranks that trained) and ``step_s``: this rank's step times in seconds after
        ``warmup`` (timed with :class:`perflab.core.timing.PhaseTimer`), None on a rank that
        only waited.

    Raises:
        ValueError: a link that is not a SimulatedLink, ``ranks`` out of range, or a
            ``compute_s_per_sample`` that is not > 0.
    """
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perflab.distributed.link_hook import register_link_hook

    rank, world, out = dist.get_rank(), dist.get_world_size(), []
    for cfg in configs:
        link, ranks = cfg.get("link"), cfg.get("ranks", world)
        if link is not None and not isinstance(link, SimulatedLink):
            raise ValueError(f"link must be a SimulatedLink or None, got {link!r}")
        if not 1 <= ranks <= world:
            raise ValueError(f"ranks must be in 1..{world} (the launch's world_size), got {ranks}")
        sim_s = cfg.get("compute_s_per_sample")
        _check_compute(sim_s)
        group = dist.new_group(list(range(ranks))) if ranks < world else None  # all ranks call
        step_s = None
        if rank < ranks:
            ddp = DDP(mlp(sizes, seed), process_group=group)
            state = None if link is None else register_link_hook(ddp, link, process_group=group)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            timer = PhaseTimer("cpu", annotate=False)
            for x, y in mlp_batches(sizes, cfg["batch"], cfg["warmup"] + cfg["steps"], rank, seed):
                if state is not None:
                    state.reset()
                with timer.step():
                    if sim_s is None:
                        torch.nn.functional.cross_entropy(ddp(x), y).backward()
                    else:  # the batch's modelled compute, slept; one sample's real gradients
                        time.sleep(sim_s * cfg["batch"])
                        torch.nn.functional.cross_entropy(ddp(x[:1]), y[:1]).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            step_s = list(timer.measurements(warmup=cfg["warmup"])["step"].times_s)
        out.append({**{k: v for k, v in cfg.items() if k != "ranks"},
                    "link": link.name if link else "real loopback", "world_size": ranks,
                    "step_s": step_s})
        dist.barrier()
    return out
