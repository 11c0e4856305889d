"""Lab 09's plots: scaling curves and the per-rank bytes of each sharding method.

* :func:`plot_scaling`: throughput and scaling efficiency (95 % CI bars) against
  world_size, weak and strong, one line per link; oversubscribed points are hollow and
  labelled.
* :func:`plot_step_prediction`: a fitted step-time model against a recording, the rank
  count the fit never saw marked with the model's prediction and its error.
* :func:`plot_state_bytes`: parameter / gradient / optimizer-state bytes per rank, one
  bar per method, with the peak memory per rank written under each bar (and what it is).
"""
from __future__ import annotations

import pandas as pd

from perflab.viz.figures import InlineFigure

__all__ = ["plot_scaling", "plot_step_prediction", "plot_state_bytes"]


_PARTS = (("params_bytes", "parameters", "#0072B2"), ("grads_bytes", "gradients", "#56B4E9"),
          ("optimizer_bytes", "optimizer state", "#009E73"))


def plot_scaling(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Two panels per mode: throughput (samples/s) and efficiency (with its 95 % CI)
    against world_size, one line per link (``table``: :func:`~perflab.analysis.scaling.
    scaling_table`'s). Hollow markers: oversubscribed (more ranks than cores).

    Raises:
        ValueError: ``table`` lacks the scaling columns.
    """
    need = {"mode", "link", "world_size", "samples_per_s", "efficiency", "ci_low", "ci_high",
            "oversubscribed"}
    if not need <= set(table.columns):
        raise ValueError(f"table must be a scaling_table (columns {sorted(need)}), got "
                         f"{list(table.columns)}")
    fig = InlineFigure(figsize=(11, 6.5), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True)
    for col, mode in enumerate(("weak", "strong")):
        part = table[table["mode"] == mode]
        for link, g in part.groupby("link", sort=False):
            g = g.sort_values("world_size")
            line, = axes[0, col].plot(g.world_size, g.samples_per_s, "-o", label=str(link))
            yerr = [g.efficiency - g.ci_low, g.ci_high - g.efficiency]
            axes[1, col].errorbar(g.world_size, g.efficiency, yerr=yerr, fmt="-o", capsize=4,
                                  color=line.get_color(), label=str(link))
            over = g[g.oversubscribed]
            for row, key in ((0, "samples_per_s"), (1, "efficiency")):
                axes[row, col].scatter(over.world_size, over[key], s=90, facecolors="white",
                                       edgecolors=line.get_color(), zorder=3)
        for w in part[part.oversubscribed].world_size.unique():
            axes[1, col].annotate("oversubscribed", (w, 0.02), ha="center", fontsize=8)
        axes[0, col].set_title(f"{mode} scaling" + (" (fixed per-rank batch)" if mode == "weak"
                                                    else " (fixed global batch)"))
        axes[0, col].set_ylabel("throughput (samples/s)")
        axes[1, col].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[1, col].set_ylim(0, 1.15)
        axes[1, col].set_ylabel("scaling efficiency X(N) / (N X(1))")
        axes[1, col].set_xlabel("world_size (ranks)")
        axes[1, col].set_xticks(sorted(table.world_size.unique()))
        axes[0, col].legend(fontsize=8, title="link", title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_step_prediction(recorded: pd.DataFrame, model: pd.DataFrame, *, held_out: int,
                         compute: str, title: str = "", second: pd.DataFrame | None = None,
                         second_label: str = "second model") -> InlineFigure:
    """Step time (ms) against world_size, one colour per link: the recorded medians
    (filled circles: the points the model was fitted to; a hollow star: ``held_out``, the
    rank count it never saw), the fitted model (dashed line) and, at ``held_out``, the
    model's prediction (a cross) with its error against the recording written beside it.
    A link without model rows (its fit failed) is drawn without a line and says "fit
    failed" in the legend. ``compute`` ("simulated ...", "measured") is written in the
    title, so the plot never hides how the compute was made.

    Args:
        recorded: columns ``link, world_size, step_ms`` (the recording's medians).
        model: columns ``link, world_size, model_ms`` (the model on a grid of rank counts).
        held_out: the rank count left out of the fit (a ``world_size`` of ``recorded``).
        compute: how the recorded compute was made, in a few words.
        second: optionally a second model (same columns as ``model``), drawn dotted with
            its own prediction and error at ``held_out``, named ``second_label``.

    Raises:
        ValueError: a column is missing, or ``held_out`` is not a recorded world_size.
    """
    if not {"link", "world_size", "step_ms"} <= set(recorded.columns) or not all(
            {"link", "world_size", "model_ms"} <= set(m.columns)
            for m in (model, second) if m is not None):
        raise ValueError("recorded needs columns link, world_size, step_ms and model needs "
                         f"link, world_size, model_ms; got {list(recorded.columns)} and "
                         f"{list(model.columns)}")
    if held_out not in set(recorded.world_size):
        raise ValueError(f"held_out={held_out!r} is not a recorded world_size "
                         f"{sorted(set(recorded.world_size))}")
    fig = InlineFigure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for k, (link, g) in enumerate(recorded.groupby("link", sort=False)):
        g = g.sort_values("world_size")
        fitted, held = g[g.world_size != held_out], g[g.world_size == held_out]
        m = model[model.link == link].sort_values("world_size")
        color = f"C{k}"
        ax.plot(fitted.world_size, fitted.step_ms, "o", color=color,
                label=f"{link}: recorded" + (", fitted" if len(m) else " (fit failed: no model)"))
        ax.plot(held.world_size, held.step_ms, "*", ms=14, mfc="white", color=color,
                label=f"{link}: recorded, held out")
        lines = [(m, "--", "x", "model")]
        if second is not None:
            lines.append((second[second.link == link].sort_values("world_size"), ":", "+",
                          second_label))
        for j, (mm, style, marker, name) in enumerate(lines):
            if not len(mm):
                continue
            ax.plot(mm.world_size, mm.model_ms, style, color=color, label=f"{link}: {name}")
            at = mm[mm.world_size == held_out]
            if len(at) and len(held):
                pred, got = float(at.model_ms.iloc[0]), float(held.step_ms.iloc[0])
                ax.plot([held_out], [pred], marker, ms=10, mew=2, color=color)
                ax.annotate(f"{name}: predicted {pred:.1f} ms, recorded {got:.1f} ms "
                            f"({pred / got - 1:+.0%})", (held_out, pred),
                            xytext=(-8, 10 + 14 * (2 * k + j)), textcoords="offset points",
                            ha="right", fontsize=8, color=color)
    ax.set_xlabel("world_size (ranks)")
    ax.set_ylabel("step time (ms), median")
    ax.set_xticks(sorted(set(recorded.world_size)))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title((title + "\n" if title else "") + f"compute: {compute}; {held_out} ranks held out "
                 "of the fit", fontsize=9)
    return fig


def plot_state_bytes(rows: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Stacked bars of model-state bytes per rank (KiB), one per ``method`` row, with the
    peak memory (MiB, and its label) under each bar.

    Args:
        rows: columns ``method``, ``params_bytes``, ``grads_bytes``, ``optimizer_bytes``,
            ``peak_bytes``, ``peak_label`` (one row per method, e.g. rank 0).

    Raises:
        ValueError: a column is missing.
    """
    need = {"method", "params_bytes", "grads_bytes", "optimizer_bytes", "peak_bytes"}
    if not need <= set(rows.columns):
        raise ValueError(f"rows need columns {sorted(need)}, got {list(rows.columns)}")
    fig = InlineFigure(figsize=(10, 4), layout="constrained")
    ax = fig.add_subplot()
    bottom = [0.0] * len(rows)
    for key, name, color in _PARTS:
        vals = list(rows[key] / 2**10)
        ax.bar(range(len(rows)), vals, bottom=bottom, color=color, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)), [f"{m}\npeak {p / 2**20:.0f} MiB" for m, p in
                                     zip(rows.method, rows.peak_bytes)], fontsize=8)
    ax.set_ylabel("model-state KiB on one rank")
    label = rows["peak_label"].iloc[0] if "peak_label" in rows else ""
    ax.set_title(title or f"per-rank bytes, measured from the tensors (peak: {label})",
                 fontsize=10)
    ax.legend(fontsize=8)
    return fig
