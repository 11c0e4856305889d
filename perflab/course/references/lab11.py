"""Lab 11's references, grader-only: the bytes of the unfused softmax chain, the row
softmax, attention's output and log-sum-exp and its gradients (SDPA in float64, the
log-sum-exp from the float64 scores), the memory bound of a tiled forward and the bytes
a ring sends; each ``judge_*`` decides one graded case from the student's raw answer."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from perflab.labs.lab11.attention import make_qkv, make_rows

__all__ = ["softmax_bytes", "judge_fusion", "judge_softmax", "attention_reference",
           "judge_attention", "memory_bound_bytes", "judge_memory", "judge_backward",
           "judge_ring", "ATOL"]

#: Tolerances (absolute, and relative to the reference) by the inputs' dtype: fp32 inputs
#: to 1e-4; bf16 outputs are rounded to 8 bits of mantissa (2^-8 relative).
ATOL = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 4e-3}


def softmax_bytes(rows: int, cols: int, elem_bytes: int) -> dict[str, int]:
    """Bytes each operator of the eager chain reads plus writes: max reads x and writes
    the row maxima; subtract reads x and the maxima, writes z; exp reads z, writes e;
    sum reads e, writes the row sums; divide reads e and the sums, writes y. The fused
    kernel reads x once and writes y once."""
    n, r = rows * cols * elem_bytes, rows * elem_bytes
    return {"max": n + r, "subtract": n + r + n, "exp": 2 * n, "sum": n + r,
            "divide": n + r + n, "fused": 2 * n}


def judge_fusion(case: list, got: Any) -> None:
    want = softmax_bytes(*case)
    assert isinstance(got, dict), f"softmax_bytes returned {type(got).__name__}, not a dict"
    for op, w in want.items():
        assert got.get(op) == w, f"{op}: got {got.get(op)!r} bytes for (rows, cols, elem_bytes) = {case}"


def judge_softmax(case: dict, got: Any) -> None:
    x = make_rows(case["rows"], case["cols"], case["dtype"], case["seed"], case["inf_rows"],
                  case["inf_every"]).float()
    want = torch.softmax(x, dim=-1)
    want[case["inf_rows"]] = 0.0   # the exercise: a row with nothing to attend to is all zeros
    t = torch.tensor(got, dtype=torch.float32)
    assert t.shape == want.shape, f"shape {tuple(t.shape)}, expected {tuple(want.shape)}"
    assert not torch.isnan(t).any(), "NaN in the output (a row of -inf must give zeros)"
    tol = ATOL[case["dtype"]]
    bad = (t - want).abs() > tol + tol * want.abs()
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} values off by more than {tol} "
                           f"(largest error {(t - want).abs().max().item():.3g}; rows "
                           f"{sorted(set(bad.nonzero()[:, 0].tolist()))[:5]})")


def attention_reference(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's output on the case's inputs in float64, and the float64 log-sum-exp of each
    query's scaled (and masked) scores: the references of every attention check."""
    q, k, v = (t.double() for t in make_qkv(case["batch"], case["heads"], case["seq"],
                                            case["dim"], case["dtype"], case["seed"]))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
    s = q @ k.transpose(-1, -2) / math.sqrt(case["dim"])
    if case["causal"]:
        t = case["seq"]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return o, torch.logsumexp(s, dim=-1)


def _close(got: Any, want: torch.Tensor, tol: float, what: str) -> None:
    t = torch.tensor(got, dtype=torch.float64) if got is not None else None
    assert t is not None and t.shape == want.shape, (
        f"{what}: shape {None if t is None else tuple(t.shape)}, expected {tuple(want.shape)}")
    err = (t - want).abs()
    bad = err > tol + tol * want.abs()
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} values off (largest error {err.max().item():.3g})"


def _no_library(got: dict) -> None:
    assert not got.get("forbidden"), (
        f"the call ran {got['forbidden']}: a library's attention, which the exercise asks you to write")


def judge_attention(case: dict, got: Any) -> None:
    """Output to the dtype's tolerance, the log-sum-exp to 1e-4 (fp32) or 2e-2 (bf16
    inputs, scores in float32), no library attention."""
    assert isinstance(got, dict) and "o" in got and "lse" in got, "expected {'o', 'lse', ...}"
    _no_library(got)
    o, lse = attention_reference(case)
    _close(got["o"], o, ATOL[case["dtype"]], "the output o")
    _close(got["lse"], lse, 1e-4 if case["dtype"] == "fp32" else 2e-2, "the log-sum-exp")


def memory_bound_bytes(batch: int, heads: int, seq: int, dim: int, block_q: int,
                       block_k: int) -> int:
    """The peak the memory check allows inside a float32 tiled forward: 16 times
    ``B·H·(T·d + T + block_q·block_k)`` float32 values, O(T·d + block_q·block_k). A T x T
    float32 score matrix is ``B·H·T²·4`` bytes: at T = 32·d it alone is twice this bound."""
    return 16 * batch * heads * (seq * dim + seq + block_q * block_k) * 4


def judge_memory(case: dict, got: Any) -> None:
    """Peak bytes at T and 2T: under :func:`memory_bound_bytes` at 2T, and growing less than
    3x from T to 2T (linear growth doubles it; a T x T matrix quadruples it)."""
    assert isinstance(got, dict) and isinstance(got.get("peaks"), list) and len(got["peaks"]) == 2
    _no_library(got)
    small, large = got["peaks"]
    b = memory_bound_bytes(case["batch"], case["heads"], 2 * case["seq"], case["dim"],
                           case["block"], case["block"])
    assert isinstance(large, int) and large > 0, f"peak {large!r} bytes: nothing allocated?"
    assert large <= b, (f"peak {large:,} bytes inside the call at T = {2 * case['seq']}, over the "
                        f"O(T·d + block_q·block_k) bound of {b:,}: is the T x T matrix formed?")
    assert large < 3 * small, (f"peak {small:,} B at T = {case['seq']} and {large:,} B at "
                               f"T = {2 * case['seq']}: it grows faster than linearly in T")


def judge_backward(case: dict, got: Any) -> None:
    """dq, dk, dv against autograd through float64 SDPA with the case's dO; the saved
    tensors no more than q, k, v, o (in the inputs' dtype) and a float64 lse."""
    assert isinstance(got, dict) and all(k in got for k in ("dq", "dk", "dv", "saved_bytes"))
    _no_library(got)
    q, k, v = (t.double().requires_grad_(True) for t in make_qkv(
        case["batch"], case["heads"], case["seq"], case["dim"], case["dtype"], case["seed"]))
    do = make_qkv(case["batch"], case["heads"], case["seq"], case["dim"], "fp32",
                  case["seed"] + 1)[0].double()
    F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"]).backward(do)
    tol = 1e-4 if case["dtype"] == "fp32" else 5e-2
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        _close(got[name], t.grad, tol, name)
    n = case["batch"] * case["heads"] * case["seq"]
    allowed = 4 * n * case["dim"] * (4 if case["dtype"] == "fp32" else 2) + 8 * n
    assert got["saved_bytes"] <= allowed, (
        f"the Function saved {got['saved_bytes']:,} bytes for its backward; q, k, v, o and lse "
        f"are {allowed:,} at most: save only those (recompute the probabilities)")


def judge_ring(case: dict, got: Any) -> None:
    """Every rank's output and log-sum-exp, joined along the sequence, against the whole
    sequence's attention; each rank sent (p − 1)/p of K and V; no library attention."""
    p = case["ranks"]
    assert isinstance(got, list) and len(got) == p, f"records of {len(got)} ranks; the ring has {p}"
    for r, rec in enumerate(got):
        assert isinstance(rec, dict) and "error" not in rec, f"rank {r}: {rec}"[:300]
        _no_library(rec)
    o, lse = attention_reference(case)
    _close([x for rec in got for x in _seq_major(rec["o"])], _seq_major_t(o), ATOL[case["dtype"]],
           "the output o, the ranks' shards joined")
    _close([x for rec in got for x in _seq_major(rec["lse"])], _seq_major_t(lse), 1e-4,
           "the log-sum-exp, the ranks' shards joined")
    kv = 2 * case["batch"] * case["heads"] * case["seq"] * case["dim"] * 4
    want = (p - 1) * kv // p
    sent = [rec.get("sent_bytes") for rec in got]
    assert all(s == want for s in sent), (
        f"bytes sent per rank {sent}: each rank passes its K and V shards on p − 1 = {p - 1} "
        f"times, (p − 1)/p of K and V = {want:,} bytes")


def _seq_major(nested: list) -> list:
    """(B, H, n, ...) nested lists -> a list over the n positions (each position's B·H
    values), so that ranks' shards can be joined along the sequence."""
    t = torch.tensor(nested, dtype=torch.float64)
    return t.movedim(2, 0).tolist()


def _seq_major_t(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(2, 0)
