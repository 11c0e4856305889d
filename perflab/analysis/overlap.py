"""Overlap efficiency of DDP: how much of the gradient allreduce hides behind backward.

From one rank's :class:`~perflab.core.result.RunResult` of a data-parallel run (medians):

* compute = the "compute" phase (the same step under ``no_sync``: no communication),
* comm = the "comm" phase (the step's buckets allreduced alone, in order),
* step = the "step" phase (DDP: forward, backward with allreduces in flight, optimizer),
* forward, optimizer = the DDP step's "forward" and "optimizer" phases;
* comm_cpu = the CPU time (all of the rank's threads) of the comm phase: the REAL
  allreduce's work (gloo copies and reduces on the same cores as compute);
* last bucket = the time of the bucket DDP sends last (the first layers' gradients,
  ready only when backward ends): on a simulated link its modelled time, on the real
  backend comm x its share of the bytes;
* exposed communication = step - compute (the allreduce time the step did not hide);
* overlap efficiency = (compute + comm - step) / (compute + comm - ideal): 0 when the
  step is compute + comm (nothing hidden), 1 when it reaches the ideal, against two
  ideals: the textbook ``max(compute, comm)`` and the bound DDP can reach,
  ``max(compute, forward + comm)``: allreduces start only when backward produces
  gradients, so the forward pass never overlaps them (Li et al. 2020, "PyTorch
  Distributed: Experiences on Accelerating Data Parallel Training", VLDB, section 3.2.3);
  and a third, **this machine's bound** (:func:`machine_bound_s`), which adds what cannot
  overlap on a machine whose allreduce runs on the compute cores: the real allreduce's CPU
  time and the last bucket, which can only start once backward ends, before the optimizer.

The worker (:mod:`perflab.distributed.worker`) interleaves the compute-only, DDP and
comm-alone steps (one of each per measured step), so a burst of load from other programs
hits all three alike and the bound's terms and the step come from the same moments.

Every table and plot of a run on a simulated link names the link (its ``describe()``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab.core.config import RunConfig
from perflab.distributed.ddp import check_compression
from perflab.viz.figures import new_ax
from perflab.distributed.link_hook import COMPRESSIONS, hook_compression
from perflab.core.simulated import LinkModel, SimulatedLink
from perflab.core.result import RunResult
from perflab.experiment import run

__all__ = ["overlap_efficiency", "ideal_step_s", "machine_bound_s", "last_bucket_s",
           "overlap_metrics", "overlap_table",
           "plot_overlap", "run_ddp", "IDEALS"]

#: The ideals an overlap efficiency is measured against: the textbook max(compute, comm),
#: DDP's bound max(compute, forward + comm), and this machine's bound (machine_bound_s).
IDEALS = ("textbook", "ddp", "machine")


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


def machine_bound_s(compute_s: float, comm_s: float, forward_s: float, optimizer_s: float,
                    comm_cpu_s: float, last_bucket_s: float) -> float:
    """The step time DDP can reach on THIS machine, seconds::

        max(compute + comm_cpu + last_bucket, forward + comm + optimizer)

    The first term: backward cannot end before its compute, plus the CPU the real
    allreduce takes from the same cores (on a CPU machine gloo reduces on the cores that
    compute; with spare cores or a GPU, ``comm_cpu_s`` is ~0), plus the last bucket, which
    is ready only when backward ends and must finish before the optimizer runs. The second:
    no allreduce starts before backward produces gradients (so not during forward), the
    link sends the buckets one after another, and the optimizer waits for the last. It is
    DDP's bound (:func:`ideal_step_s` with ``forward_s``; Li et al. 2020, VLDB, section
    3.2.3) with those terms added, so it is >= it. It is an estimate, not a hard floor:
    the allreduce's CPU time counts in full, but part of it can run while this rank
    waits for the other (an efficiency a little above 1 against it means that).

    Args:
        compute_s: the compute-only step (no_sync), forward + backward + optimizer.
        comm_s: the buckets allreduced alone (through the link, if any).
        forward_s, optimizer_s: the DDP step's forward and optimizer phases.
        comm_cpu_s: CPU seconds of the real allreduce (all the rank's threads).
        last_bucket_s: the time of the bucket sent last (:func:`last_bucket_s`).

    Raises:
        ValueError: a negative or non-numeric time (the message names it).
    """
    terms = {"compute_s": compute_s, "comm_s": comm_s, "forward_s": forward_s,
             "optimizer_s": optimizer_s, "comm_cpu_s": comm_cpu_s,
             "last_bucket_s": last_bucket_s}
    for name, v in terms.items():
        if not isinstance(v, (int, float, np.floating)) or not v >= 0:
            raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
    return max(compute_s + comm_cpu_s + last_bucket_s, forward_s + comm_s + optimizer_s)


def last_bucket_s(buckets: Sequence[dict[str, int]], comm_s: float, *,
                  link: SimulatedLink | None = None, world_size: int = 2,
                  compression: str = "none") -> float:
    """The time the bucket DDP sends LAST takes on the wire, seconds.

    DDP sends its buckets in index order (:func:`perflab.distributed.ddp.ddp_buckets`);
    the last holds the first layers' gradients, ready only when backward ends. With a
    ``link``: its modelled time, 2(p-1) alpha + wire bytes / beta (a ring,
    :meth:`perflab.core.simulated.LinkModel.duration_s`), of the bytes sent (halved by fp16/bf16
    compression). Without one: ``comm_s`` times the bucket's share of the bytes (the real
    backend's time per byte, measured; its alpha is not separated out).

    Args:
        buckets: ``[{"index", "nbytes"}, ...]`` (fp32 bytes), as ``ddp_buckets`` returns.
        comm_s: the measured seconds of all buckets allreduced alone.
        link, world_size, compression: the run's link, ranks and comm-hook compression.

    Raises:
        ValueError: no buckets, or an unknown compression.
    """
    if not buckets:
        raise ValueError("buckets is empty: last_bucket_s needs DDP's buckets "
                         "(perflab.distributed.ddp.ddp_buckets after the first step)")
    check_compression(compression)
    last = max(buckets, key=lambda b: b["index"])["nbytes"]
    if link is not None:
        sent = last // 2 if COMPRESSIONS[compression] is not None else last
        return LinkModel(link, world_size=world_size).duration_s(sent)
    return comm_s * last / sum(b["nbytes"] for b in buckets)


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
    """Compute, comm, step, forward, exposed comm, the three ideals (:data:`IDEALS`) and
    the three efficiencies of one rank's run (medians, seconds), with the buckets DDP built
    and this machine's bound's terms (optimizer, comm_cpu, last_bucket; NaN for a result
    recorded before the worker measured "comm_cpu").

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
    opt = result.phases["optimizer"].median if "optimizer" in result.phases else math.nan
    cpu = result.phases["comm_cpu"].median if "comm_cpu" in result.phases else math.nan
    last = (last_bucket_s(buckets, comm, link=link, world_size=result.config.world_size,
                          compression=hook_compression(result.config.comm_hook))
            if buckets else math.nan)
    terms = (compute, comm, fwd, opt, cpu, last)
    ideal_m = math.nan if any(math.isnan(t) for t in terms) else machine_bound_s(*terms)
    return {
        "label": result.label, "rank": result.rank, "bucket_cap_mb": result.config.bucket_cap_mb,
        "link": link.describe() if link else "real backend (no simulated link)",
        "buckets": len(buckets),
        "bucket_mb": [round(b["nbytes"] / 2 ** 20, 2) for b in buckets],
        "forward_s": fwd, "compute_s": compute, "comm_s": comm, "step_s": step,
        "optimizer_s": opt, "comm_cpu_s": cpu, "last_bucket_s": last,
        "exposed_comm_s": step - compute,
        "ideal_textbook_s": ideal_tb, "ideal_ddp_s": ideal_ddp, "ideal_machine_s": ideal_m,
        "overlap_eff_textbook": _eff(compute, comm, step, ideal_tb),
        "overlap_eff_ddp": _eff(compute, comm, step, ideal_ddp),
        "overlap_eff_machine": (math.nan if math.isnan(ideal_m)
                                else _eff(compute, comm, step, ideal_m)),
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
    if "ideal_machine_ms" in g and g["ideal_machine_ms"].notna().any():
        ax.plot(pos + w, g["ideal_machine_ms"], "b_", markersize=18, mew=2,
                label="this machine's bound (+ allreduce CPU, last bucket, optimizer)")
    ax.set_xticks(pos, [str(v) for v in g.index])
    ax.set_xlabel(x)
    ax.set_ylabel("ms per step (median)")
    ax2 = ax.twinx()
    ax2.plot(pos, g["overlap_eff_ddp"], "ko-", label="overlap eff. vs DDP bound")
    ax2.plot(pos, g["overlap_eff_textbook"], "rs--", label="overlap eff. vs textbook")
    if "overlap_eff_machine" in g and g["overlap_eff_machine"].notna().any():
        ax2.plot(pos, g["overlap_eff_machine"], "b^:", label="overlap eff. vs this machine")
    ax2.set_ylabel("overlap efficiency")
    ax2.axhline(0, color="grey", lw=0.5)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    ax.set_title(title or table.attrs.get("title", ""), fontsize=9)
    return ax.figure


def run_ddp(config: RunConfig, *, progress: bool = False, **run_kwargs: Any) -> RunResult:
    """Run ``config`` on ``config.world_size`` ranks through :func:`perflab.experiment.run`
    and return rank 0's RunResult (the ``run_fn`` of the DDP panels: one process start-up
    per click).

    Raises:
        ValueError: ``config.world_size < 2``; anything :func:`perflab.experiment.run`
            refuses.
    """
    if config.world_size < 2:
        raise ValueError(f"run_ddp needs world_size >= 2, got {config.world_size}; set "
                         "RunConfig(world_size=2, ...)")
    return run(config, progress=progress, **run_kwargs)
