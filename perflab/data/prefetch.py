"""From a DataLoader to device-ready batches: copy, prefetch, augment, or reuse one batch.

:class:`BatchStream` is what :func:`perflab.experiment.run` draws from in its ``data``
phase, so everything here is measured like any other phase:

* the host-to-device copy (``non_blocking`` when the batches are pinned);
* :class:`DevicePrefetcher`: on CUDA, the *next* batch is copied (and augmented) on a
  side stream while the model works on the current one, the pattern of NVIDIA's
  ImageNet example ("data_prefetcher") and of PyTorch's CUDA-streams notes; on a CPU
  there is nothing to overlap and it is a plain pass-through;
* the batched, on-device augmentation of decoded-cache batches (:mod:`perflab.data.cache`);
* ``compute_only``: one batch is loaded, kept on the device and returned every step.
  Training on it measures the **compute-only bound**: the throughput the same model,
  batch and device reach when loading costs nothing;
  :func:`pipeline_efficiency` compares a run with it (with a one-sided test), and
  :func:`time_first_batch` measures a loader's start-up costs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from perflab.data.augment import random_resized_crop_batch
from perflab.core.config import RunConfig
from perflab.data.loader import infinite_batches, make_loader
from perflab.core.measurement import compare
from perflab.core.result import RunResult
from perflab.core.timing import Stopwatch

__all__ = ["DevicePrefetcher", "BatchStream", "Efficiency", "pipeline_efficiency",
           "FirstBatch", "time_first_batch", "LOADER_FIELDS"]

#: The DataLoader settings perflab sweeps.
LOADER_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
#: Fields that may differ between a run and its compute-only bound.
_PIPELINE_FIELDS = {"label", "compute_only", "storage_latency_ms", "decoded_cache",
                    "device_prefetch", "steps", "warmup_steps", *LOADER_FIELDS}

Batch = tuple[torch.Tensor, torch.Tensor]


class DevicePrefetcher:
    """Iterate ``(x, y)`` batches on ``device``, copying the next one ahead on CUDA.

    On CUDA with ``side_stream=True``: while the caller computes on batch i (on the
    current stream), batch i+1 has been fetched from ``batches`` and its copy (and
    ``prepare``) queued on a side stream. ``__next__`` makes the current stream wait
    for the side stream (``wait_stream``) and marks the tensors as used there
    (``record_stream``) so the caching allocator does not reuse their memory early.
    The copy only overlaps compute when the host tensors are pinned
    (``DataLoader(pin_memory=True)``). Elsewhere (CPU, MPS, or ``side_stream=False``)
    each batch is copied and prepared when asked for, in order.

    Args:
        batches: yields ``(x, y)`` host tensors; x ``(B, 3, H, W)`` (float32, or uint8
            from a decoded cache), y ``(B,)`` int64.
        device: where the batches go.
        prepare: ``(x, y) -> (x, y)`` run on the device after the copy (augmentation,
            memory format); None = identity.
        side_stream: prefetch on a side CUDA stream (ignored off CUDA).
        non_blocking: asynchronous copies (pinned host memory).

    Order is preserved; ``StopIteration`` when ``batches`` ends.
    """

    def __init__(self, batches: Iterable[Batch], device: torch.device | str, *,
                 prepare: Callable[[torch.Tensor, torch.Tensor], Batch] | None = None,
                 side_stream: bool = True, non_blocking: bool = False) -> None:
        self.device = torch.device(device)
        self._it: Iterator[Batch] = iter(batches)
        self._prepare = prepare
        self._non_blocking = non_blocking
        self._stream = (torch.cuda.Stream(self.device)
                        if side_stream and self.device.type == "cuda" else None)
        self._next: Batch | None = None
        self._started = False

    @property
    def overlaps(self) -> bool:
        """True when copies run ahead on a side CUDA stream."""
        return self._stream is not None

    def _copy(self, batch: Batch) -> Batch:
        x, y = batch
        x = x.to(self.device, non_blocking=self._non_blocking)
        y = y.to(self.device, non_blocking=self._non_blocking)
        return self._prepare(x, y) if self._prepare else (x, y)

    def _preload(self) -> None:
        try:
            batch = next(self._it)
        except StopIteration:
            self._next = None
            return
        with torch.cuda.stream(self._stream):
            self._next = self._copy(batch)

    def __iter__(self) -> "DevicePrefetcher":
        return self

    def __next__(self) -> Batch:
        if self._stream is None:
            return self._copy(next(self._it))
        if not self._started:
            self._started = True
            self._preload()
        if self._next is None:
            raise StopIteration
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self._stream)
        x, y = self._next
        x.record_stream(current)
        y.record_stream(current)
        self._preload()
        return x, y


class BatchStream:
    """Device-ready training batches for ``config``, forever (epochs chain seamlessly).

    Applies, in this order: the host-to-device copy (``non_blocking`` with
    ``pin_memory``), via :class:`DevicePrefetcher` (on a side CUDA stream when
    ``config.device_prefetch``); for ``decoded_cache`` batches the batched augmentation
    (:func:`perflab.data.augment.random_resized_crop_batch`, on the device, random numbers
    from a CPU generator seeded with ``config.seed``); ``channels_last``. With
    ``config.compute_only`` the first batch is returned every step and the loader is
    shut down at once, so its workers do not compete with the compute.

    ``next(stream)`` -> (float32 ``(B, 3, S, S)``, int64 ``(B,)``) on ``device``.
    Call :meth:`close` (or use ``with``) to stop the loader's workers.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, config: RunConfig,
                 device: torch.device | str) -> None:

        self.config = config
        self.device = torch.device(device)
        self._fmt = torch.channels_last if config.channels_last else torch.contiguous_format
        self._gen = torch.Generator().manual_seed(config.seed)
        self._cached = config.decoded_cache != "off"
        self._host = infinite_batches(loader)
        self._source = DevicePrefetcher(self._host, self.device, prepare=self._finish,
                                        side_stream=config.device_prefetch,
                                        non_blocking=config.pin_memory)
        self._fixed: Batch | None = None

    def _finish(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if self._cached:  # uint8 (B, 3, S', S') -> float32 (B, 3, S, S), on the device
            x = random_resized_crop_batch(x, self.config.image_size, generator=self._gen)
        return x.contiguous(memory_format=self._fmt), y

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> Batch:
        if not self.config.compute_only:
            return next(self._source)
        if self._fixed is None:
            self._fixed = next(self._source)
            self.close()  # the loader's work is done: no workers compete with compute
        return self._fixed

    def close(self) -> None:
        """Shut down the loader's worker processes now (not at garbage collection)."""
        self._host.close()

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class FirstBatch:
    """One-off costs of starting a loader's epoch, seconds (single samples: they
    happen once per epoch, or once per run with persistent workers).

    Attributes:
        worker_startup_s: ``iter(loader)``: starting the worker processes (about 0
            with num_workers=0; paid every epoch unless workers are persistent).
        first_batch_s: ``iter(loader)`` plus the first ``next``: what the first step
            of an epoch waits for.
    """

    worker_startup_s: float
    first_batch_s: float


def time_first_batch(config: RunConfig) -> FirstBatch:
    """Measure ``config``'s loader start-up and time to first batch (see
    :class:`FirstBatch`) on a fresh loader. Building the loader (validation, a decoded
    cache) is not timed. Raises what :func:`perflab.data.loader.make_loader` raises."""
    loader = make_loader(config)
    with Stopwatch() as startup:
        it = iter(loader)
    with Stopwatch() as first:
        next(it)
    del it, loader  # the last references: workers (persistent ones too) shut down now
    return FirstBatch(startup.elapsed_s, startup.elapsed_s + first.elapsed_s)


@dataclass(frozen=True)
class Efficiency:
    """Input-pipeline efficiency of a run against its compute-only bound.

    Two one-sided Mann-Whitney U tests compare the run's step times with the bound's
    divided by ``target`` (a step at exactly ``target`` efficiency):

    * ``p_above``: small when the run is significantly *above* the target;
    * ``p_below``: small when it is significantly *below* it.

    On a noisy machine neither may be small: the data then cannot tell the run from
    the target. :attr:`reaches_target` gives the run that benefit of the doubt (it
    fails only when the shortfall is significant); :attr:`exceeds_target` does not.

    Attributes:
        label, bound_label: the two runs.
        efficiency: throughput / bound throughput (= bound median step / median step).
        ci95: bootstrap 95 % CI of ``efficiency`` (:func:`perflab.compare`).
        target: the fraction of the bound asked for.
        p_above, p_below: the one-sided p-values above.
        alpha: significance level.
    """

    label: str
    bound_label: str
    efficiency: float
    ci95: tuple[float, float]
    target: float
    p_above: float
    p_below: float
    alpha: float

    @property
    def exceeds_target(self) -> bool:
        """Significantly above ``target`` (one-sided test at ``alpha``)."""
        return self.p_above < self.alpha

    @property
    def falls_short(self) -> bool:
        """Significantly below ``target`` (one-sided test at ``alpha``)."""
        return self.p_below < self.alpha

    @property
    def reaches_target(self) -> bool:
        """Not significantly below ``target``."""
        return not self.falls_short

    @property
    def verdict(self) -> str:
        share = f"{self.target:.0%} of the compute-only bound"
        if self.exceeds_target:
            return (f"{self.label!r} is significantly above {share} "
                    f"(one-sided p = {self.p_above:.3g})")
        if self.falls_short:
            return (f"{self.label!r} falls significantly short of {share} "
                    f"(one-sided p = {self.p_below:.3g})")
        return (f"{self.label!r} is not significantly different from {share} "
                f"(one-sided p = {self.p_above:.3g} above, {self.p_below:.3g} below)")

    def __repr__(self) -> str:
        return (f"Efficiency: {self.efficiency:.1%} of the compute-only bound "
                f"(95 % CI {self.ci95[0]:.1%}-{self.ci95[1]:.1%})\n  verdict: {self.verdict}")


def pipeline_efficiency(result: RunResult, bound: RunResult, *, target: float = 0.95,
                        alpha: float = 0.05) -> Efficiency:
    """How close ``result`` gets to the compute-only ``bound``, with a one-sided test.

    Raises:
        ValueError: ``bound`` is not a ``compute_only`` run, the two differ in more than
            the input pipeline (model, image size, batch, amp, device, ...), or
            ``target`` / ``alpha`` is outside (0, 1).
    """
    if not bound.config.compute_only:
        raise ValueError(f"bound {bound.label!r} is not a compute-only run; measure it "
                         "with config.replace(compute_only=True)")
    if not 0 < target < 1 or not 0 < alpha < 1:
        raise ValueError(f"target and alpha must be in (0, 1), got {target}, {alpha}")
    differ = sorted(k for k in set(result.config.to_dict()) - _PIPELINE_FIELDS
                    if getattr(result.config, k) != getattr(bound.config, k))
    if differ:
        raise ValueError(f"{result.label!r} and the bound differ in {differ}, not only in "
                         "the input pipeline; measure the bound with "
                         "result.config.replace(compute_only=True)")
    c = compare(bound.step.relabel(bound.label), result.step.relabel(result.label),
                alpha=alpha)
    at_target = [t / target for t in bound.step.times_s]  # steps at exactly `target`
    steps = result.step.times_s
    from scipy import stats  # imported on use: importing scipy.stats takes seconds

    p_above = float(stats.mannwhitneyu(steps, at_target, alternative="less").pvalue)
    p_below = float(stats.mannwhitneyu(steps, at_target, alternative="greater").pvalue)
    return Efficiency(label=result.label, bound_label=bound.label, efficiency=c.speedup,
                      ci95=c.ci95, target=target, p_above=p_above, p_below=p_below,
                      alpha=alpha)
