"""Lab 09's scaling panel (its plots are :mod:`perflab.viz.scaling_plots`).

* :func:`scaling_panel`: a ``.perflab-panel`` whose Run measures the scaling curve on a
  baseline link and on another simulated link preset, plotted together (before / after).
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import ipywidgets as W
import pandas as pd

from perflab.viz.figures import figure_to_png
from perflab.core.simulated import LINK_PRESETS, SimulatedLink
from perflab.analysis.scaling import scaling_curve
from perflab.ui.shell import Panel
from perflab.viz.scaling_plots import plot_scaling

__all__ = ["scaling_panel"]


def scaling_panel(before: str = "10gbe", *, presets: Sequence[str] = ("1gbe", "10gbe",
                                                                       "nvlink"),
                  world_sizes: Sequence[int] = (1, 2), **curve_kwargs: Any):
    """Panel: pick a simulated link preset and press Run: weak and strong scaling are
    measured on the ``before`` link and on the chosen one in the same launch
    (:func:`~perflab.analysis.scaling.scaling_curve`, ``world_sizes`` ranks; tick
    "4 ranks" to add the oversubscribed point) and plotted together, before and after.

    Args:
        before: the baseline link preset (a name in :data:`perflab.core.simulated.LINK_PRESETS`).
        presets: the choices for "after".
        world_sizes: measured by a click (must include 1).
        curve_kwargs: passed to ``scaling_curve`` (sizes, batches, steps...).

    Raises:
        ValueError: an unknown preset.
    """
    for p in (before, *presets):
        SimulatedLink.preset(p)  # raises for an unknown name, listing the presets
    return _ScalingPanel(before, list(presets), list(world_sizes), curve_kwargs)


class _ScalingPanel(Panel):
    """See :func:`scaling_panel` (on the :class:`~perflab.ui.shell.Panel` shell, without
    a log)."""

    busy_status = "measuring ..."

    def __init__(self, before: str, presets: list[str], world_sizes: list[int],
                 curve_kwargs: dict):
        self.before, self.world_sizes, self.kwargs = before, world_sizes, curve_kwargs
        self.result: pd.DataFrame | None = None
        self.preset = W.Dropdown(options=presets, value=presets[0], description="after")
        self.four = W.Checkbox(value=False, description="4 ranks (oversubscribed here)",
                               indent=False)
        super().__init__("Scaling on a simulated link", "Before: "
                         f"<code>{html.escape(LINK_PRESETS[before].describe())}</code>. Pick "
                         "another link and press <b>Run</b>: weak and strong scaling are "
                         "measured on both and plotted together.",
                         W.HBox([self.preset, self.four]), log=False)

    def run(self, *, raise_errors: bool = False) -> pd.DataFrame | None:
        """Measure before and after; returns the scaling table (None if it failed)."""
        return super().run(raise_errors=raise_errors)

    def _run(self) -> pd.DataFrame:
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
