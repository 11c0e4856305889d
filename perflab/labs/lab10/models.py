"""Lab 10's models and seeded inputs (the unsharded references a judge recomputes live on
the grader's side: :mod:`perflab.course.references.lab10`).

* :func:`mlp_block`: a transformer MLP block ``Linear(d, 4d) -> GELU -> Linear(4d, d)``
  (Vaswani et al. 2017, section 3.3; GPT-2's ``c_fc``/``c_proj``), the block that
  Megatron-LM splits column- then row-wise (Shoeybi et al. 2019, arXiv:1909.08053, §3).
* :func:`transformer_block`: a pre-LayerNorm transformer block (causal multi-head
  attention, then the MLP; GPT-2's layout, Radford et al. 2019), the block that
  Megatron-LM splits by heads (Shoeybi et al. 2019, §3, Figure 3b) and whose LayerNorm
  and dropout regions sequence parallelism splits by positions (Korthikanti et al. 2022,
  arXiv:2205.05198, §4.2.2).
* :func:`tp_tensors`: one tensor-parallel case's input and upstream gradient.
* :func:`pipeline_model`, :func:`pipeline_batch`: the pipeline section's model
  (identical blocks, so stages split evenly) and its batch.
* :class:`SimulatedWork`: a module whose forward and backward *sleep* for a time per row,
  so that a stage's compute has a known length on a loaded shared CPU (like Lab 07's
  injected straggler delay); the pipeline's schedule, not the cores, then decides idle time.
"""
from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["mlp_block", "Attention", "TransformerBlock", "transformer_block", "tp_tensors",
           "SimulatedWork", "pipeline_model", "pipeline_batch"]


def mlp_block(d: int, seed: int = 0) -> torch.nn.Sequential:
    """``Sequential(Linear(d, 4d), GELU(), Linear(4d, d))`` in float32, seeded.

    Input ``(..., d)``, output ``(..., d)``. Layer names ``"0"`` (the up projection) and
    ``"2"`` (the down projection) are what ``parallelize_module``'s plan refers to.

    Raises:
        ValueError: ``d < 1``.
    """
    if not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an int >= 1 (the model width), got {d!r}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    block = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                torch.nn.Linear(4 * d, d))
    torch.random.set_rng_state(gen_state)
    return block


class Attention(torch.nn.Module):
    """Multi-head self-attention: ``wq``, ``wk``, ``wv`` (each ``Linear(d, d)``; head j is
    rows ``j·d/h … (j+1)·d/h`` of each), the core ``softmax(q kᵀ/√(d/h)) v`` per head by
    :func:`torch.nn.functional.scaled_dot_product_attention` (causal when ``causal``),
    and the output projection ``wo`` (``Linear(d, d)``; Vaswani et al. 2017, §3.2.2).

    ``forward(x)``: ``x (B, S, d_in)`` float32 -> ``(B, S, d)``. The projections are
    reshaped with ``view(B, S, -1, head_dim)``, so the head count follows from the width
    a projection returns: a rank holding the rows of whole heads (a column split, as
    ``ColwiseParallel`` makes) runs this same forward on its heads alone.

    Raises:
        ValueError: ``d < 1``, ``heads < 1`` or ``d % heads != 0``.
    """

    def __init__(self, d: int, heads: int, causal: bool = True) -> None:
        super().__init__()
        if not isinstance(d, int) or not isinstance(heads, int) or d < 1 or heads < 1 or d % heads:
            raise ValueError(f"d must be a multiple of heads (both ints >= 1), got d={d!r}, heads={heads!r}")
        self.heads, self.head_dim, self.causal = heads, d // heads, causal
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        b, s = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2)   # (B, heads, S, head_dim)
                   for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))              # (B, S, heads·head_dim) -> (B, S, d)


class TransformerBlock(torch.nn.Module):
    """A pre-LayerNorm transformer block (GPT-2's layout):
    ``x = x + drop1(attn(ln1(x)))``, then ``x = x + drop2(mlp(ln2(x)))``.

    Attributes: ``ln1``, ``ln2`` (``LayerNorm(d)``), ``attn`` (:class:`Attention`),
    ``mlp`` (:func:`mlp_block`'s ``Sequential``: layers ``"0"`` and ``"2"``), ``drop1``,
    ``drop2`` (``Dropout(dropout)``). ``forward(x)``: ``(B, S, d)`` float32 -> the same
    shape.
    """

    def __init__(self, d: int, heads: int, dropout: float = 0.0, causal: bool = True) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = Attention(d, heads, causal)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))
        self.drop1, self.drop2 = torch.nn.Dropout(dropout), torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.mlp(self.ln2(x)))


def transformer_block(d: int, heads: int, seed: int = 0, dropout: float = 0.0,
                      causal: bool = True) -> TransformerBlock:
    """A seeded :class:`TransformerBlock` in float32 (its LayerNorms' weights and biases
    drawn near 1 and 0, so that a gradient or a copy that misses them shows), in training
    mode (dropout active when ``dropout > 0``).

    Raises:
        ValueError: ``d % heads != 0``, a size < 1, or ``dropout`` outside [0, 1).
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        block = TransformerBlock(d, heads, dropout, causal)
        with torch.no_grad():
            for ln in (block.ln1, block.ln2):
                ln.weight.add_(0.1 * torch.randn(d))
                ln.bias.add_(0.1 * torch.randn(d))
    finally:
        torch.random.set_rng_state(gen_state)
    return block


def tp_tensors(case: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The input ``x (batch, seq, d)`` and the upstream gradient ``dL/dy`` of the same
    shape (float32) of one case ``{"d", "batch", "seq", "seed"}`` (and optionally
    ``"input_seed"``, default ``seed``: a data-parallel replica's own batch), equal on every
    rank that gets the same case.

    Raises:
        KeyError: a key missing from ``case``.
    """
    g = torch.Generator().manual_seed(1000 + int(case.get("input_seed", case["seed"])))
    shape = (int(case["batch"]), int(case["seq"]), int(case["d"]))
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class SimulatedWork(torch.nn.Module):
    """Identity whose forward sleeps ``forward_s_per_row`` x rows and whose backward
    ``backward_s_per_row`` x rows (seconds; rows = ``x.shape[0]``, the micro-batch size),
    so a micro-batch's compute time is proportional to its size, as a real layer's is.
    Backward twice the forward is the usual ratio (two matmuls per Linear in backward,
    one in forward; Narayanan et al. 2021, arXiv:2104.04473, §3).

    Raises:
        ValueError: a negative time.
    """

    def __init__(self, forward_s_per_row: float = 0.0, backward_s_per_row: float = 0.0):
        super().__init__()
        if forward_s_per_row < 0 or backward_s_per_row < 0:
            raise ValueError("the simulated times must be >= 0 seconds per row, got "
                             f"{forward_s_per_row!r} and {backward_s_per_row!r}")
        self.forward_s_per_row, self.backward_s_per_row = forward_s_per_row, backward_s_per_row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_s_per_row == 0 and self.backward_s_per_row == 0:
            return x
        rows = x.shape[0]
        return _Sleep.apply(x, self.forward_s_per_row * rows, self.backward_s_per_row * rows)


def pipeline_model(width: int, blocks: int, seed: int = 0, forward_s_per_row: float = 0.0,
                   backward_s_per_row: float = 0.0) -> torch.nn.Sequential:
    """``blocks`` identical blocks ``Sequential(Linear(width, width), Tanh(), SimulatedWork)``,
    seeded; input ``(B, width)`` float32, output logits over ``width`` classes.

    Identical blocks make an even split into stages a split of ``model`` itself
    (``model[i * k:(i + 1) * k]``).

    Raises:
        ValueError: ``width`` or ``blocks`` < 1.
    """
    if width < 1 or blocks < 1:
        raise ValueError(f"width and blocks must be >= 1, got {width!r} and {blocks!r}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.Tanh(),
        SimulatedWork(forward_s_per_row, backward_s_per_row)) for _ in range(blocks)])
    torch.random.set_rng_state(gen_state)
    return model


def pipeline_batch(width: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (batch, width)`` float32 and labels ``y (batch,)`` int64 in ``[0, width)``, seeded."""
    g = torch.Generator().manual_seed(2000 + int(seed))
    return torch.randn(batch, width, generator=g), torch.randint(0, width, (batch,), generator=g)
