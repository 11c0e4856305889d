"""Lab 11's plots: peak memory inside an attention call against T, and CPU times."""
from __future__ import annotations

import pandas as pd

from perflab.viz.figures import InlineFigure

__all__ = ["plot_peak_memory", "plot_times"]


def _per_impl_against_T(table: pd.DataFrame, value: str, ylabel: str, title: str):
    """A log-log figure of ``value`` against T with its axes labelled: returns ``(fig, ax,
    [(impl, rows sorted by T), ...])`` for the caller to draw one line per ``impl``.

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {"impl", "T", value}
    if not need <= set(table.columns) or table.empty:
        raise ValueError(f"table needs rows and columns {sorted(need)}, got {list(table.columns)}")
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    groups = [(impl, g.sort_values("T")) for impl, g in table.groupby("impl", sort=False)]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return fig, ax, groups


def plot_peak_memory(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Peak bytes allocated inside the call (MiB, log) against T (log): ``table`` has
    columns ``impl``, ``T`` and ``peak_mib``, one line per ``impl``; a dotted T² and a
    dashed T line through each impl's first point show the slopes.

    Raises:
        ValueError: a missing column or an empty table.
    """
    fig, ax, groups = _per_impl_against_T(table, "peak_mib", "peak MiB allocated inside the call", title)
    for k, (impl, g) in enumerate(groups):
        (line,) = ax.plot(g["T"], g["peak_mib"], "o-", label=f"{impl}, measured")
        t0, m0 = g["T"].iloc[0], g["peak_mib"].iloc[0]
        ax.plot(g["T"], m0 * (g["T"] / t0) ** 2, ":", color=line.get_color(), alpha=0.6,
                label="∝ T²" if k == 0 else None)
        ax.plot(g["T"], m0 * (g["T"] / t0), "--", color=line.get_color(), alpha=0.6,
                label="∝ T" if k == 0 else None)
    ax.legend(fontsize=8)
    return fig


def plot_times(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Median ms per call (log) against T (log), one line per ``impl``: ``table`` has
    columns ``impl``, ``T`` and ``median_ms``.

    Raises:
        ValueError: a missing column or an empty table.
    """
    fig, ax, groups = _per_impl_against_T(table, "median_ms", "median ms per call", title)
    for impl, g in groups:
        ax.plot(g["T"], g["median_ms"], "o-", label=impl)
    ax.legend(fontsize=8)
    return fig
