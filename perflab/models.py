"""Models: a torchvision-compatible ResNet-18, a small GPT (``gpt-tiny``) and a tiny CNN
for fast tests.

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

from perflab.core.config import MAX_SEQ_LEN

__all__ = ["BasicBlock", "ResNet", "resnet18", "tiny_cnn", "build_model", "mlp", "mlp_batches",
           "GPT", "GPT_TINY", "gpt_tiny"]


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


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: (B, T, d) -> (B, T, d), through
    ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` (the fused
    kernel where the device has one)."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)                  # 3 x (B, T, d)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in (q, k, v))                           # (B, heads, T, d/heads)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block (GPT-2): x + attn(ln1(x)), then x + mlp(ln2(x));
    the MLP is Linear(d, 4d) -> GELU -> Linear(4d, d). (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer (Radford et al. 2019, GPT-2; layout after nanoGPT):
    token + learned position embeddings, ``n_layer`` pre-LayerNorm blocks, a final
    LayerNorm and a head tied to the token embedding. Input (B, T) int64 token ids with
    T <= ``max_seq_len``; output logits (B, T, vocab_size) float32. Weights N(0, 0.02).

    Raises:
        ValueError: a size < 1, or ``d_model`` not a multiple of ``n_head``.
    """

    def __init__(self, vocab_size: int, n_layer: int, n_head: int, d_model: int,
                 max_seq_len: int):
        super().__init__()
        if min(vocab_size, n_layer, n_head, d_model, max_seq_len) < 1 or d_model % n_head:
            raise ValueError(f"GPT sizes must be >= 1 with d_model % n_head == 0, got "
                             f"vocab_size={vocab_size}, n_layer={n_layer}, n_head={n_head}, "
                             f"d_model={d_model}, max_seq_len={max_seq_len}")
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight                  # tied (GPT-2)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        self.checkpointing: str | int = "none"

    def stages(self) -> list[nn.Module]:
        """The blocks in order: the units of checkpointing."""
        return list(self.blocks)

    def set_checkpointing(self, mode: str | int) -> "GPT":
        """``"none"``, ``"per_stage"`` (every block through ``checkpoint``) or an int N:
        ``checkpoint_sequential`` over the blocks in N segments (1..n_layer).

        Raises:
            ValueError: another mode, or N outside 1..n_layer.
        """
        ok = mode in ("none", "per_stage") or (isinstance(mode, int) and not isinstance(
            mode, bool) and 1 <= mode <= len(self.blocks))
        if not ok:
            raise ValueError(f"checkpointing must be 'none', 'per_stage' or 1.."
                             f"{len(self.blocks)} segments, got {mode!r}")
        self.checkpointing = mode
        return self

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.max_seq_len:
            raise ValueError(f"sequence of {t} tokens > max_seq_len={self.max_seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)                # (B, T, d)
        if self.checkpointing == "none" or not torch.is_grad_enabled():
            for block in self.blocks:
                x = block(x)
        elif self.checkpointing == "per_stage":
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = checkpoint_sequential(list(self.blocks), self.checkpointing, x,
                                      use_reentrant=False)
        return self.head(self.ln_f(x))                           # (B, T, vocab)


#: ``gpt-tiny``: byte-level (256 tokens), 4 blocks, 4 heads, width 128, up to 256 tokens
#: of context (858,880 parameters; the head is tied to the token embedding).
GPT_TINY = dict(vocab_size=256, n_layer=4, n_head=4, d_model=128, max_seq_len=MAX_SEQ_LEN)


def gpt_tiny(vocab_size: int = 256) -> GPT:
    """:data:`GPT_TINY` with random weights (``vocab_size`` overrides the byte vocabulary)."""
    return GPT(**{**GPT_TINY, "vocab_size": vocab_size})


def build_model(name: str, num_classes: int) -> nn.Module:
    """Model by ``RunConfig.model`` name ("resnet18", "gpt-tiny" or "tiny");
    ``num_classes`` is the vocabulary size for a token model.

    Raises:
        ValueError: unknown name.
    """
    if name == "resnet18":
        return resnet18(num_classes)
    if name == "tiny":
        return tiny_cnn(num_classes)
    if name == "gpt-tiny":
        return gpt_tiny(num_classes)
    raise ValueError(f"unknown model {name!r}; choose 'resnet18', 'gpt-tiny' or 'tiny'")


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
    ranks together see the rows that the grader's reference
    (:func:`perflab.course.references.lab09.unsharded_adamw`) concatenates into one
    global batch of ``world_size * batch`` rows.

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
