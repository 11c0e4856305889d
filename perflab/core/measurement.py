"""One result type for timings (:class:`Measurement`) and how to compare them.

Modelled on ``torch.utils.benchmark``'s split between timer, ``Measurement`` and
``Compare``: this module holds what was measured and how to compare it, never a clock
(clocks live in :mod:`perflab.core.timing`). Statistics come from scipy (distribution-free
median CI, Mann-Whitney U, bootstrap) rather than hand-written estimators.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:   # imported where a table is made: every spawned rank imports this
    import pandas as pd   # module, and pandas costs each of them 0.25 s of CPU at start

__all__ = ["Measurement", "Comparison", "compare", "compare_table", "NOISE_IQR_FRACTION"]

#: IQR / median above which a measurement is flagged noisy (torch.utils.benchmark's 10 %).
NOISE_IQR_FRACTION = 0.10
#: Seed of the bootstrap resampling, so the printed CIs repeat exactly for the same data.
BOOTSTRAP_SEED = 0


def _fmt_s(seconds: float) -> str:
    """Seconds in the most readable unit (us / ms / s)."""
    a = abs(seconds)
    if a < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if a < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


@dataclass(frozen=True)
class Measurement:
    """Per-step (or per-call) times of one variant, warm-up excluded.

    Attributes:
        label: what was measured, e.g. ``"quick forward"``.
        times_s: measured seconds, one per step, warm-up excluded (length >= 1).
        warmup_s: seconds of the dropped warm-up steps (kept to show their cost).
        samples_per_step: samples processed per step; enables ``samples_per_s``.
    """

    label: str
    times_s: tuple[float, ...]
    warmup_s: tuple[float, ...] = ()
    samples_per_step: int | None = None
    _arr: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.label, str):
            raise ValueError(f"Measurement label must be a string, got {self.label!r}")
        if len(self.times_s) < 1:
            raise ValueError(f"Measurement {self.label!r} needs at least one time, got none")
        for name in ("times_s", "warmup_s"):
            try:
                vals = tuple(float(t) for t in getattr(self, name))
            except (TypeError, ValueError) as e:
                raise ValueError(f"Measurement {self.label!r}: {name} must be numbers of "
                                 f"seconds ({e})") from e
            bad = [t for t in vals if not (math.isfinite(t) and t >= 0)]
            if bad:
                raise ValueError(f"Measurement {self.label!r}: {name} has {len(bad)} value(s) "
                                 f"that are not finite seconds >= 0 (first: {bad[0]!r}); "
                                 "a NaN or negative time means the clock or the code that "
                                 "timed it is broken")
            object.__setattr__(self, name, vals)
        sps = self.samples_per_step
        if sps is not None and (isinstance(sps, bool) or not isinstance(sps, int) or sps < 1):
            raise ValueError(f"Measurement {self.label!r}: samples_per_step must be None or "
                             f"an int >= 1, got {sps!r}")
        object.__setattr__(self, "_arr", np.asarray(self.times_s, dtype=np.float64))

    # -- statistics (seconds) ---------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of measured samples."""
        return len(self.times_s)

    @property
    def median(self) -> float:
        """Median seconds."""
        return float(np.median(self._arr))

    @property
    def mean(self) -> float:
        """Mean seconds."""
        return float(self._arr.mean())

    @property
    def iqr(self) -> float:
        """Interquartile range (q75 - q25), seconds (numpy's linear interpolation)."""
        q25, q75 = np.percentile(self._arr, [25, 75])
        return float(q75 - q25)

    @property
    def ci95_median(self) -> tuple[float, float]:
        """Distribution-free 95 % confidence interval of the median, seconds.

        From order statistics (binomial), via ``scipy.stats.quantile_test(...)
        .confidence_interval`` (Conover, *Practical Nonparametric Statistics*, 3.2).
        With fewer than 6 samples no order statistic reaches 95 %, so the interval is
        (min, max), widened to infinity on the side scipy cannot bound.
        """
        if self.n == 1:
            return (-math.inf, math.inf)
        from scipy import stats  # imported on use: importing scipy.stats takes seconds

        res = stats.quantile_test(self._arr, q=self.median, p=0.5)
        ci = res.confidence_interval(confidence_level=0.95)
        lo = float(ci.low) if np.isfinite(ci.low) else -math.inf
        hi = float(ci.high) if np.isfinite(ci.high) else math.inf
        return (lo, hi)

    @property
    def noisy(self) -> bool:
        """True when IQR / median > ``NOISE_IQR_FRACTION`` (10 %)."""
        return self.median > 0 and self.iqr / self.median > NOISE_IQR_FRACTION

    @property
    def samples_per_s(self) -> float | None:
        """Throughput = samples_per_step / median step seconds (None without a batch size)."""
        if self.samples_per_step is None or self.median <= 0:
            return None
        return self.samples_per_step / self.median

    @property
    def samples_per_s_ci95(self) -> tuple[float, float] | None:
        """95 % CI of throughput, from the median's CI (throughput is monotone in it)."""
        if self.samples_per_step is None:
            return None
        lo, hi = self.ci95_median
        inv = lambda t: self.samples_per_step / t if t > 0 else math.inf  # noqa: E731
        return (inv(hi) if math.isfinite(hi) else 0.0, inv(lo) if math.isfinite(lo) else math.inf)

    # -- presentation -----------------------------------------------------------------
    def relabel(self, label: str) -> "Measurement":
        """A copy with another label."""
        return replace(self, label=label)

    def summary(self) -> dict:
        """Plain numbers for tables and JSON: ms, samples/s, flags."""
        lo, hi = self.ci95_median
        return {
            "label": self.label,
            "n": self.n,
            "median_ms": self.median * 1e3,
            "iqr_ms": self.iqr * 1e3,
            "mean_ms": self.mean * 1e3,
            "ci95_low_ms": lo * 1e3,
            "ci95_high_ms": hi * 1e3,
            "samples_per_s": self.samples_per_s,
            "noisy": self.noisy,
        }

    def __repr__(self) -> str:
        lo, hi = self.ci95_median
        pct = 100 * self.iqr / self.median if self.median > 0 else 0.0
        lines = [
            f"Measurement {self.label!r}: median {_fmt_s(self.median)}, "
            f"IQR {_fmt_s(self.iqr)} ({pct:.1f} %), mean {_fmt_s(self.mean)}",
            f"  95 % CI of median [{_fmt_s(lo) if math.isfinite(lo) else '-inf'}, "
            f"{_fmt_s(hi) if math.isfinite(hi) else 'inf'}], n={self.n}, "
            f"{len(self.warmup_s)} warm-up step(s) dropped",
        ]
        if self.samples_per_s is not None:
            lines.append(f"  throughput {self.samples_per_s:,.1f} samples/s "
                         f"({self.samples_per_step} samples/step)")
        if self.noisy:
            lines.append(f"  WARNING: noisy, IQR is {pct:.0f} % of the median "
                         f"(> {NOISE_IQR_FRACTION:.0%}); close other programs or add repeats")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready dict; :meth:`from_dict` restores it exactly."""
        return {"label": self.label, "times_s": list(self.times_s),
                "warmup_s": list(self.warmup_s), "samples_per_step": self.samples_per_step}

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        return cls(label=d["label"], times_s=tuple(d["times_s"]),
                   warmup_s=tuple(d.get("warmup_s", ())),
                   samples_per_step=d.get("samples_per_step"))


@dataclass(frozen=True)
class Comparison:
    """Speedup of ``new`` over ``baseline``: > 1 means ``new`` is faster.

    Attributes:
        speedup: baseline median / new median.
        ci95: bootstrap 95 % CI of that ratio (percentile method, 2,000 resamples).
        p_value: two-sided Mann-Whitney U test p-value (scipy.stats.mannwhitneyu).
        significant: p_value < alpha.
    """

    baseline: str
    new: str
    speedup: float
    ci95: tuple[float, float]
    p_value: float
    alpha: float

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    @property
    def verdict(self) -> str:
        """One sentence decided by the test, e.g. ``"'b' is faster than 'a'"``."""
        if not self.significant:
            return (f"no significant difference between {self.new!r} and {self.baseline!r} "
                    f"(p = {self.p_value:.3g} >= {self.alpha})")
        word = "faster" if self.speedup > 1 else "slower"
        return f"{self.new!r} is {word} than {self.baseline!r} (p = {self.p_value:.3g})"

    def __repr__(self) -> str:
        lo, hi = self.ci95
        return (f"Comparison: {self.new!r} vs {self.baseline!r}: speedup {self.speedup:.3f}x "
                f"(95 % CI {lo:.3f}-{hi:.3f}x), Mann-Whitney p = {self.p_value:.3g}\n"
                f"  verdict: {self.verdict}")


def compare(baseline: Measurement, new: Measurement, *, alpha: float = 0.05) -> Comparison:
    """Speedup of ``new`` over ``baseline`` with a 95 % CI and a significance test.

    The CI comes from ``scipy.stats.bootstrap`` (percentile, seeded, unpaired samples)
    of the ratio of medians; significance from ``scipy.stats.mannwhitneyu`` (two-sided),
    which assumes independent samples and makes no normality assumption.

    Raises:
        ValueError: an argument is not a Measurement (pass ``result.step`` for a
            RunResult), either has fewer than 2 samples, or alpha not in (0, 1).
    """
    for name, m in (("baseline", baseline), ("new", new)):
        if not isinstance(m, Measurement):
            hint = (" (a RunResult: pass its .step)" if hasattr(m, "step") else "")
            raise ValueError(f"compare(): {name} must be a Measurement{hint}, got "
                             f"{type(m).__name__} {m!r}"[:300])
    if baseline.n < 2 or new.n < 2:
        raise ValueError("compare() needs >= 2 samples in each measurement; "
                         f"got {baseline.n} and {new.n} (measure more steps)")
    if not (isinstance(alpha, float) and 0 < alpha < 1):
        raise ValueError(f"alpha must be a float in (0, 1), got {alpha!r}")
    from scipy import stats

    a, b = baseline._arr, new._arr
    ratio = lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis)  # noqa: E731
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # bootstrap is degenerate on constant data
        ci = (float(ratio(a, b)),) * 2
    else:
        boot = stats.bootstrap((a, b), ratio, n_resamples=2000, method="percentile",
                               vectorized=True, rng=np.random.default_rng(BOOTSTRAP_SEED))
        ci = (float(boot.confidence_interval.low), float(boot.confidence_interval.high))
    p = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return Comparison(baseline=baseline.label, new=new.label, speedup=float(ratio(a, b)),
                      ci95=ci, p_value=p, alpha=alpha)


def compare_table(measurements: Sequence[Measurement], *, baseline: int = 0,
                  alpha: float = 0.05) -> pd.DataFrame:
    """A table of several variants against ``measurements[baseline]``.

    Columns: label, n, median_ms, iqr_ms, ci95_low_ms, ci95_high_ms, samples_per_s,
    noisy, speedup, speedup_ci_low, speedup_ci_high, p_value, verdict.

    Raises:
        ValueError: empty list, or baseline index out of range.
    """
    if not measurements:
        raise ValueError("compare_table needs at least one Measurement")
    if not 0 <= baseline < len(measurements):
        raise ValueError(f"baseline index {baseline} out of range for "
                         f"{len(measurements)} measurements")
    import pandas as pd

    base = measurements[baseline]
    rows = []
    for i, m in enumerate(measurements):
        row = m.summary()
        row.pop("mean_ms")
        if i == baseline:
            row.update(speedup=1.0, speedup_ci_low=1.0, speedup_ci_high=1.0,
                       p_value=float("nan"), verdict="baseline")
        else:
            c = compare(base, m, alpha=alpha)
            row.update(speedup=c.speedup, speedup_ci_low=c.ci95[0], speedup_ci_high=c.ci95[1],
                       p_value=c.p_value, verdict=c.verdict)
        rows.append(row)
    return pd.DataFrame(rows)
