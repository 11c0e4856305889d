"""``launch(config)`` and ``launch_sweep(configs)``: data-parallel runs, RunResults per rank.

Each launch starts fresh processes (spawn, import torch, rendezvous): seconds of
start-up that :func:`launch` reports as ``extra["launch_overhead_s"]``.
:func:`launch_sweep` pays it once for several configs (e.g. a straggler delay sweep):
the same ranks run every config in turn.
"""
from __future__ import annotations

from typing import Sequence

from perflab.config import RunConfig
from perflab.distributed.ddp import check_ddp_config
from perflab.distributed.launch import default_backend, launch_fn
from perflab.distributed.worker import ddp_worker
from perflab.result import RunResult
from perflab.timing import Stopwatch

__all__ = ["launch", "launch_sweep", "sweep_worker"]


def launch(config: RunConfig, world_size: int | None = None, *, timeout_s: float = 600,
           progress: bool = True, save: bool = True, results_dir: str | None = None
           ) -> list[RunResult]:
    """Run ``config`` data-parallel on ``world_size`` local ranks; one RunResult per rank.

    Starts the ranks with :func:`launch_fn` (elastic launcher; gloo with
    ``config.threads or 1`` torch threads per rank on CPU, NCCL with one GPU per rank on
    CUDA), runs :func:`ddp_worker` on each, and saves each rank's result like
    :func:`perflab.train.run` does (``<label>-rank<r>.json``).

    Args:
        config: the experiment; ``config.world_size`` ranks unless ``world_size`` is
            given (then ``config.replace(world_size=world_size)``).
        world_size: ranks, >= 1, or None.
        timeout_s: seconds after which ranks still running are stopped.
        progress: a tqdm bar in rank 0 (shown where that process's stderr goes: the
            terminal running Jupyter or torchrun).
        save: write each rank's result as JSON.
        results_dir: where to save (None -> :func:`perflab.result.default_results_dir`).

    Returns:
        ``[rank 0's RunResult, rank 1's, ...]``; ``extra["launch_overhead_s"]``: this
        call's wall time minus the slowest rank's own wall time (process start-up,
        rendezvous, teardown), seconds.

    Raises:
        ValueError: invalid config or settings (before any process starts).
        RankFailedError, LaunchTimeoutError: see :func:`launch_fn`.
    """
    return launch_sweep([config], world_size, timeout_s=timeout_s, progress=progress,
                        save=save, results_dir=results_dir)[0]


def sweep_worker(configs: Sequence[RunConfig], progress: bool = False) -> list[RunResult]:
    """On one rank: :func:`ddp_worker` for each config in turn (same processes)."""
    return [ddp_worker(c, progress) for c in configs]


def launch_sweep(configs: Sequence[RunConfig], world_size: int | None = None, *,
                 timeout_s: float = 600, progress: bool = True, save: bool = True,
                 results_dir: str | None = None) -> list[list[RunResult]]:
    """Like :func:`launch` for several configs run one after another by the same ranks.

    All configs must share ``world_size``, ``device`` and ``threads`` (one set of
    processes runs them). ``timeout_s`` covers the whole sweep.

    Returns:
        Per config, the per-rank RunResults (``[config][rank]``); each result's
        ``extra["launch_overhead_s"]`` is the launch's wall time minus the slowest rank's
        summed run time (start-up, rendezvous, teardown; once for the sweep).

    Raises:
        ValueError: no configs, configs that differ in world_size/device/threads, or
            anything :func:`launch` rejects (before any process starts).
        RankFailedError, LaunchTimeoutError: see :func:`launch_fn`.
    """
    configs = [c.replace(world_size=world_size) if world_size is not None else c
               for c in configs]
    if not configs or not all(isinstance(c, RunConfig) for c in configs):
        raise ValueError("configs must be a non-empty list of RunConfig")
    shared = {(c.world_size, c.device, c.threads) for c in configs}
    if len(shared) != 1:
        raise ValueError("configs of one sweep must share world_size, device and threads "
                         f"(one set of ranks runs them all), got {sorted(map(str, shared))}")
    first = configs[0]
    backend = default_backend(first.device)
    for c in configs:
        check_ddp_config(c, backend)
    first.resolved_device()  # raises for a device this machine does not have
    wall = Stopwatch().start()
    per_rank = launch_fn(sweep_worker, first.world_size, args=(configs, progress),
                         backend=backend, device=first.device, timeout_s=timeout_s,
                         threads_per_rank=first.threads or 1)
    busy = max(sum(r.wall_s for r in rank_results) for rank_results in per_rank)
    overhead = wall.elapsed_s - busy
    out = []
    for i in range(len(configs)):
        row = []
        for rank_results in per_rank:
            r = rank_results[i]
            r.extra["launch_overhead_s"] = overhead
            row.append(r.save(results_dir) if save else r)
        out.append(row)
    return out
