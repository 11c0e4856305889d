"""A SIMULATED interconnect for DDP on one machine: the link model and its presets.

On a 2-core CPU, gloo's loopback allreduce shares the cores with compute, so no overlap
of communication with computation can be seen. :class:`SimulatedLink` models a network
link with the alpha-beta (latency-bandwidth) model of a message's time,
``T(n) = alpha + n / beta`` (Hockney 1994, "The communication challenge for MPP"), and
the DDP communication hook in this module delays each bucket's completion by the time
such a link would take. Every table and plot names it as "simulated link: alpha=...,
beta=...".
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import torch

from perflab.dtypes import LOW_PRECISION_DTYPES
from perflab.timing import Clock, PerfCounterClock

__all__ = ["SimulatedLink", "LINK_PRESETS", "LinkModel", "BucketRecord", "LinkHookState",
           "COMPRESSIONS", "link_hook", "register_link_hook", "ring_allreduce_wire_bytes"]


@dataclass(frozen=True, kw_only=True)
class SimulatedLink:
    """A modelled point-to-point link: latency ``alpha_s`` and bandwidth ``beta``.

    Attributes:
        name: short name shown in labels ("1gbe", "custom", ...).
        alpha_s: per-message latency, seconds (>= 0).
        beta_bytes_per_s: bandwidth, bytes per second (> 0).

    Raises:
        ValueError: a negative alpha, a non-positive beta or an empty name.
    """

    name: str = "custom"
    alpha_s: float
    beta_bytes_per_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"SimulatedLink.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.alpha_s, (int, float)) or self.alpha_s < 0:
            raise ValueError(f"SimulatedLink.alpha_s must be >= 0 seconds, got {self.alpha_s!r}")
        if not isinstance(self.beta_bytes_per_s, (int, float)) or self.beta_bytes_per_s <= 0:
            raise ValueError("SimulatedLink.beta_bytes_per_s must be > 0 bytes/s, got "
                             f"{self.beta_bytes_per_s!r}")

    @classmethod
    def preset(cls, name: str) -> "SimulatedLink":
        """One of :data:`LINK_PRESETS` by name.

        Raises:
            ValueError: unknown name (the message lists the presets).
        """
        if name not in LINK_PRESETS:
            raise ValueError(f"unknown link preset {name!r}; choose one of "
                             f"{sorted(LINK_PRESETS)} or build SimulatedLink(alpha_s=..., "
                             "beta_bytes_per_s=...)")
        return LINK_PRESETS[name]

    def message_time_s(self, nbytes: int) -> float:
        """Modelled time of one message of ``nbytes`` bytes: alpha + n / beta (seconds)."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    def describe(self) -> str:
        """``"simulated link 1gbe: alpha=50 us, beta=0.125 GB/s"``."""
        return (f"simulated link {self.name}: alpha={self.alpha_s * 1e6:g} us, "
                f"beta={self.beta_bytes_per_s / 1e9:g} GB/s")

    def __str__(self) -> str:
        return self.describe()


#: Link classes a course meets. Bandwidths are the nominal line rates per direction
#: (NVLink 4: 450 GB/s per direction per GPU, NVIDIA H100 datasheet; InfiniBand NDR/HDR
#: 100 Gb/s; Ethernet 10 and 1 Gb/s). The latencies are typical small-message
#: figures (order of magnitude), not measurements of any particular machine.
LINK_PRESETS: dict[str, SimulatedLink] = {
    "nvlink": SimulatedLink(name="nvlink", alpha_s=3e-6, beta_bytes_per_s=450e9),
    "ib100": SimulatedLink(name="ib100", alpha_s=5e-6, beta_bytes_per_s=100e9 / 8),
    "10gbe": SimulatedLink(name="10gbe", alpha_s=20e-6, beta_bytes_per_s=10e9 / 8),
    "1gbe": SimulatedLink(name="1gbe", alpha_s=50e-6, beta_bytes_per_s=1e9 / 8),
}


# -- the timing model (pure; no clock of its own, no torch.distributed) ---------------
def ring_allreduce_wire_bytes(nbytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring allreduce of an ``nbytes`` message: 2(p-1)/p * n.

    A ring allreduce is a reduce-scatter then an all-gather, each p-1 steps of n/p bytes
    (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations"; nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"). For p = 2 the factor
    is exactly 1, so on this course's 2-rank runs wire bytes = message bytes.

    Raises:
        ValueError: ``nbytes < 0`` or ``world_size < 1``.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (ranks), got {world_size!r}")
    if not isinstance(nbytes, (int, float)) or nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 bytes, got {nbytes!r}")
    return nbytes * 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class BucketRecord:
    """One bucket on the simulated link during the current step.

    Attributes:
        index: DDP's bucket index (``GradBucket.index()``; 0 is the LAST layers' bucket,
            the first one ready in backward).
        nbytes: bytes of the message actually allreduced (after compression).
        start_s: clock time the bucket reached the link (seconds, the model's clock).
        done_s: modelled completion time: ``max(start_s, link_free) + duration``.
    """

    index: int
    nbytes: int
    start_s: float
    done_s: float


class LinkModel:
    """The alpha-beta model of a link SHARED by DDP's buckets, which use it in order.

    For a message of ``n`` bytes (the allreduced tensor's size on each rank) handed to
    the link at time ``now``::

        duration = alpha + wire_bytes(n) / beta,  wire_bytes(n) = 2(p-1)/p * n
        done     = max(now, link_free) + duration;  link_free = done

    ``alpha`` is charged once per allreduce (a per-collective latency; a ring really
    pays 2(p-1) hops of latency, folded into alpha here) and ``beta`` is the link's
    bandwidth, so a fit of ``T = alpha + n / beta_alg`` over message sizes recovers
    ``alpha`` and ``beta_alg = beta * p / (2(p-1))`` (= beta for p = 2); nccl-tests'
    bus bandwidth ``busbw = algbw * 2(p-1)/p`` undoes the factor
    (:func:`perflab.collectives.bus_bandwidth`). Hockney (1994) for alpha-beta.

    Args:
        link: the :class:`SimulatedLink` (alpha_s, beta_bytes_per_s).
        world_size: ranks in the allreduce (>= 1); sets the ring factor.
        clock: an object with ``now() -> seconds`` (``perflab.timing.PerfCounterClock``
            by default, ``FakeClock`` in tests).

    Raises:
        ValueError: ``link`` is not a SimulatedLink, or a bad ``world_size``.
    """

    def __init__(self, link: SimulatedLink, *, world_size: int = 2,
                 clock: Clock | None = None):
        if not isinstance(link, SimulatedLink):
            raise ValueError(f"link must be a SimulatedLink (e.g. SimulatedLink.preset("
                             f"'1gbe')), got {link!r}")
        ring_allreduce_wire_bytes(0, world_size)  # validates world_size
        self.link, self.world_size = link, world_size
        self.clock: Clock = clock if clock is not None else PerfCounterClock()
        self.link_free_s = -math.inf

    def duration_s(self, nbytes: float) -> float:
        """Seconds the link is busy with one allreduce of ``nbytes`` (no queueing)."""
        return self.link.message_time_s(ring_allreduce_wire_bytes(nbytes, self.world_size))

    def schedule(self, nbytes: float) -> tuple[float, float]:
        """Hand a message to the link now; returns ``(now_s, done_s)`` and books the link."""
        now = self.clock.now()
        done = max(now, self.link_free_s) + self.duration_s(nbytes)
        self.link_free_s = done
        return now, done

    def reset(self) -> None:
        """Forget the link's queue (start of a step)."""
        self.link_free_s = -math.inf


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
        model: the :class:`LinkModel` (its clock is ``perflab.timing.PerfCounterClock``).
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
