"""The largest batch that fits: an out-of-memory search on a GPU, a byte budget on a CPU.

* CUDA: run a real training step at each candidate batch size; a
  ``torch.cuda.OutOfMemoryError`` means "does not fit". The error is caught, every
  tensor of the attempt is released (``gc.collect`` + ``torch.cuda.empty_cache``) and
  the search goes on. An optional budget caps the process with
  ``torch.cuda.set_per_process_memory_fraction`` during the search.
* CPU: a CPU rarely runs out of memory cleanly (the machine swaps or the OOM killer
  ends the kernel), so a budget in GiB is checked instead against measured bytes:
  model state (parameters + gradients + optimizer state, :func:`perflab.core.memory.
  model_state_bytes` after a step), the bytes saved for backward at that batch size
  (:func:`perflab.core.memory.saved_activation_bytes`) and, with checkpointing, the largest
  segment backward recomputes at once (:func:`cpu_step_bytes`). Deterministic; it
  leaves out temporaries and allocator caching, which the GPU search includes.

Both use :func:`search_max_batch`: galloping from a guess, then bisection, from the
smallest batch the model can train on (:func:`smallest_batch`: 2 where a BatchNorm layer
sees a 1x1 map, since one sample then gives it one value per channel).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

import pandas as pd
import torch

from perflab.analysis.checkpointing import segment_plan, stage_table
from perflab.core.config import RunConfig
from perflab.core.memory import GIB, MIB, model_state_bytes, saved_activation_bytes
from perflab.train.step import make_scaler, train_step
from perflab.train.workloads import synthetic_batch, training_parts

__all__ = ["MaxBatch", "search_max_batch", "find_max_batch", "cpu_step_bytes",
           "smallest_batch"]


@dataclass(frozen=True, eq=False)
class MaxBatch:
    """Result of :func:`find_max_batch`.

    Attributes:
        batch_size: the largest batch size that fitted (0 if not even the smallest
            trainable one did, :func:`smallest_batch`).
        method: how fitting was decided (OOM search or the CPU byte budget).
        budget_bytes: the budget, or None (a GPU search without one).
        trials: one row per size tried, in order: ``batch_size``, ``fits``, ``bytes``
            (measured bytes of the attempt; peak allocated on CUDA), ``note``.
        hit_limit: True when even ``limit`` fitted (the real maximum may be larger).
    """

    batch_size: int
    method: str
    budget_bytes: int | None
    trials: pd.DataFrame
    hit_limit: bool

    def __repr__(self) -> str:
        budget = (f" within {self.budget_bytes / GIB:.3f} GiB" if self.budget_bytes
                  else "")
        more = " (the search limit: it may go higher)" if self.hit_limit else ""
        return (f"MaxBatch({self.batch_size}{more}{budget}; {self.method}; "
                f"{len(self.trials)} sizes tried)")


def search_max_batch(fits: Callable[[int], tuple[bool, int | None, str]], *,
                     start: int = 8, limit: int = 4096, minimum: int = 1
                     ) -> tuple[int, pd.DataFrame, bool]:
    """Largest n in [minimum, limit] with ``fits(n)``, assuming fitting is monotone in n.

    Gallops from ``start`` (a guess: steps of 1, 2, 4, ... up while sizes fit, or down
    while they do not), then bisects between the last size that fitted and the first
    that did not; a good guess costs two attempts.

    Args:
        fits: ``fits(n) -> (fits, bytes or None, note)`` for batch size n.
        start: the first size tried (a guess, minimum <= start <= limit).
        limit: the largest size tried.
        minimum: the smallest size tried (>= 1).

    Returns:
        (largest fitting size, 0 if even ``minimum`` did not fit; the table of trials, in
        order: batch_size, fits, bytes, note; whether ``limit`` itself fitted).

    Raises:
        ValueError: unless 1 <= minimum <= start <= limit.
    """
    if not 1 <= minimum <= start <= limit:
        raise ValueError(f"need 1 <= minimum <= start <= limit, got minimum={minimum}, "
                         f"start={start}, limit={limit}")
    trials = []

    def attempt(n: int) -> bool:
        ok, nbytes, note = fits(n)
        trials.append({"batch_size": n, "fits": ok, "bytes": nbytes, "note": note})
        return ok

    step = 1
    if attempt(start):
        good, bad = start, None
        while good < limit:                    # gallop up
            n = min(good + step, limit)
            if not attempt(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        good, bad = minimum - 1, start
        while bad > minimum:                   # gallop down
            n = max(bad - step, minimum)
            if attempt(n):
                good = n
                break
            bad, step = n, step * 2
    while bad is not None and bad - good > 1:  # bisect (good, bad)
        mid = (good + bad) // 2
        if attempt(mid):
            good = mid
        else:
            bad = mid
    table = pd.DataFrame(trials, columns=["batch_size", "fits", "bytes", "note"])
    return (good if good >= minimum else 0), table, good == limit


_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d,
                torch.nn.SyncBatchNorm)


def smallest_batch(config: RunConfig) -> int:
    """The smallest batch size a training step of ``config`` accepts: 2 when a BatchNorm
    layer sees one value per channel per sample (a 1x1 map, e.g. ResNet-18's last stage
    at 32 px), else 1.

    In training, BatchNorm normalises each channel over the batch and the map
    (``N x H x W`` values); with a single value the variance is undefined and torch
    raises ``ValueError: Expected more than 1 value per channel when training``. Read
    from one forward pass of a fresh model at batch 2, in eval mode (same shapes, no
    statistics updated).
    """
    parts = training_parts(config, batch_size=2)
    per_sample: list[int] = []

    def record(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        per_sample.append(x.numel() // (x.shape[0] * x.shape[1]))

    hooks = [m.register_forward_pre_hook(record) for m in parts.model.modules()
             if isinstance(m, _BATCH_NORMS)]
    try:
        parts.model.eval()
        with torch.no_grad():
            parts.model(parts.x)
    finally:
        for h in hooks:
            h.remove()
    return 2 if any(v == 1 for v in per_sample) else 1


def cpu_step_bytes(config: RunConfig) -> Callable[[int], dict[str, int]]:
    """A function ``n -> {"state", "saved", "recompute"}`` (bytes) for one training step
    of ``config`` at batch size n, measured on one fresh seeded model.

    * state: parameters + gradients (the same size; they exist during every step even
      though ``zero_grad(set_to_none=True)`` frees them between steps) + the optimizer
      state after one step;
    * saved: bytes saved for backward by the forward pass (+ loss), checkpointing on;
    * recompute: with checkpointing, the largest checkpointed segment's own saved bytes,
      which backward holds while it recomputes that segment (Chen et al. 2016's n/k
      term; from :func:`perflab.analysis.checkpointing.stage_table`); 0 without.

    The returned function raises ``ValueError`` for n below :func:`smallest_batch`
    (a batch the model cannot train on has no training-step bytes).
    """
    lowest = smallest_batch(config)
    parts = training_parts(config, batch_size=2)
    train_step(parts.model, parts.x, parts.y, parts.optimizer, amp=config.amp)
    state = model_state_bytes(parts.model, parts.optimizer)
    state_bytes = 2 * state.params + state.optimizer
    plan = segment_plan(config.checkpointing)

    def step_bytes(n: int) -> dict[str, int]:
        if n < lowest:
            raise ValueError(
                f"batch {n} cannot train: a BatchNorm layer of this model sees a 1x1 map "
                f"at image_size={config.image_size}, one value per channel per sample; "
                f"start at smallest_batch(config) = {lowest}")
        x, y = synthetic_batch(config, n, device=parts.device)
        with torch.autocast(parts.device.type, dtype=torch.bfloat16,
                            enabled=config.amp == "bf16"):
            saved = saved_activation_bytes(parts.model, x, y).nbytes
            recompute = 0
            if any(seg.checkpointed for seg in plan):
                per_stage = stage_table(parts.model, x, y).saved_mib * MIB
                recompute = max(int(round(sum(per_stage.iloc[i] for i in seg.stages)))
                                for seg in plan if seg.checkpointed)
        return {"state": state_bytes, "saved": saved, "recompute": recompute}
    return step_bytes


def _cuda_fits(config: RunConfig) -> Callable[[int], tuple[bool, int | None, str]]:
    dev = config.resolved_device()

    def fits(n: int) -> tuple[bool, int | None, str]:
        ok, note = True, "ran one training step"
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            parts = training_parts(config, batch_size=n)
            scaler = make_scaler(config, dev)
            for _ in range(2):  # the second step holds the optimizer state too
                train_step(parts.model, parts.x, parts.y, parts.optimizer,
                           amp=config.amp, scaler=scaler)
            torch.cuda.synchronize(dev)
            del parts
        except torch.cuda.OutOfMemoryError as e:
            ok, note = False, f"OutOfMemoryError: {str(e).splitlines()[0][:80]}"
        peak = int(torch.cuda.max_memory_allocated(dev))
        gc.collect()  # the attempt's tensors (and the error's frames) are gone now
        torch.cuda.empty_cache()
        return ok, peak, note
    return fits


def find_max_batch(config: RunConfig, *, budget_gib: float | None = None,
                   start: int | None = None, limit: int = 4096) -> MaxBatch:
    """The largest training batch of ``config`` (its checkpointing, amp, image size).

    Args:
        config: the training setup; ``batch_size`` and ``compile`` are ignored.
        budget_gib: memory budget in GiB (2**30 bytes). Required on a CPU; on CUDA it
            caps the process's share of the GPU during the search (None = the whole GPU).
        start: the first batch size tried. None: on a CPU the size predicted from the
            bytes measured at batch 2 and 4 (bytes grow linearly with the batch), on
            CUDA ``config.batch_size``.
        limit: the largest batch size tried.

    Returns:
        A :class:`MaxBatch` with every size tried.

    Raises:
        ValueError: no budget on a CPU, a budget <= 0, or one larger than the GPU.
    """
    dev = config.resolved_device()
    if budget_gib is not None and budget_gib <= 0:
        raise ValueError(f"budget_gib must be > 0 GiB, got {budget_gib}")
    if dev.type != "cuda":
        if budget_gib is None:
            raise ValueError(f"find_max_batch on {dev.type} needs budget_gib=... (a "
                             "memory budget in GiB): running a CPU out of memory would "
                             "swap or kill the kernel instead of raising")
        budget = int(budget_gib * GIB)
        lowest = smallest_batch(config)
        step_bytes = cpu_step_bytes(config)

        def fits(n: int) -> tuple[bool, int | None, str]:
            b = step_bytes(n)
            note = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in b.items())
            return sum(b.values()) <= budget, sum(b.values()), note
        if start is None:  # bytes are affine in the batch size: a guess from two sizes
            b2, b4 = sum(step_bytes(2).values()), sum(step_bytes(4).values())
            per_sample = max((b4 - b2) / 2, 1.0)
            start = int(min(max((budget - (b2 - 2 * per_sample)) // per_sample, lowest),
                            limit))
        best, trials, hit = search_max_batch(fits, start=max(start, lowest), limit=limit,
                                             minimum=lowest)
        return MaxBatch(best, "CPU budget: model state + saved activations + recompute "
                        "(measured bytes)", budget, trials, hit)
    total = torch.cuda.get_device_properties(dev).total_memory
    budget = None if budget_gib is None else int(budget_gib * GIB)
    if budget is not None and budget > total:
        raise ValueError(f"budget_gib={budget_gib} exceeds this GPU's "
                         f"{total / GIB:.1f} GiB; pass a smaller budget or None")
    if budget is not None:
        torch.cuda.set_per_process_memory_fraction(budget / total, dev)
    lowest = smallest_batch(config)
    try:
        best, trials, hit = search_max_batch(
            _cuda_fits(config), limit=limit, minimum=lowest,
            start=min(max(start or config.batch_size, lowest), limit))
    finally:
        if budget is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
    return MaxBatch(best, "CUDA: training steps until torch.cuda.OutOfMemoryError", budget,
                    trials, hit)
