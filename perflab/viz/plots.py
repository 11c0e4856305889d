"""Before/after plots of :class:`~perflab.core.result.RunResult` objects.

Every function returns a :class:`perflab.viz.figures.InlineFigure` (shows itself in Jupyter,
no pyplot) with the fixed per-phase colours of :data:`perflab.viz.figures.PHASE_COLORS`.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from perflab.viz.figures import PHASE_COLORS, InlineFigure, new_ax
from perflab.core.result import PHASES, RunResult
from perflab.core.result_store import as_results

__all__ = ["plot_phases", "plot_throughput", "plot_comparison", "plot_results"]

_BASELINE_COLOR = "#999999"
_VARIANT_COLOR = "#0072B2"
_LABEL_WIDTH = 24  # characters per line of a bar label before it wraps


def _check(results: Sequence[RunResult], what: str) -> list[RunResult]:
    results = list(results)
    if not results:
        raise ValueError(f"{what} needs at least one RunResult, got an empty list; "
                         "pass e.g. [baseline, variant] from perflab.run(...)")
    return results


def _wrap(label: str) -> str:
    return "\n".join(textwrap.wrap(label, _LABEL_WIDTH)) or label


def plot_phases(results: Sequence[RunResult], ax: Axes | None = None) -> Figure:
    """Stacked horizontal bars: mean milliseconds per phase of a training step.

    One bar per result (labelled with ``result.label``, first result on top); segments
    are data, forward, backward, optimizer and other, in that order. Means are used,
    not medians, because means add up: the segments sum to the mean step time, which
    is written at the end of each bar. A phase's negative mean (clock rounding in
    "other") is drawn as 0.

    Args:
        results: the runs to show, baseline first.
        ax: draw into this Axes; None -> a new figure (about 6 x 4 inches).

    Returns:
        The Figure holding the Axes. Each phase is one ``BarContainer`` in
        ``ax.containers`` with one bar per result.

    Raises:
        ValueError: ``results`` is empty.
    """
    results = _check(results, "plot_phases")
    ax = new_ax(ax, (6.0, 1.2 + 0.6 * len(results)))
    ys = list(range(len(results)))
    left = [0.0] * len(results)
    for phase in (*PHASES, "other"):
        if not any(phase in r.phases for r in results):
            continue
        ms = [max(r.phases[phase].mean * 1e3, 0.0) if phase in r.phases else 0.0
              for r in results]
        ax.barh(ys, ms, left=left, height=0.6, color=PHASE_COLORS[phase], label=phase,
                edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, ms)]
    for y, r in zip(ys, results):
        ax.annotate(f"{r.step.mean * 1e3:,.1f} ms", (left[y], y), xytext=(4, 0),
                    textcoords="offset points", va="center", ha="left", fontsize="small")
    ax.set_yticks(ys, [_wrap(r.label) for r in results])
    ax.set_ylim(len(results) - 0.5, -0.5)  # first result on top
    ax.set_xlim(0, max(left) * 1.22 or 1.0)  # room for the total after each bar
    ax.set_xlabel("time per step (ms, mean; phases add up to the step)")
    ax.set_title("where a step's time goes", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=5, frameon=False,
              fontsize="small", handlelength=1.2, columnspacing=1.0)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return ax.figure


def plot_throughput(results: Sequence[RunResult], ax: Axes | None = None) -> Figure:
    """Horizontal bars of throughput (samples/s, from the median step time).

    Whiskers are the 95 % CI of the throughput (``result.samples_per_s_ci95``, from
    the CI of the median step; asymmetric). A side the CI cannot bound (fewer than 6
    measured steps) gets no whisker and the bar says "CI n/a". Each bar is annotated
    with its speedup over the first result ("1.00x", "1.35x").

    Args:
        results: the runs to show, baseline first.
        ax: draw into this Axes; None -> a new figure (about 6 x 4 inches).

    Returns:
        The Figure holding the Axes; its ``BarContainer`` holds one bar per result
        (``.errorbar``: the whiskers).

    Raises:
        ValueError: ``results`` is empty.
    """
    results = _check(results, "plot_throughput")
    ax = new_ax(ax, (6.0, 1.2 + 0.6 * len(results)))
    ys = list(range(len(results)))
    sps = [r.samples_per_s for r in results]
    lo_err, hi_err, bounded = [], [], []
    for r, v in zip(results, sps):
        lo, hi = r.samples_per_s_ci95
        ok = math.isfinite(lo) and math.isfinite(hi) and lo > 0
        bounded.append(ok)
        lo_err.append(max(v - lo, 0.0) if ok else 0.0)
        hi_err.append(max(hi - v, 0.0) if ok else 0.0)
    colors = [_BASELINE_COLOR] + [_VARIANT_COLOR] * (len(results) - 1)
    ax.barh(ys, sps, height=0.6, color=colors, xerr=[lo_err, hi_err], capsize=4,
            error_kw={"elinewidth": 1.2, "ecolor": "black"})
    ends = [v + e for v, e in zip(sps, hi_err)]
    for y, v, end, ok in zip(ys, sps, ends, bounded):
        text = f"{v / sps[0]:.2f}x" + ("" if ok else " (CI n/a)")
        ax.annotate(text, (end, y), xytext=(6, 0), textcoords="offset points",
                    va="center", ha="left", fontsize="small", fontweight="bold")
    ax.set_yticks(ys, [_wrap(r.label) for r in results])
    ax.set_ylim(len(results) - 0.5, -0.5)
    ax.set_xlim(0, max(ends) * 1.25 or 1.0)
    ax.set_xlabel("throughput (samples/s, median step; whiskers: 95 % CI)")
    ax.set_title(f"throughput, speedup vs {results[0].label!r}", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return ax.figure


def _device_text(results: Sequence[RunResult]) -> str:
    devices = list(dict.fromkeys(str(r.env.get("device", "unknown device")) for r in results))
    if len(devices) > 1:
        return "devices differ: " + ", ".join(devices)
    name = results[0].env.get("device_name")
    return f"on {devices[0]}" + (f" ({name})" if name and name != devices[0] else "")


def plot_comparison(results: Sequence[RunResult], title: str | None = None) -> Figure:
    """Phase breakdown (left) and throughput (right) of the same runs, side by side.

    Args:
        results: the runs to compare, baseline first.
        title: figure title; the device of ``results[0]`` (``env["device"]``, and
            ``env["device_name"]``) is always appended.

    Returns:
        A Figure (11 x 4 inches, constrained layout) with two Axes, which displays
        itself as PNG when it ends a notebook cell.

    Raises:
        ValueError: ``results`` is empty.
    """
    results = _check(results, "plot_comparison")
    fig = InlineFigure(figsize=(11.0, max(4.0, 1.8 + 0.6 * len(results))),
                        layout="constrained")
    ax_phase, ax_tput = fig.subplots(1, 2, sharey=True)
    plot_phases(results, ax=ax_phase)
    plot_throughput(results, ax=ax_tput)
    ax_tput.tick_params(labelleft=False)  # rows line up with the left panel's labels
    head = title or (" vs ".join(repr(r.label) for r in results[:3])
                     + (" ..." if len(results) > 3 else ""))
    fig.suptitle(f"{head} {_device_text(results)}", fontsize="large")
    return fig


def plot_results(items: Sequence["RunResult | str | Path"], title: str | None = None):
    """The labs' before/after figure (:func:`plot_comparison`) of saved results."""
    from perflab.viz.plots import plot_comparison

    return plot_comparison(as_results(items), title=title)
