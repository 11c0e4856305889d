"""``experiment_panel``: knobs, a Run button, and a measured before/after comparison.

A lab cell says what to turn::

    panel = perflab.experiment_panel(RunConfig.preset("quick"),
                                     {"num_workers": [0, 1, 2], "batch_size": (16, 128, 16)})
    panel

Pressing Run builds ``base.replace(**knob values)``, runs the baseline once (cached)
and the variant, then shows :func:`perflab.viz.plots.plot_comparison` as a PNG, the
:func:`perflab.core.measurement.compare_table` of the step times, and the test's verdict.
The run is synchronous (the kernel is busy, so no other cell competes for the cores
being measured); errors are shown in the panel, never as a traceback dump. The panel is
built on the :class:`perflab.ui.shell.Panel` shell; its knobs are :mod:`perflab.ui.knobs`.

Nothing is lost to a kernel restart: after every run the panel records which saved
results it showed (``<results>/panels/<key>.json``, atomically), and a panel built
again with the same title, baseline and knobs reloads them and shows the last
comparison at once, saying when it was measured; Run measures again.
"""
from __future__ import annotations

import hashlib
import html
import json
import math
from typing import Any, Callable, Mapping, Sequence

import ipywidgets as W

from perflab.core.config import RunConfig
from perflab.core.measurement import compare, compare_table
from perflab.viz.figures import figure_to_png
from perflab.viz.plots import plot_comparison
from perflab.core.result import RunResult
from perflab.core.paths import default_results_dir
from perflab.core.result_store import load_results
from perflab.core.storage import StorageError, write_atomic
from perflab.ui.knobs import knob_values, knob_widgets, set_knob_values, validate_knobs
from perflab.ui.shell import ERROR_STYLE, Panel, error_html

__all__ = ["experiment_panel", "ExperimentPanel"]

RunFn = Callable[..., RunResult]
#: Clicks handled this soon after a run ended were queued while it ran: ignore them.
QUEUED_CLICK_WINDOW_S = 0.5


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return f"{v:,.{digits}f}{unit}"


def _table_html(results: Sequence[RunResult], labels: Sequence[str]) -> str:
    """``compare_table`` of the step times, baseline first, as HTML."""
    steps = [r.step.relabel(lab) for r, lab in zip(results, labels)]
    df = compare_table(steps).drop(columns=["verdict"])
    fmts = {c: (lambda v: _fmt(v)) for c in df.columns if c.endswith("_ms")}
    fmts.update(samples_per_s=lambda v: _fmt(v, digits=1), p_value=lambda v: f"{v:.3g}")
    fmts.update({c: (lambda v: _fmt(v, "x")) for c in df.columns if c.startswith("speedup")})
    return df.to_html(index=False, formatters=fmts, na_rep="–", border=0,
                      classes="perflab-table")


class ExperimentPanel(Panel):
    """The widget panel built by :func:`experiment_panel` (a
    :class:`~perflab.ui.shell.Panel`; its knobs are disabled while a run is in progress).

    Attributes:
        base: the baseline config. controls: knob name -> its widget.
        run_button, progress, status, error, image, verdict, table, log: the widgets.
        widget: the top-level ``VBox`` (a cell ending in the panel displays it).
        results: every RunResult measured by this panel, in order (baseline first).
    """

    def __init__(self, base: RunConfig, knobs: Mapping[str, Any], *,
                 run_fn: RunFn | None = None, baseline: bool = True,
                 progress: bool = True, title: str | None = None,
                 reload: bool = True) -> None:
        specs = validate_knobs(base, knobs)
        self._state_key = hashlib.sha256(json.dumps(
            [title, base.to_dict(), {k: repr(v) for k, v in specs.items()}, baseline],
            sort_keys=True, default=repr).encode()).hexdigest()[:16]
        self.base, self._specs, self._run_fn = base, specs, run_fn
        self._baseline_on, self._progress_on = baseline, progress
        self.results: list[RunResult] = []
        self.baseline_result: RunResult | None = None
        self.controls: dict[str, W.ValueWidget] = knob_widgets(base, specs)
        what = (f"The baseline <code>{html.escape(base.display_label())}</code> runs once; "
                if baseline else "")
        self.progress = W.IntProgress(value=0, min=0, max=2 if baseline else 1,
                                      description="runs 0/" + str(2 if baseline else 1))
        self.verdict = W.HTML("")
        self.table = W.HTML("")
        # log: run_fn's own output (tqdm's step bar, prints, warnings)
        super().__init__(title or "Experiment", f"{what}choose settings and press <b>Run</b> "
                         "to measure the variant on this machine.",
                         W.VBox(list(self.controls.values())), progress=self.progress,
                         below=[self.verdict, self.table], lock=list(self.controls.values()))
        if reload:
            self._reload()

    # -- display --------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"ExperimentPanel(base={self.base.display_label()!r}, "
                f"knobs={list(self.controls)}, results={len(self.results)})")

    # -- running --------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        """The knob values currently selected."""
        return knob_values(self.controls)

    def variant_config(self) -> RunConfig:
        """``base.replace(**values())``, relabelled when it would look like the baseline.

        Raises:
            ValueError: the combination of knob values is not a valid RunConfig.
        """
        values = self.values()
        config = self.base.replace(**values)
        if "label" not in values and config.display_label() == self.base.display_label():
            changed = [f"{k}={v}" for k, v in values.items() if v != getattr(self.base, k)]
            config = config.replace(label=" ".join(changed)
                                    or f"{self.base.display_label()} (again)")
        return config

    @property
    def queued_click_window_s(self) -> float:  # type: ignore[override]
        return QUEUED_CLICK_WINDOW_S  # read at each click, so a test can change it

    def _show_error(self, exc: BaseException, what: str) -> None:
        self.error.value = error_html(exc)
        self.status.value = f'<span style="{ERROR_STYLE}">{html.escape(what)}</span>'
        self.progress.bar_style = "danger"

    def _run_one(self, config: RunConfig, i: int, total: int, role: str) -> RunResult:
        self.status.value = html.escape(f"running {role} {config.display_label()!r} "
                                        f"({i}/{total}) ...")
        run_fn = self._run_fn
        if run_fn is None:
            from perflab.experiment import run as run_fn  # imported late: torch + data stack
        with self.log:
            result = run_fn(config, progress=self._progress_on)
        self.results.append(result)
        self.progress.value = i
        self.progress.description = f"runs {i}/{total}"
        return result

    def run(self, *, raise_errors: bool = False) -> RunResult | None:
        """Do what the Run button does; returns the variant's RunResult.

        Ignored (returns None) while a run is in progress. A bad knob combination or an
        exception from the run is shown in the panel and returns None, unless
        ``raise_errors`` (for scripts), which re-raises it.
        """
        return super().run(raise_errors=raise_errors)

    def _run(self) -> RunResult:
        self.progress.bar_style = "info"
        self.failed_status = ("invalid settings: nothing ran; change the knobs named below "
                              "and press Run")
        config = self.variant_config()
        self.failed_status = Panel.failed_status
        return self._measure(config)

    # -- surviving a kernel restart -------------------------------------------------
    @property
    def state_path(self):
        """Where this panel records the saved results it showed last."""
        return default_results_dir() / "panels" / f"{self._state_key}.json"

    def _remember(self, variant: RunResult) -> None:
        shown = [self.baseline_result, variant] if self._baseline_on else [variant]
        if not all(r is not None and r.path for r in shown):
            return  # a run_fn that does not save: nothing to reload later
        try:
            write_atomic(self.state_path, json.dumps(
                {"paths": [r.path for r in shown], "values": {
                    k: v for k, v in self.values().items()
                    if isinstance(v, (int, float, str, bool)) or v is None}}))
        except StorageError:
            pass  # the results themselves are saved; only the shortcut is lost

    def _reload(self) -> None:
        """Show the comparison this panel showed before a kernel restart, if saved."""
        try:
            state = json.loads(self.state_path.read_text())
            shown = load_results(state["paths"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if len(shown) != (2 if self._baseline_on else 1):
            return
        set_knob_values(self.controls, state.get("values", {}))
        if self._baseline_on:
            self.baseline_result = shown[0]
        self.results.extend(shown)
        self._render(shown)
        when = shown[-1].created[:16].replace("T", " ")
        self.status.value = html.escape(
            f"reloaded the run measured {when} UTC ({shown[-1].path}); press Run to "
            "measure again")

    def _measure(self, config: RunConfig) -> RunResult:
        need_base = self._baseline_on and self.baseline_result is None
        total = 1 + int(need_base)
        self.log.outputs = ()
        self.progress.max, self.progress.value = total, 0
        self.progress.description = f"runs 0/{total}"
        if need_base:
            self.baseline_result = self._run_one(self.base, 1, total, "baseline")
        variant = self._run_one(config, total, total, "variant")
        shown = [self.baseline_result, variant] if self._baseline_on else [variant]
        self._render(shown)
        saved = f"; saved {variant.path}" if variant.path else ""
        self.status.value = html.escape(f"done: {variant.label!r} "
                                        f"{variant.samples_per_s:,.1f} samples/s{saved}")
        self.progress.bar_style = "success"
        self._remember(variant)
        return variant

    def _render(self, shown: list[RunResult]) -> None:
        """Plot, table and verdict of ``shown`` (baseline first when there is one)."""
        variant = shown[-1]
        labels = [r.label for r in shown]
        if len(labels) == 2 and labels[0] == labels[1]:
            labels[0] += " (baseline)"
        self.image.value = figure_to_png(plot_comparison(shown))
        self.table.value = _table_html(shown, labels)
        if len(shown) == 2:
            c = compare(shown[0].step.relabel(labels[0]), variant.step.relabel(labels[1]))
            noisy = any(r.step.noisy for r in shown)
            self.verdict.value = html.escape(
                f"speedup {c.speedup:.2f}x (95 % CI {c.ci95[0]:.2f}-{c.ci95[1]:.2f}x): "
                f"{c.verdict}" + ("; noisy (IQR > 10 % of median): close other programs "
                                  "or measure more steps" if noisy else ""))
        else:
            self.verdict.value = "baseline=False: no baseline to compare against"


def experiment_panel(base: RunConfig, knobs: Mapping[str, Any], *,
                     run_fn: RunFn | None = None, baseline: bool = True,
                     progress: bool = True, title: str | None = None,
                     reload: bool = True) -> ExperimentPanel:
    """A before/after experiment panel: knob controls, a Run button, plot and table.

    Args:
        base: the baseline config; every knob starts at its value.
        knobs: RunConfig field name -> a list of choices (dropdown) or a ``range`` /
            ``(min, max[, step])`` tuple of ints (slider, max inclusive).
        run_fn: called as ``run_fn(config, progress=bool)`` and returns a RunResult;
            None -> :func:`perflab.experiment.run` (which saves each result as JSON).
        baseline: run ``base`` once (cached across clicks) and compare against it.
        progress: passed to ``run_fn``: tqdm's per-step bar, shown inside the panel.
        title: heading of the panel (default "Experiment").
        reload: show this panel's last comparison (same title, baseline and knobs)
            from the saved results, e.g. after a kernel restart; Run measures again.

    Raises:
        TypeError: ``base`` is not a RunConfig.
        ValueError: a knob is not a RunConfig field, its spec is malformed, or the
            base value is not one of its choices / not on its slider.
    """
    return ExperimentPanel(base, knobs, run_fn=run_fn, baseline=baseline,
                           progress=progress, title=title, reload=reload)
