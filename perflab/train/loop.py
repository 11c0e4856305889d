"""The single-process training loop: ``train_loop(config, device) -> RunResult``.

Deliberately plain (after nanoGPT's training loop): one
:func:`perflab.train.step.train_step` per step, wrapped in a
:class:`~perflab.core.timing.PhaseTimer`. The techniques the labs add (autocast,
GradScaler, accumulation, checkpointing, the compiled model) live inside that step, so
they stay visible. Whether a config runs here or on ranks is decided by
:func:`perflab.experiment.run`, which calls this loop.
"""
from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from perflab.core.config import RunConfig
from perflab.core.env import env_summary
from perflab.core.memory import read_peak, reset_peak
from perflab.core.result import RunResult
from perflab.core.timing import PhaseTimer, Stopwatch
from perflab.data.prefetch import BatchStream
from perflab.train.step import build_training, make_scaler, train_step

__all__ = ["train_loop"]


def train_loop(config: RunConfig, device: torch.device, *, progress: bool = True,
               profiler: Any = None) -> RunResult:
    """Train ``config.warmup_steps + config.steps`` steps in this process on ``device``
    and measure each phase (the result is not saved: :func:`perflab.experiment.run` saves).

    Each step is timed (synchronised with the device; CUDA events on GPU) as data-wait
    (next batch + host-to-device copy, and for a decoded cache the on-device
    augmentation: see :class:`perflab.data.prefetch.BatchStream`), forward (model + loss),
    backward and optimizer; the first ``warmup_steps`` are excluded from the statistics.
    With ``config.compute_only`` the data phase returns one kept batch (the bound).
    ``config.threads`` sets torch's intra-op threads for the run and is restored after.

    Args:
        config: the experiment (validated).
        device: the resolved device (:meth:`RunConfig.resolved_device`).
        progress: show a tqdm progress bar.
        profiler: an active ``torch.profiler.profile``; ``profiler.step()`` is called
            after every step.

    Raises:
        FileNotFoundError, ValueError: a missing or bad dataset (before any training).
    """
    old_threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    batches = None
    try:
        wall = Stopwatch().start()
        loader, model, optimizer, device = build_training(config, device)
        scaler = make_scaler(config, device)
        was_reset = reset_peak(device)
        timer = PhaseTimer(device)
        batches = BatchStream(loader, config, device)
        losses: list[float] = []
        total = config.warmup_steps + config.steps
        bar = tqdm(range(total), desc=config.display_label(), unit="step",
                   disable=not progress, leave=False)
        for _ in bar:
            with timer.step():
                loss = train_step(model, None, None, optimizer, timer, amp=config.amp,
                                  scaler=scaler, next_batch=batches.__next__,
                                  accumulation_steps=config.accumulation_steps)
            losses.append(float(loss))
            if profiler is not None:
                profiler.step()
        bar.close()
        peak = read_peak(device, was_reset=was_reset)
        phases = timer.measurements(warmup=config.warmup_steps,
                                    samples_per_step=config.samples_per_step,
                                    label=config.display_label())
        env = env_summary(str(device), config.dataset).to_dict()
        env["torch_threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
        if batches is not None:
            batches.close()  # shuts down DataLoader workers now, not at garbage collection
    return RunResult(config=config, phases=phases, losses=tuple(losses), peak_memory=peak,
                     env=env, num_classes=len(loader.dataset.classes), wall_s=wall.elapsed_s)
