"""Stragglers: one slow rank slows every rank. The injected fault, its cost, its detection.

A :class:`perflab.core.simulated.Straggler` is a deliberate, labelled delay on one rank at one point of the
training step (STYLE: faults are injected on purpose and labelled).

Synchronous data parallelism runs at the pace of the slowest rank: every rank waits in
the gradient allreduce until the last one arrives, so a delay ``d`` on one rank makes
every rank's step ``step + d`` and costs every rank ``d / (step + d)`` of its throughput
(:func:`predicted_throughput_loss`; the "straggler" effect of synchronous SGD, Chen et
al. 2016, "Revisiting Distributed Synchronous SGD", section 2).

:func:`detect_stragglers` names the slow rank from all-gathered per-rank compute times
(``RunResult.extra["all_ranks_compute_s"]``, see :mod:`perflab.distributed.worker`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


__all__ = ["StragglerVerdict", "detect_stragglers",
           "predicted_throughput_loss", "predicted_slowdown", "ThroughputLoss",
           "measured_throughput_loss", "ratio_to_median_with_self", "max_abs_zscore",
           "max_zscore_bound", "straggler_recording", "DETECT_THRESHOLD", "DETECT_K",
           "DETECT_N"]

#: Detector defaults (see :func:`detect_stragglers` for why these values).
DETECT_THRESHOLD = 0.10
DETECT_K = 6
DETECT_N = 10

# -- the cost: prediction and measurement ------------------------------------------------
def _check_times(step_s: float, delay_s: float) -> None:
    if not (isinstance(step_s, (int, float)) and step_s > 0):
        raise ValueError(f"step_s must be > 0 seconds (the step without delay), got {step_s!r}")
    if not (isinstance(delay_s, (int, float)) and delay_s >= 0):
        raise ValueError(f"delay_s must be >= 0 seconds, got {delay_s!r}")


def predicted_throughput_loss(step_s: float, delay_s: float) -> float:
    """Fraction of throughput every rank loses when one rank is ``delay_s`` slower.

    ``delay / (step + delay)``: the synchronised step takes ``step + delay`` on every
    rank (the slowest rank sets the pace), so throughput falls from ``B/step`` to
    ``B/(step + delay)``.

    Args:
        step_s: the step time without the delay (seconds, > 0).
        delay_s: the delay on the slow rank per step (seconds, >= 0).

    Raises:
        ValueError: step_s <= 0 or delay_s < 0.
    """
    _check_times(step_s, delay_s)
    return delay_s / (step_s + delay_s)


def predicted_slowdown(step_s: float, delay_s: float) -> float:
    """Step-time ratio with / without the straggler: ``(step + delay) / step`` (>= 1).

    Raises:
        ValueError: step_s <= 0 or delay_s < 0.
    """
    _check_times(step_s, delay_s)
    return (step_s + delay_s) / step_s


@dataclass(frozen=True)
class ThroughputLoss:
    """Measured throughput loss (fraction), its interval (``ci95``: at the confidence
    asked for, 95 % by default) and the prediction."""

    measured: float
    ci95: tuple[float, float]
    predicted: float

    @property
    def agrees(self) -> bool:
        """True when the prediction lies inside the measured 95 % interval."""
        return self.ci95[0] <= self.predicted <= self.ci95[1]


def _median_ci(times_s: Sequence[float], confidence: float) -> tuple[float, float]:
    """Distribution-free interval of the median (order statistics, binomial):
    ``scipy.stats.quantile_test(...).confidence_interval`` (Conover, *Practical
    Nonparametric Statistics*, 3.2); an unbounded side becomes +-inf."""
    from scipy import stats

    ci = stats.quantile_test(np.asarray(times_s, dtype=np.float64), q=float(np.median(times_s)),
                             p=0.5).confidence_interval(confidence_level=confidence)
    return (float(ci.low) if np.isfinite(ci.low) else -math.inf,
            float(ci.high) if np.isfinite(ci.high) else math.inf)


def measured_throughput_loss(baseline_step_s: Sequence[float], delayed_step_s: Sequence[float],
                             delay_s: float, *, confidence: float = 0.95) -> ThroughputLoss:
    """Throughput loss measured on one rank: ``1 - median(baseline) / median(delayed)``.

    The interval combines the two medians' distribution-free intervals (each at
    ``confidence``, as :attr:`perflab.core.measurement.Measurement.ci95_median` computes
    them) at their extremes, so it is conservative. The prediction uses the baseline
    median as ``step_s``.

    Args:
        baseline_step_s: step times without delay (seconds, >= 2 values).
        delayed_step_s: step times of the same rank with the straggler (seconds, >= 2).
        delay_s: the injected delay (seconds).
        confidence: level of each median's interval, in (0, 1); 0.95 by default.

    Raises:
        ValueError: fewer than 2 times in either list, a non-positive time, or a
            confidence outside (0, 1).
    """
    for name, v in (("baseline_step_s", baseline_step_s), ("delayed_step_s", delayed_step_s)):
        if len(v) < 2 or min(v) <= 0:
            raise ValueError(f"{name} needs >= 2 step times > 0 seconds, got {list(v)!r}")
    if not (isinstance(confidence, float) and 0 < confidence < 1):
        raise ValueError(f"confidence must be a float in (0, 1), e.g. 0.95, got {confidence!r}")
    (b_lo, b_hi), (d_lo, d_hi) = (_median_ci(baseline_step_s, confidence),
                                  _median_ci(delayed_step_s, confidence))
    base, slow = float(np.median(baseline_step_s)), float(np.median(delayed_step_s))
    lo = 1 - b_hi / d_lo if d_lo > 0 and math.isfinite(b_hi) else -math.inf
    hi = 1 - b_lo / d_hi if math.isfinite(d_hi) and b_lo > 0 else 1.0
    return ThroughputLoss(measured=1 - base / slow, ci95=(lo, hi),
                          predicted=predicted_throughput_loss(base, delay_s))


# -- detection ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StragglerVerdict:
    """A flagged rank: its median ratio to the other ranks over the flagged steps
    (``slowdown``, e.g. 1.25 = 25 % slower) and the step indices it was flagged on."""

    rank: int
    slowdown: float
    steps: tuple[int, ...]

    def __str__(self) -> str:
        return (f"rank {self.rank} is a straggler: {100 * (self.slowdown - 1):.0f} % slower "
                f"than the others' median in {len(self.steps)} steps")


def _times_array(per_rank_times: Sequence[Sequence[float]]) -> np.ndarray:
    t = np.asarray(per_rank_times, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] < 2 or t.shape[1] < 1:
        raise ValueError("per_rank_times must be ranks x steps (>= 2 ranks, >= 1 step), "
                         f"got shape {t.shape}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("per_rank_times must be finite seconds > 0")
    return t


def detect_stragglers(per_rank_times: Sequence[Sequence[float]], *,
                      threshold: float = DETECT_THRESHOLD, k: int = DETECT_K,
                      n: int = DETECT_N) -> list[StragglerVerdict]:
    """Flag ranks whose compute time exceeds the OTHER ranks' median by ``threshold``
    in at least ``k`` of the last ``n`` steps.

    Comparing with the median of the *other* ranks matters with few ranks: a median
    that includes the rank itself is pulled toward it (with 2 ranks it is the mean of
    the two, so a 20 % straggler reads as only 1.2 / 1.1 = 9 % slow,
    :func:`ratio_to_median_with_self`), and a z-score cannot exceed (R - 1) / sqrt(R)
    (:func:`max_zscore_bound`: 0.71 for 2 ranks, 1.5 for 4), so a z > 2 or 3 rule never
    fires. ``k`` of ``n`` instead of every step tolerates the scheduler's hiccups.

    Defaults (``threshold=0.10, k=6, n=10``): 10 % is half the smallest delay the
    course must find (20 % with 2 ranks), so a 20 % straggler clears it even with ~10 %
    step-to-step noise; at delay 0 a rank must look >= 10 % slower in 6 of 10 steps,
    which per-step noise alone rarely produces (Lab 07 measures both, per delay, with 2
    and 4 ranks). 10 steps is the course's detection budget.

    Args:
        per_rank_times: compute seconds per step, ranks x steps (>= 2 ranks).
        threshold: relative excess that counts as slow in one step (> 0; 0.1 = 10 %).
        k: slow steps needed among the last ``n`` (1 <= k <= n).
        n: window of most recent steps looked at (>= 1; all steps when fewer).

    Returns:
        One :class:`StragglerVerdict` per flagged rank (rank order); empty if none.
        ``steps`` are indices into the full step axis.

    Raises:
        ValueError: not ranks x steps, non-positive times, or bad threshold / k / n.
    """
    t = _times_array(per_rank_times)
    if not (isinstance(threshold, (int, float)) and threshold > 0):
        raise ValueError(f"threshold must be > 0 (a fraction, e.g. 0.1), got {threshold!r}")
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"n must be an int >= 1 (steps in the window), got {n!r}")
    if not (isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"k must be an int in 1..n={n}, got {k!r}")
    first = max(0, t.shape[1] - n)
    window = t[:, first:]
    verdicts = []
    for r in range(t.shape[0]):
        others = np.median(np.delete(window, r, axis=0), axis=0)  # (steps,)
        ratio = window[r] / others
        slow = np.flatnonzero(ratio > 1 + threshold)
        if len(slow) >= min(k, window.shape[1]):
            verdicts.append(StragglerVerdict(rank=r, slowdown=float(np.median(ratio[slow])),
                                             steps=tuple(int(i) + first for i in slow)))
    return verdicts


def ratio_to_median_with_self(per_rank_times: Sequence[Sequence[float]]) -> np.ndarray:
    """Each rank's time / the median of ALL ranks (itself included), per step.

    The naive rule the detector avoids. Returns ranks x steps ratios.
    """
    t = _times_array(per_rank_times)
    return t / np.median(t, axis=0)


def max_abs_zscore(per_rank_times: Sequence[Sequence[float]]) -> np.ndarray:
    """Per step, the largest |z| over ranks, z = (t - mean) / s (sample std, ddof=1).

    Returns (steps,) floats; 0 where all ranks are equal (to 1 part in 1e9).
    """
    t = _times_array(per_rank_times)
    sd, mean = t.std(axis=0, ddof=1), t.mean(axis=0)
    spread = sd > 1e-9 * mean  # rounding noise of equal times is not a spread
    z = np.divide(t - mean, sd, out=np.zeros_like(t), where=spread)
    return np.abs(z).max(axis=0)


def max_zscore_bound(num_ranks: int) -> float:
    """The largest |z| any one of ``num_ranks`` values can have: (R - 1) / sqrt(R).

    With the sample standard deviation (ddof=1), a single outlier among R values
    reaches exactly this, whatever its size (Shiffler 1988, "Maximum Z scores and
    outliers", The American Statistician 42(1); with ddof=0 the bound is sqrt(R - 1)).

    Raises:
        ValueError: num_ranks < 2.
    """
    if not isinstance(num_ranks, int) or num_ranks < 2:
        raise ValueError(f"num_ranks must be an int >= 2, got {num_ranks!r}")
    return (num_ranks - 1) / math.sqrt(num_ranks)


def straggler_recording(name: str = "straggler_timings.json") -> dict:
    """The shipped per-rank compute times Lab 07's detector check grades against.

    Recorded on real gloo ranks by ``benchmarks/record_stragglers.py`` (seeded straggler
    schedules; the file's ``"source"`` field names the script). Returns the parsed JSON:
    ``{"source", "seed", "recorded", "machine", "units", "cases": {case: {"world_size",
    "injected": {rank: frac or [frac per step]}, "compute_s": ranks x steps seconds,
    "cpu_s": ranks x steps CPU seconds}}}``.

    Raises:
        ValueError: no recording of that name ships with perflab.
    """
    from perflab.core.storage import read_recording

    return read_recording(name, "straggler_")
