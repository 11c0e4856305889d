"""The straggler a :class:`~perflab.config.RunConfig` injects: which rank, how much, where.

A spec only (core layer): the training step sleeps it (:func:`perflab.step.train_step`),
:mod:`perflab.stragglers` predicts and measures its cost and detects it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Straggler", "STRAGGLER_WHERE"]

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
