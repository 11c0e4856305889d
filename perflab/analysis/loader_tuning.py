"""DataLoader settings chosen by measurement: efficiency, sweeps and a tuner.

The input pipeline's **efficiency** is its throughput divided by the compute-only
bound (the same config with ``compute_only=True``: one batch kept on the device; see
:func:`perflab.data.prefetch.pipeline_efficiency`).
:func:`sweep_loader` measures a grid of ``num_workers`` / ``pin_memory`` /
``persistent_workers`` / ``prefetch_factor`` with :func:`perflab.experiment.run` and
tabulates throughput (95 % CI), efficiency, data-wait share and the loader's start-up
costs; :func:`tune_loader` picks settings by measuring within a time budget, not by a
rule of thumb ("num_workers = 4 x GPUs" is wrong on a 2-core laptop and on a slow disk).

Clocks are read through :mod:`perflab.core.timing` only. This module imports
:mod:`perflab.data.loader` and :mod:`perflab.experiment` inside functions (``perflab.data.loader``
re-exports the sweep and the tuner).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from perflab.core.config import RunConfig
from perflab.viz.figures import InlineFigure
from perflab.data.prefetch import (
    FirstBatch, LOADER_FIELDS, pipeline_efficiency, time_first_batch,
)
from perflab.core.measurement import compare
from perflab.core.result import RunResult
from perflab.core.timing import Stopwatch
from perflab.experiment import run

__all__ = ["default_worker_counts", "LoaderSweep", "sweep_loader", "LoaderTuning",
           "tune_loader", "plot_sweep"]



def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def default_worker_counts(cores: int | None = None) -> list[int]:
    """Worker counts worth measuring on this machine: 0..cores when cores <= 4, else
    0, 1 and powers of two up to ``cores`` (plus ``cores`` itself)."""
    cores = cores or _cores()
    if cores <= 4:
        return list(range(cores + 1))
    return sorted({0, 1, cores} | {2 ** k for k in range(1, int(math.log2(cores)) + 1)})


def _row(result: RunResult, bound: RunResult | None, first: FirstBatch | None) -> dict:
    lo, hi = result.samples_per_s_ci95
    row: dict[str, Any] = {"label": result.label,
                           **{k: getattr(result.config, k) for k in LOADER_FIELDS},
                           "samples_per_s": result.samples_per_s,
                           "samples_per_s_ci_low": lo, "samples_per_s_ci_high": hi,
                           "step_ms": result.step.median * 1e3,
                           "data_wait_pct": 100 * result.data_wait_share}
    if bound is not None:
        e = pipeline_efficiency(result, bound)
        row.update(efficiency_pct=100 * e.efficiency, efficiency_ci_low_pct=100 * e.ci95[0],
                   efficiency_ci_high_pct=100 * e.ci95[1])
    if first is not None:
        row.update(worker_startup_s=first.worker_startup_s,
                   first_batch_s=first.first_batch_s)
    row["noisy"] = result.step.noisy
    return row


def _grid(config: RunConfig, num_workers: Sequence[int] | None,
          pin_memory: Sequence[bool] | None, persistent_workers: Sequence[bool] | None,
          prefetch_factor: Sequence[int | None] | None) -> list[RunConfig]:
    """Distinct valid configs of the grid: with 0 workers, persistent_workers and
    prefetch_factor do not apply and collapse to False / None."""
    axes = [list(num_workers) if num_workers is not None else default_worker_counts(),
            list(pin_memory) if pin_memory is not None else [config.pin_memory],
            list(persistent_workers) if persistent_workers is not None
            else [config.persistent_workers],
            list(prefetch_factor) if prefetch_factor is not None else [config.prefetch_factor]]
    for name, values in zip(LOADER_FIELDS, axes):
        if not values:
            raise ValueError(f"{name}: empty list; give at least one value")
    seen, out = set(), []
    for w, pin, persist, pf in itertools.product(*axes):
        key = (w, pin, persist and w > 0, pf if w > 0 else None)
        if key not in seen:
            seen.add(key)
            out.append(config.replace(label="", num_workers=key[0], pin_memory=key[1],
                                      persistent_workers=key[2], prefetch_factor=key[3]))
    return out


@dataclass(frozen=True)
class LoaderSweep:
    """What :func:`sweep_loader` measured.

    Attributes:
        table: one row per setting (see :func:`sweep_loader`).
        results: the RunResult of each row, in order.
        bound: the compute-only bound they are compared with.
    """

    table: pd.DataFrame
    results: tuple[RunResult, ...]
    bound: RunResult

    @property
    def best(self) -> pd.Series:
        """The row with the highest throughput."""
        return self.table.loc[self.table["samples_per_s"].idxmax()]

    def plot(self):
        """Throughput and data-wait share against num_workers (see :func:`plot_sweep`)."""
        return plot_sweep(self)

    def _repr_html_(self) -> str:
        return self.table.round(3).to_html(index=False)


def sweep_loader(config: RunConfig, *, num_workers: Sequence[int] | None = None,
                 pin_memory: Sequence[bool] | None = None,
                 persistent_workers: Sequence[bool] | None = None,
                 prefetch_factor: Sequence[int | None] | None = None,
                 bound: RunResult | None = None, steps: int | None = None,
                 warmup_steps: int | None = None, first_batch: bool = True,
                 progress: bool = True, save: bool = True) -> LoaderSweep:
    """Measure every combination of the given DataLoader settings on ``config``.

    Each combination is one :func:`perflab.experiment.run` (warm-up dropped). An axis left
    as None keeps ``config``'s value; ``num_workers`` defaults to
    :func:`default_worker_counts` (0..cores). With 0 workers, ``persistent_workers``
    and ``prefetch_factor`` do not apply, so such rows are measured once.

    Args:
        config: the pipeline to tune (its loader fields are overridden per row).
        bound: the compute-only bound; None -> measured first with
            ``config.replace(compute_only=True)``.
        steps, warmup_steps: per row; None -> ``config``'s.
        first_batch: also time worker start-up and time to first batch
            (:func:`time_first_batch`, one extra loader per row).
        progress: tqdm bars while running.
        save: save every sweep point (and the bound) the moment it is measured, as
            :func:`perflab.run` does (False: keep them in memory only).

    Returns:
        A :class:`LoaderSweep` whose ``table`` has columns label, num_workers,
        pin_memory, persistent_workers, prefetch_factor, samples_per_s,
        samples_per_s_ci_low/high (95 % CI), step_ms (median), data_wait_pct,
        efficiency_pct with efficiency_ci_low/high_pct (vs the bound), worker_startup_s
        and first_batch_s (with ``first_batch``), noisy.

    Raises:
        ValueError: an empty axis, an invalid combination (e.g. pin_memory=True
            without CUDA: RunConfig's message), or a bound that does not match.
    """
    sized = {k: v for k, v in (("steps", steps), ("warmup_steps", warmup_steps)) if v is not None}
    configs = [c.replace(**sized) for c in _grid(config, num_workers, pin_memory,
                                                 persistent_workers, prefetch_factor)]
    if bound is None:
        bound = run(config.replace(label="", compute_only=True, **sized), progress=progress,
                    save=save)
    results, rows = [], []
    for c in configs:
        r = run(c, progress=progress, save=save)
        results.append(r)
        rows.append(_row(r, bound, time_first_batch(c) if first_batch else None))
    return LoaderSweep(table=pd.DataFrame(rows), results=tuple(results), bound=bound)


@dataclass(frozen=True)
class LoaderTuning:
    """What :func:`tune_loader` chose and measured.

    Attributes:
        config: the input config with the chosen loader settings.
        settings: the chosen ``num_workers``, ``pin_memory``, ``persistent_workers``,
            ``prefetch_factor``.
        table: one row per measured candidate, in the order measured.
        reason: why this row won, with the test's p-value.
        elapsed_s: seconds spent measuring.
    """

    config: RunConfig
    settings: dict[str, Any]
    table: pd.DataFrame
    reason: str
    elapsed_s: float

    def __repr__(self) -> str:
        chosen = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return (f"LoaderTuning: {chosen}\n  {self.reason}\n  measured {len(self.table)} "
                f"settings in {self.elapsed_s:.1f} s")


def tune_loader(config: RunConfig, *, budget_s: float = 60.0, steps: int = 8,
                warmup_steps: int = 2, alpha: float = 0.05,
                progress: bool = False, save: bool = True) -> LoaderTuning:
    """Pick DataLoader settings for ``config`` by measuring them within ``budget_s``.

    Candidates, measured in order until the budget would be exceeded (a candidate is
    started only if the mean cost so far still fits): ``num_workers`` over
    :func:`default_worker_counts` with persistent workers (and ``pin_memory`` on
    CUDA); if the data-wait share at the most workers is still >= 10 % (waiting, not
    computing: slow storage), 2x and 4x the cores; then ``prefetch_factor=4`` for the
    fastest. The winner is the *simplest* candidate (fewest workers, default prefetch)
    whose throughput is not significantly lower than the fastest one's (two-sided
    Mann-Whitney at ``alpha``): extra workers that do not measurably help cost memory
    and start-up time.

    Every candidate is saved the moment it is measured (``save=False``: kept in memory).

    Raises:
        ValueError: ``budget_s`` <= 0, ``steps`` < 2, or what ``run`` raises.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")
    if steps < 2:
        raise ValueError(f"steps must be >= 2, got {steps}")
    pin = config.resolved_device().type == "cuda"
    base = config.replace(label="", steps=steps, warmup_steps=warmup_steps)
    clock = Stopwatch().start()
    results: list[RunResult] = []

    def fits() -> bool:
        if not results:
            return True
        return clock.elapsed_s + clock.elapsed_s / len(results) <= budget_s

    def measure(c: RunConfig) -> None:
        results.append(run(c, progress=progress, save=save))

    def with_workers(w: int, pf: int | None = None) -> RunConfig:
        return base.replace(num_workers=w, persistent_workers=w > 0, pin_memory=pin,
                            prefetch_factor=pf if w > 0 else None)

    counts = default_worker_counts()
    for w in counts:
        if fits():
            measure(with_workers(w))
    if results and results[-1].data_wait_share >= 0.10:
        for w in (2 * counts[-1], 4 * counts[-1]):
            if fits():
                measure(with_workers(w))
    fastest = max(results, key=lambda r: r.samples_per_s)
    if fastest.config.num_workers > 0 and fits():
        measure(with_workers(fastest.config.num_workers, 4))
        fastest = max(results, key=lambda r: r.samples_per_s)
    ranked = sorted(results, key=lambda r: (r.config.num_workers,
                                            r.config.prefetch_factor or 0))
    for r in ranked:
        c = compare(fastest.step, r.step, alpha=alpha)
        if r is fastest or not c.significant or c.speedup >= 1:
            chosen, p = r, c.p_value
            break
    settings = {k: getattr(chosen.config, k) for k in LOADER_FIELDS}
    reason = ("fastest measured" if chosen is fastest else
              f"the simplest setting not significantly slower than the fastest "
              f"({fastest.label!r}, p = {p:.3g})")
    reason += f": {chosen.samples_per_s:,.1f} samples/s"
    tuned = config.replace(**settings)
    table = pd.DataFrame([_row(r, None, None) for r in results])
    table["chosen"] = [r is chosen for r in results]
    return LoaderTuning(config=tuned, settings=settings, table=table, reason=reason,
                        elapsed_s=clock.elapsed_s)


def plot_sweep(sweep: LoaderSweep):
    """Two panels against ``num_workers``: throughput with 95 % CI whiskers (the
    compute-only bound as a dashed line) and data-wait share. One line per combination
    of the other loader settings. Returns a Figure that shows itself in Jupyter."""
    t = sweep.table
    fig = InlineFigure(figsize=(11.0, 4.0), layout="constrained")
    ax_t, ax_d = fig.subplots(1, 2)
    others = [k for k in LOADER_FIELDS[1:] if t[k].nunique(dropna=False) > 1]
    groups = t.groupby(others, dropna=False) if others else [((), t)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v}" for k, v in zip(others, key)) or "throughput"
        g = g.sort_values("num_workers")
        err = [(g["samples_per_s"] - g["samples_per_s_ci_low"]).clip(lower=0),
               (g["samples_per_s_ci_high"] - g["samples_per_s"]).clip(lower=0)]
        err = [e.where(e.map(math.isfinite), 0) for e in err]
        ax_t.errorbar(g["num_workers"], g["samples_per_s"], yerr=err, marker="o",
                      capsize=4, label=name)
        ax_d.plot(g["num_workers"], g["data_wait_pct"], marker="o", label=name)
    ax_t.axhline(sweep.bound.samples_per_s, color="black", linestyle="--",
                 label=f"compute-only bound ({sweep.bound.samples_per_s:,.0f}/s)")
    ax_t.set(xlabel="num_workers", ylabel="samples/s (median step; 95 % CI)",
             title="throughput", ylim=(0, None))
    ax_d.set(xlabel="num_workers", ylabel="data wait (% of mean step)",
             title="time waiting for the next batch", ylim=(0, None))
    for ax in (ax_t, ax_d):
        ax.set_xticks(sorted(t["num_workers"].unique()))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    what = sweep.bound.config.replace(label="", compute_only=False).display_label()
    where = sweep.bound.env.get("device_name") or sweep.bound.env.get("device")
    fig.suptitle(f"DataLoader sweep of {what!r} on {where}")
    return fig
