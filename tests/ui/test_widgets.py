"""perflab.ui.widgets.experiment_panel with an injected, fake run function (no training)."""
from __future__ import annotations

import ipywidgets as W
import pytest

from perflab.ui import widgets
from perflab.core.config import RunConfig
from perflab.core.result import RunResult
from tests.synthetic import synthetic_result
from perflab.ui.widgets import ExperimentPanel, experiment_panel

PNG = b"\x89PNG\r\n\x1a\n"
BASE = RunConfig(device="cpu", model="tiny", batch_size=8, steps=6, warmup_steps=1)


def synth(config: RunConfig) -> RunResult:
    """A RunResult whose data time falls with num_workers (fixed numbers, ms)."""
    return synthetic_result(config, {"data": 60.0 / (1 + config.num_workers), "forward": 40.0,
                                     "backward": 80.0, "optimizer": 10.0, "other": 1.0},
                            n=config.steps)


class FakeRun:
    """Records calls; optionally inspects the panel mid-run or raises."""

    def __init__(self, during=None, fail: Exception | None = None):
        self.configs: list[RunConfig] = []
        self.during, self.fail = during, fail

    def __call__(self, config: RunConfig, *, progress: bool = True) -> RunResult:
        self.configs.append(config)
        if self.during:
            self.during()
        if self.fail:
            raise self.fail
        return synth(config)


def make(run_fn=None, **kw) -> ExperimentPanel:
    knobs = {"num_workers": [0, 1, 2], "batch_size": (4, 32, 4)}
    return experiment_panel(BASE, knobs, run_fn=run_fn or FakeRun(), progress=False, **kw)


def test_panel_builds_controls_and_widgets():
    panel = make()
    assert isinstance(panel.widget, W.VBox)
    assert isinstance(panel.controls["num_workers"], W.Dropdown)
    slider = panel.controls["batch_size"]
    assert isinstance(slider, W.IntSlider)
    assert (slider.min, slider.max, slider.step, slider.value) == (4, 32, 4, 8)
    assert panel.values() == {"num_workers": 0, "batch_size": 8}
    assert "perflab-run" in panel.run_button._dom_classes
    assert "perflab-plot" in panel.image._dom_classes
    assert "perflab-error" in panel.error._dom_classes
    assert panel.image.format == "png"
    assert "application/vnd.jupyter.widget-view+json" in panel._repr_mimebundle_()
    assert "0x" not in repr(panel) and "num_workers" in repr(panel)


def test_dropdown_with_none_and_range_slider():
    panel = experiment_panel(BASE, {"threads": [None, 1, 2], "steps": range(2, 12, 2)},
                             run_fn=FakeRun(), progress=False)
    assert panel.values() == {"threads": None, "steps": 6}
    panel.controls["threads"].index = 2
    assert panel.variant_config().threads == 2


@pytest.mark.parametrize("knobs, match", [
    ({"num_wrokers": [0, 1]}, "'num_wrokers' is not a RunConfig field"),
    ({"num_workers": [1, 2]}, "base.num_workers=0 is not among the choices"),
    ({"num_workers": []}, "empty list of choices"),
    ({"batch_size": (16, 64, 16)}, "base.batch_size=8 is not on the slider 16..64"),
    ({"batch_size": (4, 32, 3)}, "not on the slider"),
    ({"batch_size": (4.0, 32.0)}, "of ints"),
    ({"batch_size": (32, 4)}, "min <= max"),
    ({"batch_size": range(0)}, "is empty"),
    ({"threads": (1, 4)}, r"base.threads=None is not on the slider"),
    ({"pin_memory": {True, False}}, "expected a list of choices"),
    ({"pin_memory": [0, 1]}, "base.pin_memory=False is not among the choices"),
])
def test_bad_knobs_raise(knobs, match):
    with pytest.raises(ValueError, match=match):
        experiment_panel(BASE, knobs, run_fn=FakeRun())


def test_base_must_be_a_runconfig():
    with pytest.raises(TypeError, match="RunConfig"):
        experiment_panel({"batch_size": 8}, {}, run_fn=FakeRun())


def test_run_shows_plot_table_verdict_and_caches_baseline():
    fake = FakeRun()
    panel = make(fake)
    panel.controls["num_workers"].value = 2
    variant = panel.run()
    assert variant is not None and variant.config.num_workers == 2
    assert bytes(panel.image.value).startswith(PNG)
    assert "<table" in panel.table.value and "speedup" in panel.table.value
    assert "workers=2" in panel.table.value and "1.00x" in panel.table.value
    assert "faster" in panel.verdict.value
    assert [c.num_workers for c in fake.configs] == [0, 2]
    assert fake.configs[0] == BASE
    panel.controls["num_workers"].value = 1
    panel.run()
    assert [c.num_workers for c in fake.configs] == [0, 2, 1]  # baseline ran once
    assert len(panel.results) == 3 and panel.results[0] is panel.baseline_result
    assert panel.error.value == "" and panel.progress.value == panel.progress.max == 1


def test_unchanged_knobs_get_a_distinct_label():
    panel = make()
    variant = panel.run()
    assert variant.label != panel.baseline_result.label
    assert "no significant difference" in panel.verdict.value


def test_baseline_false_runs_only_the_variant():
    fake = FakeRun()
    panel = make(fake, baseline=False)
    panel.run()
    assert len(fake.configs) == 1 and bytes(panel.image.value).startswith(PNG)
    assert "no baseline" in panel.verdict.value


def test_button_disabled_while_running_and_second_click_ignored():
    seen = []

    def during():
        seen.append((panel.run_button.disabled, panel.controls["num_workers"].disabled))
        panel.run_button.click()  # re-entrant click: must be ignored
        assert panel.run() is None

    fake = FakeRun(during)
    panel = make(fake)
    panel.run()
    assert seen == [(True, True), (True, True)]
    assert len(fake.configs) == 2  # baseline + variant, no extra runs
    assert not panel.run_button.disabled and not panel.controls["num_workers"].disabled


def test_click_runs_and_a_queued_click_is_ignored(monkeypatch):
    fake = FakeRun()
    panel = make(fake)
    panel.run_button.click()
    assert len(fake.configs) == 2 and bytes(panel.image.value).startswith(PNG)
    panel.run_button.click()  # arrives right after the run ended: was queued
    assert len(fake.configs) == 2
    monkeypatch.setattr(widgets, "QUEUED_CLICK_WINDOW_S", 0.0)
    panel.run_button.click()  # a later, deliberate click runs again
    assert len(fake.configs) == 3


def test_run_error_is_shown_and_panel_stays_usable():
    fake = FakeRun(fail=RuntimeError("DataLoader worker (pid 123) is killed <boom>"))
    panel = make(fake)
    assert panel.run() is None
    assert "RuntimeError" in panel.error.value and "&lt;boom&gt;" in panel.error.value
    assert "Traceback" not in panel.error.value
    assert "failed" in panel.status.value
    assert not panel.run_button.disabled and panel.results == []
    fake.fail = None
    assert panel.run() is not None  # recovers; the failed baseline was not cached
    assert panel.error.value == "" and len(panel.results) == 2
    fake.fail = KeyError("x")
    with pytest.raises(KeyError):
        panel.run(raise_errors=True)
    assert not panel.run_button.disabled


def test_invalid_combination_shown_in_status_and_nothing_runs():
    fake = FakeRun()
    panel = experiment_panel(BASE, {"persistent_workers": [False, True]}, run_fn=fake,
                             progress=False)
    panel.controls["persistent_workers"].index = 1  # needs num_workers > 0
    assert panel.run() is None
    assert fake.configs == []
    assert "invalid settings" in panel.status.value and "color:#b00020" in panel.status.value
    assert "num_workers" in panel.error.value
    with pytest.raises(ValueError, match="num_workers"):
        panel.run(raise_errors=True)


class SavingRun(FakeRun):
    """A fake run that saves its result, as perflab.run does."""

    def __call__(self, config: RunConfig, *, progress: bool = True) -> RunResult:
        return super().__call__(config, progress=progress).save()


def test_a_rebuilt_panel_reloads_its_last_comparison_instead_of_rerunning(results_dir):
    first = make(SavingRun())
    first.controls["num_workers"].value = 2
    shown = first.run()
    assert first.state_path.is_file() and first.state_path.parent == results_dir / "panels"

    fake = SavingRun()                                # the kernel restarted: a new panel
    again = make(fake)
    assert fake.configs == []                         # nothing re-ran
    assert again.baseline_result.path == first.baseline_result.path
    assert [r.path for r in again.results] == [first.baseline_result.path, shown.path]
    assert again.controls["num_workers"].value == 2   # the knobs it was run with
    assert bytes(again.image.value).startswith(PNG) and "faster" in again.verdict.value
    assert "reloaded the run measured" in again.status.value and shown.path in again.status.value
    again.controls["num_workers"].value = 1
    again.run()
    assert [c.num_workers for c in fake.configs] == [1]   # the reloaded baseline is reused


def test_reload_only_matches_the_same_panel_and_survives_a_broken_record(results_dir):
    panel = make(SavingRun())
    panel.run()
    assert make(SavingRun(), title="another panel").results == []
    assert make(SavingRun(), reload=False).results == []
    panel.state_path.write_text("{not json")
    fresh = make(SavingRun())
    assert fresh.results == [] and fresh.status.value == "ready"


def test_attention_panel_runs_the_measure_it_is_given_and_shows_both():
    """Lab 11's panel: Run calls measure(T, block, causal) with the controls' values, draws
    the rows as bars and sums them up in the status line; a measure that raises is shown,
    and bad choices are refused before any widget is built."""
    from perflab.ui.kernel_panel import attention_panel

    calls = []

    def measure(T, block, causal):
        calls.append((T, block, causal))
        return [{"impl": "naive", "peak_mib": 4.0, "median_ms": 2.0},
                {"impl": "tiled (yours)", "peak_mib": 0.5, "median_ms": 3.0}]

    panel = attention_panel(measure, seq_lens=(64, 128), block_sizes=(16, 32), causal=False)
    panel.seq.value, panel.block.value = 128, 32
    result = panel.run(raise_errors=True)
    assert calls == [(128, 32, False)] and result["rows"][1]["peak_mib"] == 0.5
    assert panel.image.value and "naive: 4 MiB, 2 ms; tiled (yours): 0.5 MiB, 3 ms" in panel.status.value

    def broken(T, block, causal):
        raise RuntimeError("out of memory")

    bad = attention_panel(broken, seq_lens=(64,), block_sizes=(16,))
    bad.run()
    assert "out of memory" in bad.error.value
    with pytest.raises(ValueError, match="block_sizes must be ints >= 1"):
        attention_panel(measure, block_sizes=())
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        from perflab.viz.kernel_plots import plot_impl_bars
        plot_impl_bars([{"impl": "x"}])
