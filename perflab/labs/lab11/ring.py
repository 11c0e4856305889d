"""Ring attention's ranks: the student's ``ring_attention`` on a sequence shard per rank.

Ring attention (Liu, Zaharia and Abbeel 2023, arXiv:2310.01889) splits the sequence over p
ranks: rank r holds positions ``[r·T/p, (r+1)·T/p)`` of q, k and v, and passes its K/V
shard around the ring p − 1 times, so that every rank sees every K/V shard once; each
step's partial output is merged with the running one by their log-sum-exps (the merge of
the online softmax). Each rank sends ``(p − 1)/p`` of K and V.

:func:`ring_rank` is what every rank runs under :func:`perflab.distributed.launch_fn`: ONE
launch of :data:`RING_WORLD` ranks runs every case, the 2-rank cases on a process group of
ranks 0 and 1 (ranks 2 and 3 wait), so one launch serves the notebook's 2- and 4-rank cases
alike. Around each call the rank counts the bytes the student's code hands to
``torch.distributed.send`` and ``isend`` (``batch_isend_irecv``'s ``P2POp`` s call
``isend``), and records the aten ops it ran (a library attention among them is reported:
:func:`perflab.labs.lab11.memory.forbidden_ops`).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, Iterator, Sequence

import torch

from perflab.distributed import launch_fn
from perflab.labs.lab11.attention import make_qkv
from perflab.labs.lab11.memory import PeakBytes, forbidden_ops

__all__ = ["RING_WORLD", "RING_SIZES", "ring_rank", "ring_on_ranks", "shard"]

#: Ranks the ring launch starts: the 4-rank cases use all, the 2-rank cases ranks 0 and 1.
RING_WORLD = 4
#: The ring sizes a case may ask for.
RING_SIZES = (2, 4)


def shard(t: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous shard of ``t``'s sequence axis (dim 2), of ``ranks``.

    Raises:
        ValueError: the sequence length is not a multiple of ``ranks``.
    """
    seq = t.shape[2]
    if seq % ranks:
        raise ValueError(f"T = {seq} must be a multiple of the ranks ({ranks}); pick T = "
                         f"{ranks * max(1, seq // ranks)}")
    n = seq // ranks
    return t[:, :, rank * n:(rank + 1) * n].contiguous()


@contextlib.contextmanager
def _count_sends() -> Iterator[list[int]]:
    """Bytes handed to ``dist.send``/``dist.isend`` (also through ``P2POp``) in the block."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    sent: list[int] = []
    real_send, real_isend = c10d.send, c10d.isend
    inside = [False]   # torch's send calls isend: count the outermost call only

    def counted(real):
        def call(tensor, *args, **kwargs):
            if inside[0]:
                return real(tensor, *args, **kwargs)
            sent.append(tensor.numel() * tensor.element_size())
            inside[0] = True
            try:
                return real(tensor, *args, **kwargs)
            finally:
                inside[0] = False
        return call

    send, isend = counted(real_send), counted(real_isend)

    send.__name__, isend.__name__ = "send", "isend"
    saved = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in ("send", "isend")]
    for m, n, _ in saved:
        setattr(m, n, send if n == "send" else isend)
    try:
        yield sent
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


@contextlib.contextmanager
def _without_interpreter_file() -> Iterator[None]:
    """Triton's interpreter runs a kernel by ``exec`` in the kernel's own globals after
    copying in every global of ``triton/runtime/interpreter.py`` that is missing there
    (triton 3.9, ``InterpretedFunction._compile_and_exec``), ``__file__`` included: a
    kernel defined in a notebook leaves ``__main__.__file__`` naming the interpreter, and
    multiprocessing's spawn then runs that file as each rank's main script (which fails).
    While the ranks start, that borrowed ``__file__`` is hidden."""
    main = sys.modules.get("__main__")
    interp = sys.modules.get("triton.runtime.interpreter")
    borrowed = (main is not None and interp is not None
                and getattr(main, "__file__", None) == getattr(interp, "__file__", ""))
    if borrowed:
        del main.__file__
    try:
        yield
    finally:
        if borrowed:
            main.__file__ = interp.__file__


def _case(student: Any, case: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    p = case["ranks"]
    q, k, v = make_qkv(case["batch"], case["heads"], case["seq"], case["dim"],
                       case.get("dtype", "fp32"), case["seed"])
    mine = [shard(t, rank, p) for t in (q, k, v)]
    try:
        with _count_sends() as sent, PeakBytes() as pb:
            o, lse = student.ring_attention(*mine, case["causal"], group)
        return {"o": o.float().tolist(), "lse": lse.float().tolist(), "sent_bytes": sum(sent),
                "sends": len(sent), "forbidden": forbidden_ops(pb.ops)}
    except Exception as e:  # noqa: BLE001 - reported per case, the others still run
        return {"error": f"{type(e).__name__}: {e}"[:400]}


def ring_rank(cases: Sequence[dict[str, Any]], student_module: str = "ring_student") -> list:
    """Every rank's body: the student's ``ring_attention(q, k, v, is_causal, group)`` on
    each case (``{"batch", "heads", "seq", "dim", "ranks", "causal", "seed"}``, optionally
    ``"dtype"``) where this rank takes part. Returns one record per case: ``{"o", "lse",
    "sent_bytes", "sends", "forbidden"}``, ``{"error"}``, or None on a rank outside the
    case's ring."""
    import torch.distributed as dist

    rank = dist.get_rank()
    groups = {2: dist.new_group([0, 1]), 4: dist.group.WORLD}   # every rank makes each group
    try:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        student = importlib.import_module(student_module)
    except Exception as e:  # noqa: BLE001
        return [{"error": f"{type(e).__name__}: {e}"[:400]} for _ in cases]
    out = []
    for case in cases:
        if case["ranks"] not in groups:
            out.append({"error": f"ranks must be one of {RING_SIZES}, got {case['ranks']}"})
        elif rank < case["ranks"]:
            out.append(_case(student, case, rank, groups[case["ranks"]]))
        else:
            out.append(None)
        dist.barrier()
    return out


def ring_on_ranks(cases: Sequence[dict[str, Any]], student_module: str = "ring_student",
                  timeout_s: float = 120) -> list[list[dict[str, Any]]]:
    """ONE launch of :data:`RING_WORLD` gloo ranks running the student's ring on every case.

    Returns:
        ``[case][rank]``: the records of the case's ranks (``ranks`` of them, in order).

    Raises:
        ValueError: a case's ``seq`` is not a multiple of its ``ranks``, or ``ranks`` is not
            in :data:`RING_SIZES` (before any rank starts).
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    for c in cases:
        if c["ranks"] not in RING_SIZES:
            raise ValueError(f"ranks must be one of {RING_SIZES}, got {c['ranks']}")
        if c["seq"] % c["ranks"]:
            raise ValueError(f"seq = {c['seq']} must be a multiple of ranks = {c['ranks']}")
    with _without_interpreter_file():
        ranks = launch_fn(ring_rank, RING_WORLD, args=(list(cases), student_module),
                          device="cpu", timeout_s=timeout_s)
    return [[ranks[r][i] for r in range(c["ranks"])] for i, c in enumerate(cases)]
