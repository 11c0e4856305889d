"""``diagnose(result)``: the dominant phase, the bottleneck, and the lab that fixes it;
``count_host_syncs()``: the host-device synchronisations a piece of code makes.

The rules and their thresholds are module constants, printed with every diagnosis, so
a student can see why a run was called input-bound or compute-bound.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perflab.core.result import PHASES, RunResult

if TYPE_CHECKING:
    from perflab.analysis.roofline import Roofline

__all__ = ["diagnose", "Diagnosis", "DATA_WAIT_SHARE", "MEMORY_FRACTION", "COMM_SHARE",
           "OPTIMIZER_SHARE", "HostSyncs", "count_host_syncs", "SYNC_OPS"]

#: Data-wait share of the mean step at or above which the input pipeline is the bottleneck.
DATA_WAIT_SHARE = 0.20
#: Peak CUDA memory / device total at or above which memory is the bottleneck.
MEMORY_FRACTION = 0.90
#: Share of a "comm" phase at or above which communication is the bottleneck.
COMM_SHARE = 0.20
#: Optimizer share at or above which a note suggests foreach / fused optimizers.
OPTIMIZER_SHARE = 0.25

_LABS = {"input pipeline": ("Lab 02: Fix data loading",),
         "memory": ("Lab 04: Activation checkpointing",),
         "communication": ("Lab 06: DDP overlap",),
         "compute": ("Lab 03: Mixed precision", "Lab 05: torch.compile")}



@dataclass(frozen=True)
class Diagnosis:
    """What limits a run and which lab fixes it (made by :func:`diagnose`).

    Attributes: ``dominant_phase`` (largest of data/forward/backward/optimizer),
    ``shares`` (fraction of the mean step per phase, ``comm`` included when present),
    ``bottleneck`` ("input pipeline", "memory", "communication" or "compute"), ``labs``,
    ``reason`` (a sentence with the measured numbers), ``thresholds`` (fractions, by
    name), ``notes`` (secondary findings).
    """

    dominant_phase: str
    shares: dict[str, float]
    bottleneck: str
    labs: tuple[str, ...]
    reason: str
    thresholds: dict[str, float]
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        shares = ", ".join(f"{p} {100 * s:.0f} %" for p, s in self.shares.items())
        dom = f"{self.dominant_phase} {100 * self.shares[self.dominant_phase]:.0f} %"
        return "\n".join([f"Diagnosis: {self.bottleneck} bound (dominant phase: {dom})",
                          f"  shares: {shares}", f"  why: {self.reason}",
                          f"  next: {'; '.join(self.labs)}",
                          *(f"  note: {n}" for n in self.notes),
                          "  thresholds: " + ", ".join(f"{k} {v:g}" for k, v
                                                       in self.thresholds.items())])


#: What helps a compute-bound step when low-precision matmuls are not faster than fp32
#: on the run's device (a CPU that emulates bf16, a GPU without tensor cores).
_COMPUTE_WITHOUT_AMP = ("torch.compile (Lab 05) fuses elementwise work; channels_last "
                        "for a CNN; torch.set_num_threads to the physical cores on a CPU; "
                        "a foreach/fused optimizer")


def diagnose(result: RunResult, *, device_total_bytes: int | None = None,
             roofline: "Roofline | None" = None) -> Diagnosis:
    """Name the dominant phase and the bottleneck of ``result``, with the lab that fixes it.

    First matching rule wins (shares are fractions of the mean step time):

    1. data-wait share >= ``DATA_WAIT_SHARE`` (0.20) -> "input pipeline", Lab 02;
    2. CUDA peak allocated memory >= ``MEMORY_FRACTION`` (0.90) of the device's total
       -> "memory", Lab 04;
    3. ``config.world_size`` > 1 and a ``comm`` phase with share >= ``COMM_SHARE`` (0.20)
       -> "communication", Lab 06;
    4. otherwise "compute" -> Lab 03 (mixed precision) and Lab 05 (torch.compile); but
       when ``roofline`` (measured on the run's device type) shows neither the bf16 nor
       the fp16 matmul faster than fp32, Lab 03 is left out, and a note says why (the
       measured rates) and names what helps there instead. A run already in bf16/fp16
       is not pointed at Lab 03 either.

    An optimizer share >= ``OPTIMIZER_SHARE`` (0.25) adds a note (foreach/fused optimizers).

    ``device_total_bytes``: the GPU's memory, bytes; None -> from ``torch.cuda`` when the
    run's GPU is in this machine (else rule 2 is skipped, with a note).
    ``roofline``: this machine's :func:`perflab.analysis.roofline.measure_roofline` (the
    matmul GFLOP/s per dtype); None: the AMP advice is not checked against hardware.

    Raises:
        ValueError: the result has none of the phases data/forward/backward/optimizer.
    """
    shares = dict(result.phase_shares())
    if "comm" in result.phases:
        shares["comm"] = result.phases["comm"].mean / result.step.mean
    main = {p: shares[p] for p in PHASES if p in shares}
    if not main:
        raise ValueError(f"result {result.label!r} has none of the phases {PHASES}")
    dominant = max(main, key=main.__getitem__)
    data, comm = shares.get("data", 0.0), shares.get("comm", 0.0)
    world = getattr(result.config, "world_size", 1) or 1
    notes: list[str] = []
    device = str(result.env.get("device", ""))
    on_cuda = device.startswith("cuda")
    if on_cuda and device_total_bytes is None and torch.cuda.is_available():
        try:  # only this machine's GPU, and only if it is the one the run used
            props = torch.cuda.get_device_properties(device)
            if props.name == result.env.get("device_name", props.name):
                device_total_bytes = props.total_memory
        except (AssertionError, RuntimeError, ValueError):
            pass
    mem_frac = (result.peak_memory.peak_bytes / device_total_bytes
                if on_cuda and device_total_bytes else None)
    if on_cuda and mem_frac is None:
        notes.append("memory not checked: the GPU's total memory is unknown here")

    if data >= DATA_WAIT_SHARE:
        bottleneck = "input pipeline"
        reason = (f"waiting for the next batch takes {data:.0%} of the mean step "
                  f"(>= {DATA_WAIT_SHARE:.0%}): the input pipeline starves the model")
    elif mem_frac is not None and mem_frac >= MEMORY_FRACTION:
        bottleneck = "memory"
        reason = (f"peak memory {result.peak_mem_gib:.2f} GiB is {mem_frac:.0%} of the "
                  f"GPU's {device_total_bytes / 2**30:.1f} GiB (>= {MEMORY_FRACTION:.0%}): "
                  "no room for a larger batch or model")
    elif world > 1 and comm >= COMM_SHARE:
        bottleneck = "communication"
        reason = (f"communication takes {comm:.0%} of the mean step with world_size="
                  f"{world} (>= {COMM_SHARE:.0%}): gradient sync is not hidden by compute")
    else:
        bottleneck = "compute"
        reason = (f"data wait is only {data:.0%} of the mean step (< {DATA_WAIT_SHARE:.0%})"
                  f" and {dominant} dominates at {main[dominant]:.0%}: compute bound")
    labs = _LABS[bottleneck]
    if bottleneck == "compute":
        amp = getattr(result.config, "amp", "off")
        if amp != "off":
            labs = ("Lab 05: torch.compile",)
            notes.append(f"the run already uses autocast ({amp}): Lab 03 has nothing more "
                         "to give it")
        elif roofline is not None and roofline.device.split(":")[0] == device.split(":")[0]:
            ratios = {d: roofline.ratio(d) for d in ("bf16", "fp16")}
            if all(r is None or r < 1 for r in ratios.values()):
                labs = ("Lab 05: torch.compile",)
                measured = "; ".join(roofline.explain(d) for d in ratios)
                notes.append(f"not Lab 03 (mixed precision): {measured}, so autocast would "
                             f"move the matmuls and convolutions to a slower path. What "
                             f"helps a compute-bound step here: {_COMPUTE_WITHOUT_AMP}")
    if shares.get("optimizer", 0.0) >= OPTIMIZER_SHARE:
        notes.append(f"the optimizer step takes {shares['optimizer']:.0%} of the mean step "
                     f"(>= {OPTIMIZER_SHARE:.0%}): try foreach=True or, on CUDA, fused=True")
    thresholds = {"data_wait_share": DATA_WAIT_SHARE, "memory_fraction": MEMORY_FRACTION,
                  "comm_share": COMM_SHARE, "optimizer_share": OPTIMIZER_SHARE}
    return Diagnosis(dominant_phase=dominant, shares=shares, bottleneck=bottleneck,
                     labs=labs, reason=reason, thresholds=thresholds,
                     notes=tuple(notes))


#: ATen ops that copy a device value to the host and so wait for the device: ``.item()``,
#: ``float(t)``, ``int(t)``, ``bool(t)`` and ``if t:`` all call ``_local_scalar_dense``.
SYNC_OPS = ("aten._local_scalar_dense",)


@dataclass
class HostSyncs:
    """What :func:`count_host_syncs` saw: ``ops`` (one ATen op name per sync, in order)."""

    ops: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Number of host-device synchronisations."""
        return len(self.ops)


class _SyncCounter(TorchDispatchMode):
    """Counts the ops that make the host wait for the device (see count_host_syncs)."""

    def __init__(self, found: HostSyncs) -> None:
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        name = name if name.startswith("aten") else f"aten.{name}"
        if name in SYNC_OPS:
            self.found.ops.append(name)
        elif name in ("aten._to_copy", "aten.copy_"):
            src = args[1] if name == "aten.copy_" else args[0]
            dst = (args[0].device if name == "aten.copy_"
                   else torch.device(kwargs.get("device") or src.device))
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst.type == "cpu":
                self.found.ops.append(f"{name} (device -> cpu)")
        return func(*args, **kwargs)


@contextmanager
def count_host_syncs() -> Iterator[HostSyncs]:
    """Count the host-device synchronisations made inside the ``with`` block.

    A ``TorchDispatchMode`` (PyTorch's "Python dispatcher" hook, torch.utils.
    _python_dispatch) sees every ATen op the block runs, on any device, and records the
    ones that copy device data to the host: ``_local_scalar_dense`` (``.item()``,
    ``float(t)``, ``int(t)``, ``bool(t)``, ``if t:``) and copies from an accelerator to
    the CPU (``.cpu()``, ``.to("cpu")``). On a GPU each of these makes the CPU wait until
    the GPU has finished all queued work, so the CPU cannot run ahead to queue the next
    kernels; on a CPU they cost little, but they are the same ops, so they can be counted
    here. Not seen on a CPU: ``.tolist()``, ``.numpy()`` and ``.cpu()`` of CPU tensors
    (no op is dispatched). On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` reports
    every synchronising call as it happens (PyTorch docs, "CUDA semantics").

    Usage::

        with count_host_syncs() as syncs:
            loss.item()
        syncs.count  # 1
    """
    found = HostSyncs()
    with _SyncCounter(found):
        yield found
