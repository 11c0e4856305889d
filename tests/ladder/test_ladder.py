"""The optimization ladder: a search whose decisions follow the statistics.

The search logic is tested with seeded fake measurements (a speed per combination of
rungs, 5 % noise): no live timing is asserted. The live tests only check the plumbing.
"""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from perflab.train import step as step_module
from perflab.cli import main
from perflab.core.config import RunConfig
from perflab.ladder.search import climb, resume_climb, search_all
from perflab.ladder.report import TABLE_COLUMNS
from perflab.ladder.rungs import (
    RUNGS, SIZES, applied, checkpointed_batch_size, make_variant, naive_config, per_sample,
    rung_config, unavailable,
)
from perflab.core.measurement import Measurement, compare
from perflab.core.memory import PeakMemory
from perflab.ui.panels import ladder_panel
from perflab.core.result import RunResult


def features(c: RunConfig) -> frozenset[str]:
    """Which rungs a config (and the optimizer options in force) has on."""
    on = {"data_loading": c.decoded_cache != "off", "amp": c.amp != "off",
          "channels_last": c.channels_last, "compile": c.compile != "off",
          "threads": c.threads is not None, "larger_batch": c.checkpointing != "none",
          "fused_optimizer": step_module._optimizer_kwargs.get("fused", False)}
    return frozenset(k for k, v in on.items() if v)


def _fake_result(config: RunConfig, per_sample_s: float, seed: int, steps: int = 12
                 ) -> RunResult:
    gen = torch.Generator().manual_seed(seed)
    per = per_sample_s * config.batch_size
    times = (per * (1 + 0.05 * torch.rand(steps, generator=gen))).tolist()  # 5 % noise
    parts = {"data": 0.2, "forward": 0.3, "backward": 0.4, "optimizer": 0.1, "other": 0.0}
    phases = {p: Measurement(p, tuple(t * f for t in times)) for p, f in parts.items()}
    phases["step"] = Measurement("step", tuple(times), samples_per_step=config.batch_size)
    return RunResult(config=config, phases=phases, losses=(2.3,) * steps,
                     peak_memory=PeakMemory(2**30, "fake"), env={"device": "cpu"},
                     num_classes=10, wall_s=1.0)


class FakeRuns:
    """Stands in for run_interleaved: seconds per sample from ``speed(features)``,
    seeded noise; every call's configs and optimizer options recorded."""

    def __init__(self, speed=None, interrupt_at: int | None = None):
        self.speed = speed or default_speed
        self.calls: list[list[RunConfig]] = []
        self.options: list[dict] = []
        self.interrupt_at = interrupt_at

    def __call__(self, configs, *, rounds, progress):
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        self.calls.append(list(configs))
        self.options.append(dict(step_module._optimizer_kwargs))
        return [_fake_result(c, self.speed(features(c)), seed=1000 + len(self.calls) + i)
                for i, c in enumerate(configs)]


def default_speed(on: frozenset[str]) -> float:
    """Data loading 4x faster, amp no change, channels_last slower, compile 1.5x faster."""
    s = 0.010
    s /= 4 if "data_loading" in on else 1
    s *= 1.3 if "channels_last" in on else 1
    s /= 1.5 if "compile" in on else 1
    return s


def _tiny(**kw) -> RunConfig:
    return naive_config("tiny", model="tiny", device="cpu", **kw)


FOUR = ["data_loading", "amp", "channels_last", "compile"]


def test_decisions_follow_the_statistics(tmp_path):
    fake = FakeRuns()
    lad = climb(_tiny(), rungs=FOUR + ["larger_batch"], rounds=1, progress=False,
                out_dir=tmp_path, run_fn=fake)
    assert lad.kept == ["data_loading", "compile"]
    assert "larger_batch" in lad.skipped and "no stages" in lad.skipped["larger_batch"]
    assert lad.greedy_on == lad.best_on == ("data_loading", "compile")
    table = lad.table
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert list(table.rung[:5]) == ["baseline", *FOUR]
    for rung in lad.rungs:  # recompute each decision from the saved per-sample times
        c = compare(per_sample(rung.incumbent.step, rung.incumbent.config.batch_size, "a"),
                    per_sample(rung.candidate.step, rung.candidate.config.batch_size, "b"))
        assert rung.kept == (c.p_value < 0.05 and c.speedup > 1)
    by_row = table.iloc[1:1 + len(lad.rungs)]
    assert list(by_row.status) == ["kept" if r.kept else "dropped" for r in lad.rungs]
    # amp's incumbent already has the cache; compile's has amp off (amp was dropped)
    assert lad.rungs[1].incumbent.config.decoded_cache == "memory"
    assert lad.rungs[3].incumbent.config.amp == "off"
    assert lad.best_config.compile == "default" and not lad.best_config.channels_last
    assert table.cumulative_speedup.iloc[-1] == pytest.approx(lad.cumulative_speedup)
    assert lad.cumulative_speedup == pytest.approx(6.0, rel=0.1)
    # saved as measured: incumbent + candidate per trial, each round too
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2 * lad.trials
    assert len(list((tmp_path / "runs" / "rounds").glob("*.json"))) == 2 * lad.trials
    tags = [json.loads(p.read_text())["extra"]["ladder"]
            for p in (tmp_path / "runs").glob("*.json")]
    assert {t["trial"] for t in tags} == set(range(lad.trials))
    # the same pair is never measured twice; nothing kept after the first pass but
    # compile, so the search re-tries amp and channels_last on the new best only
    pairs = [(r.incumbent.config.label, r.candidate.config.label) for r in lad.rungs]
    assert len(pairs) == len(set(pairs))


def test_search_finds_an_interaction_the_greedy_pass_misses(tmp_path):
    def speed(on):  # bf16 alone and NHWC alone are slower; together 1.6x faster
        amp, cl = "amp" in on, "channels_last" in on
        return 0.010 * (0.6 if amp and cl else 1.1 if amp or cl else 1.0)

    lad = climb(_tiny(), rungs=["amp", "channels_last"], rounds=1, progress=False,
                out_dir=tmp_path, run_fn=FakeRuns(speed))
    assert lad.greedy_on == ()
    assert lad.best_on == ("amp", "channels_last")
    joint = [r for r in lad.rungs if r.move == "joint"]
    assert [r.name for r in joint] == ["amp+channels_last"] and joint[0].kept
    assert lad.best_config.amp == "bf16" and lad.best_config.channels_last
    greedy = climb(_tiny(), rungs=["amp", "channels_last"], rounds=1, progress=False,
                   save=False, run_fn=FakeRuns(speed), search=False)
    assert greedy.best_on == () and greedy.trials == 2


def test_a_dropped_rung_is_retried_after_a_later_one_is_kept(tmp_path):
    def speed(on):  # amp pays only once the data no longer dominates
        s = 0.010 / (4 if "data_loading" in on else 1)
        if "amp" in on:
            s *= 0.7 if "data_loading" in on else 1.02
        return s

    lad = climb(_tiny(), rungs=["amp", "data_loading"], rounds=1, progress=False,
                out_dir=tmp_path, run_fn=FakeRuns(speed))
    assert lad.greedy_on == ("data_loading",)
    assert [(r.name, r.move, r.kept) for r in lad.rungs][:3] == [
        ("amp", "add", False), ("data_loading", "add", True), ("amp", "retry", True)]
    assert lad.best_on == ("data_loading", "amp")


def test_a_kept_rung_made_useless_by_a_later_one_is_removed(tmp_path):
    def speed(on):  # NHWC helps eager, but hurts the compiled model
        cl, comp = "channels_last" in on, "compile" in on
        return 0.010 * (0.6 if cl and comp else 0.5 if comp else 0.8 if cl else 1.0)

    lad = climb(_tiny(), rungs=["channels_last", "compile"], rounds=1, progress=False,
                out_dir=tmp_path, run_fn=FakeRuns(speed))
    assert lad.greedy_on == ("channels_last", "compile")
    removal = [r for r in lad.rungs if r.move == "remove"]
    assert [r.name for r in removal] == ["-channels_last"] and removal[0].kept
    assert lad.best_on == ("compile",) and not lad.best_config.channels_last
    assert "channels_last" not in lad.table.set_index("rung").loc["-channels_last", "change"] \
        or "channels_last=False" in lad.table.set_index("rung").loc["-channels_last", "change"]


def test_the_search_ends_at_the_exhaustive_best():
    gen = torch.Generator().manual_seed(3)
    effect = {r: float(x) for r, x in zip(FOUR, 0.6 + 0.8 * torch.rand(4, generator=gen))}

    def speed(on):  # seeded effects, and amp x channels_last interact
        s = 0.010
        for r in on:
            s *= effect[r]
        if {"amp", "channels_last"} <= on:
            s *= 0.7
        return s

    table = search_all(_tiny(), rungs=FOUR, rounds=1, progress=False, run_fn=FakeRuns(speed))
    assert len(table) == 2 ** 4 and table.ms_per_sample.is_monotonic_increasing
    lad = climb(_tiny(), rungs=FOUR, rounds=1, progress=False, save=False,
                run_fn=FakeRuns(speed))
    best = table.iloc[0]
    assert "+".join(lad.best_on) == best.key
    assert best.ms_per_sample_ci_low <= best.ms_per_sample <= best.ms_per_sample_ci_high


def test_settings_rungs_apply_around_their_own_runs_only(tmp_path):
    def speed(on):
        return 0.010 * (0.7 if "fused_optimizer" in on else 1.0)

    fake = FakeRuns(speed)
    lad = climb(_tiny(), rungs=["fused_optimizer"], rounds=2, progress=False,
                out_dir=tmp_path, run_fn=fake)
    assert lad.best_on == ("fused_optimizer",) and lad.best_settings == ("fused_optimizer",)
    # A B A B: the baseline without, the candidate with fused=True, restored after
    assert fake.options == [{}, {"fused": True}, {}, {"fused": True}]
    assert step_module._optimizer_kwargs == {}
    assert "fused_optimizer=True" in lad.rungs[0].change
    with applied(["fused_optimizer", "cudnn_benchmark"]):
        assert step_module._optimizer_kwargs == {"fused": True}
        assert torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.benchmark and step_module._optimizer_kwargs == {}


def test_rungs_this_hardware_lacks_are_skipped_with_a_reason():
    lad = climb(_tiny(), rounds=1, progress=False, save=False, run_fn=FakeRuns(),
                max_trials=3)
    if not torch.cuda.is_available():
        for rung in ("max_autotune", "cuda_graphs", "cudnn_benchmark"):
            assert lad.skipped[rung].startswith("GPU only")
    assert lad.trials == 3  # max_trials bounds the search
    if torch.get_num_threads() >= 2:
        assert unavailable("threads", _tiny()) is None
        assert rung_config("threads", _tiny()).threads == torch.get_num_threads() // 2


def test_interrupted_ladder_resumes_from_its_saved_runs(tmp_path, capsys):
    def speed(on):
        return default_speed(on) * (0.6 if {"amp", "channels_last"} <= on else 1.0)

    whole = climb(_tiny(), rungs=FOUR, rounds=1, progress=False, save=False,
                  run_fn=FakeRuns(speed))
    with pytest.raises(KeyboardInterrupt):
        climb(_tiny(), rungs=FOUR, rounds=1, progress=False, out_dir=tmp_path,
              run_fn=FakeRuns(speed, interrupt_at=7))  # in trial 3's second run
    said = capsys.readouterr().out
    assert "ladder interrupted: 6 result(s) of 3 finished trial(s) saved in" in said
    assert f"perflab ladder --resume {tmp_path}" in said
    fake = FakeRuns(speed)
    lad = resume_climb(tmp_path, progress=False, run_fn=fake)
    assert len(fake.calls) == 2 * (lad.trials - 3)  # only the missing trials measured
    assert [(r.name, r.kept) for r in lad.rungs] == [(r.name, r.kept) for r in whole.rungs]
    assert lad.best_on == whole.best_on
    # a finished ladder replays without measuring: the report is rebuilt from runs/
    again = FakeRuns(speed)
    rebuilt = resume_climb(tmp_path, progress=False, run_fn=again)
    assert again.calls == [] and rebuilt.best_on == lad.best_on
    assert rebuilt.write_report().is_file() and (tmp_path / "table.csv").is_file()


def test_resume_needs_a_ladder_folder_and_a_new_climb_a_new_one(tmp_path):
    with pytest.raises(ValueError, match="holds no ladder.json"):
        resume_climb(tmp_path)
    climb(_tiny(), rungs=["amp"], rounds=1, progress=False, out_dir=tmp_path,
          run_fn=FakeRuns())
    fake = FakeRuns()
    with pytest.raises(ValueError, match="already holds a ladder .*--resume"):
        climb(_tiny(), rungs=["amp"], rounds=1, progress=False, out_dir=tmp_path,
              run_fn=fake)
    assert fake.calls == []


def test_report_files_and_text(tmp_path):
    lad = climb(_tiny(), rungs=["data_loading", "amp"], skip=["amp"], rounds=1,
                progress=False, out_dir=tmp_path, run_fn=FakeRuns())
    report = lad.write_report()
    assert report == tmp_path / "report.md"
    for name in ("waterfall.png", "phases.png", "table.csv"):
        assert (tmp_path / name).stat().st_size > 0
    text = report.read_text()
    assert "**amp** skipped: skipped on request" in text and "## Environment" in text
    assert "Why, from this machine's roofline" in text and "fp32    matmul" in text
    assert "The first, greedy pass alone kept `data_loading`" in text
    assert list(pd.read_csv(tmp_path / "table.csv").columns) == list(TABLE_COLUMNS)
    fig = lad.plot_waterfall()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["data_loading", "total"]


def test_mfu_is_against_the_peak_of_the_runs_dtype():
    lad = climb(_tiny(), rungs=["amp"], rounds=1, progress=False, save=False,
                run_fn=FakeRuns())
    table = lad.table.set_index("rung")
    assert table.loc["baseline", "mfu_peak"].startswith("fp32 ")
    assert table.loc["amp", "mfu_peak"].startswith("bf16 ")
    assert "measured:" in table.loc["amp", "mfu_peak"]


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
    (dict(max_trials=0), "max_trials must be None or an int >= 1"),
])
def test_bad_input_fails_before_any_run(kwargs, message):
    fake = FakeRuns()
    kwargs.setdefault("config", None)
    with pytest.raises(ValueError, match=message):
        climb(progress=False, save=False, run_fn=fake, **kwargs)
    assert fake.calls == []


def test_an_unwritable_out_dir_fails_before_any_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    fake = FakeRuns()
    with pytest.raises(ValueError, match="out_dir=.* is a file"):
        climb(_tiny(), rungs=["amp"], rounds=1, progress=False, out_dir=blocker,
              run_fn=fake)
    assert fake.calls == []


def test_rung_configs_and_variants():
    base = _tiny()
    assert rung_config("data_loading", base).decoded_cache == "memory"
    assert rung_config("data_loading", base).device_prefetch
    assert rung_config("amp", base).amp == "bf16"  # a CPU: bf16 autocast
    assert rung_config("channels_last", base).channels_last
    assert rung_config("compile", base).compile == "default"
    assert "no stages" in rung_config("larger_batch", base)
    assert "setting around the run" in rung_config("fused_optimizer", base)
    on = base.replace(decoded_cache="memory", amp="bf16", channels_last=True,
                      compile="default")
    for rung in FOUR:
        assert "already on" in rung_config(rung, on)
    big = rung_config("larger_batch", naive_config("tiny"), batch_size=24)
    assert (big.checkpointing, big.batch_size) == ("per_stage", 24)
    v = make_variant(base, ["compile", "amp", "fused_optimizer"])
    assert v.on == ("amp", "compile", "fused_optimizer") and v.key == "amp+compile+fused_optimizer"
    assert v.settings == ("fused_optimizer",) and v.config.label == v.key
    with pytest.raises(ValueError, match="at most one of"):
        make_variant(base, ["compile", "max_autotune"])
    with pytest.raises(ValueError, match="unknown rung 'turbo'"):
        rung_config("turbo", base)
    assert set(SIZES) == {"tiny", "quick", "full"}
    assert all(s["warmup_steps"] >= 1 for s in SIZES.values())  # compile's first step
    assert RUNGS[:4] == tuple(FOUR)


def test_checkpointing_makes_room_for_a_larger_batch():
    n, how = checkpointed_batch_size(naive_config("tiny", device="cpu"))
    assert n > SIZES["tiny"]["batch_size"] and "per-stage checkpointing" in how


def test_cli_ladder_tiny(tiny_dataset, tmp_path, capsys):
    out = tmp_path / "ladder"
    rc = main(["ladder", "--size", "tiny", "--model", "tiny", "--dataset", tiny_dataset,
               "--rungs", "data_loading,amp,channels_last", "--rounds", "1", "--steps", "6",
               "--out", str(out), "--quiet", "--max-trials", "4"])
    text = capsys.readouterr().out
    assert rc == 0
    for col in ("rung", "move", "step_time_ms", "samples_per_s", "speedup",
                "cumulative_speedup", "mfu_pct", "peak_mem_gib", "search:"):
        assert col in text
    table = pd.read_csv(out / "table.csv")
    measured = table[table.status.isin(["kept", "dropped"])]
    assert 3 <= len(measured) <= 4
    follows = (measured.p_value < 0.05) & (measured.speedup > 1)
    assert ((measured.status == "kept") == follows).all()
    for name in ("report.md", "waterfall.png", "phases.png", "ladder.json"):
        assert (out / name).is_file()
    runs = list((out / "runs").glob("*.json"))
    assert len(runs) == 2 * len(measured)
    assert all(json.loads(p.read_text())["schema"] == 1 for p in runs)
    # --resume on the finished ladder measures nothing and rebuilds the report
    (out / "report.md").unlink()
    assert main(["ladder", "--resume", str(out), "--quiet"]) == 0
    assert (out / "report.md").is_file()
    assert len(list((out / "runs").glob("*.json"))) == len(runs)


def test_cli_ladder_errors_before_work_and_ctrl_c(tmp_path, capsys, monkeypatch):
    out = tmp_path / "never"
    assert main(["ladder", "--rungs", "data_loading,warp", "--out", str(out)]) == 2
    assert "unknown rung(s) ['warp']" in capsys.readouterr().err
    assert not out.exists()
    assert main(["ladder", "--resume", str(tmp_path)]) == 2
    assert "holds no ladder.json" in capsys.readouterr().err

    import perflab.ladder.search

    def interrupted(*a, **k):
        print("ladder interrupted: 2 result(s) of 1 finished trial(s) saved in X")
        raise KeyboardInterrupt

    monkeypatch.setattr(perflab.ladder.search, "climb", interrupted)
    assert main(["ladder", "--size", "tiny", "--out", str(tmp_path / "x")]) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out


def test_ladder_panel(tiny_dataset, results_dir):
    panel = ladder_panel(_tiny(dataset=tiny_dataset), rungs=["data_loading"], rounds=1,
                         progress=False)
    assert "perflab-panel" in panel.widget._dom_classes
    assert "perflab-run" in panel.run_button._dom_classes
    assert "perflab-plot" in panel.image._dom_classes
    assert [b.description for b in panel.boxes.values() if b.value] == ["data_loading"]
    if not torch.cuda.is_available():
        assert panel.boxes["cuda_graphs"].disabled
        assert "GPU only" in panel.boxes["cuda_graphs"].tooltip
    lad = panel.run(raise_errors=True)
    assert lad is panel.ladder and panel.image.value[:4] == b"\x89PNG"
    assert "data_loading" in panel.table.value and panel.error.value == ""
    with pytest.raises(ValueError, match="unknown rung"):
        ladder_panel(rungs=["warp"])


def test_ladder_panel_shows_errors(tiny_dataset, results_dir):
    panel = ladder_panel(_tiny(dataset=tiny_dataset, batch_size=1000),
                         rungs=["data_loading"], rounds=1, progress=False)
    assert panel.run() is None
    assert "batch_size=1000" in panel.error.value and not panel.run_button.disabled


def test_noisy_rungs_are_flagged(tmp_path):
    calls = []

    def noisy_runs(configs, *, rounds, progress):
        calls.append(1)
        r = _fake_result(configs[0], 0.010, seed=len(calls))
        if len(calls) % 2:  # the baseline: as is
            return [r]
        step = r.phases["step"]  # the candidate: every other step 3x slower
        times = tuple(t * (3 if i % 2 else 1) for i, t in enumerate(step.times_s))
        phases = dict(r.phases, step=Measurement("step", times,
                                                 samples_per_step=step.samples_per_step))
        return [dataclasses.replace(r, phases=phases)]

    lad = climb(_tiny(), rungs=["amp"], rounds=1, progress=False, out_dir=tmp_path,
                run_fn=noisy_runs)
    assert "noisy (IQR > 10 % of the median" in lad.table.verdict.iloc[1]
    assert "Noisy measurements (IQR > 10 % of the median) in: amp" in (
        lad.write_report().read_text())


def test_rounds_default_per_size():
    from perflab.ladder.rungs import ROUNDS

    for size in ("tiny", "quick"):
        fake = FakeRuns()
        climb(_tiny(), size=size, rungs=["amp"], progress=False, save=False, run_fn=fake)
        assert len(fake.calls) == 2 * ROUNDS[size]  # one run per variant per round
    fake = FakeRuns()
    climb(_tiny(), rungs=["amp"], rounds=5, progress=False, save=False, run_fn=fake)
    assert len(fake.calls) == 10


def test_a_rung_far_slower_alone_is_not_retried_in_combinations(tmp_path):
    """bf16 emulated on a CPU: amp ~10x slower alone is never tried again (the ladder
    did not finish in 15 minutes re-trying it with NHWC and compile)."""
    from perflab.ladder.moves import RESCUE_FACTOR

    def speed(on):
        s = 0.010 * (10.0 if "amp" in on else 1.0)
        s /= 1.5 if "compile" in on else 1
        return s * (1.1 if "channels_last" in on else 1.0)

    fake = FakeRuns(speed)
    lad = climb(_tiny(), rungs=["amp", "channels_last", "compile"], rounds=1,
                progress=False, out_dir=tmp_path, run_fn=fake)
    with_amp = [r for r in lad.rungs if "amp" in r.on]
    assert [r.name for r in with_amp] == ["amp"]            # measured once, alone
    assert "not re-tried" in lad.skipped["amp"] and f"{RESCUE_FACTOR:g}x" in lad.skipped["amp"]
    # channels_last, 1.1x slower (under the factor), is still tried jointly / re-tried
    assert len([r for r in lad.rungs if "channels_last" in r.name]) >= 2
    assert lad.best_on == ("compile",)


def test_a_rung_slower_by_less_than_the_factor_is_still_tried_jointly(tmp_path):
    def speed(on):  # bf16 1.5x slower alone, NHWC slower alone; together faster
        amp, cl = "amp" in on, "channels_last" in on
        return 0.010 * (0.6 if amp and cl else 1.5 if amp else 1.1 if cl else 1.0)

    lad = climb(_tiny(), rungs=["amp", "channels_last"], rounds=1, progress=False,
                out_dir=tmp_path, run_fn=FakeRuns(speed))
    assert lad.best_on == ("amp", "channels_last")


def test_budget_skips_moves_that_would_pass_it(tmp_path, monkeypatch, capsys):
    """A fake clock: each run takes 10 s; a 45 s budget measures the first trials and
    names the moves it did not measure."""
    import perflab.ladder.moves as moves
    clock = {"t": 0.0}
    monkeypatch.setattr(moves.time, "monotonic", lambda: clock["t"])

    class Clocked(FakeRuns):
        def __call__(self, configs, *, rounds, progress):
            clock["t"] += 10.0 * len(configs)
            return super().__call__(configs, rounds=rounds, progress=progress)

    lad = climb(_tiny(), rungs=FOUR, rounds=1, progress=False, out_dir=tmp_path,
                run_fn=Clocked(), budget_s=45)
    assert lad.trials == 2                                   # 20 s each; a third passes 45 s
    over = {k: v for k, v in lad.skipped.items() if "budget_s=45" in v}
    assert over and all("would pass budget_s=45 s" in v for v in over.values())
    from perflab.cli.ladder import _print_ladder          # the CLI names what it skipped
    _print_ladder(lad)
    text = capsys.readouterr().out
    for move, why in over.items():   # a rung's own row prints its reason; a move's a line
        assert why in text, (move, text)
    with pytest.raises(ValueError, match="budget_s"):
        climb(_tiny(), rungs=FOUR, rounds=1, progress=False, save=False,
              run_fn=FakeRuns(), budget_s=0)


def test_budget_counts_the_compile_a_new_graph_needs(tmp_path, monkeypatch):
    """A fake clock: each run takes 10 s, and a compiled graph not built before costs
    30 s more in its first step. After the compile trial (50 s), amp on top needs a new
    graph (estimated 20 + 30 s: over a 90 s budget, skipped, the reason named); the
    input pipeline on top reuses the graph (estimated 20 s: measured)."""
    import perflab.ladder.moves as moves
    clock = {"t": 0.0}
    monkeypatch.setattr(moves.time, "monotonic", lambda: clock["t"])
    built: set[frozenset] = set()

    class Compiling(FakeRuns):
        def __call__(self, configs, *, rounds, progress):
            out = super().__call__(configs, rounds=rounds, progress=progress)
            for i, c in enumerate(configs):
                clock["t"] += 10.0
                graph = features(c) - {"data_loading"}
                if c.compile != "off" and graph not in built:
                    built.add(graph)
                    clock["t"] += 30.0
                    step = out[i].step
                    slow = Measurement("step", step.times_s, (30.0 + step.median,),
                                       step.samples_per_step)
                    out[i] = dataclasses.replace(out[i], phases={**out[i].phases,
                                                                 "step": slow})
            return out

    lad = climb(_tiny(), rungs=["compile", "amp", "data_loading"], rounds=1,
                progress=False, out_dir=tmp_path, run_fn=Compiling(), budget_s=90)
    measured = [r.name for r in lad.rungs]
    assert measured[0] == "compile" and "data_loading" in measured, measured
    assert "amp" not in measured and "would pass budget_s=90 s" in lad.skipped["amp"]
    assert "about 50 s" in lad.skipped["amp"], lad.skipped["amp"]


class CompilingRuns(FakeRuns):
    """Each run takes 10 s on ``clock``; a compiled graph new to the process costs
    ``cold_s`` more in its first step when inductor compiles it (a cache miss), and
    COLD_OVER_WARM times less when its cache holds it (a graph in ``cached``); the
    inductor counters count the lookups as inductor does (forward and backward)."""

    def __init__(self, clock: dict, cold_s: float, cached=()):
        super().__init__()
        self.clock, self.cold_s, self.cached = clock, cold_s, list(cached)
        self.built: list[frozenset] = []

    def __call__(self, configs, *, rounds, progress):
        from torch._dynamo.utils import counters
        import perflab.ladder.moves as moves

        out = super().__call__(configs, rounds=rounds, progress=progress)
        for i, c in enumerate(configs):
            self.clock["t"] += 10.0
            graph = features(c) - {"data_loading"}
            if c.compile != "off" and graph not in self.built:
                self.built.append(graph)
                hit = graph in self.cached
                counters["inductor"]["fxgraph_cache_hit" if hit else "fxgraph_cache_miss"] += 2
                extra = self.cold_s / moves.COLD_OVER_WARM if hit else self.cold_s
                self.clock["t"] += extra
                step = out[i].step
                slow = Measurement("step", step.times_s, (extra + step.median,),
                                   step.samples_per_step)
                out[i] = dataclasses.replace(out[i], phases={**out[i].phases, "step": slow})
        return out


@pytest.fixture
def fake_clock(monkeypatch):
    """moves' clock, and inductor's counters restored after the test."""
    import perflab.ladder.moves as moves
    from torch._dynamo.utils import counters

    clock = {"t": 0.0}
    monkeypatch.setattr(moves.time, "monotonic", lambda: clock["t"])
    monkeypatch.setitem(counters, "inductor", counters["inductor"].copy())
    return clock


@pytest.mark.parametrize("cached", [False, True])
def test_budget_never_estimates_a_new_graph_from_a_cache_hit(tmp_path, fake_clock, cached):
    """A cold compile takes 40 s; with ``cached`` inductor's cache holds the fp32 graph
    (a 40 / COLD_OVER_WARM s hit). After the compile trial, amp on top needs a graph the
    cache does not hold: estimated as a cold compile (40 s, measured or from the hit),
    over the 80 s budget: skipped; the input pipeline reuses the graph: measured. The
    longest compile measured as the estimate (the hit) measured amp and ended at 85 s."""
    lad = climb(_tiny(), rungs=["compile", "amp", "data_loading"], rounds=1,
                progress=False, out_dir=tmp_path, budget_s=80,
                run_fn=CompilingRuns(fake_clock, 40.0, [{"compile"}] if cached else []))
    measured = [r.name for r in lad.rungs]
    assert measured[0] == "compile" and "data_loading" in measured, measured
    assert "amp" not in measured and "would pass budget_s=80 s" in lad.skipped["amp"], (
        measured, lad.skipped, fake_clock)
    assert "about 60 s" in lad.skipped["amp"] and fake_clock["t"] <= 80


def test_budget_assumes_a_cold_compile_before_measuring_one(tmp_path, fake_clock):
    """No compile measured yet: the first compiled graph is estimated at COLD_COMPILE_S
    (60 s), so after a 20 s trial a 70 s budget skips it, where an estimate without the
    compile (20 s) measured it and ended at 80 s; with room for it, it is measured."""
    lad = climb(_tiny(), rungs=["data_loading", "compile"], rounds=1, progress=False,
                out_dir=tmp_path, budget_s=70, run_fn=CompilingRuns(fake_clock, 40.0))
    assert [r.name for r in lad.rungs] == ["data_loading"] and fake_clock["t"] <= 70
    assert "about 80 s would pass budget_s=70 s" in lad.skipped["compile"], lad.skipped
    fake_clock["t"] = 0.0
    lad = climb(_tiny(), rungs=["data_loading", "compile"], rounds=1, progress=False,
                out_dir=tmp_path / "roomy", budget_s=100,
                run_fn=CompilingRuns(fake_clock, 40.0))
    assert [r.name for r in lad.rungs][:2] == ["data_loading", "compile"]


def test_cli_ladder_budget_defaults_per_size(tmp_path, capsys, monkeypatch):
    """`perflab ladder` bounds each size by BUDGET_S unless told; 0 lifts the bound; a
    negative budget is refused before any work."""
    import perflab.ladder.search
    from perflab.ladder.rungs import BUDGET_S

    seen = []

    def record(*a, **k):
        seen.append(k["budget_s"])
        raise KeyboardInterrupt

    monkeypatch.setattr(perflab.ladder.search, "climb", record)
    for flags in (["--size", "tiny"], ["--size", "quick"], ["--size", "full"],
                  ["--size", "tiny", "--budget-s", "0"], ["--budget-s", "42"]):
        assert main(["ladder", *flags, "--out", str(tmp_path / "x")]) == 130
    assert seen == [BUDGET_S["tiny"], BUDGET_S["quick"], None, None, 42.0]
    assert BUDGET_S["tiny"] <= 90 and BUDGET_S["quick"] <= 300
    assert main(["ladder", "--budget-s", "-1", "--out", str(tmp_path / "y")]) == 2
    assert "--budget-s must be seconds >= 0" in capsys.readouterr().err
    assert len(seen) == 5
