"""Workloads without a data loader: ResNet-18 training parts from a ``RunConfig`` with a
fixed synthetic batch, and a fusion-bound pointwise chain (Labs 04 and 05); a tiny seeded
training set-up and a simulated asynchronous device, the fixed inputs on which Lab 01's
checks run the student's code; a phase-timed loop over any batch iterator (Lab 02).

Memory and compile experiments (Labs 04 and 05) measure the model, not the input
pipeline: a fixed random batch of the configured size makes every measurement
deterministic (memory bytes do not depend on pixel values) and keeps loader time out
of compute timings. The model is set up exactly as :func:`perflab.train.step.build_training`
sets it up (checkpointing, channels_last, SGD with momentum 0.9); ``torch.compile`` is
left to the caller.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from perflab.core.config import RunConfig
from perflab.core.measurement import Measurement
from perflab.models import tiny_cnn
from perflab.train.step import build_model_and_optimizer, train_step
from perflab.core.timing import PhaseTimer

__all__ = ["NUM_CLASSES", "TrainingParts", "synthetic_batch", "training_parts",
           "pointwise_chain", "pointwise_inputs", "tiny_training", "FakeAsyncDevice",
           "train_on_batches"]

#: Classes of the embedded photo-patches dataset, used for the synthetic labels.
NUM_CLASSES = 10


def synthetic_batch(config: RunConfig, batch_size: int | None = None, *,
                    device: torch.device | str | None = None,
                    num_classes: int = NUM_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random batch shaped like ``config``'s training batches.

    Args:
        config: gives image_size, batch_size, seed, channels_last and the device.
        batch_size: overrides ``config.batch_size`` (>= 1).
        device: overrides ``config.resolved_device()``.
        num_classes: labels are drawn from ``0..num_classes-1``.

    Returns:
        ``x`` (B, 3, S, S) float32 (channels_last if the config says so) and ``y`` (B,)
        int64, on the device.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    b = config.batch_size if batch_size is None else batch_size
    if b < 1:
        raise ValueError(f"batch_size must be >= 1, got {b}")
    dev = torch.device(device) if device is not None else config.resolved_device()
    gen = torch.Generator().manual_seed(config.seed)
    s = config.image_size
    x = torch.randn(b, 3, s, s, generator=gen)                 # (B, 3, S, S) float32
    y = torch.randint(0, num_classes, (b,), generator=gen)     # (B,) int64
    fmt = torch.channels_last if config.channels_last else torch.contiguous_format
    return x.to(dev, memory_format=fmt), y.to(dev)


@dataclass(eq=False)
class TrainingParts:
    """What one training step needs: ``model`` (train mode), ``optimizer``, the
    synthetic batch ``x`` (B, 3, S, S) / ``y`` (B,), and the ``device``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    device: torch.device


def training_parts(config: RunConfig, batch_size: int | None = None) -> TrainingParts:
    """Model and optimizer as :func:`~perflab.train.step.build_training` makes them, with a
    :func:`synthetic_batch` instead of a data loader; seeded by ``config.seed``.

    ``config.compile`` is not applied: wrap ``parts.model`` in ``torch.compile`` to
    measure compilation separately.
    """
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    model, optimizer = build_model_and_optimizer(config, NUM_CLASSES, device)
    x, y = synthetic_batch(config, batch_size, device=device)
    return TrainingParts(model, optimizer, x, y, device)


def pointwise_chain(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm, GELU and four elementwise ops: (N, D) float32 -> (N, D) float32.

    Eagerly each of the 7 operators reads and writes the whole (N, D) tensor; fused,
    one pass reads ``x`` and writes the result. Memory-bound, so fusion pays.
    """
    y = F.layer_norm(x, x.shape[-1:], weight, bias)   # (N, D)
    y = F.gelu(y)
    y = y * 1.5 + 0.5
    y = torch.tanh(y) * y
    return y + x


def pointwise_inputs(rows: int = 4096, dim: int = 1024, *, seed: int = 0,
                     device: torch.device | str = "cpu"
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded ``x`` (rows, dim), ``weight`` (dim,), ``bias`` (dim,), float32."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(device)  # type: ignore[return-value]
                 for s in ((rows, dim), (dim,), (dim,)))


def tiny_training(*, seed: int = 0, batches: int = 6, batch_size: int = 8,
                  image_size: int = 16) -> TrainingParts:
    """A seeded :func:`~perflab.models.tiny_cnn`, SGD (lr 0.1, momentum 0.9) and a list
    of ``batches`` fixed CPU batches: the same model, weights and data for every call
    with the same arguments, so two training loops can be compared exactly.

    Returns:
        :class:`TrainingParts` whose ``x`` (batches, B, 3, S, S) float32 and ``y``
        (batches, B) int64 stack the batches (``zip(parts.x, parts.y)`` iterates them).

    Raises:
        ValueError: ``batches``, ``batch_size`` or ``image_size`` < 1.
    """
    for name, v in (("batches", batches), ("batch_size", batch_size),
                    ("image_size", image_size)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    torch.manual_seed(seed)
    model = tiny_cnn(NUM_CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batches, batch_size, 3, image_size, image_size, generator=gen)
    y = torch.randint(0, NUM_CLASSES, (batches, batch_size), generator=gen)
    return TrainingParts(model, optimizer, x, y, torch.device("cpu"))


class FakeAsyncDevice:
    """A simulated accelerator with its own clock, for testing step timers exactly.

    Like a GPU, :meth:`step` only *queues* its work: it advances the clock by
    ``launch_s`` (the Python call) and adds ``work_s`` to the queue; :meth:`sync`
    advances the clock until the queue is empty (``torch.cuda.synchronize``). The first
    call is cold: it queues ``cold_s`` instead (kernel selection, allocation). So a
    timer that syncs before and after each timed call, after a warm-up, reads exactly
    ``launch_s + work_s`` per call; one without the sync after reads ``launch_s``; one
    without warm-up reads the cold call. Times are seconds; the clock starts at 0.

    Attributes: ``calls`` (number of :meth:`step` calls), ``events`` (``"step"`` /
    ``"sync"`` / ``"clock"`` in call order).
    """

    def __init__(self, *, work_s: float = 0.005, launch_s: float = 0.0001,
                 cold_s: float = 0.1) -> None:
        if min(work_s, launch_s, cold_s) < 0:
            raise ValueError("work_s, launch_s and cold_s must be >= 0 seconds")
        self.work_s, self.launch_s, self.cold_s = work_s, launch_s, cold_s
        self._now_us = 0.0    # microseconds, so sums of whole numbers stay exact
        self._queued_us = 0.0
        self.calls = 0
        self.events: list[str] = []

    def step(self) -> None:
        """Queue one step's work (returns at once, like a CUDA launch)."""
        self.events.append("step")
        self._queued_us += 1e6 * (self.cold_s if self.calls == 0 else self.work_s)
        self._now_us += 1e6 * self.launch_s
        self.calls += 1

    def sync(self) -> None:
        """Wait until the queued work is done."""
        self.events.append("sync")
        self._now_us += self._queued_us
        self._queued_us = 0.0

    def clock(self) -> float:
        """The current time, seconds (a ``time.perf_counter`` stand-in)."""
        self.events.append("clock")
        return self._now_us / 1e6

    def __repr__(self) -> str:
        return (f"FakeAsyncDevice(work_s={self.work_s}, launch_s={self.launch_s}, "
                f"cold_s={self.cold_s}, calls={self.calls})")


def train_on_batches(model: nn.Module, optimizer: torch.optim.Optimizer, batches,
                     *, steps: int, warmup: int, device: torch.device | str,
                     samples_per_step: int) -> dict[str, Measurement]:
    """Train ``warmup + steps`` steps on ``next(batches)`` and time each phase.

    The same loop as :func:`perflab.experiment.run` (:func:`perflab.train.step.train_step` with a
    :class:`~perflab.core.timing.PhaseTimer`; the data phase is the wait for
    ``next(batches)``), for a batch source the caller built (Lab 02: the student's
    Dataset, DataLoader and prefetcher).

    Args:
        batches: an iterator of ``(x, y)`` on ``device``: x (B, 3, S, S) float32, y (B,)
            int64.

    Returns:
        ``PhaseTimer.measurements``: ``step``, ``data``, ``forward``, ... (seconds).

    Raises:
        ValueError: ``steps`` < 1 or ``warmup`` < 0.
        StopIteration: ``batches`` ran out.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps}, {warmup}")
    timer = PhaseTimer(device)
    for _ in range(warmup + steps):
        with timer.step():
            train_step(model, None, None, optimizer, timer,
                       next_batch=lambda: next(batches))
    return timer.measurements(warmup=warmup, samples_per_step=samples_per_step)
