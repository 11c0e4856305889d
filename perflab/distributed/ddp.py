"""DDP pieces the per-rank worker uses: wrap, communication hooks, buckets, explicit allreduce.

* :func:`wrap_ddp`: ``DistributedDataParallel`` with ``config``'s ``bucket_cap_mb`` and
  ``gradient_as_bucket_view``, plus the communication hook ``config.comm_hook`` (torch's
  own ``ddp_comm_hooks``) or the simulated link (:func:`perflab.distributed.link_hook.register_link_hook`).
* :func:`ddp_buckets`: the buckets as DDP built them, read from DDP's own logging data
  (``DistributedDataParallel._get_ddp_logging_data()``, the record behind
  ``TORCH_DISTRIBUTED_DEBUG``): after the first iterations DDP rebuilds its buckets in
  the order gradients became ready; before that, its initial (reverse-parameter) buckets.
* :func:`allreduce_by_bucket`: the gradient allreduce done by hand, bucket by bucket in
  DDP's order; the straggler measurement times it as the wait in the collective.
"""
from __future__ import annotations

import math
import re
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from perflab.core.config import RunConfig
from perflab.distributed.link_hook import COMPRESSIONS, hook_compression, register_link_hook
from perflab.core.simulated import LinkModel, SimulatedLink
from perflab.core.timing import PerfCounterClock

__all__ = ["check_compression", "timed_allreduce_buckets", "check_ddp_config", "wrap_ddp",
           "register_comm_hook",
           "ddp_buckets", "bucket_params", "allreduce_by_bucket"]


def check_ddp_config(config: RunConfig, backend: str) -> None:
    """Reject data-parallel settings this worker cannot run, before any rank starts.

    Raises:
        ValueError: a straggler run combined with ``link`` or ``comm_hook='powersgd'``
            (the straggler measurement allreduces gradients by hand, with a plain or a
            cast allreduce only); ``delay_frac`` with fewer than 2 warm-up steps to measure the
            step on; a comm hook the backend cannot run (checked: gloo runs fp16, bf16
            and PowerSGD allreduces on CPU in torch 2.x, NCCL all of them).
    """
    s = config.straggler
    if s is not None and config.link is not None:
        raise ValueError("straggler= with link= is not supported: the straggler "
                         "measurement times a plain allreduce; set link=None")
    if s is not None and config.comm_hook == "powersgd":
        raise ValueError("straggler= with comm_hook='powersgd' is not supported; use "
                         "comm_hook 'none', 'fp16' or 'bf16'")
    if s is not None and s.delay_frac is not None and config.warmup_steps < 2:
        raise ValueError("Straggler(delay_frac=...) is a fraction of the median warm-up "
                         "step, so it needs warmup_steps >= 2; set warmup_steps or use "
                         "delay_s")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")


def wrap_ddp(model: torch.nn.Module, config: RunConfig, device: torch.device
             ) -> tuple[DistributedDataParallel, Any]:
    """``DistributedDataParallel(model)`` with ``config``'s buckets and hook.

    DDP broadcasts rank 0's parameters and buffers at construction, so every rank
    starts from the same model whatever its seed.

    Returns:
        (ddp_model, link_state): ``link_state`` is the
        :class:`perflab.distributed.link_hook.LinkHookState` when ``config.link`` is set, else None.
    """
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view)
    return ddp, register_comm_hook(ddp, config.comm_hook, config.link)


def register_comm_hook(ddp: DistributedDataParallel, comm_hook: str,
                       link: SimulatedLink | None) -> Any:
    """Register the DDP communication hook for ``comm_hook`` / ``link``: the one place
    perflab registers one (PyTorch docs, "DDP Communication Hooks").

    * ``link`` set: :func:`perflab.distributed.link_hook.register_link_hook` (the real allreduce, its
      completion delayed as the simulated link would; fp16/bf16 compression inside it);
    * else ``"fp16"`` / ``"bf16"``: torch's ``fp16_compress_hook`` / ``bf16_compress_hook``;
    * ``"powersgd"``: torch's ``powerSGD_hook`` (rank 1, 2 plain warm-up allreduces);
    * ``"none"``: no hook (DDP's own allreduce).

    Returns:
        The :class:`perflab.distributed.link_hook.LinkHookState` when ``link`` is set, else None.

    Raises:
        ValueError: an unknown ``comm_hook``.
    """
    if comm_hook not in ("none", "fp16", "bf16", "powersgd"):
        raise ValueError(f"comm_hook must be 'none', 'fp16', 'bf16' or 'powersgd', "
                         f"got {comm_hook!r}")
    link_state = None
    if link is not None:
        compression = hook_compression(comm_hook)
        link_state = register_link_hook(ddp, link, compression=compression)
    elif comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif comm_hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        # rank 1 approximation after 2 plain warm-up allreduces (the paper's defaults
        # are rank 1-4; Vogels et al. 2019, "PowerSGD", section 5)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return link_state


def _ints(text: Any) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", str(text))]


def ddp_buckets(ddp: DistributedDataParallel) -> list[dict[str, int]]:
    """DDP's gradient buckets, in the order DDP allreduces them.

    Returns:
        ``[{"index": i, "nbytes": bytes, "num_params": parameter tensors}, ...]``;
        ``nbytes`` is the fp32 gradient size (before any compression).
    """
    data = ddp._get_ddp_logging_data()
    if data.get("has_rebuilt_buckets") and "rebuilt_bucket_sizes" in data:
        sizes = _ints(data["rebuilt_bucket_sizes"])
        groups = str(data.get("rebuilt_per_bucket_param_indices", "")).split(",")
        counts = [len(_ints(g)) for g in groups]
    else:
        sizes, counts = _ints(data["bucket_sizes"]), []
    if len(counts) != len(sizes):
        counts = [-1] * len(sizes)  # -1: DDP did not report the per-bucket parameters
    return [{"index": i, "nbytes": n, "num_params": c}
            for i, (n, c) in enumerate(zip(sizes, counts))]


def bucket_params(ddp: DistributedDataParallel) -> list[list[torch.nn.Parameter]]:
    """Parameters of each bucket (DDP's rebuilt order), or one bucket of all of them."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    data = ddp._get_ddp_logging_data()
    if not data.get("has_rebuilt_buckets"):
        return [params[::-1]]
    groups = str(data.get("rebuilt_per_bucket_param_indices", "")).split(",")
    return [[params[i] for i in _ints(g)] for g in groups if _ints(g)]


def allreduce_by_bucket(buckets: list[list[torch.nn.Parameter]], *,
                        compression: str = "none") -> None:
    """Average ``.grad`` over ranks, one allreduce per bucket, in order (as DDP does).

    Each bucket's gradients are flattened into one buffer, (cast to fp16/bf16 when
    ``compression`` says so, as torch's ``fp16_compress_hook`` does), divided by the
    world size, allreduced and copied back. Blocks until every bucket is done: the time
    spent here is the rank's wait for the slowest rank plus the transfer.
    """
    ws = dist.get_world_size()
    dtype = COMPRESSIONS[compression]
    works = []
    for params in buckets:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            continue
        flat = torch._utils._flatten_dense_tensors(grads)  # (sum numel,) fp32
        send = flat if dtype is None else flat.to(dtype)
        send.div_(ws)
        works.append((dist.all_reduce(send, async_op=True), send, grads))
    for work, send, grads in works:
        work.wait()
        for g, v in zip(grads, torch._utils._unflatten_dense_tensors(send, grads)):
            g.copy_(v)


def check_compression(compression: str) -> None:
    """Raise ValueError unless ``compression`` is a key of :data:`perflab.distributed.link_hook.COMPRESSIONS`."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {tuple(COMPRESSIONS)}, "
                         f"got {compression!r}")


def _message(nbytes: int, compression: str) -> torch.Tensor:
    """A flat tensor standing for ``nbytes`` of fp32 gradients, cast as the hook would."""
    dtype = COMPRESSIONS[compression] or torch.float32
    return torch.ones(max(1, math.ceil(nbytes / 4)), dtype=dtype)


def timed_allreduce_buckets(bucket_nbytes: Sequence[int], *, link: SimulatedLink | None = None,
                            compression: str = "none", group=None) -> float:
    """Seconds to allreduce one step's gradient buckets, in order, with nothing else running.

    Call on every rank of an initialised process group. After a barrier, every bucket is
    allreduced asynchronously in order (as DDP issues them once all are ready) and waited
    for; with ``link`` each bucket is also booked on a :class:`~perflab.core.simulated.LinkModel`
    (all handed to the link at the start, so they queue: ``sum(2(p-1) alpha + 2(p-1)/p n_i /
    beta)``, a ring allreduce each) and the call returns no earlier than the last modelled
    completion (sleeping, not spinning).

    Args:
        bucket_nbytes: fp32 gradient bytes of each bucket (DDP's bucket sizes), each >= 1.
        link: the simulated link, or None for the real backend alone.
        compression: "none", "fp16" or "bf16": messages are cast first (half the bytes).
        group: process group (None = WORLD).

    Returns:
        Seconds (float) from the barrier to this rank's last completion.

    Raises:
        ValueError: empty or non-positive sizes, unknown compression, a link that is not
            a SimulatedLink, or torch.distributed not initialised.
    """
    sizes = list(bucket_nbytes)
    if not sizes or any(not isinstance(n, (int, np.integer)) or n < 1 for n in sizes):
        raise ValueError(f"bucket_nbytes must be a non-empty list of ints >= 1 (bytes per "
                         f"bucket), got {bucket_nbytes!r}")
    check_compression(compression)
    if link is not None and not isinstance(link, SimulatedLink):
        raise ValueError(f"link must be None or a SimulatedLink, got {link!r}")
    if not dist.is_initialized():
        raise ValueError("torch.distributed is not initialised; run this on every rank "
                         "(e.g. through perflab.distributed.launch_fn)")
    tensors = [_message(n, compression) for n in sizes]
    clock = PerfCounterClock()
    model = (LinkModel(link, world_size=dist.get_world_size(group), clock=clock)
             if link is not None else None)
    dist.barrier(group)
    t0 = clock.now()
    works, last_done = [], t0
    for t in tensors:
        if model is not None:
            _, last_done = model.schedule(t.numel() * t.element_size())
        works.append(dist.all_reduce(t, group=group, async_op=True))
    for w in works:
        w.wait()
    wait_s = last_done - clock.now()
    if wait_s > 0:
        time.sleep(wait_s)
    return clock.now() - t0
