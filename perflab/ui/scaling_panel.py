"""Lab 09's scaling panel (its plots are :mod:`perflab.viz.scaling_plots`).

* :func:`scaling_panel`: a ``.perflab-panel`` whose Run measures the scaling curve on a
  baseline link and on another simulated link preset, plotted together (before / after).
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import pandas as pd

from perflab.viz.figures import figure_to_png
from perflab.core.simulated import LINK_PRESETS, SimulatedLink
from perflab.analysis.scaling import scaling_curve
from perflab.ui.widgets import error_html
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
