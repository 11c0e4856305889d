"""``run(config) -> RunResult``: the one place that decides one process or ranks.

``world_size == 1`` trains in this process (:func:`perflab.train.loop.train_loop`: one
:func:`perflab.train.step.train_step` per step, each phase timed); ``world_size > 1``
launches the ranks (:func:`perflab.distributed.launch`), which run the same step under
DDP. Every caller that runs a config (the notebooks' panels, the CLI, the ladder, the
overlap analysis) comes through here; this module also checks where results will be
saved, and that the machine can run the config, before any work starts.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Sequence

from perflab.core.config import RunConfig
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.core.paths import default_results_dir
from perflab.core.result import RunResult
from perflab.core.storage import StorageError, check_writable
from perflab.train.loop import train_loop

__all__ = ["run", "run_ranks", "run_interleaved"]


def run(config: RunConfig, *, progress: bool = True, save: bool = True,
        results_dir: str | None = None, profiler: Any = None) -> RunResult:
    """Train ``config.warmup_steps + config.steps`` steps and measure each phase.

    Each step is timed as data-wait, forward, backward and optimizer, warm-up excluded
    (:func:`perflab.train.loop.train_loop` says how).

    Args:
        config: the experiment.
        progress: show a tqdm progress bar (a widget in Jupyter, text elsewhere).
        save: write the result as JSON the moment it exists (atomically, under a new
            name: see :meth:`RunResult.save`); False keeps it in memory only.
        results_dir: where to save; None -> :func:`perflab.core.paths.default_results_dir`.
            Checked writable before any work starts.
        profiler: an active ``torch.profiler.profile``; ``profiler.step()`` is called
            after every step (used by :func:`perflab.analysis.profiling.profile`).

    With ``config.world_size > 1`` the ranks are launched through
    :func:`perflab.distributed.launch` (each runs this same
    :func:`~perflab.train.step.train_step` under DDP) and rank 0's result is returned;
    every rank's result is saved (:func:`run_ranks` returns them all).

    Returns:
        The :class:`RunResult` (with ``path`` set when saved).

    A result that cannot be saved after training (the disk filled up meanwhile) is
    returned unsaved, with a warning that says why: the measurement is never lost. A loss
    that becomes NaN or infinite (learning rate too high) is warned about.

    Raises:
        ValueError: ``config`` is not a RunConfig, ``save`` is not a bool,
            ``results_dir`` is not writable; this machine cannot run the config
            (:meth:`RunConfig.check_machine`); bad dataset (all before any training).
        FileNotFoundError: the dataset is missing (before any training starts).
        perflab.distributed.RankFailedError, LaunchTimeoutError: a rank failed (DDP).
    """
    out = _check_destination(config, save, results_dir)
    config.check_machine()  # a config read back from another machine's result
    if config.world_size > 1:
        if profiler is not None:
            raise ValueError("profiler= profiles one process; for a data-parallel run "
                             "profile each rank inside perflab.distributed.launch_fn")
        from perflab.distributed import launch  # the same step on every rank

        return launch(config, progress=progress, save=save, results_dir=out)[0]
    device = config.resolved_device()  # resolved once; the loop and the step use it
    result = train_loop(config, device, progress=progress, profiler=profiler)
    _warn_diverged(result)
    return _save_or_keep(result, out) if save else result


def run_ranks(config: RunConfig, *, timeout_s: float = 600.0, progress: bool = True,
              save: bool = True, results_dir: str | None = None) -> list[RunResult]:
    """Every rank's result: ``[run(config)]`` for ``world_size == 1``, else one
    :class:`RunResult` per rank (rank order) from :func:`perflab.distributed.launch`.

    Args:
        config: the experiment.
        timeout_s: seconds the ranks may take before they are stopped (ranks only).
        progress, save, results_dir: as :func:`run`.

    Raises:
        ValueError: as :func:`run`; ``timeout_s`` not > 0.
        perflab.distributed.RankFailedError, LaunchTimeoutError: a rank failed or ran
            past ``timeout_s``.
    """
    out = _check_destination(config, save, results_dir)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    if config.world_size == 1:
        return [run(config, progress=progress, save=save, results_dir=results_dir)]
    config.check_machine()
    from perflab.distributed import launch

    return launch(config, timeout_s=timeout_s, progress=progress, save=save, results_dir=out)

def _check_destination(config: Any, save: Any, results_dir: Any) -> Path | None:
    """Validate what a run will write before it starts; the folder to save in (or None)."""
    if not isinstance(config, RunConfig):
        raise ValueError(f"config must be a RunConfig (e.g. RunConfig.preset('quick')), "
                         f"got {type(config).__name__}")
    if not isinstance(save, bool):
        raise ValueError(f"save must be True or False, got {save!r}")
    if results_dir is not None and not isinstance(results_dir, (str, Path)):
        raise ValueError(f"results_dir must be a folder path or None, got {results_dir!r}")
    if not save:
        return None
    return check_writable(Path(results_dir) if results_dir else default_results_dir(),
                          field="results_dir")


def _save_or_keep(result: RunResult, out: Path | None) -> RunResult:
    """Save ``result``; when the disk refuses, warn and keep it in memory (unsaved)."""
    try:
        return result.save(out)
    except StorageError as e:
        warnings.warn(f"{result.label!r} was measured but not saved ({e}); it is returned "
                      "unsaved: call .save('another/folder') on it to keep it",
                      RuntimeWarning, stacklevel=3)
        return result


def _warn_diverged(result: RunResult) -> None:
    bad = next((i for i, v in enumerate(result.losses) if not math.isfinite(v)), None)
    if bad is not None:
        warnings.warn(f"{result.label!r}: the loss became {result.losses[bad]} at step "
                      f"{bad} (training diverged): lower lr (now {result.config.lr:g}); "
                      "the step times are still measured", RuntimeWarning, stacklevel=3)


def run_interleaved(configs: Sequence[RunConfig], *, rounds: int = 2, progress: bool = True,
                    save: bool = True, results_dir: str | None = None) -> list[RunResult]:
    """Run each config ``rounds`` times, alternating (A B A B ...), and pool the rounds.

    On a shared or thermally throttling machine, speed drifts over tens of seconds;
    measuring A entirely before B puts that drift into the comparison. Alternating
    spreads it over both. Each round is a full :func:`run` (its own warm-up dropped);
    the returned results hold every round's measured steps (``steps x rounds``
    samples per phase), the first round's losses (every round starts from the same
    seed), the highest peak memory and the summed wall time.

    With ``save`` (the default) every round is saved the moment it is measured, under
    ``<results_dir>/rounds/``, and each pooled result in ``results_dir``: an interrupted
    comparison keeps its finished rounds (Ctrl-C prints where they are).

    Raises:
        ValueError: ``rounds`` < 1 or no configs, or anything :func:`run` refuses
            (every config is validated before the first round starts).
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    if not configs:
        raise ValueError("run_interleaved needs at least one RunConfig")
    out = _check_destination(configs[0], save, results_dir)
    for config in configs[1:]:
        _check_destination(config, False, None)  # its type only: the folder is checked once
    rounds_dir = out / "rounds" if out is not None else None
    before = set(rounds_dir.glob("*.json")) if rounds_dir and rounds_dir.is_dir() else set()
    per_config: list[list[RunResult]] = [[] for _ in configs]
    try:
        for _ in range(rounds):
            for i, config in enumerate(configs):
                r = run(config, progress=progress, save=False)
                per_config[i].append(_save_or_keep(r, rounds_dir) if save else r)
    except KeyboardInterrupt:
        # Count what is on disk, not what was appended: Ctrl-C can land after a round's
        # file was linked into place but before this loop saw its path.
        kept = (set(rounds_dir.glob("*.json")) - before) if rounds_dir else set()
        where = (f"; saved {len(kept)} finished round(s) in {rounds_dir}" if kept
                 else "; nothing was saved (save=False or no round finished)")
        print(f"interrupted after {sum(map(len, per_config))} of {rounds * len(configs)} "
              f"rounds{where}")
        raise
    pooled = [_pool(rs) for rs in per_config]
    return [_save_or_keep(r, out) if save else r for r in pooled]


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
