"""Lab 09's faces: the scaling plot, the per-rank memory plot and the scaling panel.

* :func:`plot_scaling`: throughput and scaling efficiency (95 % CI bars) against
  world_size, weak and strong, one line per link; oversubscribed points are hollow and
  labelled.
* :func:`plot_state_bytes`: parameter / gradient / optimizer-state bytes per rank, one
  bar per method, with the peak memory per rank written under each bar (and what it is).
* :func:`scaling_panel`: a ``.perflab-panel`` whose Run measures the scaling curve on a
  baseline link and on another simulated link preset, plotted together (before / after).
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import pandas as pd

from perflab.figures import InlineFigure, figure_to_png
from perflab.link import LINK_PRESETS, SimulatedLink
from perflab.sharding_scaling import scaling_curve
from perflab.widgets import error_html

__all__ = ["plot_scaling", "plot_state_bytes", "scaling_panel"]

_PARTS = (("params_bytes", "parameters", "#0072B2"), ("grads_bytes", "gradients", "#56B4E9"),
          ("optimizer_bytes", "optimizer state", "#009E73"))


def plot_scaling(table: pd.DataFrame, *, title: str = "") -> InlineFigure:
    """Two panels per mode: throughput (samples/s) and efficiency (with its 95 % CI)
    against world_size, one line per link (``table``: :func:`~perflab.sharding_scaling.
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


def scaling_panel(before: str = "10gbe", *, presets: Sequence[str] = ("1gbe", "10gbe",
                                                                       "nvlink"),
                  world_sizes: Sequence[int] = (1, 2), **curve_kwargs: Any):
    """Panel: pick a simulated link preset and press Run: weak and strong scaling are
    measured on the ``before`` link and on the chosen one in the same launch
    (:func:`~perflab.sharding_scaling.scaling_curve`, ``world_sizes`` ranks; tick
    "4 ranks" to add the oversubscribed point) and plotted together, before and after.

    Args:
        before: the baseline link preset (a name in :data:`perflab.link.LINK_PRESETS`).
        presets: the choices for "after".
        world_sizes: measured by a click (must include 1).
        curve_kwargs: passed to ``scaling_curve`` (sizes, batches, steps...).

    Raises:
        ValueError: an unknown preset.
    """
    for p in (before, *presets):
        SimulatedLink.preset(p)  # raises for an unknown name, listing the presets
    return _ScalingPanel(before, list(presets), list(world_sizes), curve_kwargs)


class _ScalingPanel:
    """See :func:`scaling_panel` (the ladder panel's layout: button, status, error, plot)."""

    def __init__(self, before: str, presets: list[str], world_sizes: list[int],
                 curve_kwargs: dict):
        import ipywidgets as W

        self.before, self.world_sizes, self.kwargs = before, world_sizes, curve_kwargs
        self.result: pd.DataFrame | None = None
        self.preset = W.Dropdown(options=presets, value=presets[0], description="after")
        self.four = W.Checkbox(value=False, description="4 ranks (oversubscribed here)",
                               indent=False)
        self.run_button = W.Button(description="Run", icon="play", button_style="primary")
        self.run_button.add_class("perflab-run")
        self.run_button.on_click(lambda _b: self.run())
        self.status, self.error = W.HTML("ready"), W.HTML("")
        self.error.add_class("perflab-error")
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.image.add_class("perflab-plot")
        head = W.HTML(f"<h4>Scaling on a simulated link</h4><p>Before: "
                      f"<code>{html.escape(LINK_PRESETS[before].describe())}</code>. Pick "
                      "another link and press <b>Run</b>: weak and strong scaling are "
                      "measured on both and plotted together.</p>")
        self.widget = W.VBox([head, W.HBox([self.preset, self.four]), self.run_button,
                              self.status, self.error, self.image])
        self.widget.add_class("perflab-panel")

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)

    def run(self, *, raise_errors: bool = False) -> pd.DataFrame | None:
        """Measure before and after; returns the scaling table (None if it failed)."""
        self.run_button.disabled, self.error.value = True, ""
        self.status.value = "measuring ..."
        try:
            ws = sorted(set(self.world_sizes) | ({4} if self.four.value else set()))
            names = list(dict.fromkeys([self.before, self.preset.value]))
            self.result = scaling_curve(ws, links=[LINK_PRESETS[n] for n in names],
                                        **self.kwargs)
            self.image.value = figure_to_png(plot_scaling(self.result, title="; ".join(
                f"{when}: {LINK_PRESETS[n].describe()}" for when, n in zip(
                    ("before", "after"), names))))
            top = self.result[self.result.world_size == max(ws)]
            self.status.value = html.escape("; ".join(
                f"{r.mode}, {r.link}, {r.world_size} ranks: efficiency {r.efficiency:.2f} "
                f"[{r.ci_low:.2f}, {r.ci_high:.2f}] ({r.cores})" for r in top.itertuples()))
            return self.result
        except Exception as e:  # noqa: BLE001 - shown in the panel; the kernel lives on
            self.error.value = error_html(e)
            self.status.value = "the run failed; the panel is still usable"
            if raise_errors:
                raise
            return None
        finally:
            self.run_button.disabled = False
