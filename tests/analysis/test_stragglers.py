"""perflab.analysis.stragglers: the prediction, the measured loss, and the detector (known cases)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perflab.analysis.stragglers import (
    DETECT_K, DETECT_N, DETECT_THRESHOLD, StragglerVerdict, detect_stragglers,
    max_abs_zscore, max_zscore_bound, measured_throughput_loss, predicted_slowdown,
    predicted_throughput_loss, ratio_to_median_with_self,
)


def _times(num_ranks: int, steps: int, *, slow_rank: int | None = None, delay: float = 0.0,
           noise: float = 0.0, seed: int = 0, step_s: float = 0.1) -> np.ndarray:
    """ranks x steps compute times: ``step_s`` each, +-``noise`` (relative, uniform),
    ``slow_rank`` slower by the fraction ``delay``."""
    rng = np.random.default_rng(seed)
    t = step_s * (1 + rng.uniform(-noise, noise, size=(num_ranks, steps)))
    if slow_rank is not None:
        t[slow_rank] *= 1 + delay
    return t


# -- prediction -------------------------------------------------------------------------
@pytest.mark.parametrize("step, delay, loss, slowdown", [
    (0.1, 0.0, 0.0, 1.0), (0.1, 0.1, 0.5, 2.0), (0.08, 0.02, 0.2, 1.25),
])
def test_prediction_is_delay_over_step_plus_delay(step, delay, loss, slowdown):
    assert predicted_throughput_loss(step, delay) == pytest.approx(loss)
    assert predicted_slowdown(step, delay) == pytest.approx(slowdown)


@pytest.mark.parametrize("step, delay, match", [(0, 0.1, "step_s must be > 0"),
                                                (0.1, -1, "delay_s must be >= 0")])
def test_prediction_rejects_bad_times(step, delay, match):
    with pytest.raises(ValueError, match=match):
        predicted_throughput_loss(step, delay)
    with pytest.raises(ValueError, match=match):
        predicted_slowdown(step, delay)


def test_measured_loss_agrees_with_the_prediction_on_exact_data():
    base = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098, 0.100, 0.101]
    slow = [t + 0.025 for t in base]  # the whole step pays the delay
    res = measured_throughput_loss(base, slow, 0.025)
    assert res.measured == pytest.approx(0.2, abs=1e-3)
    assert res.predicted == pytest.approx(0.2, abs=1e-3)
    assert res.ci95[0] <= res.measured <= res.ci95[1] and res.agrees


def test_measured_loss_disagrees_when_the_delay_did_not_happen():
    base = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098, 0.100, 0.101]
    assert not measured_throughput_loss(base, base, 0.05).agrees


def test_a_higher_confidence_gives_a_wider_interval():
    base = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098, 0.100, 0.101, 0.103, 0.097]
    slow = [t + 0.05 for t in base[::-1]]
    lo95, hi95 = measured_throughput_loss(base, slow, 0.05).ci95
    lo99, hi99 = measured_throughput_loss(base, slow, 0.05, confidence=0.99).ci95
    assert lo99 <= lo95 < hi95 <= hi99 and (lo99, hi99) != (lo95, hi95)
    with pytest.raises(ValueError, match="confidence must be a float in"):
        measured_throughput_loss(base, slow, 0.05, confidence=95)


@pytest.mark.parametrize("base, slow", [([0.1], [0.1, 0.2]), ([0.1, 0.1], [0.1, 0.0])])
def test_measured_loss_rejects_too_few_or_bad_times(base, slow):
    with pytest.raises(ValueError, match="needs >= 2 step times"):
        measured_throughput_loss(base, slow, 0.1)


# -- detector ---------------------------------------------------------------------------
@pytest.mark.parametrize("ranks, slow, delay, noise, found", [
    (2, 1, 0.20, 0.03, [1]),      # the course target: 20 % with 2 ranks
    (2, 0, 0.50, 0.05, [0]),
    (2, None, 0.0, 0.05, []),     # no false positive at delay 0
    (4, 2, 0.50, 0.10, [2]),      # the course target: 50 % with 4 ranks
    (4, 3, 0.20, 0.03, [3]),
    (4, None, 0.0, 0.10, []),
    (8, 5, 0.30, 0.05, [5]),
    (2, 1, 0.05, 0.02, []),       # below the 10 % threshold: not a straggler
])
def test_detector_known_cases(ranks, slow, delay, noise, found):
    for seed in range(5):
        t = _times(ranks, 10, slow_rank=slow, delay=delay, noise=noise, seed=seed)
        verdicts = detect_stragglers(t)
        assert [v.rank for v in verdicts] == found, (seed, verdicts)
        for v in verdicts:
            assert v.slowdown == pytest.approx(1 + delay, rel=3 * noise + 0.01)
            assert len(v.steps) >= DETECT_K


def test_detector_k_of_n_counts_only_the_last_n_steps():
    t = _times(2, 20)
    t[1, :8] *= 1.5            # slow early on, then recovered
    assert detect_stragglers(t) == []                    # last 10 steps are clean
    verdicts = detect_stragglers(t, n=20, k=8)
    assert [v.rank for v in verdicts] == [1] and verdicts[0].steps == tuple(range(8))
    t[1, -5:] *= 1.5           # slow in 5 of the last 10: fewer than k=6
    assert detect_stragglers(t) == []
    assert [v.rank for v in detect_stragglers(t, k=5)] == [1]


def test_detector_reports_step_indices_on_the_full_axis():
    t = _times(2, 15, slow_rank=0, delay=0.4)
    (v,) = detect_stragglers(t)
    assert v == StragglerVerdict(rank=0, slowdown=pytest.approx(1.4), steps=tuple(range(5, 15)))
    assert str(v).startswith("rank 0 is a straggler: 40 % slower")


def test_detector_with_fewer_steps_than_k_needs_every_step():
    t = _times(2, 3, slow_rank=1, delay=0.3)
    assert [v.rank for v in detect_stragglers(t)] == [1]
    t[1, 0] = 0.1
    assert detect_stragglers(t) == []


@pytest.mark.parametrize("times, kw, match", [
    ([[0.1, 0.1]], {}, "ranks x steps"),
    ([0.1, 0.1], {}, "ranks x steps"),
    ([[0.1], [0.0]], {}, "finite seconds > 0"),
    ([[0.1], [math.nan]], {}, "finite seconds > 0"),
    ([[0.1], [0.1]], dict(threshold=0), "threshold must be > 0"),
    ([[0.1], [0.1]], dict(n=0), "n must be an int >= 1"),
    ([[0.1], [0.1]], dict(k=11), "k must be an int in 1..n=10"),
    ([[0.1], [0.1]], dict(k=0), "k must be an int in 1..n=10"),
])
def test_detector_rejects_bad_input(times, kw, match):
    with pytest.raises(ValueError, match=match):
        detect_stragglers(times, **kw)


def test_defaults_are_the_documented_ones():
    assert (DETECT_THRESHOLD, DETECT_K, DETECT_N) == (0.10, 6, 10)


# -- why the naive rules fail -----------------------------------------------------------
def test_ratio_to_a_median_including_itself_hides_a_20_pct_straggler_with_2_ranks():
    t = _times(2, 10, slow_rank=1, delay=0.2)
    ratio = ratio_to_median_with_self(t)
    assert np.allclose(ratio[1], 1.2 / 1.1)            # 9 % "slow": under a 10 % threshold
    assert [v.rank for v in detect_stragglers(t)] == [1]  # the others' median sees 20 %


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_one_outliers_zscore_reaches_exactly_the_bound(ranks):
    t = _times(ranks, 4, slow_rank=0, delay=5.0)  # an enormous straggler
    assert max_abs_zscore(t) == pytest.approx(np.full(4, max_zscore_bound(ranks)))
    if ranks <= 4:
        assert max_zscore_bound(ranks) < 2      # a z > 2 rule can never fire


def test_zscore_is_zero_when_ranks_are_equal_and_bound_needs_two_ranks():
    assert max_abs_zscore(_times(3, 2)).tolist() == [0.0, 0.0]
    assert max_zscore_bound(2) == pytest.approx(1 / math.sqrt(2))
    with pytest.raises(ValueError, match="num_ranks must be an int >= 2"):
        max_zscore_bound(1)


# -- the shipped recording --------------------------------------------------------------------
def test_the_shipped_recording_has_every_case_the_lab_grades_on():
    from perflab.analysis.stragglers import straggler_recording

    rec = straggler_recording()
    assert rec["source"] == "benchmarks/record_stragglers.py" and rec["seed"] == 7
    for name, case in rec["cases"].items():
        t = np.asarray(case["compute_s"])
        assert t.shape[0] == case["world_size"] and np.all(t > 0), name
        assert np.asarray(case["cpu_s"]).shape == t.shape, name
    assert {"2r_rank1_20pct", "4r_rank2_50pct", "4r_rank3_hiccups", "4r_rank0_recovered"} <= set(rec["cases"])


def test_the_recording_reader_rejects_an_unknown_name():
    from perflab.analysis.stragglers import straggler_recording

    with pytest.raises(ValueError, match="no shipped straggler recording"):
        straggler_recording("nope.json")
    with pytest.raises(ValueError, match="straggler_timings.json"):
        straggler_recording("allreduce_sweep_gloo2.json")


# -- the rank body, on one in-process rank --------------------------------------------------
@pytest.fixture()
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_rank_body_records_every_measured_step(one_rank):
    from perflab.course.references.lab07 import reference_gather
    from perflab.labs.lab07 import straggler_rank

    assert reference_gather(0.25) == [0.25]
    out = straggler_rank([{"name": "a", "steps": 3, "slow": {}, "batch": "even"},
                          {"name": "b", "steps": 2, "slow": {0: [0.0, 0.5]}, "batch": [64]}],
                         "perflab.course.references.lab07", sizes=(8, 16, 4), global_batch=64,
                         warmup=1)
    assert out["rank"] == 0 and out["world_size"] == 1 and out["fixed_gather"] == [0.1]
    a, b = out["phases"]
    assert [len(a[k]) for k in ("compute_s", "cpu_s", "wait_s", "step_s", "gathered")] == [3] * 5
    assert a["gathered"] == [[c] for c in a["compute_s"]] and a["verdicts"] == [None] * 3
    assert b["batch_sizes"] == [64] and b["slow"] == {"0": [0.0, 0.5]}
    assert all(s >= c for s, c in zip(a["step_s"], a["compute_s"]))


@pytest.mark.parametrize("phases, kw, match", [
    ([], {}, "at least one phase"),
    ([{"name": "x", "steps": 0, "slow": {}}], {}, "steps must be an int >= 1"),
    ([{"name": "x", "steps": 1, "slow": {}, "batch": "uneven"}], {}, "batch must be"),
    ([{"name": "x", "steps": 1, "slow": {}, "batch": [10]}], {}, "batch must be"),
    ([{"name": "x", "steps": 1, "slow": {}}], {"global_batch": 0}, "global_batch must be"),
])
def test_rank_body_rejects_bad_phases(one_rank, phases, kw, match):
    from perflab.labs.lab07 import straggler_rank

    with pytest.raises(ValueError, match=match):
        straggler_rank(phases, None, sizes=(8, 4), **kw)


def test_thread_cpu_clock_counts_work_not_sleep():
    import time

    from perflab.core.timing import Stopwatch
    from perflab.labs.lab07 import ThreadCpuClock

    with Stopwatch(clock=ThreadCpuClock()) as cpu, Stopwatch() as wall:
        time.sleep(0.05)
    assert cpu.elapsed_s < wall.elapsed_s


@pytest.mark.parametrize("answer, error", [
    ("[32]", None),
    ("[40]", "rebalance returned [40]: not 1 ints >= 1 summing to 32"),   # total changed
    ("[32.0]", "rebalance returned [32.0]"),                              # not ints
    ("1 / 0", "rebalance: ZeroDivisionError"),                            # it raised
])
def test_rank_body_rebalances_with_the_students_function(one_rank, tmp_path, monkeypatch,
                                                         answer, error):
    import importlib

    from perflab.labs.lab07 import straggler_rank

    name = f"s07_unit_{['[32]', '[40]', '[32.0]', '1 / 0'].index(answer)}"
    (tmp_path / f"{name}.py").write_text(
        "def all_gather_times(x):\n    return [x]\n\n"
        "def my_detect(t):\n    return [0] if len(t[0]) > 1 else []\n\n"
        f"def rebalance(batch_sizes, compute_s):\n    assert len(compute_s) == 1\n    return {answer}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    out = straggler_rank([{"name": "a", "steps": 2, "slow": {}, "batch": "even"},
                          {"name": "b", "steps": 2, "slow": {}, "batch": "rebalance"}],
                         name, sizes=(8, 4), global_batch=32, warmup=1)
    assert out["phases"][0]["verdicts"] == [[], [0]]     # the student's detector, every step
    assert out["phases"][1]["batch_sizes"] == [32]
    assert (error is None and out["errors"] == []) or any(error in e for e in out["errors"])
