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

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNet", "resnet18", "tiny_cnn", "build_model"]


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

    def stages(self) -> list[nn.Module]:
        """The stem and the four layer groups in order (for per-stage checkpointing)."""
        stem = nn.Sequential(self.conv1, self.bn1, self.relu, self.maxpool)
        return [stem, self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4)
        x = self.layer1(x)                                    # (B, 64, H/4, W/4)
        x = self.layer2(x)                                    # (B, 128, H/8, W/8)
        x = self.layer3(x)                                    # (B, 256, H/16, W/16)
        x = self.layer4(x)                                    # (B, 512, H/32, W/32)
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
