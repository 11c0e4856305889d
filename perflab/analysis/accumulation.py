"""Gradient accumulation: k micro-batches of B/k give the gradient of one batch of B.

With a mean-reduced loss, the gradient of a batch is the sample-weighted mean of its
micro-batches' gradients, so summing ``loss_i * len_i / B`` over micro-batches in
backward reproduces the full-batch gradient (up to floating-point summation order) while
only one micro-batch's activations are alive at a time (PyTorch AMP examples, "Gradient
accumulation"). BatchNorm breaks the equality in training mode: it normalises each
micro-batch with that micro-batch's own mean and variance, so the function being
differentiated changes, and its running statistics are updated k times instead of once.
In eval mode (running statistics), or with a normalisation that does not mix samples
(LayerNorm, GroupNorm), the equality holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["accumulated_gradients", "full_batch_gradients", "AccumulationGap",
           "accumulation_gap"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def full_batch_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: LossFn = F.cross_entropy) -> dict[str, torch.Tensor]:
    """Parameter name -> gradient of ``loss_fn(model(x), y)`` (mean over the batch).

    Existing ``.grad``\\s are cleared first and left holding this gradient.
    """
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    return _grads(model)


def accumulated_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          micro_batches: int, loss_fn: LossFn = F.cross_entropy
                          ) -> dict[str, torch.Tensor]:
    """Parameter name -> gradient accumulated over ``micro_batches`` chunks of the batch.

    Each chunk's mean loss is weighted by ``len(chunk) / len(x)`` before its backward,
    so uneven chunks still give the full batch's mean-loss gradient.

    Args:
        model: the model (its mode decides how BatchNorm behaves).
        x: (B, ...) inputs; y: (B,) targets.
        micro_batches: k, with 1 <= k <= B.

    Raises:
        ValueError: k outside 1..B.
    """
    b = len(x)
    if not 1 <= micro_batches <= b:
        raise ValueError(f"micro_batches must be in 1..batch size {b}, got {micro_batches}")
    model.zero_grad(set_to_none=True)
    for xc, yc in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)):
        (loss_fn(model(xc), yc) * (len(xc) / b)).backward()   # grads add up in .grad
    return _grads(model)


@dataclass(frozen=True)
class AccumulationGap:
    """How far accumulated gradients are from the full-batch ones.

    Attributes:
        micro_batches: k. training: whether the model was in train mode.
        max_abs_diff: largest |g_acc - g_full| over all parameters.
        max_rel_diff: the largest per-parameter ``||g_acc - g_full|| / ||g_full||``
            (Euclidean norms), and ``worst`` the parameter it belongs to.
    """

    micro_batches: int
    training: bool
    max_abs_diff: float
    max_rel_diff: float
    worst: str

    def matches(self, rtol: float = 1e-4) -> bool:
        """True when every parameter's relative difference is at most ``rtol``."""
        return self.max_rel_diff <= rtol


def accumulation_gap(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     micro_batches: int, loss_fn: LossFn = F.cross_entropy
                     ) -> AccumulationGap:
    """Compare :func:`accumulated_gradients` with :func:`full_batch_gradients`.

    Both start from the same parameters and buffers: the buffers (BatchNorm running
    statistics) are restored after each pass, and ``.grad`` is cleared at the end.
    """
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}

    def restore() -> None:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])
    try:
        full = full_batch_gradients(model, x, y, loss_fn)
        restore()
        acc = accumulated_gradients(model, x, y, micro_batches, loss_fn)
    finally:
        restore()
        model.zero_grad(set_to_none=True)
    rel = {n: float((acc[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in full.items()}
    worst = max(rel, key=rel.get)
    return AccumulationGap(
        micro_batches=micro_batches, training=model.training,
        max_abs_diff=max(float((acc[n] - g).abs().max()) for n, g in full.items()),
        max_rel_diff=rel[worst], worst=worst)
