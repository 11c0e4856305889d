"""The lab panels that are not a plain before/after :func:`perflab.ui.widgets.experiment_panel`.

* :func:`bucket_panel`, :func:`link_panel` (Lab 06): a DDP run of ``base`` vs another
  ``bucket_cap_mb`` / simulated link preset; each press of Run launches the ranks.
* :func:`ladder_panel` (Lab 08): a checkbox per ladder rung and a waterfall plot.

Every panel is built on the :class:`perflab.ui.shell.Panel` shell: a ``.perflab-panel``
with a ``.perflab-run`` button, an ``img.perflab-plot`` and a ``.perflab-error`` box
(what the browser tests look for).
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import ipywidgets as W

from perflab.core.config import RunConfig
from perflab.viz.figures import figure_to_png
from perflab.ladder.search import climb, validate_climb
from perflab.ladder.report import Ladder
from perflab.ladder.rungs import RUNGS, naive_config, unavailable
from perflab.core.simulated import SimulatedLink
from perflab.analysis.overlap import run_ddp
from perflab.core.result import RunResult
from perflab.ui.shell import Panel
from perflab.ui.widgets import experiment_panel

__all__ = ["bucket_panel", "link_panel", "ladder_panel"]


def _seed(panel: Any, base: RunConfig, baseline_result: RunResult | None) -> Any:
    if baseline_result is not None:
        if not isinstance(baseline_result, RunResult) or baseline_result.config != base:
            raise ValueError("baseline_result must be a RunResult measured with exactly "
                             "`base` (e.g. rank 0 of launch_sweep([base, ...])); got one for "
                             f"{getattr(baseline_result, 'label', baseline_result)!r}")
        panel.baseline_result = baseline_result  # a click then launches the variant only
    return panel


def bucket_panel(base: RunConfig, choices_mb: Sequence[float] = (1, 5, 25, 100), *,
                 baseline_result: RunResult | None = None):
    """Experiment panel: DDP step of ``base`` vs the same with another ``bucket_cap_mb``
    (:func:`perflab.ui.widgets.experiment_panel`; each run launches ``base.world_size``
    ranks). ``baseline_result``: ``base`` already measured (rank 0), so a click costs
    one launch instead of two.

    Raises:
        ValueError: ``baseline_result`` was not measured with ``base``; bad knobs.
    """
    choices = sorted({float(c) for c in choices_mb} | {float(base.bucket_cap_mb)})
    panel = experiment_panel(base, {"bucket_cap_mb": choices}, run_fn=run_ddp,
                             progress=False, title=f"Bucket size ({base.display_label()})")
    return _seed(panel, base, baseline_result)


def link_panel(base: RunConfig, presets: Sequence[str] = ("nvlink", "10gbe", "1gbe"), *,
               baseline_result: RunResult | None = None):
    """Experiment panel: DDP step of ``base`` vs the same on another simulated link preset
    (:data:`perflab.core.simulated.LINK_PRESETS`); ``baseline_result`` as in :func:`bucket_panel`.

    Raises:
        ValueError: unknown preset; ``baseline_result`` not measured with ``base``.
    """
    links = [SimulatedLink.preset(p) for p in presets]
    if base.link not in links:  # the baseline must be selectable (None = real backend)
        links.insert(0, base.link)
    panel = experiment_panel(base, {"link": links}, run_fn=run_ddp, progress=False,
                             title="Simulated link preset")
    return _seed(panel, base, baseline_result)


def ladder_panel(config=None, *, size: str = "tiny", rungs: Sequence[str] | None = None,
                 rounds: int = 1, progress: bool = True, title: str | None = None):
    """The Lab 08 panel: a checkbox per rung, a Run button (class ``perflab-run``) in a
    ``.perflab-panel``; Run searches the ticked rungs (:func:`perflab.ladder.search.climb`) and
    shows the waterfall as an ``img.perflab-plot`` with the table below. A rung this
    device cannot run is shown disabled, its reason as the tooltip. Errors show in the
    panel.

    Args:
        config, size, rounds, progress: as :func:`perflab.ladder.search.climb`.
        rungs: the rungs ticked at first (default all of ``RUNGS``).
        title: heading (default "Optimization ladder").

    Returns:
        A ``LadderPanel`` (displays itself; ``.run()`` does what the button does,
        ``.ladder`` is the last climb).

    Raises:
        ValueError: as :func:`perflab.ladder.search.climb`, before any widget is built.
    """
    rungs = list(RUNGS if rungs is None else rungs)
    validate_climb(rungs, (), rounds, 0.05)
    config = naive_config(size) if config is None else config
    return _LadderPanel(config, rungs, rounds, progress, title or "Optimization ladder")


class _LadderPanel(Panel):
    """See :func:`ladder_panel` (its own class because the ladder shows a waterfall of
    several rungs, not experiment_panel's before/after pair)."""

    busy_status = "climbing ..."
    failed_status = "the climb failed; the panel is still usable"

    def __init__(self, config, rungs: list[str], rounds: int, progress: bool, title: str):
        self.config, self.rounds, self.progress = config, rounds, progress
        self.ladder: Ladder | None = None
        why = {r: unavailable(r, config) for r in RUNGS}
        self.boxes = {r: W.Checkbox(value=r in rungs and not why[r], description=r,
                                    indent=False, disabled=bool(why[r]),
                                    tooltip=why[r] or f"try the {r} rung")
                      for r in RUNGS}
        self.table = W.HTML("")
        boxes = W.HBox(list(self.boxes.values()), layout=W.Layout(flex_flow="row wrap"))
        super().__init__(title, f"Baseline <code>{html.escape(config.display_label())}</code>"
                         "; tick the rungs and press <b>Run</b> to search them on this "
                         "machine.", boxes, below=[self.table])

    def run(self, *, raise_errors: bool = False) -> Ladder | None:
        """Climb the ticked rungs; returns the Ladder (None if it failed)."""
        return super().run(raise_errors=raise_errors)

    def _run(self) -> Ladder:
        ticked = [r for r, box in self.boxes.items() if box.value]
        with self.log:
            self.ladder = climb(self.config, rungs=ticked, rounds=self.rounds,
                                progress=self.progress)
        self.image.value = figure_to_png(self.ladder.plot_waterfall())
        cols = ["rung", "move", "status", "step_time_ms", "samples_per_s", "speedup",
                "p_value", "cumulative_speedup", "mfu_pct"]
        self.table.value = self.ladder.table[cols].to_html(
            index=False, float_format=lambda v: f"{v:,.3g}", na_rep="–", border=0)
        self.status.value = html.escape(repr(self.ladder))
        return self.ladder
