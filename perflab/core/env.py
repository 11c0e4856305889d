"""``env_summary()``: the provenance header every lab opens with (hardware, versions).

After airbench's habit of printing the machine next to every result: a number without
the hardware it was measured on cannot be compared.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from perflab.core.devices import resolve_device
from perflab.core.paths import EMBEDDED_NAME, dataset_fingerprint, default_data_root

__all__ = ["EnvSummary", "env_summary", "cpu_flags", "bf16_support"]


def cpu_flags() -> set[str]:
    """CPU feature flags from /proc/cpuinfo (empty set where unavailable)."""
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def bf16_support(device: torch.device | str) -> tuple[bool, str]:
    """Whether bf16 compute is fast on ``device``, and why.

    CUDA: compute capability >= 8.0 (Ampere and later have bf16 tensor cores;
    ``torch.cuda.is_bf16_supported``). CPU: AVX512_BF16 or AMX-BF16 instructions
    (oneDNN uses them); without them bf16 runs but is emulated and usually slower.

    Returns:
        (supported, reason) where reason names the evidence.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        ok = major >= 8
        return ok, f"compute capability {major}.{minor} ({'>=' if ok else '<'} 8.0)"
    if dev.type == "mps":
        return False, "bf16 autocast on MPS is not measured by perflab"
    flags = cpu_flags()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    onednn = torch.backends.mkldnn.is_available()
    if native and onednn:
        return True, f"CPU has {', '.join(native)}; oneDNN available"
    why = "no avx512_bf16/amx_bf16 CPU flags" if not native else "oneDNN not available"
    return False, f"{why}: bf16 is emulated (expect no speedup)"


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class EnvSummary:
    """Where a measurement was taken. All fields are plain strings/numbers (JSON-ready)."""

    device: str
    device_name: str
    cpu_cores: int
    torch_threads: int
    python: str
    torch: str
    numpy: str | None
    perflab: str | None
    torchvision: str | None
    cuda: str | None
    bf16: bool
    bf16_reason: str
    dataset_fingerprint: str | None
    platform: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __repr__(self) -> str:
        rows = [(k, v) for k, v in self.to_dict().items() if v is not None]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def env_summary(device: str = "auto", dataset: str | None = None) -> EnvSummary:
    """Describe this machine: device and its name, cores, torch threads, versions,
    bf16 support, and the dataset fingerprint (manifest SHA-256 prefix).

    Args:
        device: a ``RunConfig.device`` value; "auto" picks CUDA, then MPS, then CPU.
        dataset: dataset directory whose fingerprint to show; None -> the embedded set
            (only if already built: this never builds data).
    """
    dev = resolve_device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    elif dev.type == "mps":
        name = "Apple GPU (MPS)"
    else:
        name = platform.processor() or platform.machine()
        for line in _cpuinfo_lines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ds = Path(dataset) if dataset else default_data_root() / EMBEDDED_NAME
    bf16, why = bf16_support(dev)
    return EnvSummary(
        device=str(dev), device_name=name, cpu_cores=int(cores or 1),
        torch_threads=torch.get_num_threads(),
        python=sys.version.split()[0], torch=torch.__version__, numpy=_version("numpy"),
        perflab=_version("perflab"), torchvision=_version("torchvision"),
        cuda=torch.version.cuda, bf16=bf16, bf16_reason=why,
        dataset_fingerprint=dataset_fingerprint(ds), platform=platform.platform(),
    )


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


