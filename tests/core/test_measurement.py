"""Measurement statistics and comparisons, checked exactly against a seeded fake clock."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perflab.core.measurement import Measurement, compare, compare_table
from perflab.core.timing import FakeClock, PhaseTimer, measure, naive_time


def test_statistics_match_numpy():
    times = (0.010, 0.012, 0.011, 0.013, 0.010, 0.030, 0.011, 0.012)
    m = Measurement(label="x", times_s=times, warmup_s=(0.5,), samples_per_step=32)
    arr = np.array(times)
    assert m.median == pytest.approx(np.median(arr))
    assert m.mean == pytest.approx(arr.mean())
    assert m.iqr == pytest.approx(np.percentile(arr, 75) - np.percentile(arr, 25))
    assert m.samples_per_s == pytest.approx(32 / np.median(arr))
    lo, hi = m.ci95_median
    assert lo <= m.median <= hi
    tlo, thi = m.samples_per_s_ci95
    assert tlo <= m.samples_per_s <= thi


def test_ci_of_median_covers_order_statistics():
    m = Measurement(label="x", times_s=tuple(range(1, 21)))
    lo, hi = m.ci95_median
    # n=20: the distribution-free 95 % CI of the median is (x_(6), x_(15)) (Conover, table A3)
    assert (lo, hi) == (6.0, 15.0)


def test_noise_warning_threshold():
    quiet = Measurement(label="q", times_s=(1.0, 1.0, 1.01, 1.02, 1.0))
    noisy = Measurement(label="n", times_s=(1.0, 1.5, 0.7, 1.3, 0.9))
    assert not quiet.noisy and "WARNING" not in repr(quiet)
    assert noisy.noisy and "WARNING: noisy" in repr(noisy)


def test_repr_has_units_and_no_address():
    m = Measurement(label="step", times_s=(0.0101, 0.0102, 0.0100), samples_per_step=8)
    r = repr(m)
    assert "ms" in r and "samples/s" in r and "0x" not in r
    assert "step" in r


def test_empty_measurement_raises():
    with pytest.raises(ValueError, match="at least one time"):
        Measurement(label="e", times_s=())


def test_round_trip_dict():
    m = Measurement(label="x", times_s=(0.1, 0.2), warmup_s=(1.0,), samples_per_step=4)
    assert Measurement.from_dict(m.to_dict()) == m


def test_fake_clock_phase_timer_exact():
    clock = FakeClock(tick_s=0.001)
    timer = PhaseTimer("cpu", clock=clock, annotate=False)
    for _ in range(5):
        with timer.step():
            with timer.phase("data"):
                clock.advance(0.010)
            with timer.phase("forward"):
                clock.advance(0.020)
    ms = timer.measurements(warmup=1, samples_per_step=4)
    # each stamp adds 1 ms: step = 10 + 20 + 5 ticks (start, 2 per phase... ) exact arithmetic
    assert ms["data"].median == pytest.approx(0.011)
    assert ms["forward"].median == pytest.approx(0.021)
    assert ms["step"].median == pytest.approx(0.035)
    assert ms["other"].median == pytest.approx(0.035 - 0.032)
    assert ms["step"].n == 4 and len(ms["step"].warmup_s) == 1
    assert ms["step"].samples_per_s == pytest.approx(4 / 0.035)


def test_phase_timer_misuse_raises():
    timer = PhaseTimer("cpu", annotate=False)
    with pytest.raises(RuntimeError, match="inside 'with timer.step"):
        with timer.phase("data"):
            pass
    with pytest.raises(RuntimeError, match="cannot nest"):
        with timer.step():
            with timer.step():
                pass
    with pytest.raises(ValueError, match="reserved"):
        with timer.step():
            with timer.phase("step"):
                pass
    with pytest.raises(ValueError, match="at least warmup"):
        timer.measurements(warmup=5)


def test_measure_with_fake_clock():
    clock = FakeClock(tick_s=0.002)
    m = measure(lambda: None, warmup=2, repeats=5, clock=clock, label="noop")
    assert m.label == "noop" and m.n == 5 and len(m.warmup_s) == 2
    assert m.median == pytest.approx(0.002)


def test_measure_argument_errors():
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        measure(lambda: None, warmup=-1)
    with pytest.raises(ValueError, match="repeats must be an int >= 2"):
        measure(lambda: None, repeats=1)


def test_naive_time_one_sample():
    clock = FakeClock(tick_s=0.5)
    assert naive_time(lambda: None, clock=clock) == pytest.approx(0.5)


def test_fake_clock_is_seeded():
    a = [FakeClock(0.001, 0.0005, seed=3).now() for _ in range(1)]
    c1, c2 = FakeClock(0.001, 0.0005, seed=3), FakeClock(0.001, 0.0005, seed=3)
    assert [c1.now() for _ in range(5)] == [c2.now() for _ in range(5)]
    assert a[0] > 0
    with pytest.raises(ValueError, match="must be >= 0"):
        FakeClock(tick_s=-1)


def _seeded(label, center, n=30, seed=0, spread=0.02):
    rng = np.random.default_rng(seed)
    return Measurement(label=label, times_s=tuple(center * (1 + spread * rng.standard_normal(n))))


def test_compare_detects_real_speedup():
    a, b = _seeded("slow", 0.020, seed=1), _seeded("fast", 0.010, seed=2)
    c = compare(a, b)
    assert c.speedup == pytest.approx(a.median / b.median)
    assert c.ci95[0] <= c.speedup <= c.ci95[1]
    assert c.significant and "'fast' is faster than 'slow'" in c.verdict
    assert compare(a, b).ci95 == c.ci95  # seeded bootstrap repeats exactly


def test_compare_no_difference():
    a, b = _seeded("a", 0.010, seed=1), _seeded("b", 0.010, seed=2)
    c = compare(a, b)
    assert not c.significant and "no significant difference" in c.verdict


def test_compare_errors():
    one = Measurement(label="one", times_s=(1.0,))
    two = Measurement(label="two", times_s=(1.0, 1.1))
    with pytest.raises(ValueError, match=">= 2 samples"):
        compare(one, two)
    with pytest.raises(ValueError, match="alpha"):
        compare(two, two, alpha=1.5)


def test_compare_constant_data():
    a = Measurement(label="a", times_s=(2.0, 2.0, 2.0))
    b = Measurement(label="b", times_s=(1.0, 1.0, 1.0))
    c = compare(a, b)
    assert c.speedup == 2.0 and c.ci95 == (2.0, 2.0)


def test_compare_table():
    ms = [_seeded("base", 0.02, seed=1), _seeded("x", 0.01, seed=2), _seeded("y", 0.02, seed=3)]
    t = compare_table(ms)
    assert list(t["label"]) == ["base", "x", "y"]
    assert t.loc[0, "verdict"] == "baseline" and t.loc[0, "speedup"] == 1.0
    assert t.loc[1, "speedup"] > 1.5 and math.isnan(t.loc[0, "p_value"])
    with pytest.raises(ValueError, match="at least one"):
        compare_table([])
    with pytest.raises(ValueError, match="out of range"):
        compare_table(ms, baseline=3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(label="x", times_s=(0.1, float("nan"))), "not finite seconds >= 0"),
    (dict(label="x", times_s=(0.1, -0.2)), "not finite seconds >= 0"),
    (dict(label="x", times_s=(0.1, 0.2), warmup_s=(float("inf"),)), "warmup_s has 1"),
    (dict(label="x", times_s=("fast",)), "times_s must be numbers of seconds"),
    (dict(label=3, times_s=(0.1,)), "label must be a string"),
    (dict(label="x", times_s=(0.1,), samples_per_step=True), "samples_per_step must be"),
])
def test_measurement_refuses_bad_times(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Measurement(**kwargs)


def test_compare_refuses_what_is_not_a_measurement():
    m = Measurement("a", (0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="new must be a Measurement, got float"):
        compare(m, 1.0)

    class FakeResult:
        step = m
    with pytest.raises(ValueError, match=r"a RunResult: pass its \.step"):
        compare(FakeResult(), m)
    with pytest.raises(ValueError, match="alpha must be a float"):
        compare(m, m, alpha=5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(repeats=2.5), "repeats must be an int >= 2"),
    (dict(repeats=True), "repeats must be an int >= 2"),
    (dict(warmup=1.0), "warmup must be an int >= 0"),
    (dict(number=0), "number must be an int >= 1"),
])
def test_measure_refuses_bad_counts_before_running(kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        measure(lambda: calls.append(1), **kwargs)
    assert calls == []
    with pytest.raises(ValueError, match="fn must be a callable"):
        measure(42)


def test_measure_number_batches_calls_and_reports_per_call_time():
    clock = FakeClock(tick_s=0.001)            # every clock read advances 1 ms
    calls = []
    m = measure(lambda: calls.append(1), warmup=1, repeats=4, number=10, clock=clock)
    assert len(calls) == 50                    # (1 + 4) samples x 10 calls
    assert m.n == 4 and m.median == pytest.approx(0.001 / 10)   # one tick per sample / 10


def test_phase_timer_other_is_never_negative():
    """Stamps whose phase ends a rounding error after the step (as CUDA events' 0.5 us
    resolution can): "other" is clamped to 0 instead of a negative time."""
    from perflab.core.timing import PhaseTimer

    class Stamps:
        def __init__(self, values):
            self.values = list(values)

        def now(self):
            return self.values.pop(0)

    # per step: step start, phase start, phase end (past the step end), step end
    one = [0.0, 0.0, 0.30000000000000004, 0.3]
    timer = PhaseTimer("cpu", clock=Stamps(one * 2))
    for _ in range(2):
        with timer.step():
            with timer.phase("a"):
                pass
    assert timer.measurements()["other"].times_s == (0.0, 0.0)
