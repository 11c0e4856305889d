"""Pipeline-parallel plots: the measured bubble against the formula.

* :func:`plot_bubble`: idle fraction of a pipeline step against the number of
  micro-batches m, measured (one line per schedule) and GPipe's (p - 1) / (m + p - 1)
  (Huang et al. 2019, arXiv:1811.06965, §2.2).
"""
from __future__ import annotations

import pandas as pd

from perflab.viz.figures import InlineFigure

__all__ = ["plot_bubble"]


def plot_bubble(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Bubble fraction vs micro-batches: ``table`` has columns ``schedule``, ``m``,
    ``bubble_measured`` and ``bubble_formula`` (NaN where no formula was given; a
    ``stages`` column names p in the legend).

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {"schedule", "m", "bubble_measured", "bubble_formula"}
    if not need <= set(table.columns) or table.empty:
        raise ValueError(f"table needs rows and columns {sorted(need)}, got {list(table.columns)}")
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for schedule, g in table.groupby("schedule", sort=False):
        g = g.sort_values("m")
        ax.plot(g["m"], g["bubble_measured"], "o-", label=f"{schedule}, measured")
    formula = table.drop_duplicates("m").sort_values("m")
    if formula["bubble_formula"].notna().any():
        p = int(table["stages"].iloc[0]) if "stages" in table else None
        ax.plot(formula["m"], formula["bubble_formula"], "k--",
                label="(p-1)/(m+p-1)" + (f", p={p}" if p else ""))
    ax.set_xscale("log", base=2)
    ms = sorted(int(m) for m in table["m"].unique())
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("idle fraction of the step")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(title, fontsize=9)
    return fig
