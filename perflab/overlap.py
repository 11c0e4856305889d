"""Overlap efficiency of DDP: how much of the gradient allreduce hides behind backward.

From one rank's :class:`~perflab.result.RunResult` of a data-parallel run (medians):

* compute = the "compute" phase (the same step under ``no_sync``: no communication),
* comm = the "comm" phase (the step's buckets allreduced alone, in order),
* step = the "step" phase (DDP: forward, backward with allreduces in flight, optimizer),
* forward = the "forward" phase;
* exposed communication = step - compute (the allreduce time the step did not hide);
* overlap efficiency = (compute + comm - step) / (compute + comm - ideal): 0 when the
  step is compute + comm (nothing hidden), 1 when it reaches the ideal, against two
  ideals: the textbook ``max(compute, comm)`` and the bound DDP can reach,
  ``max(compute, forward + comm)``: allreduces start only when backward produces
  gradients, so the forward pass never overlaps them (Li et al. 2020, "PyTorch
  Distributed: Experiences on Accelerating Data Parallel Training", VLDB, section 3.2.3).

Every table and plot of a run on a simulated link names the link (its ``describe()``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab.config import RunConfig
from perflab.distributed import launch
from perflab.figures import new_ax
from perflab.result import RunResult

__all__ = ["overlap_efficiency", "ideal_step_s", "overlap_metrics", "overlap_table",
           "plot_overlap", "run_ddp", "IDEALS"]

#: The two ideals an overlap efficiency is measured against.
IDEALS = ("textbook", "ddp")


def ideal_step_s(compute_s: float, comm_s: float, forward_s: float | None = None) -> float:
    """The ideal step time: ``max(compute, comm)`` (textbook, ``forward_s=None``) or
    ``max(compute, forward + comm)`` (the bound DDP can reach). Seconds.

    Raises:
        ValueError: a negative time.
    """
    for name, v in (("compute_s", compute_s), ("comm_s", comm_s),
                    ("forward_s", 0.0 if forward_s is None else forward_s)):
        if not isinstance(v, (int, float, np.floating)) or not v >= 0:
            raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
    return max(compute_s, comm_s if forward_s is None else forward_s + comm_s)


def overlap_efficiency(compute_s: float, comm_s: float, step_s: float,
                       ideal_s: float) -> float:
    """(compute + comm - step) / (compute + comm - ideal): the hidden share of what
    overlap could hide. Dimensionless; 1 = the ideal reached, 0 = no overlap, < 0 =
    the step is slower than compute and comm back to back (they contend for the cores).

    Args:
        compute_s, comm_s, step_s: median seconds (each > 0).
        ideal_s: from :func:`ideal_step_s`.

    Raises:
        ValueError: a time <= 0, or ``ideal_s >= compute_s + comm_s`` (nothing could be
            hidden, so the ratio is undefined).
    """
    for name, v in (("compute_s", compute_s), ("comm_s", comm_s), ("step_s", step_s),
                    ("ideal_s", ideal_s)):
        if not isinstance(v, (int, float, np.floating)) or not v > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
    room = compute_s + comm_s - ideal_s
    if room <= 0:
        raise ValueError(f"ideal_s={ideal_s:g} s >= compute_s + comm_s = "
                         f"{compute_s + comm_s:g} s: no overlap is possible, so overlap "
                         "efficiency is undefined")
    return (compute_s + comm_s - step_s) / room


def _eff(compute: float, comm: float, step: float, ideal: float) -> float:
    try:
        return overlap_efficiency(compute, comm, step, ideal)
    except ValueError:
        return math.nan


def overlap_metrics(result: RunResult) -> dict[str, Any]:
    """Compute, comm, step, forward, exposed comm, both ideals and both efficiencies of
    one rank's run (medians, seconds), with the buckets DDP built.

    Raises:
        ValueError: the result lacks a "compute", "comm", "step" or "forward" phase
            (it did not come from :func:`perflab.distributed.launch`).
    """
    missing = [p for p in ("compute", "comm", "step", "forward") if p not in result.phases]
    if missing:
        raise ValueError(f"result {result.label!r} has no {missing} phase(s); overlap needs "
                         "a data-parallel run from perflab.distributed.launch(config)")
    compute, comm, step, fwd = (result.phases[p].median
                                for p in ("compute", "comm", "step", "forward"))
    ideal_tb, ideal_ddp = ideal_step_s(compute, comm), ideal_step_s(compute, comm, fwd)
    buckets = result.extra.get("buckets", [])
    link = result.config.link
    return {
        "label": result.label, "rank": result.rank, "bucket_cap_mb": result.config.bucket_cap_mb,
        "link": link.describe() if link else "real backend (no simulated link)",
        "buckets": len(buckets),
        "bucket_mb": [round(b["nbytes"] / 2 ** 20, 2) for b in buckets],
        "forward_s": fwd, "compute_s": compute, "comm_s": comm, "step_s": step,
        "exposed_comm_s": step - compute,
        "ideal_textbook_s": ideal_tb, "ideal_ddp_s": ideal_ddp,
        "overlap_eff_textbook": _eff(compute, comm, step, ideal_tb),
        "overlap_eff_ddp": _eff(compute, comm, step, ideal_ddp),
    }


def overlap_table(runs: Sequence[RunResult | Sequence[RunResult]]) -> pd.DataFrame:
    """One row per rank per run: :func:`overlap_metrics` with times in ms.

    ``runs``: RunResults, or lists of them (one list per :func:`launch`, one per rank).
    The frame's ``attrs["title"]`` names the simulated link(s).

    Raises:
        ValueError: no runs, or a result without the overlap phases.
    """
    flat = [r for run in runs for r in (run if isinstance(run, (list, tuple)) else [run])]
    if not flat:
        raise ValueError("overlap_table needs at least one RunResult (from "
                         "perflab.distributed.launch)")
    rows = []
    for r in flat:
        m = overlap_metrics(r)
        rows.append({k: (v * 1e3 if k.endswith("_s") else v) for k, v in m.items()})
    df = pd.DataFrame(rows).rename(columns=lambda c: c[:-2] + "_ms" if c.endswith("_s") else c)
    df.attrs["title"] = "; ".join(dict.fromkeys(df["link"]))
    return df


def plot_overlap(table: pd.DataFrame, x: str = "bucket_cap_mb", ax: Any = None,
                 title: str | None = None):
    """Compute, comm and step (ms, medians over ranks) per ``x``, with both ideals,
    and both overlap efficiencies on a second axis. Title: the link(s) simulated.

    Raises:
        ValueError: ``x`` is not a column of ``table``.
    """
    if x not in table.columns:
        raise ValueError(f"x={x!r} is not a column of the table; use one of "
                         f"{list(table.columns)}")
    g = table.groupby(x, sort=False).median(numeric_only=True)
    ax = new_ax(ax, (7.0, 4.0))
    pos = np.arange(len(g))
    w = 0.25
    ax.bar(pos - w, g["compute_ms"], w, label="compute (no_sync)", color="#0072B2")
    ax.bar(pos, g["comm_ms"], w, label="comm (allreduce alone)", color="#E69F00")
    ax.bar(pos + w, g["step_ms"], w, label="DDP step", color="#999999")
    ax.plot(pos + w, g["ideal_ddp_ms"], "k_", markersize=18, mew=2,
            label="DDP bound max(compute, fwd + comm)")
    ax.plot(pos + w, g["ideal_textbook_ms"], "r_", markersize=18, mew=2,
            label="textbook max(compute, comm)")
    ax.set_xticks(pos, [str(v) for v in g.index])
    ax.set_xlabel(x)
    ax.set_ylabel("ms per step (median)")
    ax2 = ax.twinx()
    ax2.plot(pos, g["overlap_eff_ddp"], "ko-", label="overlap eff. vs DDP bound")
    ax2.plot(pos, g["overlap_eff_textbook"], "rs--", label="overlap eff. vs textbook")
    ax2.set_ylabel("overlap efficiency")
    ax2.axhline(0, color="grey", lw=0.5)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    ax.set_title(title or table.attrs.get("title", ""), fontsize=9)
    return ax.figure


def run_ddp(config: RunConfig, *, progress: bool = False, **launch_kwargs: Any) -> RunResult:
    """Launch ``config`` on ``config.world_size`` ranks and return rank 0's RunResult
    (the ``run_fn`` of this module's panels: one process start-up per click).

    Raises:
        ValueError: ``config.world_size < 2``.
    """
    if config.world_size < 2:
        raise ValueError(f"run_ddp needs world_size >= 2, got {config.world_size}; set "
                         "RunConfig(world_size=2, ...)")
    return launch(config, progress=progress, **launch_kwargs)[0]
