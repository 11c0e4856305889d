"""What a :class:`~perflab.core.config.RunConfig` can simulate: a network link and a straggler.

Specs and pure models only (core layer, no torch.distributed):

* :class:`SimulatedLink`: a modelled network link. On a 2-core CPU, gloo's loopback
  allreduce shares the cores with compute, so no overlap of communication with
  computation can be seen; a SimulatedLink models a link with the alpha-beta
  (latency-bandwidth) model of a message's time, ``T(n) = alpha + n / beta`` (Hockney
  1994, "The communication challenge for MPP"), and :class:`LinkModel` schedules DDP's
  buckets on it as ring allreduces: ``2(p-1)`` latency hops and ``2(p-1)/p * n`` bytes per
  rank (Patarasuk & Yuan 2009), the one latency convention of Labs 06, 09 and 10. The
  DDP communication hook that applies it is :mod:`perflab.distributed.link_hook`. Every table and plot names it as "simulated link:
  alpha=..., beta=...".
* :class:`Straggler`: a delay injected on one rank: which rank, how much, where. The
  training step sleeps it (:func:`perflab.train.step.train_step`);
  :mod:`perflab.analysis.stragglers` predicts and measures its cost and detects it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from perflab.core.timing import Clock, PerfCounterClock

__all__ = ["Straggler", "STRAGGLER_WHERE", "SimulatedLink", "LINK_PRESETS", "LinkModel",
           "BucketRecord", "ring_allreduce_wire_bytes"]

#: Where in the step the delay is slept: before the forward pass, between forward and
#: backward, or while loading the batch (inside the data phase).
STRAGGLER_WHERE = ("before_forward", "before_backward", "data")


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """A delay injected on one rank, every step (sleeping, so no CPU is burned).

    Attributes:
        rank: the slow rank (0 <= rank < world_size).
        delay_s: seconds added per step; or
        delay_frac: a fraction of the rank's own compute step (forward + backward +
            optimizer, median of the warm-up steps), e.g. 0.2 = 20 % slower.
            Exactly one of ``delay_s`` / ``delay_frac`` is set.
        where: "before_forward", "before_backward" or "data".

    Raises:
        ValueError: a negative rank or delay, both or neither delay given, an unknown
            ``where``.
    """

    rank: int
    delay_s: float | None = None
    delay_frac: float | None = None
    where: Literal["before_forward", "before_backward", "data"] = "before_forward"

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise ValueError(f"Straggler.rank must be an int >= 0, got {self.rank!r}")
        if (self.delay_s is None) == (self.delay_frac is None):
            raise ValueError("Straggler needs exactly one of delay_s (seconds) or delay_frac "
                             f"(fraction of the step); got delay_s={self.delay_s!r}, "
                             f"delay_frac={self.delay_frac!r}")
        for name in ("delay_s", "delay_frac"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or v < 0):
                raise ValueError(f"Straggler.{name} must be a number >= 0, got {v!r}")
        if self.where not in STRAGGLER_WHERE:
            raise ValueError(f"Straggler.where must be one of {STRAGGLER_WHERE}, "
                             f"got {self.where!r}")

    def describe(self) -> str:
        """``"straggler rank 1 +50 ms before_forward"`` or ``"... +20 % of step ..."``."""
        amount = (f"+{self.delay_s * 1e3:g} ms" if self.delay_s is not None
                  else f"+{self.delay_frac * 100:g} % of step")
        return f"straggler rank {self.rank} {amount} {self.where}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True, kw_only=True)
class SimulatedLink:
    """A modelled point-to-point link: latency ``alpha_s`` and bandwidth ``beta``.

    Attributes:
        name: short name shown in labels ("1gbe", "custom", ...).
        alpha_s: per-message (per-hop) latency, seconds (>= 0); a ring allreduce on p
            ranks pays it 2(p-1) times (:class:`LinkModel`).
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


#: Link classes a course meets. The three cluster links are derived from the nccl-tests
#: tables shipped in ``perflab/recordings/nccl/`` (sources, hardware and licenses in its
#: ``SOURCES.md``), with one convention: the link model is a flat ring, so its per-hop
#: alpha is the table's 8-byte all-reduce time (out-of-place) divided by the ring's
#: 2(n-1) hops at the table's n ranks, which makes :class:`LinkModel` charge exactly that
#: 8-byte time at that n (``tests/core/test_link_presets.py`` recomputes each from its
#: table):
#:
#: * ``nvlink``: one node of 8 H100 on NVSwitch (``aws-p5-1node-8gpu``): alpha = 12.90 us
#:   / 14 hops; beta = the table's largest busbw, 483.05 GB/s at 16 GiB (busbw is what a
#:   ring's link must carry, and inside one node every hop is NVLink).
#: * ``efa400``: the network between H100 nodes, 400 Gb/s per GPU (an AWS p5.48xlarge has
#:   3,200 Gbps of EFA for 8 GPUs, AWS's p5 page); alpha = the two-node p5 table's 8-byte
#:   time (``aws-p5-2node-16gpu-efa``, 69.12 us) / 30 hops. A ring in which every hop
#:   crosses this network (one GPU per node) would see this beta as its busbw; a two-node
#:   table's busbw is several times larger, because NCCL keeps most hops inside the nodes
#:   and spreads what crosses over all of a node's network interfaces (Lab 06, section 8).
#: * ``ib100``: a 100 Gb/s network link per GPU (the line rate of InfiniBand EDR or
#:   HDR100, and of each of an AWS p4d's four EFA interfaces, which serve its 8 A100);
#:   alpha = the two-node p4d table's 8-byte time (``aws-p4d-2node-16gpu-efa``,
#:   179.1 us) / 30 hops. Not an H100 cluster's network: that is ``efa400``.
#:
#: ``10gbe`` and ``1gbe`` are Ethernet's nominal line rates, 10 and 1 Gb/s, with typical
#: small-message latencies (order of magnitude), not measurements of any machine; the
#: CPU labs simulate them because this machine's cores cannot hide faster links.
LINK_PRESETS: dict[str, SimulatedLink] = {
    "nvlink": SimulatedLink(name="nvlink", alpha_s=12.90e-6 / (2 * (8 - 1)),
                            beta_bytes_per_s=483.05e9),
    "efa400": SimulatedLink(name="efa400", alpha_s=69.12e-6 / (2 * (16 - 1)),
                            beta_bytes_per_s=400e9 / 8),
    "ib100": SimulatedLink(name="ib100", alpha_s=179.1e-6 / (2 * (16 - 1)),
                           beta_bytes_per_s=100e9 / 8),
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
    the link at time ``now``, a ring allreduce on ``p`` ranks::

        duration = 2(p-1) * alpha + wire_bytes(n) / beta,  wire_bytes(n) = 2(p-1)/p * n
        done     = max(now, link_free) + duration;  link_free = done

    A ring allreduce is a reduce-scatter then an all-gather, 2(p-1) steps one after the
    other, each a message of n/p bytes paying the link's latency ``alpha`` (Patarasuk &
    Yuan 2009; Thakur, Rabenseifner & Gropp 2005); ``beta`` is the link's bandwidth.
    So a fit of ``T = alpha_fit + n / beta_alg`` over message sizes at one ``p``
    recovers ``alpha_fit = 2(p-1) * alpha`` (the latency of one whole allreduce at that
    p: 2 alpha at p = 2) and ``beta_alg = beta * p / (2(p-1))`` (= beta for p = 2);
    nccl-tests' bus bandwidth ``busbw = algbw * 2(p-1)/p`` undoes the factor
    (:func:`perflab.analysis.collectives.busbw_bytes_per_s`) and
    :attr:`perflab.analysis.collectives.AlphaBetaFit.alpha_hop_s` the 2(p-1). At p = 1
    nothing is sent and the duration is 0. Hockney (1994) for alpha-beta.

    Args:
        link: the :class:`SimulatedLink` (alpha_s, beta_bytes_per_s).
        world_size: ranks in the allreduce (>= 1); sets the ring factor.
        clock: an object with ``now() -> seconds`` (``perflab.core.timing.PerfCounterClock``
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
        """Seconds the link is busy with one ring allreduce of ``nbytes`` (no queueing):
        ``2(p-1) * alpha + 2(p-1)/p * nbytes / beta``."""
        hops = 2 * (self.world_size - 1)
        return (hops * self.link.alpha_s
                + ring_allreduce_wire_bytes(nbytes, self.world_size) / self.link.beta_bytes_per_s)

    def schedule(self, nbytes: float) -> tuple[float, float]:
        """Hand a message to the link now; returns ``(now_s, done_s)`` and books the link."""
        now = self.clock.now()
        done = max(now, self.link_free_s) + self.duration_s(nbytes)
        self.link_free_s = done
        return now, done

    def reset(self) -> None:
        """Forget the link's queue (start of a step)."""
        self.link_free_s = -math.inf
