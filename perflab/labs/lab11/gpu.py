"""Attention timed on a GPU with ``triton.testing.do_bench`` (CUDA only).

``do_bench`` (triton/testing.py) runs the function, flushes the L2 cache between calls,
times with CUDA events and returns the median milliseconds. TFLOP/s counts attention's
matmuls as FlashAttention's benchmarks do (:func:`perflab.labs.lab11.attention.attention_flops`:
4·B·H·T²·d forward, half of it causal, 3.5x for forward + backward).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from perflab.labs.lab11.attention import attention_flops

__all__ = ["gpu_skip_reason", "bench_attention"]


def gpu_skip_reason(triton_how: str) -> str | None:
    """Why the GPU section cannot run here (None when it can): no CUDA device, or no
    Triton (``triton_how`` is :func:`perflab.labs.lab11.kernels.load_triton`'s)."""
    if not torch.cuda.is_available():
        return ("no CUDA GPU here: these timings need one (run `make gpu-check` or this "
                "notebook on a GPU machine); the interpreter's times are not a kernel's")
    if "interpreter" not in triton_how:
        return f"Triton is not usable here: {triton_how}"
    return None


def bench_attention(impls: dict[str, Callable[..., Any]], seqs: list[int], *, batch: int = 4,
                    heads: int = 16, dim: int = 64, is_causal: bool = True,
                    backward: bool = False) -> list[dict[str, Any]]:
    """Median ms and TFLOP/s of each ``impls[name](q, k, v, is_causal)`` (returning the
    output, or ``(o, lse)``) on bf16 CUDA inputs of each T in ``seqs``, forward or
    forward + backward (``backward=True``: ``o.backward(do)``). A case that raises (out of
    memory at a long T for the naive attention) is a row with its ``error``.

    Raises:
        RuntimeError: no CUDA device.
    """
    import triton.testing

    if not torch.cuda.is_available():
        raise RuntimeError("bench_attention needs a CUDA GPU")
    rows = []
    for seq in seqs:
        q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=backward) for _ in range(3))
        do = torch.randn_like(q)
        flops = attention_flops(batch, heads, seq, dim, is_causal, backward)
        for name, fn in impls.items():
            def call():
                out = fn(q, k, v, is_causal)
                o = out[0] if isinstance(out, tuple) else out
                if backward:
                    o.backward(do)
            try:
                ms = triton.testing.do_bench(call)
                rows.append({"impl": name, "T": seq, "pass": "fwd+bwd" if backward else "fwd",
                             "median_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12})
            except Exception as e:  # noqa: BLE001 - out of memory at long T, etc.
                rows.append({"impl": name, "T": seq, "pass": "fwd+bwd" if backward else "fwd",
                             "error": f"{type(e).__name__}: {str(e)[:120]}"})
            torch.cuda.empty_cache()
    return rows
