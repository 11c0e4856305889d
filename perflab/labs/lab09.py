"""Sharding and scaling experiments on N ranks (Lab 09): the rank bodies.

Each function named ``*_rank`` is what every rank runs under
:func:`perflab.distributed.launch_fn` (module level, so spawned ranks import it):

* :func:`sharding_rank`: trains the same small MLP with AdamW under each method (plain
  DDP, DDP with fp16 / PowerSGD communication hooks, the student's ZeRO-1 from their own
  file, ``torch.distributed.optim.ZeroRedundancyOptimizer``, FSDP2's ``fully_shard``) and
  measures, per rank: model-state bytes (:func:`perflab.analysis.sharding.state_bytes`), the peak
  memory (:func:`perflab.core.memory.read_peak`, reset per method), collective bytes per step
  (:class:`perflab.analysis.sharding.count_collectives`) and the losses.
* :func:`tasks_rank`: runs a list of sharding and scaling tasks in one launch; the
  scaling task is the library's :func:`perflab.analysis.scaling.scaling_rank`.

The model they train is :func:`perflab.models.mlp`.

DDP, ZeroRedundancyOptimizer and FSDP2 are torch's; nothing here re-implements them.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Sequence

import torch

from perflab.distributed.ddp import register_comm_hook
from perflab.core.memory import read_peak, reset_peak
from perflab.analysis.sharding import count_collectives, state_bytes
from perflab.analysis.scaling import scaling_rank
from perflab.models import mlp, mlp_batches

__all__ = ["unsharded_adamw", "sharding_rank", "SHARDING_METHODS", "tasks_rank"]

#: What :func:`sharding_rank` can run, and how each is built.
SHARDING_METHODS = {
    "ddp": "DDP + AdamW (every rank holds everything)",
    "ddp_fp16": "DDP + AdamW, torch's fp16_compress_hook",
    "ddp_powersgd": "DDP + AdamW, torch's PowerSGD hook (rank 1)",
    "zero1": "DDP + your ZeRO-1 (optimizer state sharded by parameter)",
    "zero_redundancy": "DDP + torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1)",
    "fsdp2": "FSDP2: fully_shard per Linear and the root (params, grads, state sharded)",
}


def unsharded_adamw(sizes: Sequence[int], world_size: int, batch: int, steps: int, *,
                    lr: float = 1e-2, weight_decay: float = 0.01, seed: int = 0
                    ) -> list[float]:
    """The reference: one process, plain ``torch.optim.AdamW``, the global batch.

    Returns:
        The parameters after ``steps`` steps, flattened in ``model.parameters()`` order.
    """
    model = mlp(sizes, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    per_rank = [mlp_batches(sizes, batch, steps, r, seed) for r in range(world_size)]
    for s in range(steps):
        x = torch.cat([per_rank[r][s][0] for r in range(world_size)])
        y = torch.cat([per_rank[r][s][1] for r in range(world_size)])
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _build(method: str, model: torch.nn.Module, device: torch.device, lr: float,
           weight_decay: float, student: Any) -> tuple[torch.nn.Module, Any, Any]:
    """(module to call, optimizer to step, optimizer whose state is this rank's)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if method == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        return model, opt, opt
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if method in ("ddp_fp16", "ddp_powersgd"):
        register_comm_hook(ddp, method.split("_")[1], None)
    else:  # torch's plain allreduce hook: the same allreduce, visible to the counter
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    if method == "zero1":
        opt = student.MyZero1(ddp.parameters(), lr=lr, weight_decay=weight_decay)
        return ddp, opt, opt.local_optimizer
    if method == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=lr, weight_decay=weight_decay)
        return ddp, opt, opt.optim
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr, weight_decay=weight_decay)
    return ddp, opt, opt


def sharding_rank(methods: Sequence[str], sizes: Sequence[int], batch: int, steps: int,
                  student_module: str | None = None, lr: float = 1e-2,
                  weight_decay: float = 0.01, seed: int = 0, device: str = "cpu",
                  params_up_to: int = 20_000) -> dict[str, dict[str, Any]]:
    """Rank body: train :func:`mlp` ``(sizes)`` with each method; measure this rank.

    Args:
        methods: keys of :data:`SHARDING_METHODS`.
        sizes, batch, steps, seed: the model, per-rank batch and steps (>= 2; the first
            step is not counted in the collective bytes: it builds the optimizer state).
        student_module: module name of the student's file (``zero1_student`` for
            ``zero1_student.py`` in the working folder); it must define ``MyZero1``
            (``local_optimizer`` attribute) and ``my_state_bytes(optimizer)``. Needed for
            "zero1"; when given, ``my_state_bytes`` is also called on every method.
        lr, weight_decay: AdamW's.
        device: "cpu" or "cuda" (this rank's GPU).
        params_up_to: return the final parameters when the model has at most this many.

    Returns:
        method -> ``{"state": state_bytes(...), "student_optimizer_bytes": int | None,
        "largest_param_bytes", "num_params", "param_bytes" (unsharded fp32 total),
        "peak_bytes", "peak_label", "comm_per_step": count_collectives.summary,
        "comm_calls_per_step", "losses", "params" (flat list or None)}``.

    Raises:
        ValueError: an unknown method, steps < 2, or "zero1" without ``student_module``.
    """
    import torch.distributed as dist

    bad = [m for m in methods if m not in SHARDING_METHODS]
    if bad:
        raise ValueError(f"unknown methods {bad}; choose from {list(SHARDING_METHODS)}")
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (one to build the state, then counted), got {steps}")
    if "zero1" in methods and not student_module:
        raise ValueError("method 'zero1' needs student_module (your file's module name)")
    if student_module and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module) if student_module else None
    rank = dist.get_rank()
    dev = torch.device(f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu")
    data = [(x.to(dev), y.to(dev)) for x, y in mlp_batches(sizes, batch, steps, rank, seed)]
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        model = mlp(sizes, seed).to(dev)
        shapes = [p.numel() for p in model.parameters()]
        was_reset = reset_peak(dev)
        module, opt, holder = _build(method, model, dev, lr, weight_decay, student)
        losses: list[float] = []
        with count_collectives() as comm:
            for s, (x, y) in enumerate(data):
                if s == 1:  # from the second step on: the steady state
                    comm.calls.clear()
                    comm.bytes.clear()
                loss = torch.nn.functional.cross_entropy(module(x), y)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                if s < steps - 1:
                    opt.zero_grad(set_to_none=True)
        measured = state_bytes(model, holder)  # grads of the last step still held
        peak = read_peak(dev, was_reset=was_reset)
        params = None
        if sum(shapes) <= params_up_to:
            full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
            params = torch.cat([p.detach().flatten().cpu() for p in full]).tolist()
        out[method] = {
            "state": measured,
            "student_optimizer_bytes": (int(student.my_state_bytes(holder))
                                        if student is not None else None),
            "largest_param_bytes": 4 * max(shapes), "num_params": sum(shapes),
            "param_bytes": 4 * sum(shapes), "peak_bytes": peak.peak_bytes, "peak_label": peak.kind,
            "comm_per_step": comm.summary(steps - 1),
            "comm_calls_per_step": {k: v / (steps - 1) for k, v in comm.calls.items()},
            "losses": losses, "params": params}
        dist.barrier()
    return out


def tasks_rank(tasks: Sequence[tuple[str, tuple, dict]]) -> list[Any]:
    """Rank body running several experiments in one launch (process start-up costs
    seconds): ``tasks`` is a list of ``(name, args, kwargs)`` with name "sharding"
    (:func:`sharding_rank`) or "scaling" (:func:`perflab.analysis.scaling.scaling_rank`); returns their results.

    Raises:
        ValueError: an unknown task name.
    """
    bodies = {"sharding": sharding_rank, "scaling": scaling_rank}
    out = []
    for name, args, kwargs in tasks:
        if name not in bodies:
            raise ValueError(f"unknown task {name!r}; use 'sharding' or 'scaling'")
        out.append(bodies[name](*args, **kwargs))
    return out
