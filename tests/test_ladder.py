"""The optimization ladder: decisions follow the statistics, reports are complete."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from perflab.cli import main
from perflab.config import RunConfig
from perflab.panels import ladder_panel
from perflab.ladder import (RUNGS, SIZES, checkpointed_batch_size, climb,
                            naive_config, per_sample, rung_config)
from perflab.ladder_report import TABLE_COLUMNS
from perflab.measurement import Measurement, compare
from perflab.memory import PeakMemory
from perflab.result import PHASES, RunResult

#: Seconds per sample of each fake variant: data loading 4x faster, amp no change,
#: channels_last slower, compile 1.5x faster (decided per config by _fake_speed).
def _fake_speed(c: RunConfig) -> float:
    s = 0.010
    if c.decoded_cache != "off":
        s /= 4
    if c.channels_last:
        s *= 1.3
    if c.compile != "off":
        s /= 1.5
    return s


def _fake_result(config: RunConfig, seed: int, steps: int = 12) -> RunResult:
    gen = torch.Generator().manual_seed(seed)
    per = _fake_speed(config) * config.batch_size
    times = (per * (1 + 0.05 * torch.rand(steps, generator=gen))).tolist()  # 5 % noise
    parts = {"data": 0.2, "forward": 0.3, "backward": 0.4, "optimizer": 0.1, "other": 0.0}
    phases = {p: Measurement(p, tuple(t * f for t in times)) for p, f in parts.items()}
    phases["step"] = Measurement("step", tuple(times), samples_per_step=config.batch_size)
    return RunResult(config=config, phases=phases, losses=(2.3,) * steps,
                     peak_memory=PeakMemory(2**30, "fake"), env={"device": "cpu"},
                     num_classes=10, wall_s=1.0)


class FakeRuns:
    """Stands in for run_interleaved: seeded synthetic step times, calls recorded."""

    def __init__(self):
        self.calls: list[list[RunConfig]] = []

    def __call__(self, configs, *, rounds, progress):
        self.calls.append(list(configs))
        return [_fake_result(c, seed=len(self.calls) * 10 + i) for i, c in enumerate(configs)]


def _tiny(**kw) -> RunConfig:
    return naive_config("tiny", model="tiny", device="cpu", **kw)


def test_decisions_follow_the_statistics(tmp_path):
    fake = FakeRuns()
    lad = climb(_tiny(), rounds=1, progress=False, out_dir=tmp_path, run_fn=fake)
    assert lad.kept == ["data_loading", "compile"]
    assert lad.dropped == ["amp", "channels_last"]
    assert "larger_batch" in lad.skipped and "no stages" in lad.skipped["larger_batch"]
    table = lad.table
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert list(table.rung) == ["baseline", *RUNGS]
    for rung in lad.rungs:  # recompute each decision from the saved per-sample times
        c = compare(per_sample(rung.incumbent.step, rung.incumbent.config.batch_size, "a"),
                    per_sample(rung.candidate.step, rung.candidate.config.batch_size, "b"))
        assert rung.kept == (c.p_value < 0.05 and c.speedup > 1)
        row = table.set_index("rung").loc[rung.name]
        assert row.status == ("kept" if rung.kept else "dropped")
        assert row.p_value == pytest.approx(c.p_value)
    # each rung is measured against the best so far: amp's incumbent has the cache
    assert fake.calls[1][0].decoded_cache == "memory"
    assert fake.calls[2][0].amp == "off"  # amp was dropped
    assert lad.best_config.compile == "default" and not lad.best_config.channels_last
    assert lad.cumulative_speedup == pytest.approx(
        lad.rungs[0].comparison.speedup * lad.rungs[3].comparison.speedup)
    assert table.cumulative_speedup.iloc[-1] == pytest.approx(lad.cumulative_speedup)
    assert lad.cumulative_speedup == pytest.approx(6.0, rel=0.1)
    # saved as measured: incumbent + candidate per rung
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2 * len(lad.rungs)


def test_report_files_and_text(tmp_path):
    lad = climb(_tiny(), rungs=["data_loading", "amp"], skip=["amp"], rounds=1,
                progress=False, out_dir=tmp_path, run_fn=FakeRuns())
    report = lad.write_report()
    assert report == tmp_path / "report.md"
    for name in ("waterfall.png", "phases.png", "table.csv"):
        assert (tmp_path / name).stat().st_size > 0
    text = report.read_text()
    assert "**amp** skipped: skipped on request" in text and "## Environment" in text
    assert list(pd.read_csv(tmp_path / "table.csv").columns) == list(TABLE_COLUMNS)
    fig = lad.plot_waterfall()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["data_loading", "total"]


def test_unsaved_ladder_needs_a_report_folder(tmp_path):
    lad = climb(_tiny(), rungs=["amp"], rounds=1, progress=False, save=False,
                run_fn=FakeRuns())
    assert lad.out_dir is None and lad.dropped == ["amp"]
    with pytest.raises(ValueError, match="save=False; pass write_report"):
        lad.write_report()
    assert lad.write_report(tmp_path).is_file()


@pytest.mark.parametrize("kwargs, message", [
    (dict(rungs=["fast"]), r"unknown rung\(s\) \['fast'\] in rungs"),
    (dict(skip=["nope"]), r"unknown rung\(s\) \['nope'\] in skip"),
    (dict(rungs="amp"), "must be a list of rung names"),
    (dict(rungs=["amp", "amp"]), "lists a rung twice"),
    (dict(rounds=0), "rounds must be an int >= 1"),
    (dict(alpha=1.5), r"alpha must be in \(0, 1\)"),
    (dict(size="huge"), "size must be one of"),
    (dict(config="resnet18"), "config must be a RunConfig"),
])
def test_bad_input_fails_before_any_run(kwargs, message):
    fake = FakeRuns()
    kwargs.setdefault("config", None)
    with pytest.raises(ValueError, match=message):
        climb(progress=False, save=False, run_fn=fake, **kwargs)
    assert fake.calls == []


def test_rung_configs():
    base = _tiny()
    assert rung_config("data_loading", base).decoded_cache == "memory"
    assert rung_config("data_loading", base).device_prefetch
    assert rung_config("amp", base).amp == "bf16"  # a CPU: bf16 autocast
    assert rung_config("channels_last", base).channels_last
    assert rung_config("compile", base).compile == "default"
    assert "no stages" in rung_config("larger_batch", base)
    on = base.replace(decoded_cache="memory", amp="bf16", channels_last=True,
                      compile="default")
    for rung in RUNGS[:4]:
        assert "already on" in rung_config(rung, on)
    big = rung_config("larger_batch", naive_config("tiny"), batch_size=24)
    assert (big.checkpointing, big.batch_size) == ("per_stage", 24)
    with pytest.raises(ValueError, match="unknown rung 'turbo'"):
        rung_config("turbo", base)
    assert set(SIZES) == {"tiny", "quick", "full"}
    assert all(s["warmup_steps"] >= 1 for s in SIZES.values())  # compile's first step


def test_checkpointing_makes_room_for_a_larger_batch():
    n, how = checkpointed_batch_size(naive_config("tiny", device="cpu"))
    assert n > SIZES["tiny"]["batch_size"] and "per-stage checkpointing" in how


def test_cli_ladder_tiny(tiny_dataset, tmp_path, capsys):
    out = tmp_path / "ladder"
    rc = main(["ladder", "--size", "tiny", "--model", "tiny", "--dataset", tiny_dataset,
               "--skip", "compile", "--rounds", "1", "--steps", "6", "--out", str(out),
               "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    for col in ("rung", "step_time_ms", "samples_per_s", "speedup", "cumulative_speedup",
                "mfu_pct", "peak_mem_gib"):
        assert col in text
    table = pd.read_csv(out / "table.csv")
    assert list(table.rung) == ["baseline", *RUNGS]
    measured = table[table.status.isin(["kept", "dropped"])]
    assert len(measured) == 3  # data_loading, amp, channels_last
    follows = (measured.p_value < 0.05) & (measured.speedup > 1)
    assert ((measured.status == "kept") == follows).all()
    assert set(table.status[table.rung.isin(["compile", "larger_batch"])]) == {"skipped"}
    for name in ("report.md", "waterfall.png", "phases.png"):
        assert (out / name).is_file()
    runs = list((out / "runs").glob("*.json"))
    assert len(runs) == 6 and all(json.loads(p.read_text())["schema"] == 1 for p in runs)


def test_cli_ladder_bad_rung_is_an_error_before_work(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["ladder", "--rungs", "data_loading,warp", "--out", str(out)]) == 2
    assert "unknown rung(s) ['warp']" in capsys.readouterr().err
    assert not out.exists()


def test_ladder_panel(tiny_dataset, results_dir):
    panel = ladder_panel(_tiny(dataset=tiny_dataset), rungs=["data_loading"], rounds=1,
                         progress=False)
    assert "perflab-panel" in panel.widget._dom_classes
    assert "perflab-run" in panel.run_button._dom_classes
    assert "perflab-plot" in panel.image._dom_classes
    assert [b.description for b in panel.boxes.values() if b.value] == ["data_loading"]
    lad = panel.run(raise_errors=True)
    assert lad is panel.ladder and panel.image.value[:4] == b"\x89PNG"
    assert "data_loading" in panel.table.value and panel.error.value == ""
    with pytest.raises(ValueError, match="unknown rung"):
        ladder_panel(rungs=["warp"])


def test_ladder_panel_shows_errors(tiny_dataset, results_dir):
    panel = ladder_panel(_tiny(dataset=tiny_dataset, batch_size=1000), rounds=1,
                         progress=False)
    assert panel.run() is None
    assert "batch_size=1000" in panel.error.value and not panel.run_button.disabled


def test_noisy_rungs_are_flagged(tmp_path):
    def noisy_runs(configs, *, rounds, progress):
        out = [_fake_result(c, seed=i) for i, c in enumerate(configs)]
        step = out[1].phases["step"]  # the candidate: every other step 3x slower
        times = tuple(t * (3 if i % 2 else 1) for i, t in enumerate(step.times_s))
        phases = dict(out[1].phases, step=Measurement("step", times,
                                                      samples_per_step=step.samples_per_step))
        return [out[0], dataclasses.replace(out[1], phases=phases)]

    lad = climb(_tiny(), rungs=["amp"], rounds=1, progress=False, out_dir=tmp_path,
                run_fn=noisy_runs)
    assert "noisy (IQR > 10 % of the median" in lad.table.verdict.iloc[-1]
    assert "Noisy measurements (IQR > 10 % of the median) in: amp" in (
        lad.write_report().read_text())


def test_rounds_default_per_size():
    from perflab.ladder import ROUNDS

    seen = []

    def record(configs, *, rounds, progress):
        seen.append(rounds)
        return FakeRuns()(configs, rounds=rounds, progress=progress)

    for size in ("tiny", "quick"):
        climb(_tiny(), size=size, rungs=["amp"], progress=False, save=False, run_fn=record)
    climb(_tiny(), rungs=["amp"], rounds=5, progress=False, save=False, run_fn=record)
    assert seen == [ROUNDS["tiny"], ROUNDS["quick"], 5]
