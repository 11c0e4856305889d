"""Clocks, device synchronisation and phase timers: the only module that reads a clock.

Every duration perflab reports goes through here, so the rules live in one place:

* synchronise the device before reading a clock (CUDA kernels are asynchronous; a
  host clock read without ``torch.cuda.synchronize`` measures only the launch);
* on CUDA, time with CUDA events recorded on the stream (PyTorch docs,
  "CUDA semantics: asynchronous execution"), read after one sync per step;
* drop warm-up steps from the statistics (lazy initialisation, allocator growth and
  oneDNN/cuDNN primitive creation make the first steps slower).

The host clock can be swapped for a :class:`FakeClock` so statistics and reprs are
tested exactly.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import torch

from perflab.core.measurement import Measurement

__all__ = [
    "Clock",
    "PerfCounterClock",
    "FakeClock",
    "sync",
    "measure",
    "PhaseTimer",
    "naive_time",
    "Stopwatch",
]


class Clock(Protocol):
    """A monotonic host clock returning seconds (float)."""

    def now(self) -> float: ...


class PerfCounterClock:
    """``time.perf_counter``: the highest-resolution monotonic clock Python has."""

    def now(self) -> float:
        return time.perf_counter()


class FakeClock:
    """A seeded fake clock for tests: each ``now()`` advances by a fixed or random tick.

    Args:
        tick_s: seconds added on every read (>= 0).
        jitter_s: half-width of a uniform random term added to each tick (seconds).
        seed: seed of the jitter's random generator, so sequences repeat exactly.
    """

    def __init__(self, tick_s: float = 0.001, jitter_s: float = 0.0, seed: int = 0):
        if tick_s < 0 or jitter_s < 0:
            raise ValueError(f"tick_s and jitter_s must be >= 0, got {tick_s}, {jitter_s}")
        self._t = 0.0
        self._tick = tick_s
        self._jitter = jitter_s
        self._gen = torch.Generator().manual_seed(seed)

    def now(self) -> float:
        u = float(torch.rand((), generator=self._gen)) * 2 - 1 if self._jitter else 0.0
        self._t += self._tick + u * self._jitter
        return self._t

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (simulates work in tests)."""
        self._t += seconds


def sync(device: torch.device | str) -> None:
    """Wait until all queued work on ``device`` has finished (no-op on CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """Wall-clock seconds of a block (set-up costs, whole runs), host clock only::

        with Stopwatch() as sw:
            ...
        sw.elapsed_s
    """

    def __init__(self, clock: Clock | None = None):
        self._clock = clock or PerfCounterClock()
        self._t0: float | None = None
        self._t1: float | None = None

    def start(self) -> "Stopwatch":
        """Start (or restart) timing; returns self."""
        self._t0, self._t1 = self._clock.now(), None
        return self

    def __enter__(self) -> "Stopwatch":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._t1 = self._clock.now()

    @property
    def elapsed_s(self) -> float:
        """Seconds from entering the block to leaving it (or to now, while inside)."""
        if self._t0 is None:
            raise RuntimeError("Stopwatch was never started; use it as 'with Stopwatch() as sw:'")
        return (self._t1 if self._t1 is not None else self._clock.now()) - self._t0


def naive_time(fn: Callable[[], object], clock: Clock | None = None) -> float:
    """Time ONE call of ``fn`` with a bare host clock: no sync, no warm-up, one sample.

    This is the timer Lab 01 warns against; it exists so the lab can show its number
    next to :func:`measure`'s. Returns seconds (float).
    """
    clock = clock or PerfCounterClock()
    t0 = clock.now()
    fn()
    return clock.now() - t0


def measure(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeats: int = 20,
    device: torch.device | str = "cpu",
    label: str = "fn",
    samples_per_call: int | None = None,
    clock: Clock | None = None,
    number: int = 1,
) -> Measurement:
    """Time ``fn()`` correctly: ``warmup`` untimed samples, then ``repeats`` synced samples.

    Each sample is ``number`` back-to-back calls, bracketed by device syncs (CUDA events
    on a CUDA device); the sample's time divided by ``number`` is one call's time.
    *Floor*: every sample pays a clock read pair (and on a GPU a sync); for a function
    under about 1 ms that overhead is a visible share of one call, so pass ``number``
    so that a sample takes >= 1 ms (torch.utils.benchmark's ``blocked_autorange`` batches
    calls the same way).

    Args:
        fn: a callable with no arguments; its return value is ignored.
        warmup: calls run before timing (>= 0); their times are kept in
            ``Measurement.warmup_s`` but excluded from the statistics.
        repeats: timed calls (>= 2, so an IQR exists).
        device: where ``fn`` runs; decides how to sync and which timer to use.
        label: name shown in reprs and tables.
        samples_per_call: samples one call processes, for throughput (samples/s).
        clock: host clock override (tests); ignored on CUDA where events time.
        number: calls per timed sample (>= 1).

    Returns:
        A :class:`~perflab.core.measurement.Measurement` of per-call seconds.

    Raises:
        ValueError: ``fn`` not callable, ``warmup`` not an int >= 0, ``repeats`` not an
            int >= 2, ``number`` not an int >= 1 (before anything runs).
    """
    def whole(name: str, value: object, lo: int, why: str = "") -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}{why}, got {value!r}")

    if not callable(fn):
        raise ValueError(f"fn must be a callable with no arguments, got {fn!r}")
    whole("warmup", warmup, 0)
    whole("repeats", repeats, 2, " (an IQR needs two samples)")
    whole("number", number, 1, " (calls per timed sample)")
    timer = PhaseTimer(device, clock=clock, annotate=False)
    for _ in range(warmup + repeats):
        with timer.step():
            for _ in range(number):
                fn()
    step = timer.measurements(warmup=warmup, samples_per_step=samples_per_call)["step"]
    if number == 1:
        return step.relabel(label)
    return Measurement(label=label, times_s=tuple(t / number for t in step.times_s),
                       warmup_s=tuple(t / number for t in step.warmup_s),
                       samples_per_step=samples_per_call)


class PhaseTimer:
    """Times each step of a loop and the named phases inside it.

    Usage, in any training loop::

        timer = PhaseTimer(device)
        for _ in range(steps):
            with timer.step():
                with timer.phase("data"):
                    x, y = next(batches)
                with timer.phase("forward"):
                    loss = loss_fn(model(x), y)
                ...
        m = timer.measurements(warmup=2, samples_per_step=batch_size)
        m["step"].median, m["forward"].median   # seconds

    On CUDA every boundary records a CUDA event and the step ends with one
    ``torch.cuda.synchronize``, after which event pairs are read (milliseconds ->
    seconds). Elsewhere the device is synced and the host clock read at each boundary.
    Phases are contiguous when written back to back, so they add up to the step time
    (the remainder is loop overhead between phases, reported as ``other``).

    What runs inside a timed step is kept to the minimum (the harness-overhead
    benchmark compares it with a hand-written loop): a clock read (or a CUDA event
    record) per boundary, no device sync on a CPU (there is nothing to wait for), and a
    ``record_function`` range only while a profiler is recording (entering one is a
    dispatcher call even when nothing records it). Turning events into seconds, and
    the per-step bookkeeping, happen after the step's end stamp.

    Args:
        device: the device the loop runs on.
        clock: host clock override (tests); unused on CUDA.
        annotate: wrap each phase in ``torch.profiler.record_function("perflab:<phase>")``
            while a profiler is active, so phases appear as ranges in its traces.
    """

    PREFIX = "perflab:"

    def __init__(self, device: torch.device | str = "cpu", *, clock: Clock | None = None,
                 annotate: bool = True):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._clock = clock or PerfCounterClock()
        self._annotate = annotate
        self._steps: list[dict[str, float]] = []
        self._marks: list[tuple[str, str, object]] = []  # (phase, "start"/"end", stamp)
        self._in_step = False
        self._now = self._clock.now
        self._needs_sync = self.device.type not in ("cpu", "cuda")  # MPS: sync first

    def _stamp(self) -> object:
        if self._cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        if self._needs_sync:
            sync(self.device)
        return self._now()

    def _elapsed(self, a: object, b: object) -> float:
        if self._cuda:
            return a.elapsed_time(b) / 1000.0  # type: ignore[attr-defined]
        return float(b) - float(a)  # type: ignore[arg-type]

    @contextmanager
    def step(self) -> Iterator[None]:
        """Bracket one step; nested phases are recorded inside it."""
        if self._in_step:
            raise RuntimeError("PhaseTimer.step() is already open; steps cannot nest")
        self._in_step = True
        self._marks = []
        start = self._stamp()
        try:
            yield
        finally:
            end = self._stamp()
            self._in_step = False
        if self._cuda:
            torch.cuda.synchronize(self.device)
        times = {"step": self._elapsed(start, end)}
        opened: dict[str, object] = {}
        for phase, kind, stamp in self._marks:
            if kind == "start":
                opened[phase] = stamp
            else:
                times[phase] = times.get(phase, 0.0) + self._elapsed(opened.pop(phase), stamp)
        self._steps.append(times)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a named phase inside the open step (a phase may repeat; times add)."""
        if not self._in_step:
            raise RuntimeError(f"phase({name!r}) must be inside 'with timer.step():'")
        if name == "step":
            raise ValueError("'step' is reserved for the whole step; name the phase otherwise")
        ctx = (torch.profiler.record_function(self.PREFIX + name)
               if self._annotate and torch.autograd._profiler_enabled() else _null())
        with ctx:
            self._marks.append((name, "start", self._stamp()))
            try:
                yield
            finally:
                self._marks.append((name, "end", self._stamp()))

    @property
    def steps_recorded(self) -> int:
        """Number of completed steps."""
        return len(self._steps)

    def measurements(self, *, warmup: int = 0, samples_per_step: int | None = None,
                     label: str = "") -> dict[str, Measurement]:
        """Per-phase :class:`Measurement` objects, plus ``"step"`` and ``"other"``.

        ``other`` is step time minus the phases' sum for each step (loop overhead).

        Raises:
            ValueError: fewer than ``warmup + 2`` steps recorded.
        """
        if len(self._steps) < warmup + 2:
            raise ValueError(f"need at least warmup + 2 = {warmup + 2} steps to report "
                             f"statistics, recorded {len(self._steps)}")
        names: list[str] = []
        for s in self._steps:
            names += [n for n in s if n not in names]
        rows = []
        for s in self._steps:
            row = {n: s.get(n, 0.0) for n in names}
            # >= 0 up to rounding: contiguous phases can sum one float ulp (or, with
            # CUDA events, half a microsecond) past the step; clamp that to 0
            row["other"] = max(0.0, row["step"] - sum(v for n, v in row.items()
                                                      if n != "step"))
            rows.append(row)
        prefix = f"{label} " if label else ""
        return {
            n: Measurement(
                label=f"{prefix}{n}",
                times_s=tuple(r[n] for r in rows[warmup:]),
                warmup_s=tuple(r[n] for r in rows[:warmup]),
                samples_per_step=samples_per_step,
            )
            for n in names + ["other"]
        }


@contextmanager
def _null() -> Iterator[None]:
    yield
