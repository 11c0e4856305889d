"""Plots of data-parallel runs: the per-rank timeline and throughput loss vs prediction.

Figures are built directly (no pyplot), like :mod:`perflab.viz.plots`, and show themselves in
Jupyter. Colours: compute in the forward-pass blue, waiting in the collective in the
data-wait vermillion of :data:`perflab.viz.figures.PHASE_COLORS`.
"""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from perflab.viz.figures import PHASE_COLORS, InlineFigure
from perflab.core.result import RunResult

__all__ = ["plot_rank_timeline", "plot_loss_vs_prediction"]

_COMPUTE = PHASE_COLORS["forward"]
_WAIT = PHASE_COLORS["data"]


def plot_rank_timeline(results: Sequence[RunResult], title: str | None = None) -> Figure:
    """One row per rank: each step as a compute bar followed by a wait bar (time axis).

    Args:
        results: every rank's RunResult of one straggler run (``extra["per_step"]`` set).

    Raises:
        ValueError: no results, or a result without per-step timings (a run without a
            ``straggler``; use ``Straggler(rank=..., delay_s=0)`` for a baseline).
    """
    results = sorted(results, key=lambda r: r.rank or 0)
    if not results or any(r.extra.get("per_step") is None for r in results):
        raise ValueError("plot_rank_timeline needs every rank's RunResult of a straggler "
                         "run (extra['per_step']); launch with straggler=Straggler(...)")
    fig = InlineFigure(figsize=(9, 0.8 + 0.7 * len(results)), layout="constrained")
    ax = fig.add_subplot()
    for row, r in enumerate(results):
        ps, t = r.extra["per_step"], 0.0
        for c, w, s in zip(ps["compute_s"], ps["wait_s"], ps["step_s"]):
            ax.barh(row, c * 1e3, left=t * 1e3, color=_COMPUTE, edgecolor="white", height=0.6)
            ax.barh(row, w * 1e3, left=(t + c) * 1e3, color=_WAIT, edgecolor="white",
                    height=0.6)
            t += s
    ax.set_yticks(range(len(results)), [f"rank {r.rank}" for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first measured step (ms)")
    handles = [Patch(color=_COMPUTE, label="local compute (incl. injected delay)"),
               Patch(color=_WAIT, label="waiting in the gradient allreduce")]
    ax.legend(handles=handles, loc="upper center", ncol=2, frameon=False,
              bbox_to_anchor=(0.5, -0.35 if len(results) < 3 else -0.2))
    ax.set_title(title or results[0].label, fontsize=10)
    return fig


def plot_loss_vs_prediction(delays_s: Sequence[float], measured: Sequence[Sequence[float]],
                            predicted: Sequence[float], *,
                            ci95: Sequence[Sequence[tuple[float, float]]] | None = None,
                            title: str = "throughput loss: measured on every rank vs "
                                         "predicted") -> Figure:
    """Throughput loss (%) per delay: one marker per rank, the prediction as a line.

    Args:
        delays_s: the injected delays (seconds), one per run.
        measured: per delay, the loss measured on each rank (fractions).
        predicted: per delay, ``delay / (step + delay)`` (fractions).
        ci95: optional per delay, per rank (low, high) intervals (fractions).

    Raises:
        ValueError: lengths differ.
    """
    if not (len(delays_s) == len(measured) == len(predicted)) or not delays_s:
        raise ValueError("delays_s, measured and predicted need one entry per delay, got "
                         f"{len(delays_s)}, {len(measured)}, {len(predicted)}")
    fig = InlineFigure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    ms = [d * 1e3 for d in delays_s]
    order = sorted(range(len(ms)), key=ms.__getitem__)  # the line from delay 0 upward
    ax.plot([0.0] + [ms[i] for i in order], [0.0] + [100 * predicted[i] for i in order],
            "-", color="black", label="predicted: delay / (step + delay)")
    ranks = len(measured[0])
    for r in range(ranks):
        ys = [100 * m[r] for m in measured]
        offset = (r - (ranks - 1) / 2) * 0.01 * (max(ms) or 1)  # side by side
        xs = [x + offset for x in ms]
        if ci95 is not None:
            err = [[100 * (m[r] - c[r][0]) for m, c in zip(measured, ci95)],
                   [100 * (c[r][1] - m[r]) for m, c in zip(measured, ci95)]]
            err = [[max(0.0, e) if e == e and e != float("inf") else 0.0 for e in row]
                   for row in err]
            ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=f"measured, rank {r}")
        else:
            ax.plot(xs, ys, "o", label=f"measured, rank {r}")
    ax.set_xlabel("delay injected on one rank (ms per step)")
    ax.set_ylabel("throughput loss (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False)
    return fig
