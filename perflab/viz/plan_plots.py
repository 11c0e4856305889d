"""Plots of a parallel layout's plan (Lab 12, :mod:`perflab.ui.plan_panel`): memory per GPU
by part against the GPU's HBM and the step time by part, as stacked bars; and predicted
against published throughput of published runs.

* :func:`plot_plan`: one or more layouts side by side, memory and time stacked by part.
* :func:`plot_predicted_vs_published`: a scatter of predicted against published values
  with the y = x line, calibration rows marked.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from perflab.viz.figures import InlineFigure

__all__ = ["MEMORY_PARTS", "TIME_PARTS", "plot_plan", "plot_predicted_vs_published"]

#: The memory parts stacked (bytes per GPU), bottom to top, and their colours.
MEMORY_PARTS = {"params": "#0072B2", "grads": "#56B4E9", "optimizer": "#009E73",
                "activations": "#D55E00", "buffers": "#B0B0B0"}
#: The step-time parts stacked (seconds), bottom to top, and their colours.
TIME_PARTS = {"compute": "#0072B2", "recompute": "#56B4E9", "tp_comm": "#E69F00",
              "bubble": "#D55E00", "pp_p2p": "#CC79A7", "dp_comm": "#F0E442",
              "optimizer": "#009E73"}


def plot_plan(memory: Sequence[Mapping[str, float]], time: Sequence[Mapping[str, float]],
              labels: Sequence[str], hbm_bytes: float, *, title: str = "") -> InlineFigure:
    """Two panels of stacked bars, one bar per layout: memory per GPU by part (GiB) with
    the HBM capacity as a dashed line, and the step time by part (s).

    Args:
        memory: per layout, bytes by part (keys of :data:`MEMORY_PARTS`; others ignored).
        time: per layout, seconds by part (keys of :data:`TIME_PARTS`).
        labels: one label per layout. hbm_bytes: the GPU's HBM (bytes).
        title: the figure's title.

    Raises:
        ValueError: lengths that differ, or no layout.
    """
    if not labels or not len(memory) == len(time) == len(labels):
        raise ValueError(f"plot_plan needs as many memory and time dicts as labels (>= 1), got "
                         f"{len(memory)}, {len(time)}, {len(labels)}")
    fig = InlineFigure(figsize=(10, 3.8), layout="constrained")
    ax_m, ax_t = fig.subplots(1, 2)
    xs = range(len(labels))
    for ax, rows, parts, scale, unit in ((ax_m, memory, MEMORY_PARTS, 2 ** 30, "GiB per GPU"),
                                         (ax_t, time, TIME_PARTS, 1.0, "seconds per step")):
        bottom = [0.0] * len(labels)
        for part, colour in parts.items():
            vals = [float(r.get(part, 0.0)) / scale for r in rows]
            ax.bar(xs, vals, bottom=bottom, color=colour, label=part, width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(list(xs), labels, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_ylim(0, 1.12 * max(max(bottom), hbm_bytes / 2 ** 30 if ax is ax_m else 0.0))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax_m.axhline(hbm_bytes / 2 ** 30, color="black", ls="--", lw=1)
    ax_m.annotate(f"HBM {hbm_bytes / 2 ** 30:.0f} GiB", (1.0, hbm_bytes / 2 ** 30),
                  xycoords=("axes fraction", "data"), xytext=(-2, 2), textcoords="offset points",
                  ha="right", fontsize=8)
    ax_m.set_title("memory per GPU", fontsize=9)
    ax_t.set_title("step time", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_predicted_vs_published(published: Sequence[float], predicted: Sequence[float],
                                labels: Sequence[str], calibration: Sequence[bool], *,
                                unit: str = "TFLOP/s per GPU",
                                title: str = "") -> InlineFigure:
    """Predicted against published values, one point per row (calibration rows as open
    squares), with the y = x line and each row's label.

    Raises:
        ValueError: lengths that differ, or no row.
    """
    n = len(labels)
    if not n or not len(published) == len(predicted) == len(calibration) == n:
        raise ValueError("plot_predicted_vs_published needs equal, non-empty lists")
    fig = InlineFigure(figsize=(5.2, 4.2), layout="constrained")
    ax = fig.add_subplot()
    lo = 0.9 * min(min(published), min(predicted))
    hi = 1.1 * max(max(published), max(predicted))
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="predicted = published")
    for used, marker, name in ((True, "s", "calibration rows"), (False, "o", "predicted rows")):
        pts = [(x, y) for x, y, c in zip(published, predicted, calibration) if c == used]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=name,
                       facecolors="none" if used else "#0072B2", edgecolors="#0072B2")
    for x, y, lab in zip(published, predicted, labels):
        ax.annotate(lab, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"published {unit}")
    ax.set_ylabel(f"predicted {unit}")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return fig
