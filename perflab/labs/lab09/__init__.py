"""Sharding and scaling experiments on N ranks (Lab 09): the rank bodies.

Each function named ``*_rank`` is what every rank runs under
:func:`perflab.distributed.launch_fn` (module level, so spawned ranks import it):

* :func:`sharding_rank`: trains the same small MLP with AdamW under each method (plain
  DDP, DDP with fp16 / PowerSGD communication hooks, the student's ZeRO-1 and ZeRO-2
  from their own file, ``torch.distributed.optim.ZeroRedundancyOptimizer``, FSDP2's
  ``fully_shard``) and
  measures, per rank: model-state bytes (:func:`perflab.analysis.sharding.state_bytes`), the peak
  memory (:func:`perflab.core.memory.read_peak`, reset per method), collective bytes per step
  (:class:`perflab.analysis.sharding.count_collectives`) and the losses. While the
  student's optimizers are built and stepped, it records whether torch's own sharding
  ran (:data:`ZERO_FORBIDDEN`, seen by :func:`perflab.labs.checking.watch_calls` on the
  rank): the records say so even for the lab's own launch, which runs outside any graded
  call and so out of reach of the graded call's spy.
* :func:`fsdp2_rank`: applies the student's FSDP2 configuration (``my_fully_shard`` from
  their file: ``fully_shard`` per block and at the root, a ``MixedPrecisionPolicy``,
  ``reshard_after_forward``) to :func:`perflab.models.mlp` models and measures, per rank,
  the DTensor bytes of the parameters, the dtype of the forward's output and the
  collectives of a steady-state step (counted, with their bytes).
* :func:`~perflab.labs.lab09.prefetch.prefetch_order_rank` (in :mod:`.prefetch`): the
  student's FSDP2 explicit prefetching, the order of its collectives recorded.
* :func:`tasks_rank`: runs a list of sharding, prefetching and scaling tasks in one
  launch; the scaling task is the library's :func:`perflab.analysis.scaling.scaling_rank`.

The model they train is :func:`perflab.models.mlp`.

DDP, ZeroRedundancyOptimizer and FSDP2 are torch's; nothing here re-implements them.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, Sequence

import torch

from perflab.distributed.ddp import register_comm_hook
from perflab.core.memory import read_peak, reset_peak
from perflab.analysis.sharding import count_collectives, state_bytes
from perflab.analysis.scaling import scaling_rank
from perflab.models import mlp, mlp_batches
from perflab.labs.lab09.fsdp import _storage, _storage_ptr, my_fsdp_rank
from perflab.labs.lab09.prefetch import prefetch_order_rank
from perflab.labs.lab09.watch import ZERO_FORBIDDEN, _watch_student

__all__ = ["sharding_rank", "SHARDING_METHODS", "ZERO_FORBIDDEN", "fsdp2_rank",
           "held_gradient_bytes", "held_gradient_parts",
           "tasks_rank", "record_scaling", "allreduce_by_world_size_rank", "load_scaling_recording", "SCALING_RECORDING"]

#: The shipped recording of 1- to 8-rank weak and strong scaling runs with simulated
#: compute, and an all-reduce sweep per link (perflab/recordings/, written by
#: :func:`record_scaling`).
SCALING_RECORDING = "scaling_simcompute_1to8.json"

#: What :func:`sharding_rank` can run, and how each is built.
SHARDING_METHODS = {
    "ddp": "DDP + AdamW (every rank holds everything)",
    "ddp_fp16": "DDP + AdamW, torch's fp16_compress_hook",
    "ddp_powersgd": "DDP + AdamW, torch's PowerSGD hook (rank 1)",
    "zero1": "DDP + your ZeRO-1 (optimizer state sharded by parameter)",
    "zero_redundancy": "DDP + torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1)",
    "zero2": "your ZeRO-2 (P_os+g), no DDP: each bucket of gradients reduce-scattered "
             "during backward and freed, AdamW on this rank's shard",
    "fsdp2": "FSDP2: fully_shard per Linear and the root (params, grads, state sharded)",
}


def _build(method: str, model: torch.nn.Module, device: torch.device, lr: float,
           weight_decay: float, student: Any,
           zero2_bucket_cap_mb: float | None = None) -> tuple[torch.nn.Module, Any, Any]:
    """(module to call, optimizer to step, optimizer whose state is this rank's)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if method == "zero2":  # the student's: no DDP, their hooks and step() communicate
        kw = {} if zero2_bucket_cap_mb is None else {"bucket_cap_mb": zero2_bucket_cap_mb}
        opt = student.MyZero2(model.parameters(), lr=lr, weight_decay=weight_decay, **kw)
        return model, opt, opt.local_optimizer
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
                  params_up_to: int = 20_000,
                  zero2_bucket_cap_mb: float | None = None) -> dict[str, dict[str, Any]]:
    """Rank body: train :func:`mlp` ``(sizes)`` with each method; measure this rank.

    Args:
        methods: keys of :data:`SHARDING_METHODS`.
        sizes, batch, steps, seed: the model, per-rank batch and steps (>= 2; the first
            step is not counted in the collective bytes: it builds the optimizer state).
        student_module: module name of the student's file (``zero1_student`` for
            ``zero1_student.py`` in the working folder); it must define ``MyZero1`` and,
            for "zero2", ``MyZero2`` (each with a ``local_optimizer`` attribute) and
            ``my_state_bytes(optimizer)``. Needed for "zero1" and "zero2"; when given,
            ``my_state_bytes`` is also called on every method.
        lr, weight_decay: AdamW's.
        device: "cpu" or "cuda" (this rank's GPU).
        params_up_to: return the final parameters when the model has at most this many.
        zero2_bucket_cap_mb: passed to the student's ``MyZero2`` as ``bucket_cap_mb``
            (None: its own default).

    Returns:
        method -> ``{"state": state_bytes(...), "student_optimizer_bytes": int | None,
        "largest_param_bytes", "num_params", "param_bytes" (unsharded fp32 total),
        "peak_bytes", "peak_label", "comm_per_step": count_collectives.summary,
        "comm_calls_per_step", "losses", "params" (flat list or None), "exp_avg" (the
        local optimizer's ``exp_avg`` buffers flattened in its parameter order, a list of
        floats, for "zero1" and "zero2" only; None otherwise), "delegated" (the names in
        :data:`ZERO_FORBIDDEN` that ran while the student's optimizer was built and
        stepped, for "zero1" and "zero2"; ``[]`` otherwise), "grad_bytes_after_backward"
        (the most gradient bytes this rank held right after a ``backward()`` returned,
        :func:`held_gradient_bytes`), "grad_held_parts" (where those bytes were, at that
        ``backward()``: :func:`held_gradient_parts`), "state_tensors" (parameters with optimizer state
        on this rank), "calls_in_backward" / "calls_in_step" (kind ->
        collectives per step issued while ``backward()`` / ``step()`` ran, steady state)}``.

    Raises:
        ValueError: an unknown method, steps < 2, or "zero1" / "zero2" without
            ``student_module``.
    """
    import torch.distributed as dist

    bad = [m for m in methods if m not in SHARDING_METHODS]
    if bad:
        raise ValueError(f"unknown methods {bad}; choose from {list(SHARDING_METHODS)}")
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (one to build the state, then counted), got {steps}")
    if {"zero1", "zero2"} & set(methods) and not student_module:
        raise ValueError("methods 'zero1' and 'zero2' need student_module (your file's module name)")
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
        losses: list[float] = []
        with _watch_student(method in ("zero1", "zero2")) as delegated:
            module, opt, holder = _build(method, model, dev, lr, weight_decay, student,
                                         zero2_bucket_cap_mb)
            held, held_parts = 0, []
            with count_collectives() as comm:
                for s, (x, y) in enumerate(data):
                    if s == 1:  # from the second step on: the steady state
                        comm.calls.clear()
                        comm.bytes.clear()
                        comm.phase_calls.clear()
                    loss = torch.nn.functional.cross_entropy(module(x), y)
                    comm.phase = "backward"
                    loss.backward()
                    comm.phase = ""
                    parts = held_gradient_parts(model, opt, holder)
                    if sum(b for _, _, b in parts) >= held:
                        held, held_parts = sum(b for _, _, b in parts), parts
                    comm.phase = "step"
                    opt.step()
                    comm.phase = ""
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
            "losses": losses, "params": params,
            "exp_avg": _exp_avg(holder) if method in ("zero1", "zero2") else None,
            "delegated": sorted(delegated), "grad_bytes_after_backward": held,
            "grad_held_parts": held_parts,
            "state_tensors": len(getattr(holder, "state", {})),
            "calls_in_backward": {k: v / (steps - 1)
                                  for k, v in comm.phase_calls.get("backward", {}).items()},
            "calls_in_step": {k: v / (steps - 1)
                              for k, v in comm.phase_calls.get("step", {}).items()}}
        dist.barrier()
    return out


def held_gradient_bytes(model: torch.nn.Module, optimizer: Any, holder: Any) -> int:
    """Bytes of gradient storage a rank holds now: every ``p.grad`` of ``model`` (a
    DTensor's local shard), the ``.grad`` of the parameters ``holder`` (the optimizer
    whose state is this rank's) steps, and every other tensor reachable from
    ``optimizer``'s attributes (lists, tuples and dicts of them, three levels deep: a
    ZeRO-2's reduced shards and bucket buffers). Parameters, their storage (a flat buffer
    the parameters are views of included) and ``holder``'s state (Adam's moments) are not
    gradients and are left out; each storage counts once, whole (a view keeps all of it
    alive). So a tensor a hand-written optimizer keeps between steps counts whatever it
    holds, a separate flat copy of the parameters included: it is memory the rank holds
    beyond the parameters and the optimizer state, what ZeRO-2 exists to save.

    For DDP this is Ψ·4 bytes in fp32 (its buckets hold every gradient); for ZeRO-2
    (P_os+g, Rajbhandari et al. 2020, §5.2) Ψ·4/N plus what is still in flight.
    :func:`held_gradient_parts` says where the bytes are.
    """
    return sum(nbytes for _, _, nbytes in held_gradient_parts(model, optimizer, holder))


def held_gradient_parts(model: torch.nn.Module, optimizer: Any,
                        holder: Any) -> list[list[Any]]:
    """Where :func:`held_gradient_bytes` found its bytes, for a message that names them:
    ``[place, tensors, bytes]`` per place, in the order found (each storage counted once,
    at the first place it was reached): ``"p.grad"`` (the model's parameters'),
    ``"local optimizer's parameters' .grad"`` (``holder``'s, when they are not the
    model's) and, for a hand-written optimizer, each attribute path with every list or
    tuple index as ``[*]`` (``"self.reduced[*][*]"``: the tensors in the entries of
    ``self.reduced``; ``"self.buffers['w']"``). Places with nothing counted are left out.

    Returns:
        list of ``[str, int, int]``: place, distinct storages, bytes.
    """
    groups = getattr(holder, "param_groups", []) or []
    theirs = [p for g in groups for p in g["params"]]
    params = list(model.parameters())
    skip = [*params, *theirs]
    for state in getattr(holder, "state", {}).values():
        skip += [v for v in state.values() if isinstance(v, torch.Tensor)]
    named: list[tuple[str, Any]] = [("p.grad", p.grad) for p in params]
    named += [("local optimizer's parameters' .grad", p.grad) for p in theirs]
    if optimizer is not holder and not isinstance(optimizer, torch.optim.Optimizer):
        named += [(re.sub(r"\[\d+\]", "[*]", where), t)   # a hand-written optimizer's buffers
                  for name, value in vars(optimizer).items()
                  for where, t in _named_tensors(value, f"self.{name}", 3)]
    skipped = {_storage_ptr(t) for t in skip} - {None}
    seen: set[int] = set()
    parts: dict[str, list[Any]] = {}
    for where, t in named:
        ptr = _storage_ptr(t)
        if ptr is None or ptr in skipped or ptr in seen:
            continue
        seen.add(ptr)
        part = parts.setdefault(where, [where, 0, 0])
        part[1] += 1
        part[2] += _storage(t).nbytes()
    return list(parts.values())


def _named_tensors(obj: Any, path: str, depth: int) -> Any:
    """Yield ``(path, tensor)`` for the tensors reachable from ``obj`` through lists,
    tuples and dicts, ``depth`` levels deep (:func:`~perflab.labs.lab09.fsdp.tensors_in`
    with the way there: ``self.reduced[2][1]``, ``self.buffers['w']``)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif depth and isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _named_tensors(v, f"{path}[{i}]", depth - 1)
    elif depth and isinstance(obj, dict):
        for k, v in obj.items():
            yield from _named_tensors(v, f"{path}[{k!r}]", depth - 1)


def _exp_avg(optimizer: Any) -> list[float] | None:
    """AdamW's ``exp_avg`` of ``optimizer`` (a torch optimizer), flattened in its
    param_groups order; None when it has none."""
    bufs = [optimizer.state[p]["exp_avg"].detach().flatten().cpu()
            for g in getattr(optimizer, "param_groups", []) for p in g["params"]
            if "exp_avg" in optimizer.state.get(p, {})]
    return torch.cat(bufs).tolist() if bufs else None


def fsdp2_rank(configs: Sequence[dict[str, Any]], student_module: str) -> list[dict[str, Any]]:
    """Rank body: the student's ``my_fully_shard(model, reshard_after_forward,
    param_dtype, reduce_dtype)`` on :func:`perflab.models.mlp` models, one per config.

    Args:
        configs: dicts with ``sizes``, ``batch`` (per rank), ``steps`` (>= 2: the first
            is not counted), ``seed``, ``reshard_after_forward`` (bool), ``param_dtype``
            and ``reduce_dtype`` (torch dtype names, e.g. "bfloat16").
        student_module: the module name of the student's file in the working folder.

    Returns:
        Per config: ``{"local_param_bytes": bytes of this rank's parameter shards
        (:func:`perflab.analysis.sharding.local_nbytes`), "all_dtensor": every parameter a
        DTensor, "output_dtype": the forward's output dtype (str), "calls" / "bytes":
        kind -> collectives per step and their message bytes per step (counted from the
        second step on, :class:`perflab.analysis.sharding.count_collectives`),
        "losses"}``.

    Raises:
        ValueError: a config with steps < 2.
    """
    import torch.distributed as dist

    from perflab.analysis.sharding import local_nbytes

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    student = importlib.import_module(student_module)
    out = []
    for cfg in configs:
        if cfg["steps"] < 2:
            raise ValueError(f"steps must be >= 2, got {cfg['steps']}")
        model = mlp(cfg["sizes"], cfg["seed"])
        model = student.my_fully_shard(model, cfg["reshard_after_forward"],
                                       getattr(torch, cfg["param_dtype"]),
                                       getattr(torch, cfg["reduce_dtype"])) or model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = mlp_batches(cfg["sizes"], cfg["batch"], cfg["steps"], dist.get_rank(), cfg["seed"])
        losses, output_dtype = [], None
        with count_collectives() as comm:
            for s, (x, y) in enumerate(data):
                if s == 1:  # the steady state: the first step builds the optimizer state
                    comm.calls.clear()
                    comm.bytes.clear()
                logits = model(x)
                output_dtype = str(logits.dtype).removeprefix("torch.")
                loss = torch.nn.functional.cross_entropy(logits.float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
        n = cfg["steps"] - 1
        params = list(model.parameters())
        out.append({"local_param_bytes": sum(local_nbytes(p) for p in params),
                    "all_dtensor": all(callable(getattr(p, "to_local", None)) for p in params),
                    "output_dtype": output_dtype,
                    "calls": {k: v / n for k, v in comm.calls.items()},
                    "bytes": {k: v / n for k, v in comm.bytes.items()}, "losses": losses})
        dist.barrier()
    return out


def tasks_rank(tasks: Sequence[tuple[str, tuple, dict]]) -> list[Any]:
    """Rank body running several experiments in one launch (process start-up costs
    seconds): ``tasks`` is a list of ``(name, args, kwargs)`` with name "sharding"
    (:func:`sharding_rank`), "fsdp2_student" (:func:`fsdp2_rank`), "prefetch_order"
    (:func:`~perflab.labs.lab09.prefetch.prefetch_order_rank`), "my_fsdp"
    (:func:`~perflab.labs.lab09.fsdp.my_fsdp_rank`) or "scaling"
    (:func:`perflab.analysis.scaling.scaling_rank`); returns their results.

    Raises:
        ValueError: an unknown task name.
    """
    bodies = {"sharding": sharding_rank, "fsdp2_student": fsdp2_rank,
              "prefetch_order": prefetch_order_rank, "scaling": scaling_rank,
              "my_fsdp": my_fsdp_rank}
    out = []
    for name, args, kwargs in tasks:
        if name not in bodies:
            raise ValueError(f"unknown task {name!r}; use one of {list(bodies)}")
        out.append(bodies[name](*args, **kwargs))
    return out


def allreduce_by_world_size_rank(world_sizes: Sequence[int], sizes: Sequence[int], repeats: int,
                                 warmup: int, seed: int = 0) -> list[Any]:
    """Rank body: the real all-reduce of one step's DDP gradient buckets, with no link,
    timed on the first ``w`` ranks for each ``w`` in ``world_sizes`` (one launch of
    ``max(world_sizes)`` ranks; the other ranks wait at a barrier).

    The buckets are those DDP builds for :func:`perflab.models.mlp` ``(sizes)`` (read with
    :func:`perflab.distributed.ddp.ddp_buckets` after one backward), all-reduced as DDP
    issues them with :func:`perflab.distributed.ddp.timed_allreduce_buckets` (``link=None``).

    Returns:
        ``[bucket_bytes, times]``: DDP's bucket sizes in bytes, and per world size this
        rank's ``repeats`` times in seconds (after ``warmup``), or None on a rank outside
        the first ``w``.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perflab.distributed.ddp import ddp_buckets, timed_allreduce_buckets

    ddp = DDP(mlp(sizes, seed))
    for x, y in mlp_batches(sizes, 2, 2, dist.get_rank(), seed):  # DDP rebuilds its buckets after step 1
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    buckets = [b["nbytes"] for b in ddp_buckets(ddp)]
    times: list[list[float] | None] = []
    for w in world_sizes:
        group = dist.new_group(list(range(w))) if w < dist.get_world_size() else None  # all ranks call
        mine = None
        if dist.get_rank() < w:
            mine = [timed_allreduce_buckets(buckets, group=group)
                    for _ in range(warmup + repeats)][warmup:]
        times.append(mine)
        dist.barrier()
    return [buckets, times]


def _scaling_recording_rank(cfgs: Sequence[dict[str, Any]], sizes: Sequence[int], seed: int,
                            world_sizes: Sequence[int], repeats: int) -> list[Any]:
    """Rank body of :func:`record_scaling`: the scaling runs, then the real all-reduce at
    every world size (:func:`allreduce_by_world_size_rank`), in one launch."""
    return [scaling_rank(cfgs, sizes, seed),
            allreduce_by_world_size_rank(world_sizes, sizes, repeats, 3, seed)]


def record_scaling(path: str, *, steps: int = 30, seed: int = 0,
                   compute_s_per_sample: float | None = None) -> dict[str, Any]:
    """Record weak and strong scaling step times at 1, 2, 3, 4, 6 and 8 gloo ranks on the
    10 and 1 Gbit/s simulated links, with **simulated compute**, and an all-reduce sweep
    on each link, and write them to ``path`` as JSON.

    Each rank's forward+backward is slept for a modelled time, ``compute_s_per_sample``
    seconds per sample of its batch (:func:`perflab.analysis.scaling.scaling_rank`), then
    one sample's real forward+backward gives real gradients of the real sizes, which DDP
    all-reduces through Lab 06's link hook: so 8 ranks run on a 2-core machine without
    sharing cores for compute, though their real all-reduces do share them: a run with
    more ranks than cores is labelled oversubscribed. With ``compute_s_per_sample=None``
    it is measured once first: the median of a real 1-rank step (the 256-512-512-10 MLP,
    batch 256, SGD, 1 thread, no link) divided by 256. The runs: SGD, 256 samples per rank
    (weak) or 480 in all (strong: divisible by 1, 2, 3, 4, 6 and 8), ``steps`` steps after
    3 warm-ups, all in one 8-rank launch (a run of w ranks on the first w). The sweeps:
    :func:`perflab.analysis.collectives.allreduce_sweep` at p = 2, 1 KiB .. 16 MiB, on each
    link, 15 repeats: their fastest and their median (Lab 09 fits Lab 06's alpha-beta model
    to the fastest: the link's time plus the machine's floor, without the waits for a core
    that other work on a shared machine adds to the median).

    The JSON: ``{"source", "machine", "load_average" (``os.getloadavg()`` before and
    after: other work on the machine), "cores" (this machine's usable cores, counted from
    the CPU affinity mask), "compute" (what was simulated, in words),
    "compute_s_per_sample", "sizes", "param_bytes", "links": {name: {"alpha_s",
    "beta_bytes_per_s"}}, "link_model", "sweeps": {name: {"world_size", "size_bytes",
    "time_min_s", "time_median_s"}}, "runs": [{"mode", "link", "world_size", "global_batch", "compute"
    ("simulated"), "oversubscribed" (more ranks than this machine's cores), "step_s":
    [slowest rank's step, s]}], "allreduce": {"world_size": [...], "bucket_bytes": [DDP's
    buckets], "step_s": [[slowest rank's seconds per repeat] per world size], "what"}}``.
    The last is the real gloo all-reduce of one step's gradients at every world size with
    no link (:func:`allreduce_by_world_size_rank`, in the same launch): the collective cost
    on this machine that the link model leaves out.

    Returns:
        The recording (the dict written).
    """
    import json

    import numpy as np

    from perflab.analysis.collectives import allreduce_sweep
    from perflab.analysis.scaling import _cores, core_label, scaling_configs
    from perflab.core.simulated import LINK_PRESETS
    from perflab.distributed import launch_fn

    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    cores = _cores()
    sizes, links = [256, 512, 512, 10], [LINK_PRESETS["10gbe"], LINK_PRESETS["1gbe"]]
    world_sizes, per_rank_batch, global_batch = (1, 2, 3, 4, 6, 8), 256, 480
    if compute_s_per_sample is None:  # one real 1-rank step, measured once
        probe = scaling_configs(1, links=[None], per_rank_batch=per_rank_batch,
                                global_batch=per_rank_batch, steps=20, warmup=3)[:1]
        step_s = launch_fn(scaling_rank, 1, args=(probe, sizes, seed), device="cpu",
                           timeout_s=300)[0][0]["step_s"]
        compute_s_per_sample = float(np.median(step_s)) / per_rank_batch
    cfgs = [c for w in world_sizes for c in scaling_configs(
        w, links=links, per_rank_batch=per_rank_batch, global_batch=global_batch,
        steps=steps, warmup=3, compute_s_per_sample=compute_s_per_sample)]
    launched = launch_fn(_scaling_recording_rank, max(world_sizes),
                         args=(cfgs, sizes, seed, world_sizes, steps), device="cpu", timeout_s=900)
    ranks = [r[0] for r in launched]
    allreduce = {"world_size": list(world_sizes), "bucket_bytes": launched[0][1][0], "step_s": [
        [max(launched[r][1][1][i][k] for r in range(w)) for k in range(steps)]  # slowest rank
        for i, w in enumerate(world_sizes)]}
    runs = []
    for i, cfg in enumerate(ranks[0]):
        w = cfg["world_size"]
        slowest = [max(ranks[r][i]["step_s"][s] for r in range(w)) for s in range(steps)]
        runs.append({"mode": cfg["mode"], "link": cfg["link"], "world_size": w,
                     "global_batch": cfg["batch"] * w, "compute": "simulated",
                     "oversubscribed": w > cores, "step_s": slowest})
    sweep_sizes = [2 ** k for k in range(10, 25, 2)]
    table = allreduce_sweep(sweep_sizes, world_size=2, repeats=15, warmup=3, link=links)
    sweeps = {}
    for lk in links:
        rows = table[table.link == lk.describe()]
        sweeps[lk.name] = {"world_size": 2, "size_bytes": [int(n) for n in rows.size_bytes],
                           "time_min_s": [float(t) for t in rows.time_min_s],
                           "time_median_s": [float(t) for t in rows.time_s]}
    out = {"source": f"perflab.labs.lab09.record_scaling(steps={steps}, seed={seed}, "
                     f"compute_s_per_sample={compute_s_per_sample!r})",
           "machine": core_label(max(world_sizes), simulated_compute=True),
           "load_average": {"before": load_before,
                            "after": os.getloadavg() if hasattr(os, "getloadavg") else None},
           "compute": (f"simulated: each rank sleeps {compute_s_per_sample * 1e6:.2f} us per "
                       "sample of its batch (the MLP's forward+backward, measured once on 1 "
                       "rank of this machine), then runs one sample's forward+backward, so DDP "
                       "all-reduces real gradients of the real sizes through the simulated "
                       "link; the SGD step is real. The real gloo all-reduces of up to 8 "
                       "processes still share the machine's cores (each ring hop waits for "
                       "its process to be scheduled)"),
           "cores": cores, "compute_s_per_sample": compute_s_per_sample, "sizes": sizes,
           "param_bytes": 4 * sum(p.numel() for p in mlp(sizes).parameters()),
           "links": {lk.name: {"alpha_s": lk.alpha_s, "beta_bytes_per_s": lk.beta_bytes_per_s}
                     for lk in links},
           "link_model": "ring all-reduce on p ranks: 2(p-1) alpha + 2(p-1)/p n / beta "
                         "(perflab.core.simulated.LinkModel), completed no earlier than the "
                         "real gloo all-reduce",
           "sweeps": sweeps,
           "allreduce": {**allreduce, "what": (
               "the real gloo all-reduce of one step's DDP gradient buckets (bucket_bytes, in "
               f"DDP's order), no simulated link, on the first world_size ranks of the same "
               f"{max(world_sizes)}-rank launch, {steps} repeats after 3 warm-ups; step_s: per "
               "repeat, the slowest rank's seconds (perflab.distributed.ddp."
               "timed_allreduce_buckets)")},
           "runs": runs}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return out


def load_scaling_recording() -> dict[str, Any]:
    """The shipped :data:`SCALING_RECORDING` (see :func:`record_scaling` for its fields)."""
    import importlib.resources
    import json

    return json.loads((importlib.resources.files("perflab") / "recordings" / SCALING_RECORDING
                       ).read_text())
