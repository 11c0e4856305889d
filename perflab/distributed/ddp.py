"""DDP pieces the per-rank worker uses: wrap, communication hooks, buckets, explicit allreduce.

* :func:`wrap_ddp`: ``DistributedDataParallel`` with ``config``'s ``bucket_cap_mb`` and
  ``gradient_as_bucket_view``, plus the communication hook ``config.comm_hook`` (torch's
  own ``ddp_comm_hooks``) or the simulated link (:func:`perflab.link.register_link_hook`).
* :func:`ddp_buckets`: the buckets as DDP built them, read from DDP's own logging data
  (``DistributedDataParallel._get_ddp_logging_data()``, the record behind
  ``TORCH_DISTRIBUTED_DEBUG``): after the first iterations DDP rebuilds its buckets in
  the order gradients became ready; before that, its initial (reverse-parameter) buckets.
* :func:`allreduce_by_bucket`: the gradient allreduce done by hand, bucket by bucket in
  DDP's order; the straggler measurement times it as the wait in the collective.
"""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from perflab.config import RunConfig

__all__ = ["check_ddp_config", "wrap_ddp", "ddp_buckets", "bucket_params", "allreduce_by_bucket",
           "COMPRESSION_DTYPES"]

#: comm_hook -> dtype the gradients are cast to before the allreduce (None = fp32).
COMPRESSION_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


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
        :class:`perflab.link.LinkHookState` when ``config.link`` is set, else None.
    """
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view)
    link_state = None
    if config.link is not None:
        from perflab.link import register_link_hook

        compression = config.comm_hook if config.comm_hook in ("fp16", "bf16") else "none"
        link_state = register_link_hook(ddp, config.link, compression=compression)
    elif config.comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif config.comm_hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif config.comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        # rank 1 approximation after 2 plain warm-up allreduces (the paper's defaults
        # are rank 1-4; Vogels et al. 2019, "PowerSGD", section 5)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, link_state


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
    dtype = COMPRESSION_DTYPES[compression]
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
