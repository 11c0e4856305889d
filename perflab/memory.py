"""Peak memory of a run, from the allocator that owns it.

* CUDA: the caching allocator's peak of allocated tensor bytes
  (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``).
* CPU: the process's resident-set high-water mark (Linux ``VmHWM``), reset at the start
  of the run by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0, see
  ``man 5 proc``). Where the reset is not allowed the peak is since process start, and
  the label says so. RSS includes the Python interpreter, libraries and the loader's
  buffers, not only tensors.
"""
from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["PeakMemory", "reset_peak", "read_peak", "GIB"]

GIB = 1024 ** 3


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
