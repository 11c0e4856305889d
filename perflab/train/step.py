"""One training step for one process and every DDP rank, and what it trains.

:func:`train_step` reads top to bottom (after nanoGPT's training loop): autocast,
GradScaler, gradient accumulation with DDP's ``no_sync``, the injected straggler's
delay and the simulated link's per-step reset are visible in it and nowhere else.
:func:`perflab.experiment.run` (one process) and :func:`perflab.distributed.ddp_worker`
(every rank) both call it; :func:`build_training` builds the loader, model (with
activation checkpointing, ``channels_last`` and ``torch.compile`` applied) and optimizer
they train.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from perflab.core.config import RunConfig
from perflab.data.loader import make_loader
from perflab.core.dtypes import LOW_PRECISION_DTYPES
from perflab.models import build_model

__all__ = ["train_step", "build_training", "build_model_and_optimizer", "make_scaler",
           "StragglerDelay", "AMP_DTYPES", "OPTIMIZER_OPTIONS", "optimizer_options"]


#: autocast dtype per ``RunConfig.amp`` mode (None = fp32, autocast disabled).
AMP_DTYPES: dict[str, torch.dtype | None] = {"off": None, **LOW_PRECISION_DTYPES}


class _NoTimer:
    """Stands in for a PhaseTimer when a step is not being timed."""

    @contextlib.contextmanager
    def phase(self, name: str):
        yield


class StragglerDelay:
    """The injected straggler's sleep at its place in the step (no CPU burned).

    ``StragglerDelay(where)`` with ``delay_s`` set (seconds) on the slow rank only; a
    :func:`train_step` calls it at "data", "before_forward" and "before_backward" of
    its first micro-batch and it sleeps where ``where`` says
    (:class:`perflab.core.simulated.Straggler`).
    """

    def __init__(self, where: str, delay_s: float = 0.0):
        self.where, self.delay_s = where, delay_s

    def __call__(self, where: str) -> None:
        if self.delay_s > 0 and where == self.where:
            time.sleep(self.delay_s)


#: Keyword arguments of ``torch.optim.SGD`` that :func:`optimizer_options` may set:
#: ``foreach`` (one multi-tensor kernel launch per group of parameters) and ``fused``
#: (one fused kernel for the whole update; CPU and CUDA, PyTorch >= 2.4). PyTorch docs,
#: torch.optim, "Algorithms: implementations (for-loop, foreach, fused)".
OPTIMIZER_OPTIONS = ("foreach", "fused")
_optimizer_kwargs: dict[str, bool] = {}


@contextlib.contextmanager
def optimizer_options(**options: bool):
    """Inside the block, :func:`build_model_and_optimizer` builds SGD with ``options``
    (e.g. ``fused=True``): how the ladder's ``fused_optimizer`` rung changes the
    optimizer of a :func:`perflab.experiment.run` (RunConfig has no field for it).

    Raises:
        ValueError: an option not in :data:`OPTIMIZER_OPTIONS`, or not a bool.
    """
    bad = {k: v for k, v in options.items()
           if k not in OPTIMIZER_OPTIONS or not isinstance(v, bool)}
    if bad:
        raise ValueError(f"optimizer_options takes {OPTIMIZER_OPTIONS} as True/False, got "
                         f"{bad}")
    old = dict(_optimizer_kwargs)
    _optimizer_kwargs.update(options)
    try:
        yield
    finally:
        _optimizer_kwargs.clear()
        _optimizer_kwargs.update(old)


def make_scaler(config: RunConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for ``config.amp == "fp16"``, else None: fp16
    gradients underflow without loss scaling; bf16 has fp32's exponent range (PyTorch
    "Automatic Mixed Precision examples")."""
    return torch.amp.GradScaler(device.type) if config.amp == "fp16" else None


def train_step(model: torch.nn.Module, x: torch.Tensor | None, y: torch.Tensor | None,
               optimizer: torch.optim.Optimizer, timer: Any = None, *, amp: str = "off",
               scaler: torch.amp.GradScaler | None = None, accumulation_steps: int = 1,
               next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
               sync: bool = True, straggler: Callable[[str], None] | None = None,
               link: Any = None, allreduce: Callable[[], None] | None = None
               ) -> torch.Tensor:
    """One optimisation step, for one process and for every DDP rank alike.

    Reads top to bottom: for each of ``accumulation_steps`` micro-batches, (data,)
    forward + loss under ``torch.autocast``, backward (scaled by the ``GradScaler`` for
    fp16); then the optimizer step. Mixed precision follows the PyTorch AMP recipe
    ("Automatic Mixed Precision examples"): forward and loss under autocast, backward
    outside it; the scaler steps the optimizer (skipping steps whose gradients
    overflowed) and updates its scale. Gradient accumulation divides each micro-batch's
    loss by ``accumulation_steps`` so the summed gradient is the mean over all of them;
    under DDP every micro-batch but the last runs inside ``model.no_sync()``, so the
    gradients are allreduced once per step, overlapped with the last backward (PyTorch
    DDP docs, ``no_sync``). Activation checkpointing and ``torch.compile`` live in the
    model itself (:func:`build_training`).

    Args:
        model: maps (B, 3, H, W) float images to (B, num_classes) logits, or (B, T)
            int64 tokens to (B, T, vocab) logits (the loss is then the mean over all
            B x T next-token predictions); a ``DistributedDataParallel`` on a rank.
        x, y: the first micro-batch, images (B, 3, H, W) float32 and class indices (B,)
            int64 on the model's device; None when ``next_batch`` gives every
            micro-batch (then its wait is timed as the "data" phase).
        optimizer: updates ``model``'s parameters.
        timer: a :class:`PhaseTimer` with an open step, or None.
        amp: "off" (fp32), "bf16" or "fp16" (autocast dtype, see :data:`AMP_DTYPES`).
        scaler: a ``torch.amp.GradScaler`` (needed for fp16, :func:`make_scaler`), or None.
        accumulation_steps: micro-batches per optimizer step (>= 1).
        next_batch: returns the next ``(x, y)`` on the device (e.g. ``next(stream)``).
        sync: DDP only: False runs every micro-batch under ``no_sync`` (no allreduce: the
            compute-only step of :mod:`perflab.analysis.overlap`).
        straggler: a :class:`StragglerDelay` (the injected straggler), or None.
        link: the simulated link's state (:func:`perflab.distributed.link_hook.register_link_hook`), or
            None; its queue is emptied at the start of the step.
        allreduce: called between the last backward and the optimizer, timed as the
            "wait" phase (the hand-run bucket allreduce of a straggler run), or None.

    Returns:
        The loss summed over micro-batches (each divided by ``accumulation_steps``): a
        detached 0-d float32 tensor on the device (read it after the step).

    Raises:
        ValueError: ``accumulation_steps`` < 1, or no batch given (neither ``x, y`` nor
            ``next_batch``).
    """
    if not (isinstance(accumulation_steps, int) and accumulation_steps >= 1):
        raise ValueError(f"accumulation_steps must be an int >= 1, got {accumulation_steps!r}")
    if x is None and next_batch is None:
        raise ValueError("train_step needs a batch: pass x and y, or next_batch")
    timer = timer or _NoTimer()
    wait = straggler or (lambda where: None)
    if link is not None:
        link.reset()
    is_ddp = isinstance(model, DistributedDataParallel)
    total = None
    for micro in range(accumulation_steps):
        first, last = micro == 0, micro == accumulation_steps - 1
        if x is None or not first:
            with timer.phase("data"):
                if first:
                    wait("data")
                x, y = next_batch()       # (B, 3, H, W) float32, (B,) int64, on device
        # DDP allreduces in the last micro-batch's backward only (none when not sync)
        no_sync = model.no_sync() if is_ddp and not (sync and last) else contextlib.nullcontext()
        with no_sync:
            with timer.phase("forward"):
                if first:
                    wait("before_forward")
                with torch.autocast(x.device.type, dtype=AMP_DTYPES[amp], enabled=amp != "off"):
                    logits = model(x)                      # (B, num_classes), low precision
                    if logits.dim() == 3:                  # a token model: (B, T, vocab)
                        logits, y = logits.flatten(0, 1), y.flatten()
                    loss = F.cross_entropy(logits, y)      # 0-d fp32 (autocast keeps it)
                if accumulation_steps > 1:
                    loss = loss / accumulation_steps       # mean over the micro-batches
            with timer.phase("backward"):
                if first:
                    wait("before_backward")
                (scaler.scale(loss) if scaler else loss).backward()
        total = loss.detach().float() if total is None else total + loss.detach().float()
    if allreduce is not None:
        with timer.phase("wait"):
            allreduce()
    with timer.phase("optimizer"):
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total


def build_model_and_optimizer(config: RunConfig, num_classes: int, device: torch.device
                              ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (train mode, on ``device``, with ``config.checkpointing`` and
    ``channels_last`` applied; not compiled) and its SGD optimizer (momentum 0.9; with
    the implementation :func:`optimizer_options` asks for, if any)."""
    model = build_model(config.model, num_classes).to(device).train()
    if config.checkpointing != "none":
        model.set_checkpointing(config.checkpointing)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9,
                                **_optimizer_kwargs)
    return model, optimizer


def build_training(config: RunConfig, device: torch.device | None = None):
    """Data loader, model and optimizer for ``config``, seeded, on ``device`` (None: the
    config's resolved device).

    The dataset is validated first, before any model work. The model gets
    ``config.checkpointing``, ``channels_last`` and ``torch.compile(mode=...)`` applied
    (compilation itself happens lazily, in the first steps).

    Returns:
        (loader, model, optimizer, device) with the model on ``device`` in train mode.
    """
    device = config.resolved_device() if device is None else device
    torch.manual_seed(config.seed)
    loader = make_loader(config)  # validates the dataset before any model work
    num_classes = len(loader.dataset.classes)
    model, optimizer = build_model_and_optimizer(config, num_classes, device)
    if config.compile != "off":
        model = torch.compile(model, mode=None if config.compile == "default"
                              else config.compile)
    return loader, model, optimizer, device
