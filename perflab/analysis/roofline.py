"""This machine's measured roofline: matmul FLOP/s per dtype and memory bandwidth.

A technique helps only where the hardware has a fast path for it: bf16 autocast pays
when a bf16 matmul is faster than an fp32 one *here*, which CPU flags or a compute
capability only suggest. :func:`measure_roofline` measures it, in a few seconds:

* **compute roofs**: a square ``n x n @ n x n`` matmul (2 n^3 FLOPs) per dtype (fp32,
  bf16, fp16, where the device runs them), timed with ``torch.utils.benchmark.Timer``
  (PyTorch's micro-benchmark timer: syncs the device, autoranges, runs at the current
  thread count); the roof is the best block (a roof is what the hardware reaches, and
  the best block is the least disturbed by other programs), flagged ``noisy`` when the
  blocks' IQR exceeds 10 % of their median (torch.utils.benchmark's own warning). ``n``
  doubles from 256 while one call takes under 10 ms (up to 1024
  on a CPU, 8192 on a GPU), so an emulated dtype is measured small instead of taking
  seconds per call;
* **memory roof**: a large ``dst.copy_(src)`` (64 MiB on a CPU, 1 GiB on a GPU: larger
  than the caches), counted as 2 x bytes (read + write), the STREAM "copy" convention
  (McCalpin 1995).

The two give the roofline model (Williams, Waterman and Patterson, "Roofline: an
insightful visual performance model", CACM 2009): attainable FLOP/s =
min(peak FLOP/s, bandwidth x arithmetic intensity), with the ridge point at
peak / bandwidth FLOPs per byte. Results are cached per process (per device, dtype and
thread count).
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from types import ModuleType

import torch

from perflab.core.devices import DEVICES, resolve_device
from perflab.core.dtypes import LOW_PRECISION_DTYPES
from perflab.core.env import env_summary

__all__ = ["ROOFLINE_DTYPES", "ACCELERATED_RATIO", "MatmulRoof", "Roofline",
           "measure_roofline", "measure_matmul", "measure_bandwidth"]

#: The dtypes whose matmul roof is measured.
ROOFLINE_DTYPES = ("fp32", "bf16", "fp16")
#: A low-precision dtype counts as accelerated when its matmul runs at least this many
#: times fp32's rate (below 1 it is slower: emulated or unoptimised).
ACCELERATED_RATIO = 1.2
_TORCH_DTYPE = {"fp32": torch.float32, **LOW_PRECISION_DTYPES}
_START_N, _MAX_N = 256, {"cuda": 8192}
_CPU_MAX_N = 1024
_GROW_BELOW_S = 0.010  # grow n while one call takes less than this
_MIN_RUN_S = 0.2  # blocked_autorange's budget per measurement


@dataclass(frozen=True)
class MatmulRoof:
    """One dtype's measured matmul rate.

    Attributes:
        dtype: "fp32", "bf16" or "fp16".
        gflops: achieved GFLOP/s (1e9 FLOP/s) of an ``n x n`` matmul, or None when the
            device does not run this dtype (see ``note``).
        n: the matrix side measured (0 when not measured).
        note: why it was not measured ("" when it was).
        noisy: the timed blocks' IQR exceeded 10 % of their median (other programs
            competed for the device: the rate may be understated).
    """

    dtype: str
    gflops: float | None
    n: int
    note: str = ""
    noisy: bool = False


@dataclass(frozen=True)
class Roofline:
    """A device's measured roofs (see the module docstring for how).

    Attributes:
        device: e.g. "cpu" or "cuda:0".
        device_name: the CPU model or GPU name.
        threads: intra-op CPU threads during the measurement.
        matmul: one :class:`MatmulRoof` per dtype of :data:`ROOFLINE_DTYPES`.
        bandwidth_gb_s: copy bandwidth in GB/s (1e9 bytes/s; read + write counted).
        copy_mib: size of the copied buffer (MiB).
    """

    device: str
    device_name: str
    threads: int
    matmul: tuple[MatmulRoof, ...]
    bandwidth_gb_s: float
    copy_mib: int

    def roof(self, dtype: str) -> MatmulRoof:
        """The :class:`MatmulRoof` of ``dtype``.

        Raises:
            ValueError: a dtype not in :data:`ROOFLINE_DTYPES`.
        """
        for r in self.matmul:
            if r.dtype == dtype:
                return r
        raise ValueError(f"dtype must be one of {ROOFLINE_DTYPES}, got {dtype!r}")

    def gflops(self, dtype: str) -> float | None:
        """Measured matmul GFLOP/s in ``dtype`` (None: not run on this device)."""
        return self.roof(dtype).gflops

    def ratio(self, dtype: str, base: str = "fp32") -> float | None:
        """``dtype``'s matmul rate over ``base``'s (e.g. 0.02: 50x slower; None when
        either is unavailable)."""
        a, b = self.gflops(dtype), self.gflops(base)
        return None if a is None or not b else a / b

    def accelerated(self, dtype: str) -> bool:
        """True when ``dtype``'s matmul runs at >= :data:`ACCELERATED_RATIO` x fp32's."""
        r = self.ratio(dtype)
        return r is not None and r >= ACCELERATED_RATIO

    def ridge_flops_per_byte(self, dtype: str = "fp32") -> float | None:
        """The ridge point (FLOPs per byte) where the compute roof of ``dtype`` meets the
        memory roof: below it a kernel is memory-bound (Williams et al. 2009)."""
        g = self.gflops(dtype)
        return None if g is None else g / self.bandwidth_gb_s

    def attainable_gflops(self, dtype: str, flops_per_byte: float) -> float | None:
        """The roofline: min(compute roof, bandwidth x arithmetic intensity), GFLOP/s.

        Raises:
            ValueError: ``flops_per_byte`` <= 0.
        """
        if not flops_per_byte > 0:
            raise ValueError(f"flops_per_byte must be > 0, got {flops_per_byte!r}")
        g = self.gflops(dtype)
        return None if g is None else min(g, self.bandwidth_gb_s * flops_per_byte)

    def explain(self, dtype: str) -> str:
        """One sentence, from the measurement, on what ``dtype`` compute does here,
        e.g. "bf16 matmul runs at 0.014x of fp32 here (1.1 vs 78 GFLOP/s): this CPU's
        bf16 path is not accelerated"."""
        if dtype == "fp32":
            return f"fp32 matmul: {_g(self.gflops('fp32'))} GFLOP/s"
        roof, r = self.roof(dtype), self.ratio(dtype)
        if r is None:
            return f"{dtype} matmul was not measured here ({roof.note or 'no fp32 rate'})"
        kind = "GPU" if self.device.startswith("cuda") else self.device.split(":")[0].upper()
        head = (f"{dtype} matmul runs at {r:.2g}x of fp32 here ({_g(roof.gflops)} vs "
                f"{_g(self.gflops('fp32'))} GFLOP/s)")
        caveat = ("" if not (roof.noisy or self.roof("fp32").noisy) else
                  " (noisy measurement: other programs competed for the cores; re-run "
                  "`perflab doctor` on a quiet machine to confirm)")
        if r >= ACCELERATED_RATIO:
            return f"{head}: this {kind}'s {dtype} path is accelerated{caveat}"
        if r >= 1 / ACCELERATED_RATIO:
            return (f"{head}: about fp32's speed, so {dtype} saves memory and bandwidth "
                    f"but no matmul time{caveat}")
        return f"{head}: this {kind}'s {dtype} path is not accelerated{caveat}"

    def table(self) -> list[dict]:
        """One row per dtype: dtype, gflops, ratio_to_fp32, n, ridge_flops_per_byte."""
        return [dict(dtype=r.dtype, gflops=r.gflops, ratio_to_fp32=self.ratio(r.dtype),
                     n=r.n, ridge_flops_per_byte=self.ridge_flops_per_byte(r.dtype))
                for r in self.matmul]

    def __repr__(self) -> str:
        rows = [f"Roofline of {self.device} ({self.device_name}, {self.threads} threads):",
                f"  memory  copy {self.bandwidth_gb_s:,.1f} GB/s ({self.copy_mib} MiB buffer)"]
        for r in self.matmul:
            if r.gflops is None:
                rows.append(f"  {r.dtype:<6}  not measured: {r.note}")
                continue
            ratio = self.ratio(r.dtype)
            rel = "" if r.dtype == "fp32" or ratio is None else f", {ratio:.2g}x fp32"
            rows.append(f"  {r.dtype:<6}  matmul {_g(r.gflops)} GFLOP/s (n={r.n}{rel}; ridge "
                        f"{self.ridge_flops_per_byte(r.dtype):,.1f} FLOP/byte)"
                        + ("  noisy" if r.noisy else ""))
        return "\n".join(rows)


def _g(v: float | None) -> str:
    return "–" if v is None else f"{v:,.3g}" if v < 100 else f"{v:,.0f}"


def _device(device: str | torch.device) -> torch.device:
    """The concrete device, or ValueError naming the valid ones (resolve_device passes
    an unknown type through to torch, whose error is a RuntimeError)."""
    text = str(device)
    if text.split(":")[0] not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} (or 'cuda:N'), got {text!r}")
    return resolve_device(text)


def _benchmark() -> ModuleType:
    """``torch.utils.benchmark``, imported on first use and quietly.

    Importing it imports ``torch.utils.cpp_extension`` (its C++ timer's JIT), which on a
    CUDA build of torch with no usable GPU logs "No CUDA runtime is found, using
    CUDA_HOME='...'" once per process, at import (it locates a CUDA compiler for
    building C++ extensions, which perflab never does). Imported with this module, the
    line would reach every kernel and rank that imports perflab's analyses; so the import
    waits for the first measurement, and that one logger is held at ERROR for the import
    alone (its level is put back, nothing else changes; a later import is a no-op)."""
    if "torch.utils.benchmark" in sys.modules:
        return sys.modules["torch.utils.benchmark"]
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils import benchmark
    finally:
        log.setLevel(level)
    return benchmark


def _timer(stmt: str, **globals_) -> "torch.utils.benchmark.Timer":
    return _benchmark().Timer(stmt, globals=globals_, num_threads=torch.get_num_threads())


def _supported(dev: torch.device, dtype: str) -> str:
    """"" when ``dev`` runs a ``dtype`` matmul, else why not."""
    if dev.type == "cuda" and dtype == "bf16" and not torch.cuda.is_bf16_supported(
            including_emulation=False):
        major, minor = torch.cuda.get_device_capability(dev)
        return f"no bf16 on compute capability {major}.{minor} (needs >= 8.0)"
    return ""


_MATMUL: dict[tuple, MatmulRoof] = {}
_BANDWIDTH: dict[tuple, tuple[float, int]] = {}


def measure_matmul(device: str | torch.device = "cpu", dtype: str = "fp32") -> MatmulRoof:
    """Measure one dtype's matmul roof on ``device`` (cached per device, dtype, threads).

    Raises:
        ValueError: unknown dtype, or a device not available here.
    """
    if dtype not in ROOFLINE_DTYPES:
        raise ValueError(f"dtype must be one of {ROOFLINE_DTYPES}, got {dtype!r}")
    dev = _device(device)
    key = (str(dev), dtype, torch.get_num_threads())
    if key in _MATMUL:
        return _MATMUL[key]
    why = _supported(dev, dtype)
    if why:
        _MATMUL[key] = MatmulRoof(dtype, None, 0, why)
        return _MATMUL[key]
    max_n = _MAX_N.get(dev.type, _CPU_MAX_N)
    gen = torch.Generator().manual_seed(0)
    n = _START_N
    try:
        while True:
            a = torch.randn(n, n, generator=gen).to(dev, _TORCH_DTYPE[dtype])  # (n, n)
            b = torch.randn(n, n, generator=gen).to(dev, _TORCH_DTYPE[dtype])  # (n, n)
            t = _timer("a @ b", a=a, b=b)
            t.timeit(1)  # warm-up: kernel selection, lazy init
            if n >= max_n or t.timeit(1).median >= _GROW_BELOW_S:
                break
            n *= 2
        m = t.blocked_autorange(min_run_time=_MIN_RUN_S)
    except RuntimeError as e:  # a dtype this device's kernels do not implement
        _MATMUL[key] = MatmulRoof(dtype, None, 0, f"{type(e).__name__}: {str(e)[:80]}")
        return _MATMUL[key]
    best_s = min(m.times)  # per-call seconds of the least disturbed block
    _MATMUL[key] = MatmulRoof(dtype, 2 * n ** 3 / best_s / 1e9, n,
                              noisy=m.iqr > 0.1 * m.median)
    return _MATMUL[key]


def measure_bandwidth(device: str | torch.device = "cpu") -> tuple[float, int]:
    """Measure copy bandwidth on ``device``: (GB/s with read + write counted, buffer MiB).
    Cached per device and thread count.

    Raises:
        ValueError: a device not available here.
    """
    dev = _device(device)
    key = (str(dev), torch.get_num_threads())
    if key not in _BANDWIDTH:
        mib = 1024 if dev.type == "cuda" else 64
        src = torch.ones(mib * 2 ** 20, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        t = _timer("dst.copy_(src)", dst=dst, src=src)
        t.timeit(1)
        m = t.blocked_autorange(min_run_time=_MIN_RUN_S)
        _BANDWIDTH[key] = (2 * src.numel() / min(m.times) / 1e9, mib)
        del src, dst
    return _BANDWIDTH[key]


def measure_roofline(device: str | torch.device = "auto") -> Roofline:
    """Measure ``device``'s roofline: matmul GFLOP/s per dtype and copy bandwidth.

    Takes a few seconds the first time (about 0.3 s per roof, longer for an emulated
    dtype's single calls); later calls in the same process return the cached values
    (per device and thread count).

    Args:
        device: a ``RunConfig.device`` value ("auto", "cpu", "cuda", "cuda:N", "mps").

    Returns:
        A frozen :class:`Roofline`.

    Raises:
        ValueError: the device is unknown or not available here.
    """
    dev = _device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    bw, mib = measure_bandwidth(dev)
    name = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else env_summary("cpu").device_name if dev.type == "cpu" else dev.type)
    return Roofline(device=str(dev), device_name=name, threads=torch.get_num_threads(),
                    matmul=tuple(measure_matmul(dev, d) for d in ROOFLINE_DTYPES),
                    bandwidth_gb_s=bw, copy_mib=mib)
