"""The per-rank DDP worker: one RunResult per rank.

Each rank (started by :func:`perflab.distributed.launch_fn`, or by ``torchrun`` through
``python -m perflab.distributed``) builds the same pieces as the single-process
:func:`perflab.experiment.run`: :func:`perflab.train.step.build_training` (loader, model,
optimizer), :class:`perflab.data.prefetch.BatchStream`, :class:`perflab.core.timing.PhaseTimer`
and :mod:`perflab.core.memory`, and trains with the same :func:`perflab.train.step.train_step`
(accumulation with ``no_sync``, the straggler's delay and the link's per-step reset
happen there; DDP's communication hook is registered once, by :func:`wrap_ddp`). Data differ by rank through a **rank-offset seed**
(``seed + rank`` seeds the shuffle and the augmentations of the rank's loader); the
models start equal because DDP broadcasts rank 0's parameters when it wraps the model.

A run measures three kinds of step, INTERLEAVED (after their warm-ups: ``warmup_steps``
compute-only steps, then as many DDP steps, then one allreduce alone), one of each per
measured step, so a burst of load from other programs hits all three alike (the overlap
bound's terms and the step it bounds come from the same moments):

1. ``compute``: the step under ``model.no_sync()``, no allreduce: the compute-only step
   time. Its warm-up median is the base of ``Straggler(delay_frac=...)``. Model and
   optimizer state are restored after each (outside the timed step), so the ranks stay
   identical.
2. the DDP step: phases data, forward, backward (DDP's allreduce overlapped with it),
   optimizer, other, step; all but the last micro-batch of ``accumulation_steps`` under
   ``no_sync``. DDP's buckets are read after the first one (DDP rebuilds them then).
3. ``comm``: the gradient allreduce alone, DDP's bucket sizes in DDP's order through the
   same link / compression (:func:`perflab.distributed.ddp.timed_allreduce_buckets`), no
   compute; ``comm_cpu``: the CPU time of this process (all threads, gloo's included)
   during it, the real allreduce's work, which competes with compute on a CPU machine.

Then, with a straggler only:

4. only with ``config.straggler`` (``steps``): local compute (data, forward, backward
   under ``no_sync``, with the injected delay; then the optimizer) and, between
   backward and optimizer, the gradient allreduce done by hand bucket by bucket
   (:func:`perflab.distributed.ddp.allreduce_by_bucket`), timed as the **wait**: the
   time this rank waits for the slowest rank plus the transfer. Per step:
   ``wait_s`` = the allreduce, ``compute_s`` = step - wait, ``step_s``; stored in
   ``extra["per_step"]``, and every rank's ``compute_s`` all-gathered into
   ``extra["all_ranks_compute_s"]`` (ranks x steps) for the straggler detector.

The straggler's delay (sleeping) is injected on its rank in every measured step of every
block (not in warm-up steps), at ``where``: in the data phase, at the start of the
forward phase, or at the start of the backward phase.
"""
from __future__ import annotations

import copy
import functools
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from perflab.core.config import RunConfig
from perflab.core.env import env_summary
from perflab.distributed.link_hook import hook_compression
from perflab.data.prefetch import BatchStream
from perflab.core.measurement import Measurement
from perflab.core.memory import read_peak, reset_peak
from perflab.core.result import RunResult
from perflab.core.timing import PhaseTimer, Stopwatch
from perflab.train.step import StragglerDelay, build_training, make_scaler, train_step
from perflab.distributed.ddp import (allreduce_by_bucket, bucket_params, ddp_buckets,
                                     timed_allreduce_buckets,
                                     wrap_ddp)

__all__ = ["ddp_worker", "rank_device", "total_steps"]


def rank_device(config: RunConfig) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when the config resolves to CUDA, else it."""
    dev = config.resolved_device()
    if dev.type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return dev


def total_steps(config: RunConfig) -> int:
    """Steps :func:`ddp_worker` runs for ``config`` (every kind of step, warm-up included)."""
    w, n = config.warmup_steps, config.steps
    return 2 * (w + n) + n + (n if config.straggler else 0)


class _Progress:
    """tqdm on rank 0 and/or the count of steps done written to ``path`` (rank 0), which
    :func:`perflab.distributed.launch` reads to show a bar in the launching process."""

    def __init__(self, bar: Any, path: str | None, offset: int):
        self.bar, self.path, self.done = bar, path, offset

    def update(self) -> None:
        self.bar.update()
        self.done += 1
        if self.path:
            with open(self.path, "w") as f:
                f.write(str(self.done))

    def close(self) -> None:
        self.bar.close()


def _snapshot(model: Any, optimizer: Any) -> tuple[dict, dict]:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


def _restore(model: Any, optimizer: Any, saved: tuple[dict, dict]) -> None:
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    optimizer.zero_grad(set_to_none=True)


def _block(model: Any, optimizer: Any, batches: BatchStream, config: RunConfig,
           scaler: Any, straggler: StragglerDelay, n: int, timer: PhaseTimer, bar: Any, *,
           sync: bool, allreduce: Any = None, link_state: Any = None) -> list[float]:
    """Run ``n`` steps of :func:`perflab.train.step.train_step` into ``timer``; returns the
    losses. ``sync=False``: every micro-batch under ``no_sync`` (compute only);
    ``allreduce``: the hand-run bucket allreduce, timed as the "wait" phase."""
    losses = []
    for _ in range(n):
        with timer.step():
            loss = train_step(model, None, None, optimizer, timer, amp=config.amp,
                              scaler=scaler, accumulation_steps=config.accumulation_steps,
                              next_batch=batches.__next__, sync=sync, straggler=straggler,
                              link=link_state, allreduce=allreduce)
        losses.append(float(loss))
        bar.update()
    return losses


def ddp_worker(config: RunConfig, progress: bool = False, progress_file: str | None = None,
               step_offset: int = 0) -> RunResult:
    """Train ``config`` on this rank of an initialised process group; measure it.

    See the module docstring for what each kind of step measures. Runs on every
    rank; ``progress`` shows a tqdm bar on rank 0; with ``progress_file`` rank 0 writes
    ``step_offset`` + the steps done so far into that file after every step.

    Returns:
        This rank's :class:`RunResult` (``rank`` set, not saved): phases "data",
        "forward", "backward", "optimizer", "other", "step" (DDP steps), "compute",
        "comm", "comm_cpu" (seconds); ``extra`` with "buckets", "link", "straggler", "delay_s",
        "per_step" (None without a straggler), "all_ranks_compute_s", "backend",
        "world_size", "data_seed", "param_checksum" (sum of all parameters at the end).
    """

    rank, world_size = dist.get_rank(), dist.get_world_size()
    wall = Stopwatch().start()
    device = rank_device(config)
    local = config.replace(seed=config.seed + rank,  # rank-offset seed: data differ by rank
                           device=str(device) if device.type == "cuda" else config.device)
    loader, model, optimizer, device = build_training(local)
    ddp, link_state = wrap_ddp(model, config, device)  # hooks registered once, here
    scaler = make_scaler(config, device)
    was_reset = reset_peak(device)
    batches = BatchStream(loader, local, device)
    s = config.straggler
    w, n = config.warmup_steps, config.steps
    bar = _Progress(tqdm(total=total_steps(config), unit="step", leave=False,
                         desc=f"rank {rank}: {config.display_label()}",
                         disable=not (progress and rank == 0)),
                    progress_file if rank == 0 else None, step_offset)
    straggler = StragglerDelay(s.where if s else "none")  # sleeps on the slow rank only
    run = functools.partial(_block, ddp, optimizer, batches, config, scaler, straggler)
    try:
        # Warm-up, in the measured order: compute-only steps (their median is the
        # straggler delay's base), DDP steps (the delay off; DDP rebuilds its buckets
        # after the first), then the buckets' allreduce alone once.
        comp, timer = PhaseTimer(device), PhaseTimer(device)
        saved = _snapshot(model, optimizer)
        run(w, comp, bar, sync=False)
        _restore(model, optimizer, saved)
        if s is not None and rank == s.rank:
            if s.delay_s is not None:
                straggler.delay_s = s.delay_s
            else:
                # check_ddp_config made sure w >= 2: the median of the warm-up steps
                straggler.delay_s = s.delay_frac * comp.measurements(warmup=0)["step"].median
        delay, straggler.delay_s = straggler.delay_s, 0.0
        losses = run(w, timer, bar, sync=True, link_state=link_state)
        straggler.delay_s = delay
        compression = hook_compression(config.comm_hook)
        sizes: list[int] | None = None
        comm_s: list[float] = []
        comm_cpu_s: list[float] = []
        # 1-3 interleaved, one of each per measured step, so load from other programs
        # hits the compute-only step, the DDP step and the allreduce alone alike.
        for _ in range(n):
            saved = _snapshot(model, optimizer)  # outside the timed steps
            run(1, comp, bar, sync=False)
            _restore(model, optimizer, saved)  # ranks stay identical
            losses += run(1, timer, bar, sync=True, link_state=link_state)
            if sizes is None:
                sizes = [b["nbytes"] for b in ddp_buckets(ddp)]
                timed_allreduce_buckets(sizes, link=config.link, compression=compression)
            cpu0 = time.process_time()  # every thread of this process: gloo's too
            comm_s.append(timed_allreduce_buckets(sizes, link=config.link,
                                                  compression=compression))
            comm_cpu_s.append(time.process_time() - cpu0)
            bar.update()
        buckets = ddp_buckets(ddp)
        # 4. straggler runs: local compute, then the allreduce by hand (= the wait)
        per_step = None
        if s is not None:
            expl = PhaseTimer(device)
            params = bucket_params(ddp)
            run(n, expl, bar, sync=False, allreduce=functools.partial(
                allreduce_by_bucket, params, compression=config.comm_hook))
            m = expl.measurements(warmup=0)
            wait_s, step_s = list(m["wait"].times_s), list(m["step"].times_s)
            per_step = {"compute_s": [t - u for t, u in zip(step_s, wait_s)],
                        "wait_s": wait_s, "step_s": step_s}
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, per_step["compute_s"] if per_step else None)
        peak = read_peak(device, was_reset=was_reset)
    finally:
        bar.close()
        batches.close()
    label = config.display_label()
    phases = timer.measurements(warmup=w, samples_per_step=config.samples_per_step,
                                label=label)
    phases["compute"] = comp.measurements(warmup=w, samples_per_step=config.samples_per_step,
                                          label=label)["step"].relabel(f"{label} compute")
    phases["comm"] = Measurement(label=f"{label} comm", times_s=tuple(comm_s))
    phases["comm_cpu"] = Measurement(label=f"{label} comm CPU", times_s=tuple(comm_cpu_s))
    env = env_summary(config.device, config.dataset).to_dict()
    env["torch_threads"] = torch.get_num_threads()
    extra = {"buckets": buckets, "link": config.link.describe() if config.link else None,
             "straggler": s.describe() if s else None, "delay_s": straggler.delay_s,
             "per_step": per_step,
             "all_ranks_compute_s": gathered if per_step else None,
             "backend": dist.get_backend(), "world_size": world_size,
             "data_seed": local.seed,
             "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()
                                   if p.requires_grad),
             # equal on every rank when DDP kept the replicas identical
             "param_checksum": float(sum(p.detach().double().sum().cpu()
                                         for p in model.parameters()))}
    return RunResult(config=config, phases=phases, losses=tuple(losses), peak_memory=peak,
                     env=env, num_classes=len(loader.dataset.classes),
                     wall_s=wall.elapsed_s, rank=rank, extra=extra)

