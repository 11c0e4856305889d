"""Peak FLOP/s of a device in a dtype: the datasheet table, or a measured matmul peak.

A CUDA GPU in :data:`PEAK_TFLOPS` gets its vendor datasheet value (dense, no structured
sparsity); a CPU or an unknown GPU gets a *measured* matmul peak of the run's dtype
(:mod:`perflab.analysis.roofline`, so a bf16 run on a CPU without bf16 instructions is
compared with that CPU's bf16 rate), labelled "measured"; never a guess (an unmeasurable
peak is None and MFU "unavailable"). :func:`dtype_of` says which dtype's peak a run is
compared with. The utilisation itself (MFU / HFU) is :mod:`perflab.analysis.flops`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch

from perflab.core.config import RunConfig
from perflab.core.devices import resolve_device
from perflab.core.dtypes import LOW_PRECISION_DTYPES
from perflab.core.env import env_summary
from perflab.analysis.roofline import measure_matmul
from perflab.core.timing import measure

__all__ = ["PeakFlops", "peak_flops", "measure_peak_flops", "PEAK_TFLOPS", "dtype_of",
           "measured_peak"]

Dtype = Literal["fp32", "tf32", "bf16", "fp16"]
DTYPES = ("fp32", "tf32", "bf16", "fp16")
_TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, **LOW_PRECISION_DTYPES}

#: Dense peak TFLOP/s per dtype from each vendor datasheet (the datasheets print TF32,
#: BF16 and FP16 Tensor Core figures "with sparsity"; the dense values here are half of
#: those). Keys are matched against ``torch.cuda.get_device_name()`` in order.
#: Sources: "NVIDIA A100 Tensor Core GPU" datasheet (SXM4 and PCIe: FP32 19.5, TF32 156,
#: BF16/FP16 312); "NVIDIA H100 Tensor Core GPU" datasheet (SXM: FP32 67, TF32 494.5,
#: BF16/FP16 989.5; PCIe: 51, 378, 756.5; NVL: 60, 417.5, 835.5); "NVIDIA H200 Tensor
#: Core GPU" datasheet (SXM: 67, 494.5, 989.5; NVL: 60, 417.5, 835.5); "NVIDIA L4 Tensor
#: Core GPU" datasheet (30.3, 60, 121); "NVIDIA L40S GPU" datasheet (91.6, 183, 362.05);
#: "NVIDIA A10 Tensor Core GPU" datasheet (31.2, 62.5, 125); "NVIDIA V100 Tensor Core
#: GPU" datasheet (SXM2: FP32 15.7, FP16 125; PCIe: 14, 112; no TF32/BF16); "NVIDIA T4"
#: datasheet (FP32 8.1, FP16 65; no TF32/BF16).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    "A100 PCIe": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "A100 SXM": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100 SXM2": {"fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp32": 14.0, "fp16": 112.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}


def _table_key(device_name: str) -> str | None:
    """The :data:`PEAK_TFLOPS` key for a ``torch.cuda.get_device_name()`` string.

    Examples: "NVIDIA H100 80GB HBM3" -> "H100 SXM", "NVIDIA H100 PCIe" -> "H100 PCIe",
    "NVIDIA A100-SXM4-80GB" -> "A100 SXM", "NVIDIA A100 80GB PCIe" -> "A100 PCIe",
    "Tesla V100-SXM2-16GB" -> "V100 SXM2", "NVIDIA L4" -> "L4" (not "L40S").
    """
    name = device_name.upper()
    for chip in ("H200", "H100", "A100", "V100", "L40S", "L4", "A10", "T4"):
        if not re.search(rf"\b{chip}\b", name.replace("-", " ")):
            continue
        if chip in ("H200", "H100"):
            form = "NVL" if "NVL" in name else "PCIe" if "PCIE" in name else "SXM"
            key = f"{chip} {form}" if not (chip == "H200" and form == "SXM") else "H200"
            return key if key in PEAK_TFLOPS else None
        if chip == "A100":
            return "A100 PCIe" if "PCIE" in name else "A100 SXM"
        if chip == "V100":
            return "V100 PCIe" if "PCIE" in name else "V100 SXM2"
        return chip
    return None


@dataclass(frozen=True)
class PeakFlops:
    """A peak FLOP/s and where it came from.

    Attributes:
        flops_per_s: peak FLOP/s, or None when unavailable (MFU is then unavailable).
        dtype: "fp32", "tf32", "bf16" or "fp16".
        device_name: e.g. "NVIDIA H100 80GB HBM3" or the CPU's model name.
        source: "datasheet: <document>", "measured: <how>", or "unavailable: <why>".
    """

    flops_per_s: float | None
    dtype: str
    device_name: str
    source: str

    @property
    def tflops(self) -> float | None:
        return None if self.flops_per_s is None else self.flops_per_s / 1e12

    def __repr__(self) -> str:
        value = "unavailable" if self.flops_per_s is None else f"{self.tflops:.3g} TFLOP/s"
        return f"PeakFlops({value} {self.dtype} on {self.device_name}; {self.source})"


_MEASURED: dict[tuple, PeakFlops] = {}  # (device, dtype, n, threads) -> measured peak


def measure_peak_flops(device: str | torch.device = "cpu", dtype: Dtype = "fp32", *,
                       n: int = 1024, repeats: int = 10) -> PeakFlops:
    """MEASURE a matmul peak: ``n x n @ n x n`` (2 n^3 FLOPs) timed with
    :func:`perflab.core.timing.measure` (synchronised, warm-up dropped), best of ``repeats``.

    This is the achievable dense-matmul rate of this device at the current thread count,
    not a datasheet number, so MFU against it reads higher than against a theoretical
    peak; the result says "measured". Cached per (device, dtype, n, threads).

    Raises:
        ValueError: unknown dtype, n < 64, or repeats < 2.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 64:
        raise ValueError(f"n must be an int >= 64 (matrix side), got {n!r}")
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2, got {repeats!r}")
    dev = torch.device(device)
    key = (str(dev), dtype, n, torch.get_num_threads())
    if key not in _MEASURED:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(dev, _TORCH_DTYPE[dtype])
        b = torch.randn(n, n, generator=gen).to(dev, _TORCH_DTYPE[dtype])
        m = measure(lambda: a @ b, warmup=2, repeats=repeats, device=dev)
        best_s = min(m.times_s)
        name = _device_name(dev)
        _MEASURED[key] = PeakFlops(
            2 * n ** 3 / best_s, dtype, name,
            f"measured: {n}x{n} {dtype} matmul, best of {repeats}, "
            f"{torch.get_num_threads()} threads")
    return _MEASURED[key]


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return str(env_summary("cpu").to_dict().get("device_name") or dev.type)


def peak_flops(device: str | torch.device = "auto", dtype: Dtype = "fp32", *,
               measure_unknown: bool = True) -> PeakFlops:
    """Peak dense FLOP/s of ``device`` in ``dtype``: datasheet, measured, or unavailable.

    A CUDA GPU in :data:`PEAK_TFLOPS` gets its datasheet value (dense); a CPU, or a GPU
    not in the table, gets :func:`measured_peak` (this process's measured matmul rate in
    ``dtype``, :mod:`perflab.analysis.roofline`) when ``measure_unknown``, else
    "unavailable" (flops_per_s None). A dtype the datasheet lists no figure for (e.g.
    bf16 on a V100) is unavailable.

    Raises:
        ValueError: unknown dtype (before any work).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    dev = resolve_device(str(device))
    name = _device_name(dev)
    if dev.type == "cuda":
        key = _table_key(name)
        if key is not None:
            tflops = PEAK_TFLOPS[key].get(dtype)
            if tflops is None:
                return PeakFlops(None, dtype, name, f"unavailable: the {key} datasheet "
                                 f"lists no {dtype} figure")
            return PeakFlops(tflops * 1e12, dtype, name,
                             f"datasheet: NVIDIA {key.split()[0]} datasheet, {key}, dense")
    if dtype == "tf32" and dev.type != "cuda":
        return PeakFlops(None, dtype, name, "unavailable: tf32 is a CUDA tensor-core format")
    if measure_unknown:
        return measured_peak(dev, dtype)
    return PeakFlops(None, dtype, name, "unavailable: device not in the datasheet table "
                     "and measure_unknown=False")


def measured_peak(device: str | torch.device, dtype: Dtype) -> PeakFlops:
    """The peak of ``dtype`` from :func:`perflab.analysis.roofline.measure_matmul` (the same,
    per-process cached measurement ``perflab doctor`` prints), labelled "measured";
    "unavailable" when the device does not run that dtype.

    Raises:
        ValueError: a dtype the roofline does not measure (e.g. tf32).
    """
    dev = torch.device(device)
    roof = measure_matmul(dev, dtype)
    name = _device_name(dev)
    if roof.gflops is None:
        return PeakFlops(None, dtype, name, f"unavailable: {roof.note}")
    return PeakFlops(roof.gflops * 1e9, dtype, name,
                     f"measured: {roof.n}x{roof.n} {dtype} matmul (torch.utils.benchmark), "
                     f"{torch.get_num_threads()} threads")


def dtype_of(config: RunConfig) -> str:
    """The dtype a run's matmuls/convs use: amp bf16/fp16, else tf32 on a CUDA GPU with
    compute capability >= 8 when ``torch.backends.cudnn.allow_tf32`` (PyTorch's default
    for convolutions, "TensorFloat-32 (TF32) on Ampere" in the CUDA semantics notes),
    else fp32."""
    if config.amp != "off":
        return config.amp
    dev = config.resolved_device()
    if (dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 8
            and torch.backends.cudnn.allow_tf32 and config.model == "resnet18"):
        return "tf32"
    return "fp32"
