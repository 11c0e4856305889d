"""``launch(config)`` and ``launch_sweep(configs)``: data-parallel runs, RunResults per rank.

Each launch starts fresh processes (spawn, import torch, rendezvous): seconds of
start-up that :func:`launch` reports as ``extra["launch_overhead_s"]``.
:func:`launch_sweep` pays it once for several configs (e.g. a straggler delay sweep):
the same ranks run every config in turn. :func:`summary_table` and
:func:`print_rank_results` show one row per rank: what ``perflab run --world-size N``
and ``python -m perflab.distributed`` print.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from perflab.core.config import RunConfig
from perflab.distributed.ddp import check_ddp_config
from perflab.distributed.launch import default_backend, launch_fn
from perflab.distributed.worker import ddp_worker, total_steps
from perflab.core.result import RunResult
from perflab.core.paths import default_results_dir
from perflab.core.storage import check_writable, write_atomic
from perflab.core.timing import Stopwatch

__all__ = ["launch", "launch_sweep", "sweep_worker", "summary_table",
           "print_rank_results"]


def launch(config: RunConfig, world_size: int | None = None, *, timeout_s: float = 600,
           progress: bool = True, save: bool = True, results_dir: str | None = None
           ) -> list[RunResult]:
    """Run ``config`` data-parallel on ``world_size`` local ranks; one RunResult per rank.

    Starts the ranks with :func:`launch_fn` (elastic launcher; gloo with
    ``config.threads or 1`` torch threads per rank on CPU, NCCL with one GPU per rank on
    CUDA), runs :func:`ddp_worker` on each, and saves each rank's result like
    :func:`perflab.experiment.run` does (``<label>-rank<r>.json``).

    Args:
        config: the experiment; ``config.world_size`` ranks unless ``world_size`` is
            given (then ``config.replace(world_size=world_size)``).
        world_size: ranks, >= 1, or None.
        timeout_s: seconds after which ranks still running are stopped.
        progress: a tqdm bar here (a widget in Jupyter), following rank 0's steps.
        save: write each rank's result as JSON.
        results_dir: where to save (None -> :func:`perflab.core.paths.default_results_dir`).

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


def sweep_worker(configs: Sequence[RunConfig], progress: bool = False,
                 progress_file: str | None = None,
                 results_dir: str | None = None) -> list[RunResult]:
    """On one rank: :func:`ddp_worker` for each config in turn (same processes).

    With ``results_dir`` each rank saves each result the moment it is measured
    (``<label>-rank<r>.json``), so a sweep stopped half-way keeps its finished points.
    """
    out, offset = [], 0
    for c in configs:
        r = ddp_worker(c, progress, progress_file, offset)
        out.append(r.save(results_dir) if results_dir is not None else r)
        offset += total_steps(c)
    return out


class _ProgressWatcher:
    """A tqdm bar in the launching process, fed by the step count rank 0 writes to a
    file (a widget in Jupyter: the ranks' own stderr does not reach a notebook)."""

    def __init__(self, total: int, desc: str):
        self.path = str(Path(tempfile.mkdtemp(prefix="perflab-progress-")) / "steps")
        self._bar = tqdm(total=total, desc=desc, unit="step", leave=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            try:
                done = int(Path(self.path).read_text() or 0)
            except (OSError, ValueError):
                continue
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._bar.close()
        shutil.rmtree(Path(self.path).parent, ignore_errors=True)


def launch_sweep(configs: Sequence[RunConfig], world_size: int | None = None, *,
                 timeout_s: float = 600, progress: bool = True, save: bool = True,
                 results_dir: str | None = None) -> list[list[RunResult]]:
    """Like :func:`launch` for several configs run one after another by the same ranks.

    All configs must share ``world_size``, ``device`` and ``threads`` (one set of
    processes runs them). ``timeout_s`` covers the whole sweep.

    With ``save`` every rank saves every result the moment it is measured (the folder
    is checked writable before any process starts).

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
    if not isinstance(save, bool):
        raise ValueError(f"save must be True or False, got {save!r}")
    out_dir = (str(check_writable(results_dir or default_results_dir(), field="results_dir"))
               if save else None)
    wall = Stopwatch().start()
    watcher = (_ProgressWatcher(sum(total_steps(c) for c in configs),
                                f"{first.world_size} ranks: {first.display_label()}")
               if progress else None)
    try:
        per_rank = launch_fn(sweep_worker, first.world_size,
                             args=(configs, False, watcher.path if watcher else None,
                                   out_dir),
                             backend=backend, device=first.device, timeout_s=timeout_s,
                             threads_per_rank=first.threads or 1)
    finally:
        if watcher is not None:
            watcher.close()
    busy = max(sum(r.wall_s for r in rank_results) for rank_results in per_rank)
    overhead = wall.elapsed_s - busy
    for rank_results in per_rank:
        for r in rank_results:
            r.extra["launch_overhead_s"] = overhead
            if r.path:  # saved by its rank already: add the overhead to the file
                write_atomic(r.path, json.dumps(r.to_dict(), indent=1))
    return [[rank_results[i] for rank_results in per_rank] for i in range(len(configs))]


def summary_table(results: Sequence[RunResult]):
    """One row per rank: step, compute, comm medians (ms), samples/s, delay (ms).

    Args:
        results: one data-parallel RunResult per rank (as :func:`launch` returns them).

    Returns:
        A ``pandas.DataFrame`` indexed by rank, rounded to 2 decimals.
    """
    import pandas as pd

    rows = [{"rank": r.rank, "step_ms": r.step.median * 1e3,
             "compute_ms": r.phases["compute"].median * 1e3,
             "comm_ms": r.phases["comm"].median * 1e3,
             "samples_per_s": r.samples_per_s,
             "delay_ms": r.extra["delay_s"] * 1e3} for r in results]
    return pd.DataFrame(rows).set_index("rank").round(2)


def print_rank_results(config: RunConfig, results: Sequence[RunResult]) -> None:
    """Print ``"<label>: N ranks, backend B"`` and :func:`summary_table` of ``results``:
    what ``perflab run --world-size N`` and ``python -m perflab.distributed`` show."""
    print(f"{config.display_label()}: {config.world_size} ranks, backend "
          f"{results[0].extra.get('backend', '?')}")
    print(summary_table(results).to_string())
