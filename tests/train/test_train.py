"""run(config) -> RunResult: phases add up, results survive a restart, errors come first."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from perflab import RunConfig, RunResult, run
from perflab.core.result import PHASES


@pytest.fixture(scope="module")
def tiny_result(tiny_dataset, tmp_path_factory):
    os.environ["PERFLAB_RESULTS"] = str(tmp_path_factory.mktemp("results"))
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=6, warmup_steps=2)
    try:
        return run(cfg, progress=False)
    finally:
        del os.environ["PERFLAB_RESULTS"]


def test_phases_add_up_to_step(tiny_result):
    r = tiny_result
    assert set(PHASES) <= set(r.phases)
    # The phases and "other" (the loop's time between them) make up each step exactly.
    # How small "other" is moves with the machine's load (CI once measured 9 % with three
    # test processes on 2 cores): benchmarks/harness_overhead.py measures what run() adds
    # per step, on a quiet machine.
    total = sum(r.phases[p].mean for p in (*PHASES, "other"))
    assert total == pytest.approx(r.step.mean, rel=1e-9)
    assert min(r.phases["other"].times_s) >= 0.0
    assert sum(r.phase_shares().values()) == pytest.approx(1.0)
    assert all(r.phases[p].n == 6 and len(r.phases[p].warmup_s) == 2 for p in PHASES)


def test_result_contents(tiny_result):
    r = tiny_result
    assert len(r.losses) == 8 and all(torch.isfinite(torch.tensor(r.losses)))
    assert r.num_classes == 10
    assert r.samples_per_s == pytest.approx(4 / r.step.median)
    lo, hi = r.samples_per_s_ci95
    assert lo <= r.samples_per_s <= hi
    assert r.peak_memory.peak_bytes > 0 and "RSS" in r.peak_memory.kind
    assert r.env["device"] == "cpu" and r.env["torch"] == torch.__version__
    table = r.phase_table()
    assert list(table.index) == [*PHASES, "other", "step"]
    assert "0x" not in repr(r) and "samples/s" in repr(r)


def test_saved_json_round_trip(tiny_result):
    assert tiny_result.path and tiny_result.path.endswith(".json")
    loaded = RunResult.load(tiny_result.path)
    assert loaded.to_dict() == tiny_result.to_dict()
    assert loaded.step.median == tiny_result.step.median


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        RunResult.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        RunResult.load(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 0}))
    with pytest.raises(ValueError, match="schema"):
        RunResult.load(old)


def test_same_seed_same_losses(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=2, warmup_steps=0, seed=3)
    a = run(cfg, progress=False, save=False)
    b = run(cfg, progress=False, save=False)
    assert a.losses == b.losses


def test_threads_restored(tiny_dataset, results_dir):
    before = torch.get_num_threads()
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=2, warmup_steps=0, threads=1)
    r = run(cfg, progress=False, save=False)
    assert r.env["torch_threads"] == 1
    assert torch.get_num_threads() == before


def test_workers_run(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=3, warmup_steps=1, num_workers=1, persistent_workers=True,
                    prefetch_factor=2)
    assert run(cfg, progress=False).step.n == 3


def test_bad_dataset_fails_before_training(tmp_path, results_dir):
    (tmp_path / "train" / "cls").mkdir(parents=True)
    (tmp_path / "train" / "cls" / "broken.jpg").write_bytes(b"not a jpeg")
    cfg = RunConfig(model="tiny", dataset=str(tmp_path), batch_size=2)
    with pytest.raises(ValueError, match="broken.jpg"):
        run(cfg, progress=False)
    assert not list(results_dir.rglob("*"))  # nothing was run, nothing saved


@pytest.mark.parametrize("changes", [dict(amp="bf16"), dict(channels_last=True),
                                     dict(model="resnet18", checkpointing="per_stage"),
                                     dict(decoded_cache="memory", device_prefetch=True),
                                     dict(storage_latency_ms=1.0, num_workers=1),
                                     dict(compute_only=True, num_workers=1)])
def test_technique_knobs_run(tiny_dataset, results_dir, changes):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=2, warmup_steps=0).replace(**changes)
    r = run(cfg, progress=False, save=False)
    assert all(torch.isfinite(torch.tensor(r.losses)))


def test_train_step_bf16_matches_fp32_loosely():
    from perflab.models import tiny_cnn
    from perflab.train.step import train_step

    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    losses = {}
    for amp in ("off", "bf16"):
        torch.manual_seed(1)
        m = tiny_cnn(10)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses[amp] = float(train_step(m, x, y, opt, amp=amp))
    assert losses["off"] == pytest.approx(losses["bf16"], rel=0.05)


def test_compute_only_has_no_data_wait(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=4, warmup_steps=1, storage_latency_ms=20.0)
    slow = run(cfg, progress=False, save=False)
    bound = run(cfg.replace(compute_only=True), progress=False, save=False)
    assert slow.phases["data"].median >= 4 * 0.020  # 4 files x 20 ms, simulated
    assert bound.phases["data"].median < slow.phases["data"].median / 10  # a kept batch
    assert bound.phases["data"].warmup_s[0] >= 4 * 0.020  # the one batch was loaded


def test_run_interleaved_pools_rounds(tiny_dataset, results_dir):
    from perflab.experiment import run_interleaved

    a = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                  steps=3, warmup_steps=1)
    ra, rb = run_interleaved([a, a.replace(amp="bf16")], rounds=2, progress=False)
    assert ra.step.n == 6 and len(ra.step.warmup_s) == 2 and rb.config.amp == "bf16"
    assert len(ra.losses) == 4 and ra.env["rounds"] == 2
    # saved by default: every round as it was measured, and the two pooled results
    assert len(list((results_dir / "rounds").glob("*.json"))) == 4
    assert sorted(Path(r.path).parent for r in (ra, rb)) == [results_dir] * 2
    assert RunResult.load(ra.path).step.n == 6
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        run_interleaved([a], rounds=0)
    with pytest.raises(ValueError, match="at least one RunConfig"):
        run_interleaved([])


# -- one step for one process and every rank (perflab.train.step) ------------------------------
def _tiny_model_and_batch(seed: int = 0):
    """A model without batch statistics (BatchNorm would make micro-batches differ from
    the whole batch) and a fixed batch of 8 (B, 3, 4, 4) images."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 10))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 4, 4, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    return model, x, y


def test_accumulation_equals_one_big_batch():
    """Two micro-batches of 4 with accumulation_steps=2 update the parameters exactly
    as one batch of 8 (the loss is divided by the number of micro-batches)."""
    from perflab.train.step import train_step

    big, x, y = _tiny_model_and_batch()
    small, _, _ = _tiny_model_and_batch()
    opt_big = torch.optim.SGD(big.parameters(), lr=0.1)
    opt_small = torch.optim.SGD(small.parameters(), lr=0.1)
    loss_big = train_step(big, x, y, opt_big)
    rest = iter([(x[4:], y[4:])])
    loss_small = train_step(small, x[:4], y[:4], opt_small, accumulation_steps=2,
                            next_batch=lambda: next(rest))
    assert float(loss_small) == pytest.approx(float(loss_big), rel=1e-5)
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # a wrong accumulation (no division by the micro-batch count) would differ:
    wrong, _, _ = _tiny_model_and_batch()
    opt_wrong = torch.optim.SGD(wrong.parameters(), lr=0.1)
    for xb, yb in ((x[:4], y[:4]), (x[4:], y[4:])):
        torch.nn.functional.cross_entropy(wrong(xb), yb).backward()
    opt_wrong.step()
    assert any(not torch.allclose(a, b, atol=1e-6)
               for a, b in zip(big.parameters(), wrong.parameters()))


def test_train_step_times_every_micro_batch_and_the_wait():
    from perflab.train.step import train_step
    from perflab.core.timing import PhaseTimer

    model, x, y = _tiny_model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter([(x, y)] * 6)
    calls = []
    timer = PhaseTimer("cpu")
    for _ in range(2):
        with timer.step():
            train_step(model, None, None, opt, timer, accumulation_steps=3,
                       next_batch=lambda: next(batches), allreduce=lambda: calls.append(1))
    assert calls == [1, 1]  # once per step, after the last backward
    m = timer.measurements(warmup=0)
    assert {"data", "forward", "backward", "wait", "optimizer"} <= set(m)
    with pytest.raises(StopIteration):
        next(batches)  # all 2 x 3 micro-batches were drawn, inside the data phase


@pytest.mark.parametrize("kwargs, match", [
    (dict(accumulation_steps=0), "accumulation_steps must be an int >= 1"),
    (dict(accumulation_steps=1.5), "accumulation_steps must be an int >= 1"),
])
def test_train_step_rejects_bad_accumulation(kwargs, match):
    from perflab.train.step import train_step

    model, x, y = _tiny_model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=match):
        train_step(model, x, y, opt, **kwargs)


def test_train_step_needs_a_batch():
    from perflab.train.step import train_step

    model, _, _ = _tiny_model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="needs a batch"):
        train_step(model, None, None, opt)


@pytest.mark.parametrize("where", ["data", "before_forward", "before_backward"])
def test_straggler_delay_sleeps_once_where_it_is_placed(monkeypatch, where):
    from perflab.train import step
    from perflab.core.timing import PhaseTimer

    slept: list[tuple[str, float]] = []
    current = {"phase": None}
    monkeypatch.setattr(step.time, "sleep", lambda s: slept.append((current["phase"], s)))

    class Spy(PhaseTimer):
        def phase(self, name):
            current["phase"] = name
            return super().phase(name)

    model, x, y = _tiny_model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter([(x, y)] * 2)
    timer = Spy("cpu")
    with timer.step():
        step.train_step(model, None, None, opt, timer, accumulation_steps=2,
                        next_batch=lambda: next(batches),
                        straggler=step.StragglerDelay(where, delay_s=0.05))
    phase = "data" if where == "data" else where.split("_")[1]
    assert slept == [(phase, 0.05)]  # once per step (first micro-batch), in its phase
    slept.clear()
    step.StragglerDelay(where, delay_s=0.0)(where)
    assert slept == []


def test_run_accumulates_on_one_process(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=3, warmup_steps=1, accumulation_steps=2)
    r = run(cfg, progress=False, save=False)
    assert r.step.samples_per_step == 8
    assert r.samples_per_s == pytest.approx(8 / r.step.median)
    assert len(r.losses) == 4 and all(torch.isfinite(torch.tensor(r.losses)))


@pytest.mark.slow
def test_run_with_world_size_launches_ranks(tiny_dataset, tmp_path):
    """world_size > 1 is never a silent single process: the ranks are launched."""
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=32, batch_size=4,
                    steps=2, warmup_steps=2, world_size=2, compute_only=True)
    r = run(cfg, progress=False, results_dir=str(tmp_path))
    assert r.rank == 0 and r.extra["world_size"] == 2
    assert sorted(p.stem.rsplit("-", 1)[-1] for p in tmp_path.glob("*.json")) == ["rank0",
                                                                               "rank1"]


def test_run_refuses_a_profiler_for_ranks(tiny_dataset):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, world_size=2)
    with pytest.raises(ValueError, match="profile each rank"):
        run(cfg, profiler=object())
