"""Workloads without a data loader: ResNet-18 training parts from a ``RunConfig`` with a
fixed synthetic batch, and a fusion-bound pointwise chain (Labs 04 and 05).

Memory and compile experiments (Labs 04 and 05) measure the model, not the input
pipeline: a fixed random batch of the configured size makes every measurement
deterministic (memory bytes do not depend on pixel values) and keeps loader time out
of compute timings. The model is set up exactly as :func:`perflab.step.build_training`
sets it up (checkpointing, channels_last, SGD with momentum 0.9); ``torch.compile`` is
left to the caller.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from perflab.config import RunConfig
from perflab.step import build_model_and_optimizer

__all__ = ["NUM_CLASSES", "TrainingParts", "synthetic_batch", "training_parts",
           "pointwise_chain", "pointwise_inputs"]

#: Classes of the embedded photo-patches dataset, used for the synthetic labels.
NUM_CLASSES = 10


def synthetic_batch(config: RunConfig, batch_size: int | None = None, *,
                    device: torch.device | str | None = None,
                    num_classes: int = NUM_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random batch shaped like ``config``'s training batches.

    Args:
        config: gives image_size, batch_size, seed, channels_last and the device.
        batch_size: overrides ``config.batch_size`` (>= 1).
        device: overrides ``config.resolved_device()``.
        num_classes: labels are drawn from ``0..num_classes-1``.

    Returns:
        ``x`` (B, 3, S, S) float32 (channels_last if the config says so) and ``y`` (B,)
        int64, on the device.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    b = config.batch_size if batch_size is None else batch_size
    if b < 1:
        raise ValueError(f"batch_size must be >= 1, got {b}")
    dev = torch.device(device) if device is not None else config.resolved_device()
    gen = torch.Generator().manual_seed(config.seed)
    s = config.image_size
    x = torch.randn(b, 3, s, s, generator=gen)                 # (B, 3, S, S) float32
    y = torch.randint(0, num_classes, (b,), generator=gen)     # (B,) int64
    fmt = torch.channels_last if config.channels_last else torch.contiguous_format
    return x.to(dev, memory_format=fmt), y.to(dev)


@dataclass(eq=False)
class TrainingParts:
    """What one training step needs: ``model`` (train mode), ``optimizer``, the
    synthetic batch ``x`` (B, 3, S, S) / ``y`` (B,), and the ``device``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    device: torch.device


def training_parts(config: RunConfig, batch_size: int | None = None) -> TrainingParts:
    """Model and optimizer as :func:`~perflab.step.build_training` makes them, with a
    :func:`synthetic_batch` instead of a data loader; seeded by ``config.seed``.

    ``config.compile`` is not applied: wrap ``parts.model`` in ``torch.compile`` to
    measure compilation separately.
    """
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    model, optimizer = build_model_and_optimizer(config, NUM_CLASSES, device)
    x, y = synthetic_batch(config, batch_size, device=device)
    return TrainingParts(model, optimizer, x, y, device)


def pointwise_chain(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm, GELU and four elementwise ops: (N, D) float32 -> (N, D) float32.

    Eagerly each of the 7 operators reads and writes the whole (N, D) tensor; fused,
    one pass reads ``x`` and writes the result. Memory-bound, so fusion pays.
    """
    y = F.layer_norm(x, x.shape[-1:], weight, bias)   # (N, D)
    y = F.gelu(y)
    y = y * 1.5 + 0.5
    y = torch.tanh(y) * y
    return y + x


def pointwise_inputs(rows: int = 4096, dim: int = 1024, *, seed: int = 0,
                     device: torch.device | str = "cpu"
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded ``x`` (rows, dim), ``weight`` (dim,), ``bias`` (dim,), float32."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(device)  # type: ignore[return-value]
                 for s in ((rows, dim), (dim,), (dim,)))
