"""Lab 11's panel plot: the peak memory and the time of each attention implementation at
one sequence length, side by side (:mod:`perflab.ui.kernel_panel`)."""
from __future__ import annotations

from typing import Mapping, Sequence

from perflab.viz.figures import InlineFigure

__all__ = ["plot_impl_bars"]


def plot_impl_bars(rows: Sequence[Mapping], *, title: str = "") -> InlineFigure:
    """Two bar charts, one bar per implementation: peak MiB allocated inside the call and
    median ms per call, each bar labelled with its value.

    Args:
        rows: one mapping per implementation with ``impl``, ``peak_mib`` and ``median_ms``.

    Raises:
        ValueError: no rows, or a row without those keys.
    """
    need = ("impl", "peak_mib", "median_ms")
    if not rows or any(k not in r for r in rows for k in need):
        raise ValueError(f"rows must be a non-empty list of mappings with {list(need)}, got {rows!r}")
    fig = InlineFigure(figsize=(8, 3.2), layout="constrained")
    names = [str(r["impl"]) for r in rows]
    for k, (key, label) in enumerate((("peak_mib", "peak MiB allocated inside the call"),
                                      ("median_ms", "median ms per call"))):
        ax = fig.add_subplot(1, 2, k + 1)
        values = [float(r[key]) for r in rows]
        bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(rows))])
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title, fontsize=9)
    return fig
