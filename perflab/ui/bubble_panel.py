"""Lab 10's pipeline panel (its plot is :func:`perflab.viz.pipeline_plots.plot_bubble`).

* :func:`bubble_panel`: a ``.perflab-panel`` whose Run measures the pipeline bubble for
  the ticked micro-batch counts with the chosen schedule and plots it beside the formula.
  The measurement is a callable the notebook passes in (it launches the ranks with the
  student's own pipeline), so this panel depends on no lab's code.
"""
from __future__ import annotations

import html
from typing import Callable, Sequence

import ipywidgets as W
import pandas as pd

from perflab.ui.shell import Panel
from perflab.viz.figures import figure_to_png
from perflab.viz.pipeline_plots import plot_bubble

__all__ = ["bubble_panel"]


def bubble_panel(measure: Callable[[str, list[int]], pd.DataFrame], *,
                 schedules: Sequence[str] = ("gpipe", "1f1b"),
                 micro_batches: Sequence[int] = (2, 4, 8, 16)):
    """Panel: pick a schedule and micro-batch counts, press Run: ``measure(schedule, ms)``
    runs the pipeline (one launch) and returns a table with columns ``schedule``, ``m``,
    ``bubble_measured``, ``bubble_formula`` (and ``stages``), which is plotted.

    Args:
        measure: the experiment; its exceptions are shown in the panel.
        schedules: the schedule choices.
        micro_batches: the micro-batch counts offered (all ticked at first).

    Raises:
        ValueError: no schedule or no micro-batch count, or a count < 1.
    """
    if not schedules or not micro_batches or min(micro_batches) < 1:
        raise ValueError("bubble_panel needs schedules and micro-batch counts >= 1, got "
                         f"{list(schedules)!r} and {list(micro_batches)!r}")
    return _BubblePanel(measure, list(schedules), list(micro_batches))


class _BubblePanel(Panel):
    """See :func:`bubble_panel`."""

    busy_status = "measuring (starting the ranks takes seconds) ..."

    def __init__(self, measure: Callable[[str, list[int]], pd.DataFrame],
                 schedules: list[str], micro_batches: list[int]):
        self.measure = measure
        self.result: pd.DataFrame | None = None
        self.schedule = W.Dropdown(options=schedules, value=schedules[0], description="schedule")
        self.ms = W.SelectMultiple(options=micro_batches, value=tuple(micro_batches),
                                   description="m", rows=min(4, len(micro_batches)))
        super().__init__("Pipeline bubble vs micro-batches", "Pick a schedule and the "
                         "micro-batch counts, press <b>Run</b>: your pipeline runs on the "
                         "ranks and its measured idle fraction is plotted beside "
                         "<code>(p-1)/(m+p-1)</code>.", W.HBox([self.schedule, self.ms]),
                         log=False, lock=[self.schedule, self.ms])

    def _run(self) -> pd.DataFrame:
        ms = sorted(self.ms.value)
        if not ms:
            raise ValueError("tick at least one micro-batch count m")
        self.result = self.measure(self.schedule.value, ms)
        self.image.value = figure_to_png(plot_bubble(self.result, title=f"schedule "
                                                     f"{self.schedule.value}"))
        r = self.result
        self.status.value = html.escape("; ".join(
            f"m={row.m}: measured {row.bubble_measured:.2f}, formula {row.bubble_formula:.2f}"
            for row in r.itertuples()))
        return self.result
