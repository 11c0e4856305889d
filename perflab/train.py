"""``run(config) -> RunResult``: build data, model and optimizer; time every phase.

The loop is deliberately plain (after nanoGPT's training loop): one
:func:`perflab.step.train_step` per step, wrapped in a :class:`~perflab.timing.PhaseTimer`.
The techniques the labs add (autocast, GradScaler, accumulation, checkpointing, the
compiled model) live inside that step, so they stay visible. ``world_size > 1`` launches
the ranks (:mod:`perflab.distributed`), which run the same step under DDP.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from perflab.config import RunConfig
from perflab.env import env_summary
from perflab.loading import BatchStream
from perflab.measurement import Measurement
from perflab.memory import PeakMemory, read_peak, reset_peak
from perflab.result import RunResult
from perflab.step import build_training, make_scaler, train_step
from perflab.timing import PhaseTimer, Stopwatch

__all__ = ["run", "run_interleaved"]


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

    With ``config.world_size > 1`` the ranks are launched through
    :func:`perflab.distributed.launch` (each runs this same :func:`train_step` under
    DDP) and rank 0's result is returned; every rank's result is saved.

    Returns:
        The :class:`RunResult` (with ``path`` set when saved).

    Raises:
        ValueError / FileNotFoundError: bad dataset (before any training starts).
        perflab.distributed.RankFailedError, LaunchTimeoutError: a rank failed (DDP).
    """
    if config.world_size > 1:
        if profiler is not None:
            raise ValueError("profiler= profiles one process; for a data-parallel run "
                             "profile each rank inside perflab.distributed.launch_fn")
        from perflab.distributed import launch  # the same step on every rank

        return launch(config, progress=progress, save=save, results_dir=results_dir)[0]
    old_threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    batches = None
    try:
        wall = Stopwatch().start()
        loader, model, optimizer, device = build_training(config)
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
