"""Lab 08's workloads: the data, the change names and the ``Training`` holder the
student's ``make_training`` returns.

The lab hands out a naive training script (in the notebook, plain PyTorch) for two
models: ResNet-18 on small synthetic images and ``gpt-tiny`` on the byte corpus
(:mod:`perflab.data.tokens`). The student rewrites it as ``make_training(model_name,
changes, ...)``; this module holds only what is not the exercise: the datasets, the
fixed seeded batch the checks train on, the list of change names with why one cannot
run here (read from the machine, never typed), and the container with ``step()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Dataset

from perflab.data.tokens import VOCAB_SIZE, TokenDataset

__all__ = ["CHANGES", "GPU_ONLY", "CNN_ONLY", "MODEL_NAMES", "NAIVE_LR", "NAIVE_MOMENTUM",
           "IMAGE_CLASSES", "NoiseImages", "dataset_for", "num_classes", "fixed_batch",
           "unavailable_change", "Training"]

#: The changes ``make_training`` knows, in the order the lab applies them.
CHANGES = ("loader", "autocast", "matmul_precision", "channels_last", "foreach", "fused",
           "compile", "threads", "cudnn_benchmark", "cuda_graphs")
#: Changes that need a CUDA device.
GPU_ONLY = ("cudnn_benchmark", "cuda_graphs")
#: Changes that need image (4-D) tensors.
CNN_ONLY = ("channels_last",)
#: The models the naive script trains (``perflab.build_model`` names).
MODEL_NAMES = ("resnet18", "gpt-tiny")
#: The naive script's optimizer: ``SGD(lr=NAIVE_LR, momentum=NAIVE_MOMENTUM, foreach=False)``.
NAIVE_LR = 0.05
#: The naive optimizer's momentum.
NAIVE_MOMENTUM = 0.9
#: Classes of the synthetic image task.
IMAGE_CLASSES = 10


class NoiseImages(Dataset):
    """Seeded synthetic images, made per sample the way a decoding pipeline works: a
    uint8 image drawn from a generator seeded by (seed, index), converted to float and
    normalised on the CPU, in ``__getitem__``.

    Item ``i``: ``(x, y)``: x float32 ``(3, image_size, image_size)``, y int64 scalar in
    ``[0, IMAGE_CLASSES)``.

    Raises:
        ValueError: ``image_size`` < 8 or ``length`` < 1.
    """

    def __init__(self, image_size: int, length: int = 4096, seed: int = 0):
        if image_size < 8 or length < 1:
            raise ValueError(f"image_size must be >= 8 px and length >= 1, got "
                             f"{image_size}, {length}")
        self.image_size, self.length, self.seed = image_size, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (3, self.image_size, self.image_size), generator=g,
                            dtype=torch.uint8)
        x = (img.float() / 255.0 - 0.5) / 0.25
        return x, torch.tensor(int(torch.randint(0, IMAGE_CLASSES, (1,), generator=g)))


def num_classes(model_name: str) -> int:
    """Classes (ResNet-18) or vocabulary size (gpt-tiny) of ``model_name``.

    Raises:
        ValueError: a model not in :data:`MODEL_NAMES`.
    """
    if model_name not in MODEL_NAMES:
        raise ValueError(f"model_name must be one of {MODEL_NAMES}, got {model_name!r}")
    return IMAGE_CLASSES if model_name == "resnet18" else VOCAB_SIZE


def dataset_for(model_name: str, *, image_size: int, seq_len: int) -> Dataset:
    """The training set of ``model_name``: :class:`NoiseImages` at ``image_size`` px for
    ResNet-18, :class:`perflab.data.tokens.TokenDataset` windows of ``seq_len`` tokens
    for gpt-tiny.

    Raises:
        ValueError: an unknown model, or a size the dataset rejects.
    """
    num_classes(model_name)
    if model_name == "resnet18":
        return NoiseImages(image_size)
    return TokenDataset(seq_len)


def fixed_batch(model_name: str, batch_size: int, seed: int, *, image_size: int = 16,
                seq_len: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded batch the checks train on (CPU tensors, made with a
    ``torch.Generator`` seeded by ``seed``): ResNet-18: x float32
    ``(batch_size, 3, image_size, image_size)`` N(0, 1), y int64 ``(batch_size,)``;
    gpt-tiny: x int64 ``(batch_size, seq_len)`` byte ids, y the same shifted by one.

    Raises:
        ValueError: an unknown model or batch_size < 1.
    """
    classes = num_classes(model_name)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    g = torch.Generator().manual_seed(seed)
    if model_name == "resnet18":
        x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        return x, torch.randint(0, classes, (batch_size,), generator=g)
    ids = torch.randint(0, classes, (batch_size, seq_len + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def unavailable_change(change: str, model_name: str, device: str | torch.device
                       ) -> str | None:
    """Why ``change`` cannot apply to ``model_name`` on ``device``, read from the machine
    (e.g. ``"torch.cuda.is_available() is False"``), or None when it can.

    Raises:
        ValueError: an unknown change or model.
    """
    if change not in CHANGES:
        raise ValueError(f"unknown change {change!r}; choose from {CHANGES}")
    num_classes(model_name)
    dev = torch.device(device)
    if change in GPU_ONLY and dev.type != "cuda":
        return (f"{change} needs a CUDA device: this run is on {dev.type}, "
                f"torch.cuda.is_available() is {torch.cuda.is_available()}, "
                f"torch.version.cuda is {torch.version.cuda}")
    if change in CNN_ONLY and model_name != "resnet18":
        return f"{change} reorders 4-D image tensors; {model_name} has none"
    if change == "threads" and dev.type != "cpu":
        return f"threads sets CPU intra-op threads; the step runs on {dev.type}"
    if change == "threads" and torch.get_num_threads() < 2:
        return f"torch.get_num_threads() is {torch.get_num_threads()}: nothing to halve"
    return None


@dataclass
class Training:
    """What ``make_training`` returns: the pieces of one training setup.

    Attributes:
        model: the model (possibly ``torch.compile``-d).
        optimizer: its optimizer.
        loader: the ``DataLoader`` of its training set.
        train_on: ``train_on(x, y) -> loss``: one optimizer step on the CPU batch
            ``(x, y)`` (moved to the device inside), returning the loss, a 0-dim tensor
            (not ``.item()``: no sync).
        changes: the changes applied (a frozenset of names from :data:`CHANGES`).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    train_on: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    changes: frozenset = frozenset()
    _batches: Iterator | None = field(default=None, repr=False)

    def step(self) -> torch.Tensor:
        """One step on the loader's next batch (the loader restarts when exhausted);
        returns the loss tensor."""
        try:
            if self._batches is None:
                raise StopIteration
            x, y = next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            x, y = next(self._batches)
        return self.train_on(x, y)
