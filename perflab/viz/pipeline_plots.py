"""Pipeline- and tensor-parallel plots (Lab 10).

* :func:`plot_bubble`: idle fraction of a pipeline step against the number of
  micro-batches m, measured (one line per schedule and number of stages p) and GPipe's
  (p - 1) / (m + p - 1) (Huang et al. 2019, arXiv:1811.06965, §2.2), one dashed line per p.
* :func:`plot_comm_share`: the share of a tensor-parallel step spent in its all-reduces
  against the link's bandwidth, from a model (the student's alpha-beta ``tp_step_comm_s``)
  beside the points computed from the counted all-reduces (Hockney's alpha-beta model,
  a ring all-reduce: Patarasuk & Yuan 2009).
"""
from __future__ import annotations

import pandas as pd

from perflab.viz.figures import InlineFigure

__all__ = ["plot_bubble", "plot_comm_share"]


def plot_bubble(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Bubble fraction vs micro-batches: ``table`` has columns ``schedule``, ``m``,
    ``bubble_measured`` and ``bubble_formula`` (NaN where no formula was given); an
    optional ``stages`` column (p) splits the lines by p and names it in the legend, an
    optional ``virtual`` column (v, stages per rank) draws the formula of each v apart,
    labelled (p-1)/(v·m+p-1).

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {"schedule", "m", "bubble_measured", "bubble_formula"}
    if not need <= set(table.columns) or table.empty:
        raise ValueError(f"table needs rows and columns {sorted(need)}, got {list(table.columns)}")
    table = table if "stages" in table else table.assign(stages=pd.NA)
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for (p, schedule), g in table.groupby(["stages", "schedule"], sort=False, dropna=False):
        g = g.sort_values("m")
        label = f"{schedule}, measured" + (f", p={int(p)}" if pd.notna(p) else "")
        ax.plot(g["m"], g["bubble_measured"], "o-", label=label)
    table = table if "virtual" in table else table.assign(virtual=1)
    for k, ((p, v), g) in enumerate(table.groupby(["stages", "virtual"], sort=True, dropna=False)):
        formula = g.dropna(subset=["bubble_formula"]).drop_duplicates("m").sort_values("m")
        if not formula.empty:
            name = "(p-1)/(m+p-1)" if v == 1 else f"(p-1)/(v·m+p-1), v={int(v)}"
            ax.plot(formula["m"], formula["bubble_formula"], ("k--", "k:", "k-.")[k % 3],
                    label=name + (f", p={int(p)}" if pd.notna(p) else ""))
    ax.set_xscale("log", base=2)
    ms = sorted(int(m) for m in table["m"].unique())
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("idle fraction of the step")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def plot_comm_share(model: pd.DataFrame, points: pd.DataFrame | None = None, *,
                    title: str = "") -> InlineFigure:
    """Communication share of a step (0..1) against link bandwidth (log scale, Gbit/s).

    Args:
        model: one row per link: columns ``link`` (its name), ``beta_bytes_per_s``
            (bytes/s) and ``comm_share`` (0..1, the model's; NaN where it failed);
            drawn as a line through the links, each marker named.
        points: optional, the same columns: drawn as separate markers (the share from
            the counted all-reduces), so a model that agrees hides them.
        title: the axes' title.

    Raises:
        ValueError: a missing column or an empty ``model``.
    """
    need = {"link", "beta_bytes_per_s", "comm_share"}
    for name, t in (("model", model), ("points", points)):
        if t is not None and (not need <= set(t.columns) or t.empty):
            raise ValueError(f"{name} needs rows and columns {sorted(need)}, got {list(t.columns)}")
    fig = InlineFigure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    m = model.sort_values("beta_bytes_per_s")
    gbit = 8 * m["beta_bytes_per_s"] / 1e9
    ax.plot(gbit, m["comm_share"], "o-", label="your tp_step_comm_s")
    for x, y, name in zip(gbit, m["comm_share"], m["link"]):
        if pd.notna(y):
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
    if points is not None:
        pt = points.sort_values("beta_bytes_per_s")
        ax.plot(8 * pt["beta_bytes_per_s"] / 1e9, pt["comm_share"], "s", mfc="none", ms=10,
                label="counted all-reduces on the link model")
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth (Gbit/s)")
    ax.set_ylabel("communication share of the step")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig
