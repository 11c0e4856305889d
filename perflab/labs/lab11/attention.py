"""The attention the lab starts from, its inputs and its FLOPs.

Shapes follow ``torch.nn.functional.scaled_dot_product_attention``: q, k and v are
``(batch, heads, T, d)``; the scale is ``1/sqrt(d)``; a causal mask lets query i see keys
j <= i. The log-sum-exp of query i's row of scaled scores, ``lse[i] = log sum_j
exp(s_ij)``, is what FlashAttention keeps for its backward (Dao 2023, Algorithm 1, line 13).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["make_qkv", "make_rows", "naive_attention", "attention_flops"]


def make_qkv(batch: int, heads: int, seq: int, dim: int, dtype: str = "fp32", seed: int = 0,
             requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v of shape ``(batch, heads, seq, dim)``, standard normal, on the CPU.

    Args:
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    Raises:
        ValueError: a size below 1, or another dtype.
    """
    for name, v in (("batch", batch), ("heads", heads), ("seq", seq), ("dim", dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(batch, heads, seq, dim, generator=g).to(dtypes[dtype]) for _ in range(3)]
    return tuple(t.requires_grad_(requires_grad) for t in out)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention as the formula reads (Vaswani et al. 2017): the whole ``(T, T)`` score
    matrix, its softmax, then ``P @ V``, in float32. Returns ``(o, lse)``: o ``(B, H, T, d)``
    in q's dtype, lse ``(B, H, T)`` float32 (natural log). Memory: O(T^2) per head.

    Raises:
        ValueError: q, k, v not 4-D with the same shape.
    """
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must be (batch, heads, T, d) of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        t = q.shape[-2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.exp(s - lse[..., None]) @ v.float()
    return o.to(q.dtype), lse


def attention_flops(batch: int, heads: int, seq: int, dim: int, is_causal: bool = False,
                    backward: bool = False) -> float:
    """The FLOPs of attention's two matmuls, as FlashAttention's benchmarks count them
    (Dao 2023, §4.1; flash-attention/benchmarks): ``4·B·H·T²·d`` for the forward
    (``QKᵀ`` and ``PV``, 2 FLOPs per multiply-add), half of it causal; forward + backward
    is 3.5 times the forward (the backward's five matmuls, one of them the recomputed
    ``QKᵀ``: 2.5 times)."""
    f = 4.0 * batch * heads * seq * seq * dim / (2 if is_causal else 1)
    return f * 3.5 if backward else f


def make_rows(rows: int, cols: int, dtype: str = "fp32", seed: int = 0,
              inf_rows: Sequence[int] = (), inf_every: int = 0) -> torch.Tensor:
    """A seeded ``(rows, cols)`` input for a row softmax, scaled by 4 (large enough that an
    unstable ``exp(x)`` overflows in fp16), with the rows ``inf_rows`` all ``-inf`` and,
    when ``inf_every > 0``, every ``inf_every``-th element of the other rows ``-inf`` (a
    masked position).

    Raises:
        ValueError: a size below 1, an unknown dtype, or a row out of range.
    """
    x = make_qkv(1, 1, rows, cols, dtype, seed)[0][0, 0].float() * 4
    if inf_every:
        x[:, ::inf_every] = float("-inf")
    for r in inf_rows:
        if not 0 <= r < rows:
            raise ValueError(f"inf_rows holds {r}, outside 0..{rows - 1}")
        x[r] = float("-inf")
    return x.to(make_qkv(1, 1, 1, 1, dtype)[0].dtype)
