"""The data-parallel part of :class:`perflab.core.config.RunConfig`'s validation (kept
apart so that config.py stays readable): world_size, the DDP knobs, the simulated link
and straggler."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from perflab.core.simulated import SimulatedLink, Straggler

if TYPE_CHECKING:
    from perflab.core.config import RunConfig

__all__ = ["check_distributed", "MAX_WORLD_SIZE"]  # COMM_HOOKS: public in perflab.core.config

#: DDP communication hooks a config may name (see perflab.distributed.ddp).
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
#: The most local ranks a config may ask for.
MAX_WORLD_SIZE = 64


def _real(v: Any) -> bool:
    """A finite int or float, not a bool (``True`` is an int in Python)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_distributed(self: "RunConfig", need: Callable[[bool, str], None]) -> None:
    """World size, DDP knobs, simulated link and straggler of ``self`` (a RunConfig), each
    error naming the fix (through ``need(condition, message)``)."""
    ws = self.world_size
    need(isinstance(ws, int) and not isinstance(ws, bool) and 1 <= ws <= MAX_WORLD_SIZE,
         f"world_size must be an int in 1..{MAX_WORLD_SIZE} (ranks on this machine), "
         f"got {ws!r}")
    need(_real(self.bucket_cap_mb) and 0 < self.bucket_cap_mb <= 4096,
         f"bucket_cap_mb must be a number of MiB in (0, 4096], got {self.bucket_cap_mb!r}")
    need(isinstance(self.gradient_as_bucket_view, bool),
         f"gradient_as_bucket_view must be True or False, got "
         f"{self.gradient_as_bucket_view!r}")
    need(isinstance(self.comm_hook, str) and self.comm_hook in COMM_HOOKS,
         f"comm_hook must be one of {COMM_HOOKS}, got {self.comm_hook!r}")
    acc = self.accumulation_steps
    need(isinstance(acc, int) and not isinstance(acc, bool) and 1 <= acc <= 1024,
         f"accumulation_steps must be an int in 1..1024, got {acc!r}")
    need(self.link is None or isinstance(self.link, SimulatedLink),
         f"link must be None or a SimulatedLink (e.g. SimulatedLink.preset('1gbe')), "
         f"got {self.link!r}")
    need(self.straggler is None or isinstance(self.straggler, Straggler),
         f"straggler must be None or a Straggler(rank=..., delay_s=...), "
         f"got {self.straggler!r}")
    if ws == 1:
        used = [name for name, on in (
            ("bucket_cap_mb", self.bucket_cap_mb != 25.0),
            ("gradient_as_bucket_view", self.gradient_as_bucket_view),
            ("comm_hook", self.comm_hook != "none"),
            ("link", self.link is not None),
            ("straggler", self.straggler is not None)) if on]
        need(not used, f"{', '.join(used)} only apply to data-parallel runs; set "
             "world_size >= 2 (perflab.run launches the ranks)")
    if self.straggler is not None and isinstance(ws, int):
        need(self.straggler.rank < ws,
             f"straggler.rank={self.straggler.rank} but world_size={ws}; use a rank "
             f"in 0..{ws - 1}")
    need(not (self.link is not None and self.comm_hook == "powersgd"),
         "link= (simulated interconnect) cannot be combined with comm_hook='powersgd'"
         " (its messages are not one allreduce per bucket); use comm_hook 'none', "
         "'fp16' or 'bf16'")
