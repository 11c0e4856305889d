"""The training augmentation on whole batches, on the device.

:class:`perflab.data.loader.TrainTransform` crops, flips and normalises one PIL image at a
time on the host. For batches that are already decoded (a uint8 ``(B, 3, H, W)``
tensor from :mod:`perflab.data.cache`), the same augmentation runs as a few tensor ops for
the whole batch, on whatever device holds it: random boxes drawn vectorised on the CPU
(:func:`crop_boxes`), then one ``F.grid_sample`` that crops, resizes and flips every
image at once (:func:`resized_crop_batch`), the approach of
GPU augmentation libraries such as Kornia and DALI.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F


__all__ = ["crop_boxes", "fallback_crop_size", "resized_crop_batch", "random_resized_crop_batch"]


def fallback_crop_size(width: int, height: int, ratio: Sequence[float]) -> tuple[int, int]:
    """RandomResizedCrop's fallback (width, height) in pixels when no random try fits:
    the whole image, its aspect ratio clamped into ``[min(ratio), max(ratio)]``."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        return width, int(round(width / min(ratio)))
    if in_ratio > max(ratio):
        return int(round(height * max(ratio))), height
    return width, height


def crop_boxes(n: int, height: int, width: int, *,
               scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3),
               generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` RandomResizedCrop boxes, vectorised: int64 ``(n, 4)`` of (top, left, h, w).

    The algorithm of :func:`perflab.data.loader.random_resized_crop` (torchvision's): 10 tries
    per sample of an area fraction from ``scale`` and a log-uniform aspect ratio from
    ``ratio``; the first try that fits wins, else a centre crop with the ratio clamped.
    Drawn on the CPU from ``generator`` (or torch's global RNG).
    """
    area = height * width
    target = area * torch.empty(n, 10).uniform_(scale[0], scale[1], generator=generator)
    aspect = torch.exp(torch.empty(n, 10).uniform_(math.log(ratio[0]), math.log(ratio[1]),
                                                   generator=generator))
    w = torch.sqrt(target * aspect).round().long()
    h = torch.sqrt(target / aspect).round().long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.long().argmax(dim=1, keepdim=True)  # index of the first fitting try
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    fw, fh = fallback_crop_size(width, height, ratio)  # where no try fits
    ok = fits.any(dim=1)
    w, h = torch.where(ok, w, fw), torch.where(ok, h, fh)
    u = torch.rand(n, 2, generator=generator)
    top = (u[:, 0] * (height - h + 1)).long().clamp(max=height - h)
    left = (u[:, 1] * (width - w + 1)).long().clamp(max=width - w)
    top = torch.where(ok, top, (height - h) // 2)
    left = torch.where(ok, left, (width - w) // 2)
    return torch.stack([top, left, h, w], dim=1)


def resized_crop_batch(images: torch.Tensor, boxes: torch.Tensor, size: int, *,
                       flip: torch.Tensor | None = None,
                       mean: Sequence[float] = (0.485, 0.456, 0.406),
                       std: Sequence[float] = (0.229, 0.224, 0.225)) -> torch.Tensor:
    """Crop each image to its box, resize to ``size x size``, flip, normalise: one op.

    One ``F.grid_sample`` (bilinear, ``align_corners=False``) over the whole batch, on
    ``images``' device, with a separable sampling grid (an axis-aligned box needs no
    general ``F.affine_grid``): output pixel centres map into each box, so a
    full-image box at the same size returns the image exactly. No antialiasing (PIL's
    resize has it); with :data:`STORED_SCALE` the downscale is at most 1.25x.

    Args:
        images: uint8 (or float in 0..255) ``(B, 3, H, W)``.
        boxes: int ``(B, 4)`` of (top, left, h, w) in pixels (see :func:`crop_boxes`).
        size: output side in pixels.
        flip: bool ``(B,)``: mirror left-right; None = no flips.

    Returns:
        float32 ``(B, 3, size, size)``, ImageNet-normalised, on ``images``' device.
    """
    _, _, height, width = images.shape
    dev = images.device
    top, left, h, w = boxes.to(dev, torch.float32, non_blocking=True).unbind(1)  # (B,)
    # Normalised (align_corners=False) source coordinate of each output pixel centre:
    # u_in = (box size / image size) * u_out + (2 * box start + box size) / image size - 1
    u = (torch.arange(size, device=dev, dtype=torch.float32) * 2 + 1) / size - 1  # (s,)
    sx = w / width
    if flip is not None:
        sx = torch.where(flip.to(dev), -sx, sx)
    gx = sx[:, None] * u + ((2 * left + w) / width - 1)[:, None]        # (B, s)
    gy = (h / height)[:, None] * u + ((2 * top + h) / height - 1)[:, None]
    grid = torch.stack(torch.broadcast_tensors(gx[:, None, :], gy[:, :, None]), dim=-1)
    x = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)                                 # (B, 3, s, s)
    m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1) * 255
    s = torch.tensor(std, device=x.device).view(1, 3, 1, 1) * 255
    return (x - m) / s


def random_resized_crop_batch(images: torch.Tensor, size: int, *,
                              generator: torch.Generator | None = None,
                              scale: tuple[float, float] = (0.08, 1.0),
                              ratio: tuple[float, float] = (3 / 4, 4 / 3),
                              flip_p: float = 0.5) -> torch.Tensor:
    """The training augmentation of :class:`perflab.data.loader.TrainTransform`, batched.

    RandomResizedCrop (:func:`crop_boxes`), horizontal flip with probability ``flip_p``
    and normalisation, for a whole uint8 ``(B, 3, H, W)`` batch on any device; random
    numbers come from the CPU ``generator`` (small: B x 22 draws).

    Returns:
        float32 ``(B, 3, size, size)`` on ``images``' device.
    """
    b, _, height, width = images.shape
    boxes = crop_boxes(b, height, width, scale=scale, ratio=ratio, generator=generator)
    flip = torch.rand(b, generator=generator) < flip_p
    return resized_crop_batch(images, boxes, size, flip=flip)
