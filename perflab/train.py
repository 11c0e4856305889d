"""``run(config) -> RunResult``: build data, model and optimizer; time every phase.

The loop is deliberately plain (after nanoGPT's training loop): one ``train_step`` that
reads top to bottom, wrapped in a :class:`~perflab.timing.PhaseTimer`. Later labs add
their technique *inside* ``train_step`` (autocast, GradScaler, checkpointing, the
compiled model) so it stays visible.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from perflab.config import RunConfig
from perflab.data import make_loader
from perflab.env import env_summary
from perflab.loading import BatchStream
from perflab.measurement import Measurement
from perflab.memory import PeakMemory, read_peak, reset_peak
from perflab.models import build_model
from perflab.result import RunResult
from perflab.timing import PhaseTimer, Stopwatch

__all__ = ["run", "run_interleaved", "train_step", "build_training", "AMP_DTYPES"]

#: autocast dtype per ``RunConfig.amp`` mode (None = fp32, autocast disabled).
AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class _NoTimer:
    """Stands in for a PhaseTimer when a step is not being timed."""

    @contextlib.contextmanager
    def phase(self, name: str):
        yield


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
               optimizer: torch.optim.Optimizer, timer: Any = None, *, amp: str = "off",
               scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """One optimisation step: forward, loss, backward, optimizer step.

    Mixed precision follows the PyTorch AMP recipe ("Automatic Mixed Precision
    examples"): forward and loss under ``torch.autocast``, backward outside it; with a
    ``GradScaler`` (fp16) the loss is scaled before backward and the scaler steps the
    optimizer (skipping steps whose gradients overflowed) and updates its scale.

    Args:
        model: maps (B, 3, H, W) float images to (B, num_classes) logits.
        x: images, (B, 3, H, W) float32 on the model's device.
        y: class indices, (B,) int64 on the same device.
        optimizer: updates ``model``'s parameters.
        timer: a :class:`PhaseTimer` with an open step, or None.
        amp: "off" (fp32), "bf16" or "fp16" (autocast dtype, see ``AMP_DTYPES``).
        scaler: a ``torch.amp.GradScaler`` (needed for fp16), or None.

    Returns:
        The loss, a detached 0-d float32 tensor on the device (read it after the step).
    """
    timer = timer or _NoTimer()
    with timer.phase("forward"):
        with torch.autocast(x.device.type, dtype=AMP_DTYPES[amp], enabled=amp != "off"):
            logits = model(x)                      # (B, num_classes), low precision
            loss = F.cross_entropy(logits, y)      # autocast runs it in fp32
    with timer.phase("backward"):
        (scaler.scale(loss) if scaler else loss).backward()
    with timer.phase("optimizer"):
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()


def build_model_and_optimizer(config: RunConfig, num_classes: int, device: torch.device
                              ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (train mode, on ``device``, with ``config.checkpointing`` and
    ``channels_last`` applied; not compiled) and its SGD optimizer (momentum 0.9)."""
    model = build_model(config.model, num_classes).to(device).train()
    if config.checkpointing != "none":
        model.set_checkpointing(config.checkpointing)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    return model, optimizer


def build_training(config: RunConfig):
    """Data loader, model and optimizer for ``config``, seeded.

    The dataset is validated first, before any model work. The model gets
    ``config.checkpointing``, ``channels_last`` and ``torch.compile(mode=...)`` applied
    (compilation itself happens lazily, in the first steps).

    Returns:
        (loader, model, optimizer, device) with the model on ``device`` in train mode.
    """
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    loader = make_loader(config)  # validates the dataset before any model work
    num_classes = len(loader.dataset.classes)
    model, optimizer = build_model_and_optimizer(config, num_classes, device)
    if config.compile != "off":
        model = torch.compile(model, mode=None if config.compile == "default"
                              else config.compile)
    return loader, model, optimizer, device


def run(config: RunConfig, *, progress: bool = True, save: bool = True,
        results_dir: str | None = None, profiler: Any = None) -> RunResult:
    """Train ``config.warmup_steps + config.steps`` steps and measure each phase.

    Each step is timed (synchronised with the device; CUDA events on GPU) as data-wait
    (next batch + host-to-device copy, and for a decoded cache the on-device
    augmentation: see :class:`perflab.loading.BatchStream`), forward (model + loss),
    backward and optimizer; the first ``warmup_steps`` are excluded from the statistics.
    With ``config.compute_only`` the data phase returns one kept batch (the bound).

    Args:
        config: the experiment.
        progress: show a tqdm progress bar (a widget in Jupyter, text elsewhere).
        save: write the result as JSON (see :meth:`RunResult.save`).
        results_dir: where to save; None -> :func:`perflab.result.default_results_dir`.
        profiler: an active ``torch.profiler.profile``; ``profiler.step()`` is called
            after every step (used by :func:`perflab.profiling.profile`).

    Returns:
        The :class:`RunResult` (with ``path`` set when saved).

    Raises:
        ValueError / FileNotFoundError: bad dataset (before any training starts).
    """
    old_threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    batches = None
    try:
        wall = Stopwatch().start()
        loader, model, optimizer, device = build_training(config)
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range.
        scaler = torch.amp.GradScaler(device.type) if config.amp == "fp16" else None
        was_reset = reset_peak(device)
        timer = PhaseTimer(device)
        batches = BatchStream(loader, config, device)
        losses: list[float] = []
        total = config.warmup_steps + config.steps
        bar = tqdm(range(total), desc=config.display_label(), unit="step",
                   disable=not progress, leave=False)
        for _ in bar:
            with timer.step():
                with timer.phase("data"):
                    x, y = next(batches)  # on device: (B, 3, H, W) float32, (B,) int64
                loss = train_step(model, x, y, optimizer, timer, amp=config.amp,
                                  scaler=scaler)
            losses.append(float(loss))
            if profiler is not None:
                profiler.step()
        bar.close()
        peak = read_peak(device, was_reset=was_reset)
        phases = timer.measurements(warmup=config.warmup_steps,
                                    samples_per_step=config.batch_size,
                                    label=config.display_label())
        env = env_summary(config.device, config.dataset).to_dict()
        env["torch_threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
        if batches is not None:
            batches.close()  # shuts down DataLoader workers now, not at garbage collection
    result = RunResult(config=config, phases=phases, losses=tuple(losses), peak_memory=peak,
                       env=env, num_classes=len(loader.dataset.classes),
                       wall_s=wall.elapsed_s)
    return result.save(results_dir) if save else result


def run_interleaved(configs: Sequence[RunConfig], *, rounds: int = 2, progress: bool = True,
                    save: bool = False, results_dir: str | None = None) -> list[RunResult]:
    """Run each config ``rounds`` times, alternating (A B A B ...), and pool the rounds.

    On a shared or thermally throttling machine, speed drifts over tens of seconds;
    measuring A entirely before B puts that drift into the comparison. Alternating
    spreads it over both. Each round is a full :func:`run` (its own warm-up dropped);
    the returned results hold every round's measured steps (``steps x rounds``
    samples per phase), the first round's losses (every round starts from the same
    seed), the highest peak memory and the summed wall time.

    Raises:
        ValueError: ``rounds`` < 1 or no configs; anything :func:`run` raises.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not configs:
        raise ValueError("run_interleaved needs at least one RunConfig")
    per_config: list[list[RunResult]] = [[] for _ in configs]
    for _ in range(rounds):
        for i, config in enumerate(configs):
            per_config[i].append(run(config, progress=progress, save=False))
    pooled = [_pool(rs) for rs in per_config]
    return [r.save(results_dir) if save else r for r in pooled]


def _pool(results: list[RunResult]) -> RunResult:
    first = results[0]
    phases = {name: Measurement(label=m.label,
                                times_s=sum((r.phases[name].times_s for r in results), ()),
                                warmup_s=sum((r.phases[name].warmup_s for r in results), ()),
                                samples_per_step=m.samples_per_step)
              for name, m in first.phases.items()}
    peak = max((r.peak_memory for r in results), key=lambda p: p.peak_bytes)
    env = dict(first.env, rounds=len(results))
    return RunResult(config=first.config, phases=phases, losses=first.losses,
                     peak_memory=PeakMemory(peak.peak_bytes, peak.kind), env=env,
                     num_classes=first.num_classes, wall_s=sum(r.wall_s for r in results))
