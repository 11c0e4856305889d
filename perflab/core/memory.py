"""Memory of a training step: peaks, saved activations, model state, and a breakdown.

Peak memory of a run, from the allocator that owns it:

* CUDA: the caching allocator's peak of allocated tensor bytes
  (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``).
* CPU: the process's resident-set high-water mark (Linux ``VmHWM``), reset at the start
  of the run by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0, see
  ``man 5 proc``). Where the reset is not allowed the peak is since process start, and
  the label says so. RSS includes the Python interpreter, libraries and the loader's
  buffers, not only tensors.

What the memory is made of (Lab 04), all deterministic, on every device:

* :class:`SavedTensorsCounter` / :func:`saved_activation_bytes`: bytes of the distinct
  storages autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``);
* :func:`model_state_bytes`: parameters, gradients and optimizer state, measured;
* :func:`tensor_peak_bytes`: the peak of tensor bytes during a call (CUDA allocator, or
  torch.profiler's memory events on CPU).

The formulas they are compared with are in :mod:`perflab.analysis.memory_parts`.
"""
from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PeakMemory", "reset_peak", "read_peak", "GIB", "MIB", "SavedTensors",
           "SavedTensorsCounter", "saved_activation_bytes", "ModelState",
           "model_state_bytes", "model_state_tensors", "tensor_peak_bytes"]

GIB = 1024 ** 3
MIB = 1024 ** 2


@dataclass(frozen=True)
class PeakMemory:
    """A peak-memory reading.

    Attributes:
        peak_bytes: the peak, bytes.
        kind: what was measured, e.g. ``"CUDA allocator peak (allocated tensors)"``.
    """

    peak_bytes: int
    kind: str

    @property
    def peak_gib(self) -> float:
        """The peak in GiB (2**30 bytes)."""
        return self.peak_bytes / GIB

    def __repr__(self) -> str:
        return f"PeakMemory({self.peak_gib:.3f} GiB, {self.kind})"


def reset_peak(device: torch.device | str) -> bool:
    """Reset the peak counter of ``device``; returns False where it cannot be reset."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _vm_hwm_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB -> bytes
    except OSError:
        pass
    return None


def read_peak(device: torch.device | str, *, was_reset: bool = True) -> PeakMemory:
    """Peak memory on ``device`` since the last :func:`reset_peak`.

    Args:
        device: the run's device.
        was_reset: what :func:`reset_peak` returned (changes the CPU label).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return PeakMemory(int(torch.cuda.max_memory_allocated(dev)),
                          "CUDA allocator peak (allocated tensors)")
    if dev.type == "mps":
        return PeakMemory(int(torch.mps.driver_allocated_memory()),
                          "MPS driver allocated memory (current, not a peak)")
    hwm = _vm_hwm_bytes()
    since = "this run" if was_reset else "process start"
    if hwm is not None:
        return PeakMemory(hwm, f"process RSS high-water mark since {since} (CPU)")
    # ru_maxrss is KiB on Linux and bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024
    return PeakMemory(int(peak), "process RSS high-water mark since process start (CPU)")


# ---------------------------------------------------------------------------------------
# Saved activations, model state, and the breakdown of a training step's memory.

@dataclass(frozen=True)
class SavedTensors:
    """What autograd saved for backward during a forward pass.

    Attributes:
        nbytes: bytes of the distinct storages saved (a storage saved twice, or two
            views of one storage, count once; the whole storage counts), excluding the
            storages of the counter's ``exclude`` tensors (:func:`saved_activation_bytes`
            excludes the parameters and buffers).
        storages: number of distinct storages saved.
        saves: number of tensors autograd packed (with repeats).
    """

    nbytes: int
    storages: int
    saves: int

    @property
    def mib(self) -> float:
        """``nbytes`` in MiB (2**20 bytes)."""
        return self.nbytes / MIB

    def __repr__(self) -> str:
        return (f"SavedTensors({self.mib:.2f} MiB in {self.storages} storages, "
                f"{self.saves} saves)")


class SavedTensorsCounter:
    """Count the bytes autograd saves for backward inside a ``with`` block.

    Uses ``torch.autograd.graph.saved_tensors_hooks`` (PyTorch docs, "Hooks for saved
    tensors"): every tensor autograd saves passes through the pack hook, which records
    its storage (keyed by device and data pointer) and returns the tensor unchanged, so
    training is not altered. Deterministic on every device. Inside a non-reentrant
    ``torch.utils.checkpoint`` region autograd saves through checkpoint's own hooks,
    which keep nothing; what checkpoint itself keeps (each segment's inputs) is saved
    outside them and is counted here.

    Args:
        exclude: tensors whose storages are model state, not activations (e.g.
            ``list(model.parameters()) + list(model.buffers())``).

    Example::

        with SavedTensorsCounter(exclude=model.parameters()) as saved:
            loss = F.cross_entropy(model(x), y)
        saved.result().mib
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {_storage_key(t) for t in exclude}
        self._storages: dict[tuple, Any] = {}  # key -> storage, alive so keys stay unique
        self._sizes: dict[tuple, int] = {}
        self._saves = 0
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._saves += 1
        try:
            key, keep, nbytes = _storage_key(t), t.untyped_storage(), None
        except (RuntimeError, NotImplementedError):  # no storage (e.g. a sparse tensor)
            key, keep, nbytes = ("tensor", id(t)), t, t.nbytes
        if key not in self._exclude and key not in self._sizes:
            self._storages[key] = keep
            self._sizes[key] = keep.nbytes() if nbytes is None else nbytes
        return t

    def __enter__(self) -> "SavedTensorsCounter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self._storages.clear()  # sizes are kept; the storages are autograd's again

    def result(self) -> SavedTensors:
        """The bytes counted so far."""
        return SavedTensors(sum(self._sizes.values()), len(self._sizes), self._saves)


def _storage_key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr(), s.nbytes())


def model_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``model`` (the tensors that are not activations)."""
    return [*model.parameters(), *model.buffers()]


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None,
                           loss_fn: Callable[..., torch.Tensor] = F.cross_entropy
                           ) -> SavedTensors:
    """Bytes autograd saves for backward in one forward pass (+ loss) of ``model``.

    Runs ``loss_fn(model(x), y)`` (or ``model(x)`` when ``y`` is None) under a
    :class:`SavedTensorsCounter` that excludes the model's parameters and buffers, then
    drops the graph without a backward pass. The model's buffers (BatchNorm running
    statistics) are restored, so the model is unchanged.

    Args:
        model: in the mode to measure (``train()`` for training).
        x: a batch, e.g. (B, 3, H, W) float32 on the model's device.
        y: targets for ``loss_fn``, e.g. (B,) int64, or None.
        loss_fn: maps (output, y) to a scalar loss.
    """
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    try:
        with torch.enable_grad(), SavedTensorsCounter(model_state_tensors(model)) as c:
            out = model(x)
            if y is not None:
                out = loss_fn(out, y)
        del out
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])
    return c.result()


@dataclass(frozen=True)
class ModelState:
    """Bytes of model state, measured from the tensors that exist now.

    Attributes:
        params: parameter bytes (distinct storages). grads: bytes of ``.grad`` tensors
        (0 before the first backward or after ``zero_grad(set_to_none=True)``).
        optimizer: bytes of the optimizer's state tensors (0 before its first step).
        num_params: number of parameter elements.
    """

    params: int
    grads: int
    optimizer: int
    num_params: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                      ) -> ModelState:
    """Measure parameter, gradient and optimizer-state bytes of ``model`` right now."""
    params = {_storage_key(p): p for p in model.parameters()}
    grads = [p.grad for p in params.values() if p.grad is not None]
    state = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            state += sum(v.untyped_storage().nbytes() for v in st.values()
                         if isinstance(v, torch.Tensor))
    return ModelState(params=sum(p.untyped_storage().nbytes() for p in params.values()),
                      grads=sum(g.untyped_storage().nbytes() for g in grads),
                      optimizer=state, num_params=sum(p.numel() for p in params.values()))


def tensor_peak_bytes(fn: Callable[[], object], device: torch.device | str = "cpu"
                      ) -> PeakMemory:
    """Peak bytes of tensors allocated while ``fn()`` runs, above those alive before.

    CUDA: the caching allocator's ``max_memory_allocated`` after a reset, minus the
    bytes allocated at the start. CPU: the running sum of torch.profiler's memory events
    (``profile_memory=True``; each allocation and free of a CPU tensor), its maximum.
    Both count tensors only, not the interpreter or allocator caches; not a process
    RSS (for that see :func:`read_peak`).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return PeakMemory(int(torch.cuda.max_memory_allocated(dev) - base),
                          "CUDA allocator: peak of tensors allocated during the call")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return PeakMemory(peak, f"torch.profiler memory events: peak of tensors allocated "
                            f"during the call ({dev.type})")
