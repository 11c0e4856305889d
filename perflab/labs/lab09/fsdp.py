"""FSDP written by hand (Lab 09, Exercise 2c): the rank body that trains the student's
``MyFSDP`` and measures what it holds and sends.

The student's ``MyFSDP(blocks, reshard_after_forward=True, prefetch=True,
param_dtype=None)`` (in their own file, imported on every rank) keeps each block's parameters as ONE flat shard per
rank (``.shards``: a list of ``nn.Parameter``, one per block in forward order; rank r
holds the r-th of ``world_size`` equal slices of the block's parameters flattened in
``block.parameters()`` order and zero-padded at the end), all-gathers a block in a
forward pre-hook, frees it after the forward (when resharding after forward),
all-gathers it again before its backward, reduce-scatters its gradients into the
shard's ``.grad`` and frees it, and prefetches the next block's all-gather one block
ahead; with a ``param_dtype`` it casts each shard to it before the all-gather and the
block's inputs in its pre-hook (FSDP2's ``MixedPrecisionPolicy(param_dtype=...)``), and
reduces the gradients in the shards' fp32. This is FSDP's algorithm (Zhao et al. 2023, "PyTorch FSDP", section 3; the ZeRO
paper's P_os+g+p, Rajbhandari et al. 2020, section 5.3); torch's FSDP2 (``fully_shard``)
does the same per parameter with DTensors.

:func:`my_fsdp_rank` trains it with ``torch.optim.AdamW(fsdp.shards)`` and records,
per rank:

* the parameters after training, gathered from every rank's shards (what the grader
  compares with one process of plain AdamW on the global batch);
* the collectives per steady-state step, their message bytes and the phase (forward,
  backward, step) they were issued in (:class:`perflab.analysis.sharding.count_collectives`);
* the peak of UNSHARDED parameter bytes (:func:`unsharded_bytes`), sampled after every
  collective call, every block's forward pre-hook and forward hook and every
  parameter's post-accumulate-grad hook (perflab's hooks are registered after the
  student's, so they see the state the student's hooks left);
* which of torch's own sharding APIs ran while ``MyFSDP`` was built and trained
  (``"delegated"``: :data:`perflab.labs.lab09.ZERO_FORBIDDEN`).

The expected collectives are FSDP2's on the same model: per step, one all-gather of
each block in forward, another in backward when resharding after forward, and one
reduce-scatter of each block's gradients (``tests/labs/test_lab09_fsdp.py`` measures
FSDP2 and checks the count). Their bytes are the flat layout's, each block padded once
to a multiple of the world size; FSDP2 pads each parameter's rows instead, so its bytes
are the same only where the world size divides every layer's width
(``mlp([6, 5, 7, 3])`` on 2 ranks: 816 and 408 all-gathered and reduce-scattered bytes
per step by hand, 976 and 488 by FSDP2).
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Sequence

import torch

from perflab.analysis.sharding import count_collectives
from perflab.labs.lab09.watch import _watch_student
from perflab.models import mlp, mlp_batches

__all__ = ["my_fsdp_rank", "unsharded_bytes", "tensors_in", "distinct_storage_bytes"]

def unsharded_bytes(blocks: Sequence[torch.nn.Module], holder: Any,
                    skip: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of unsharded parameter storage alive now: the storage behind every
    parameter of ``blocks`` (a parameter that is a view of a flat buffer counts the whole
    buffer once; a storage resized to 0 counts 0) plus every other tensor reachable from
    ``holder``'s attributes (lists, tuples and dicts, three levels deep: a prefetched
    buffer not yet handed to the parameters), except ``skip`` (the shards and their
    gradients) and the blocks' gradients.

    Returns:
        int bytes; each storage counted once.
    """
    params = [p for b in blocks for p in b.parameters()]
    kept = [t for value in vars(holder).values() if not isinstance(value, torch.nn.Module)
            for t in tensors_in(value, 3)]
    return distinct_storage_bytes([*params, *kept], skip=[*skip, *(p.grad for p in params)])


def _storage(t: Any) -> Any:
    """The untyped storage behind ``t`` (a DTensor's local shard); None for a non-tensor."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.untyped_storage() if isinstance(t, torch.Tensor) else None


def _storage_ptr(t: Any) -> int | None:
    """The address of ``t``'s storage; None for a non-tensor or an empty storage."""
    st = _storage(t)
    return None if st is None or st.nbytes() == 0 else st.data_ptr()


def tensors_in(obj: Any, depth: int) -> Any:
    """Yield the tensors reachable from ``obj`` through lists, tuples and dicts, ``depth``
    levels deep (a tensor itself at depth 0)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v, depth - 1)
    elif depth and isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, depth - 1)


def distinct_storage_bytes(tensors: Sequence[Any], skip: Sequence[Any] = ()) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries ignored; a DTensor:
    its local shard; a view counts its whole storage, once), leaving out the storages
    behind ``skip`` (tensors) and empty ones.

    Returns:
        int bytes.
    """
    skip = {_storage_ptr(t) for t in skip} - {None}
    seen: set[int] = set()
    total = 0
    for t in tensors:
        ptr = _storage_ptr(t)
        if ptr is None or ptr in skip or ptr in seen:
            continue
        seen.add(ptr)
        total += _storage(t).nbytes()
    return total


class _Peak:
    """The largest :func:`unsharded_bytes` seen at the sample points, with where."""

    def __init__(self, blocks: Sequence[torch.nn.Module]) -> None:
        self.blocks, self.holder, self.skip = list(blocks), None, []
        self.bytes, self.where = 0, ""

    def sample(self, where: str) -> None:
        if self.holder is None:
            return
        now = unsharded_bytes(self.blocks, self.holder, self.skip)
        if now > self.bytes:
            self.bytes, self.where = now, where


def my_fsdp_rank(configs: Sequence[dict[str, Any]], student_module: str) -> list[dict[str, Any]]:
    """Rank body: the student's ``MyFSDP`` on :func:`perflab.models.mlp` models (each
    ``nn.Linear`` a block), trained with AdamW; one record per config.

    Args:
        configs: dicts with ``sizes``, ``batch`` (per rank), ``steps`` (>= 2: the first is
            not counted in the collectives), ``seed``, ``lr``, ``weight_decay``,
            ``reshard_after_forward`` and ``prefetch`` (bools passed to ``MyFSDP``) and,
            optionally, ``param_dtype`` (a torch dtype name such as "bfloat16", passed as
            the dtype; absent or None: not passed). The loss is the cross-entropy of the
            logits in fp32.
        student_module: the module name of the student's file in the working folder (it
            defines ``MyFSDP``).

    Returns:
        Per config: ``{"params": the parameters after training, gathered from the ranks'
        shards and unpadded, flat in ``model.parameters()`` order (list of float; None
        when the shards do not have the layout above), "losses": this rank's losses,
        "calls" / "bytes": kind -> collectives per step and their message bytes per step
        (from the second step on), "calls_in": phase ("forward", "backward", "step") ->
        kind -> calls per step, "peak_unsharded_bytes": int, "peak_where": str,
        "gathers_before_forward": per block, the all-gathers the last step's forward had
        issued when the block's forward began (i + 1 without prefetching, i + 2 with one
        block of prefetch),
        "block_bytes": each block's fp32 parameter bytes (unpadded), "shard_numels": the
        numel of each of this rank's shards, "delegated": torch sharding APIs that ran}``.

    Raises:
        ValueError: a config with steps < 2.
        AttributeError: the student's module has no ``MyFSDP`` or it has no ``shards``.
    """
    import torch.distributed as dist

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module)
    rank, ws = dist.get_rank(), dist.get_world_size()
    out = []
    for cfg in configs:
        if cfg["steps"] < 2:
            raise ValueError(f"steps must be >= 2 (one builds the state, then counted), got {cfg['steps']}")
        model = mlp(cfg["sizes"], cfg["seed"])
        blocks = [m for m in model if isinstance(m, torch.nn.Linear)]
        numels = [sum(p.numel() for p in b.parameters()) for b in blocks]
        data = mlp_batches(cfg["sizes"], cfg["batch"], cfg["steps"], rank, cfg["seed"])
        peak = _Peak(blocks)
        losses: list[float] = []
        with _watch_student(True) as delegated:
            mixed = ({"param_dtype": getattr(torch, cfg["param_dtype"])}
                     if cfg.get("param_dtype") else {})
            fsdp = student.MyFSDP(blocks, reshard_after_forward=cfg["reshard_after_forward"],
                                  prefetch=cfg["prefetch"], **mixed)
            shards = list(fsdp.shards)
            opt = torch.optim.AdamW(shards, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
            peak.holder = fsdp
            peak.skip = shards
            order: list[int] = []   # this step's forward all-gathers issued before block i ran

            def before_forward(i: int) -> None:
                peak.sample(f"block {i} pre-forward")
                order.append(comm.phase_calls["forward"]["all_gather"] - base)

            for i, b in enumerate(blocks):   # after the student's hooks: see what they left
                b.register_forward_pre_hook(lambda *a, i=i: before_forward(i))
                b.register_forward_hook(lambda *a, i=i: peak.sample(f"block {i} forward done"))
                for p in b.parameters():
                    p.register_post_accumulate_grad_hook(
                        lambda _p, i=i: peak.sample(f"block {i} gradient accumulated"))
            # an unsharded buffer exists once its all-gather is issued: sample after each
            with count_collectives(after_call=lambda name: peak.sample(f"after {name}")) as comm:
                for s, (x, y) in enumerate(data):
                    if s == 1:  # the steady state: the first step builds AdamW's state
                        comm.calls.clear()
                        comm.bytes.clear()
                        comm.phase_calls.clear()
                    order.clear()
                    base = comm.phase_calls["forward"]["all_gather"]
                    comm.phase = "forward"
                    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                    comm.phase = "backward"
                    loss.backward()
                    comm.phase = "step"
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    comm.phase = ""
                    losses.append(float(loss.detach()))
        params = _gathered(shards, numels, ws)
        n = cfg["steps"] - 1
        out.append({"params": params, "losses": losses,
                    "calls": {k: v / n for k, v in comm.calls.items()},
                    "bytes": {k: v / n for k, v in comm.bytes.items()},
                    "calls_in": {ph: {k: v / n for k, v in kinds.items()}
                                 for ph, kinds in comm.phase_calls.items() if ph},
                    "peak_unsharded_bytes": peak.bytes, "peak_where": peak.where,
                    "gathers_before_forward": list(order),
                    "block_bytes": [4 * k for k in numels],
                    "shard_numels": [s.numel() for s in shards],
                    "delegated": sorted(delegated)})
        dist.barrier()
    return out


def _gathered(shards: Sequence[torch.Tensor], numels: Sequence[int], ws: int) -> list[float] | None:
    """Every block's parameters from every rank's shard (the ranks' shards exchanged as
    objects, so a rank whose shards have another size cannot hang its peers; the
    padding dropped), flat; None when the shards are not one equal slice per block."""
    import torch.distributed as dist

    mine = [s.detach().float().cpu() for s in shards]
    every: list[Any] = [None] * ws
    dist.all_gather_object(every, mine)
    sizes = [-(-k // ws) for k in numels]
    if any(len(r) != len(numels) or [t.numel() for t in r] != sizes for r in every):
        return None
    return torch.cat([torch.cat([r[b] for r in every])[:k] for b, k in enumerate(numels)]).tolist()
