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

from dataclasses import dataclass

__all__ = ["SimulatedLink", "LINK_PRESETS"]


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
