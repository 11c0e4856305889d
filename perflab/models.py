"""Models: a torchvision-compatible ResNet-18 and a tiny CNN for fast tests.

ResNet-18 follows He et al. 2016, "Deep Residual Learning for Image Recognition"
(table 1, the 18-layer column) exactly as ``torchvision.models.resnet18`` builds it:
7x7 stride-2 stem, 3x3 stride-2 max-pool, BasicBlocks [2, 2, 2, 2] with widths
64-128-256-512, stride-2 1x1 downsample shortcuts, global average pool, linear head.
Module names match torchvision's, so a torchvision ``state_dict`` loads unchanged.
It is written out here because torchvision does not import with CPU-only torch on
every machine, and one definition everywhere keeps measurements comparable.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

__all__ = ["BasicBlock", "ResNet", "resnet18", "tiny_cnn", "build_model", "mlp", "mlp_batches"]


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual shortcut: (B, C_in, H, W) -> (B, C, H/s, W/s)."""

    expansion = 1

    def __init__(self, in_ch: int, ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(ch, ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, ch, 1, stride, bias=False),
                                            nn.BatchNorm2d(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with BasicBlocks. Input (B, 3, H, W) float; output logits (B, num_classes)."""

    def __init__(self, layers: tuple[int, int, int, int] = (2, 2, 2, 2),
                 num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = (64, 128, 256, 512)
        in_ch = 64
        for i, (w, n) in enumerate(zip(widths, layers)):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(in_ch, w, stride=2 if (i > 0 and j == 0) else 1))
                in_ch = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        # Initialisation as torchvision: Kaiming-normal convs (fan_out), BN weight 1, bias 0.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

        self.checkpointing: str | int = "none"

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def stages(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """The stem and the four layer groups in order: the units of checkpointing."""
        return [self._stem, self.layer1, self.layer2, self.layer3, self.layer4]

    def set_checkpointing(self, mode: str | int) -> "ResNet":
        """Recompute activations in backward instead of saving them (``use_reentrant=False``).

        ``"none"``; ``"per_stage"``: each of the 5 stages through
        ``torch.utils.checkpoint.checkpoint``; an int N: ``checkpoint_sequential`` with N
        segments, which (as PyTorch documents) leaves the *last* segment un-checkpointed.
        Gradients are unchanged; BatchNorm running statistics are updated again during
        recomputation (train mode), as with any checkpointed BatchNorm.
        Source: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".

        Raises:
            ValueError: an unknown mode or a segment count outside 1..5.
        """
        ok = mode in ("none", "per_stage") or (
            isinstance(mode, int) and not isinstance(mode, bool) and 1 <= mode <= 5)
        if not ok:
            raise ValueError(f"checkpointing must be 'none', 'per_stage' or 1..5 segments, "
                             f"got {mode!r}")
        self.checkpointing = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # stem (B, 64, H/4, W/4) -> layer1 (B, 64, H/4, W/4) -> layer2 (B, 128, H/8, W/8)
        # -> layer3 (B, 256, H/16, W/16) -> layer4 (B, 512, H/32, W/32)
        stages = self.stages()
        if self.checkpointing == "none" or not torch.is_grad_enabled():
            for stage in stages:
                x = stage(x)
        elif self.checkpointing == "per_stage":
            for stage in stages:
                x = checkpoint(stage, x, use_reentrant=False)
        else:
            x = checkpoint_sequential(stages, self.checkpointing, x, use_reentrant=False)
        x = torch.flatten(self.avgpool(x), 1)                 # (B, 512)
        return self.fc(x)                                     # (B, num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    """ImageNet ResNet-18 (11,689,512 parameters at 1000 classes), random weights.

    Raises:
        ValueError: num_classes < 1.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return ResNet((2, 2, 2, 2), num_classes)


def tiny_cnn(num_classes: int = 10) -> nn.Module:
    """A two-conv CNN for fast tests: (B, 3, H, W) -> (B, num_classes)."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes),
    )


def build_model(name: str, num_classes: int) -> nn.Module:
    """Model by ``RunConfig.model`` name ("resnet18" or "tiny").

    Raises:
        ValueError: unknown name.
    """
    if name == "resnet18":
        return resnet18(num_classes)
    if name == "tiny":
        return tiny_cnn(num_classes)
    raise ValueError(f"unknown model {name!r}; choose 'resnet18' or 'tiny'")


def mlp(sizes: Sequence[int], seed: int = 0) -> torch.nn.Sequential:
    """``Linear(sizes[0], sizes[1]), ReLU, ..., Linear(sizes[-2], sizes[-1])``, seeded.

    Input ``(B, sizes[0])`` float32, output logits ``(B, sizes[-1])``.

    Raises:
        ValueError: fewer than two sizes, or a size < 1.
    """
    if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
        raise ValueError(f"sizes must list >= 2 layer widths >= 1, got {list(sizes)!r}")
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
    return torch.nn.Sequential(*layers)


def mlp_batches(sizes: Sequence[int], batch: int, steps: int, rank: int, seed: int = 0
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` fixed batches for one rank: ``x (batch, sizes[0])`` float32, ``y (batch,)``
    int64 class labels, drawn from a generator seeded by (seed, step, rank). World_size
    ranks together see the rows that :func:`unsharded_adamw` concatenates into one global
    batch of ``world_size * batch`` rows.

    Raises:
        ValueError: batch or steps < 1, or rank < 0.
    """
    if batch < 1 or steps < 1 or rank < 0:
        raise ValueError(f"batch and steps must be >= 1 and rank >= 0, got batch={batch}, "
                         f"steps={steps}, rank={rank}")
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1_000_003 * seed + 1_009 * step + rank + 1)
        out.append((torch.randn(batch, sizes[0], generator=g),
                    torch.randint(0, sizes[-1], (batch,), generator=g)))
    return out
