"""Why fusion pays: a row softmax as five eager operators, each reading and writing the
whole tensor, against one fused kernel that reads it once and writes it once.

The FLOPs per operator are counted one per element per arithmetic step (a compare, a
subtraction, an exponential, an addition, a division: the roofline's convention of
counting useful operations, Williams et al. 2009), which makes each operator's intensity
a fraction of a FLOP per byte: far below any machine's ridge point.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["SOFTMAX_CHAIN", "softmax_chain_flops", "unfused_softmax", "fused_softmax",
           "compiled", "time_softmax"]

#: The unfused chain, in order (what :func:`unfused_softmax` runs).
SOFTMAX_CHAIN = ("max", "subtract", "exp", "sum", "divide")


def softmax_chain_flops(rows: int, cols: int) -> dict[str, int]:
    """FLOPs of each operator of :data:`SOFTMAX_CHAIN` on a ``(rows, cols)`` input: one
    per element each (the row reductions too: cols − 1 per row, counted as cols)."""
    n = rows * cols
    return {op: n for op in SOFTMAX_CHAIN}


def unfused_softmax(x: torch.Tensor) -> torch.Tensor:
    """The row softmax as five eager operators (:data:`SOFTMAX_CHAIN`), each a separate
    kernel that writes its result to memory for the next to read."""
    m = x.amax(dim=-1, keepdim=True)
    z = x - m
    e = z.exp()
    s = e.sum(dim=-1, keepdim=True)
    return e / s


def fused_softmax(x: torch.Tensor) -> torch.Tensor:
    """The same chain as :func:`unfused_softmax`, for ``torch.compile`` to fuse."""
    return unfused_softmax(x)


def compiled(fn: Any, dynamic: bool = False) -> Any:
    """``torch.compile(fn, dynamic=dynamic)``: Inductor, which on a CPU generates one C++
    loop nest for a chain of pointwise operators and reductions (a fused kernel)."""
    return torch.compile(fn, dynamic=dynamic)


def time_softmax(rows: int, cols: int, repeats: int, fused: Any) -> dict[str, Any]:
    """Time the eager chain and ``fused`` (e.g. :func:`compiled` of :func:`fused_softmax`)
    on a ``(rows, cols)`` float32 input with :func:`perflab.core.timing.measure`; ``fused``
    is called once first, so that compiling is not timed.

    Returns:
        ``{"eager": Measurement, "compiled": Measurement}``.
    """
    from perflab.core.timing import measure

    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    fused(x)
    return {"eager": measure(lambda: unfused_softmax(x), warmup=2, repeats=repeats,
                             label="eager (5 kernels)"),
            "compiled": measure(lambda: fused(x), warmup=2, repeats=repeats,
                                label="compiled (fused)")}
