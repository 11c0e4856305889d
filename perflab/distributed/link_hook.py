"""The DDP communication hook that puts a SIMULATED link under the allreduce.

The link and its alpha-beta timing model are specs in :mod:`perflab.core.simulated`
(:class:`~perflab.core.simulated.SimulatedLink`, :class:`~perflab.core.simulated.LinkModel`);
this hook delays each bucket's completion by the time such a link would take, so on a
2-core CPU (where gloo's loopback allreduce shares the cores with compute) the overlap of
communication with computation can be seen. Every table and plot names it as "simulated
link: alpha=..., beta=...".
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from perflab.core.dtypes import LOW_PRECISION_DTYPES
from perflab.core.simulated import BucketRecord, LinkModel, SimulatedLink

__all__ = ["LinkHookState", "COMPRESSIONS", "hook_compression", "link_hook",
           "register_link_hook"]


# -- the DDP communication hook ---------------------------------------------------------
#: Compression of a bucket before the allreduce, as in torch's default_hooks.
COMPRESSIONS = {"none": None, **LOW_PRECISION_DTYPES}


def hook_compression(comm_hook: str) -> str:
    """The :data:`COMPRESSIONS` key a ``RunConfig.comm_hook`` casts buckets with: "fp16"
    or "bf16" for those hooks, "none" for every other hook (allreduce, powersgd, ...)."""
    return comm_hook if comm_hook in LOW_PRECISION_DTYPES else "none"


class LinkHookState:
    """State of :func:`link_hook`: the link model, the process group and this step's records.

    Attributes:
        model: the :class:`LinkModel` (its clock is ``perflab.core.timing.PerfCounterClock``).
        compression: "none", "fp16" or "bf16".
        process_group: the group to allreduce over (None = WORLD).
        records: one :class:`BucketRecord` per bucket the hook saw since :meth:`reset`.
    """

    def __init__(self, model: LinkModel, *, compression: str = "none",
                 process_group: Any = None):
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {tuple(COMPRESSIONS)}, "
                             f"got {compression!r}")
        self.model, self.compression, self.process_group = model, compression, process_group
        self.records: list[BucketRecord] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Call at the start of each step: clears ``records`` and the link's queue."""
        with self._lock:
            self.records = []
            self.model.reset()

    def _book(self, index: int, nbytes: int) -> BucketRecord:
        with self._lock:
            start, done = self.model.schedule(nbytes)
            rec = BucketRecord(index=index, nbytes=nbytes, start_s=start, done_s=done)
            self.records.append(rec)
            return rec


def link_hook(state, bucket):  # no annotations: DDP checks them, and ours are strings
    """DDP communication hook: the REAL allreduce, completed no earlier than the link would.

    ``(state: LinkHookState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]``.

    Like ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks`` (``allreduce_hook``
    or ``fp16_compress_hook``/``bf16_compress_hook``): divide by the world size, (cast),
    allreduce asynchronously, (copy back into the fp32 bucket). The bucket is booked on
    the shared link when the hook is called; the returned future completes at the later
    of the real allreduce's end and the modelled ``done_s``, set by a ``threading.Timer``
    (sleeping, so no CPU is burned while the "wire" is busy).

    Returns:
        A ``torch.futures.Future`` holding the averaged bucket buffer (its dtype/shape).
    """
    import torch.distributed as dist

    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()  # (numel,) flat fp32 gradients of this bucket
    dtype = COMPRESSIONS[state.compression]
    send = buffer.div_(group.size()) if dtype is None else buffer.to(dtype).div_(group.size())
    rec = state._book(bucket.index(), send.numel() * send.element_size())
    real = dist.all_reduce(send, group=group, async_op=True).get_future()
    out: torch.futures.Future = torch.futures.Future()
    clock = state.model.clock

    def finish(fut: torch.futures.Future) -> None:
        try:
            fut.value()
            if dtype is not None:
                buffer.copy_(send)  # decompress in place, as default_hooks does
        except Exception as exc:  # the real allreduce failed: pass the error to DDP
            out.set_exception(exc)
            return
        wait_s = rec.done_s - clock.now()
        if wait_s > 0:
            timer = threading.Timer(wait_s, out.set_result, args=(buffer,))
            timer.daemon = True
            timer.start()
        else:
            out.set_result(buffer)

    real.add_done_callback(finish)
    return out


def register_link_hook(ddp_model: Any, link: SimulatedLink, *, compression: str = "none",
                       process_group: Any = None) -> LinkHookState:
    """Put the simulated link under a DDP model's gradient allreduce.

    ``ddp_model.register_comm_hook(state, link_hook)`` (PyTorch docs, "DDP Communication
    Hooks"). Call ``state.reset()`` at the start of every step; after the step
    ``state.records`` lists each bucket's (index, nbytes, start_s, done_s).

    Args:
        ddp_model: a ``torch.nn.parallel.DistributedDataParallel`` (before its first step).
        link: the modelled link.
        compression: "none", "fp16" or "bf16" (halves the bytes sent).
        process_group: None = the default (WORLD) group.

    Returns:
        The :class:`LinkHookState`.

    Raises:
        ValueError: unknown compression, not a SimulatedLink, or not a DDP model.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {tuple(COMPRESSIONS)}, "
                         f"got {compression!r}")
    if not isinstance(link, SimulatedLink):
        raise ValueError(f"link must be a SimulatedLink (e.g. SimulatedLink.preset('1gbe'))"
                         f", got {link!r}")
    if not isinstance(ddp_model, DistributedDataParallel):
        raise ValueError("register_link_hook needs a DistributedDataParallel model, got "
                         f"{type(ddp_model).__name__}; wrap it with DDP first")
    world_size = dist.get_world_size(process_group)
    state = LinkHookState(LinkModel(link, world_size=world_size), compression=compression,
                          process_group=process_group)
    ddp_model.register_comm_hook(state, link_hook)
    return state
