"""Lab 11's plots: peak memory inside an attention call against T, and CPU times."""
from __future__ import annotations

import pandas as pd

from perflab.viz.figures import InlineFigure

__all__ = ["plot_peak_memory", "plot_times"]


def plot_peak_memory(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Peak bytes allocated inside the call (MiB, log) against T (log): ``table`` has
    columns ``impl``, ``T`` and ``peak_mib``, one line per ``impl``; a dotted T² and a
    dashed T line through each impl's first point show the slopes.

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {"impl", "T", "peak_mib"}
    if not need <= set(table.columns) or table.empty:
        raise ValueError(f"table needs rows and columns {sorted(need)}, got {list(table.columns)}")
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for impl, g in table.groupby("impl", sort=False):
        g = g.sort_values("T")
        (line,) = ax.plot(g["T"], g["peak_mib"], "o-", label=f"{impl}, measured")
        t0, m0 = g["T"].iloc[0], g["peak_mib"].iloc[0]
        ax.plot(g["T"], m0 * (g["T"] / t0) ** 2, ":", color=line.get_color(), alpha=0.6,
                label="∝ T²" if impl == table["impl"].iloc[0] else None)
        ax.plot(g["T"], m0 * (g["T"] / t0), "--", color=line.get_color(), alpha=0.6,
                label="∝ T" if impl == table["impl"].iloc[0] else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("peak MiB allocated inside the call")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def plot_times(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Median ms per call (log) against T (log), one line per ``impl``: ``table`` has
    columns ``impl``, ``T`` and ``median_ms``.

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {"impl", "T", "median_ms"}
    if not need <= set(table.columns) or table.empty:
        raise ValueError(f"table needs rows and columns {sorted(need)}, got {list(table.columns)}")
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for impl, g in table.groupby("impl", sort=False):
        g = g.sort_values("T")
        ax.plot(g["T"], g["median_ms"], "o-", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("median ms per call")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig
