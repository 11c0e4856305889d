"""``torch.compile``: compile time vs steady state, break-even, graph breaks, kernels (Lab 05).

* :func:`time_compile` measures an eager and a compiled callable the same way
  (:func:`perflab.core.timing.measure`); the compiled one's first calls hold the compile
  time (:func:`compile_overhead_s`), the rest its steady state;
  :func:`break_even_steps` is the arithmetic of when compiling pays.
* :func:`graph_breaks` (``torch._dynamo.explain``) and :func:`count_compiles`
  (``torch._dynamo.utils.counters`` and its guard failures) count what dynamo did.
* :func:`generated_code` and :func:`kernel_summary` read what inductor generated:
  fused kernels (``cpp_fused_*`` on CPU, ``triton_*`` on GPU) and calls to library
  kernels (convolutions, matmuls) that it did not generate.
* :func:`op_time_share` says how much of a step the library kernels take.

The workloads (a fusion-bound pointwise chain, ResNet-18) are in :mod:`perflab.train.workloads`.

Inductor's compile cache (warm vs cold, in fresh processes) lives in
:mod:`perflab.analysis.compile_cache`.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from perflab.core.measurement import Comparison, Measurement, compare
from perflab.core.timing import measure

__all__ = ["compile_overhead_s", "break_even_steps", "describe_break_even", "CompileTiming",
           "time_compile", "GraphBreaks", "graph_breaks", "CompileCount", "count_compiles",
           "generated_code", "KernelSummary", "kernel_summary", "op_time_share"]


# -- when does compiling pay? ----------------------------------------------------------
def compile_overhead_s(compiled: Measurement) -> float:
    """Seconds the compiled callable's warm-up calls took beyond its steady state.

    ``sum(warmup_s) - len(warmup_s) * median``: the first call traces and compiles
    (and a later warm-up call may compile again, e.g. a backward graph), the
    steady-state part of those calls is what any call costs. Never negative.

    Raises:
        ValueError: the measurement kept no warm-up times.
    """
    if not compiled.warmup_s:
        raise ValueError(f"{compiled.label!r} has no warm-up times; measure with "
                         "warmup >= 1 so the compiling call is kept")
    return max(sum(compiled.warmup_s) - len(compiled.warmup_s) * compiled.median, 0.0)


def break_even_steps(compile_s: float, eager_step_s: float, compiled_step_s: float) -> float:
    """Steps after which compiling has paid for itself; ``math.inf`` if it never does.

    N steps cost ``N * eager`` eagerly and ``compile_s + N * compiled`` compiled; they
    are equal at ``N = compile_s / (eager - compiled)``. When the compiled step is not
    faster (``compiled >= eager``) there is no such N: ``math.inf`` ("never").

    Raises:
        ValueError: a negative time, or a step time of 0.
    """
    if compile_s < 0 or eager_step_s <= 0 or compiled_step_s <= 0:
        raise ValueError(f"need compile_s >= 0 and step times > 0 seconds, got "
                         f"{compile_s}, {eager_step_s}, {compiled_step_s}")
    gain = eager_step_s - compiled_step_s
    return compile_s / gain if gain > 0 else math.inf


def describe_break_even(steps: float, unit: str = "steps") -> str:
    """``"never"`` for ``math.inf``, else e.g. ``"after 1,234 steps"`` (rounded up;
    ``unit`` names what is counted, e.g. "calls")."""
    return "never" if math.isinf(steps) else f"after {math.ceil(steps):,} {unit}"


@dataclass(frozen=True)
class CompileTiming:
    """One workload, eager vs compiled, measured in the same way.

    Attributes:
        label: the workload's name.
        eager, compiled: per-call seconds; ``compiled.warmup_s`` holds the compile.
        compile_s: :func:`compile_overhead_s` of ``compiled`` (seconds).
    """

    label: str
    eager: Measurement
    compiled: Measurement
    compile_s: float

    @property
    def speedup(self) -> float:
        """Eager median / compiled median (> 1: compiled is faster)."""
        return self.eager.median / self.compiled.median

    @property
    def comparison(self) -> Comparison:
        """Speedup CI and Mann-Whitney test (:func:`perflab.compare`)."""
        return compare(self.eager, self.compiled)

    @property
    def break_even(self) -> float:
        """:func:`break_even_steps` of the medians (``math.inf`` = never)."""
        return break_even_steps(self.compile_s, self.eager.median, self.compiled.median)

    def summary(self) -> dict[str, Any]:
        """Plain numbers for a table (seconds, ms, x, steps)."""
        c = self.comparison
        return {"workload": self.label, "compile_s": self.compile_s,
                "eager_ms": self.eager.median * 1e3, "compiled_ms": self.compiled.median * 1e3,
                "speedup": self.speedup, "speedup_ci_low": c.ci95[0],
                "speedup_ci_high": c.ci95[1], "p_value": c.p_value,
                "break_even_steps": self.break_even, "verdict": c.verdict}


def time_compile(eager_fn: Callable[[], Any], compiled_fn: Callable[[], Any], *,
                 label: str, warmup: int = 2, repeats: int = 10,
                 device: torch.device | str = "cpu", samples_per_call: int | None = None,
                 inductor_config: dict[str, Any] | None = None) -> CompileTiming:
    """Measure ``eager_fn`` and ``compiled_fn`` (not yet called) with the same timer.

    Args:
        eager_fn, compiled_fn: no-argument callables doing the same work; the second
            wraps a ``torch.compile``\\d function whose first call compiles.
        label: the workload's name.
        warmup, repeats: :func:`perflab.core.timing.measure`'s; warmup >= 1.
        device: where they run (for the device sync).
        samples_per_call: for throughput.
        inductor_config: ``torch._inductor.config`` values patched around each compiled
            call (e.g. ``{"freezing": True}``; compilation happens inside a call).

    Raises:
        ValueError: warmup < 1 (the compile would be in the statistics).
    """
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 so the compiling call is not timed as a "
                         f"steady-state call, got {warmup}")
    import torch._inductor.config as inductor_cfg

    def fn() -> Any:
        with inductor_cfg.patch(**(inductor_config or {})):
            return compiled_fn()
    kw = dict(warmup=warmup, repeats=repeats, device=device, samples_per_call=samples_per_call)
    eager = measure(eager_fn, label=f"{label} eager", **kw)
    compiled = measure(fn, label=f"{label} compiled", **kw)
    return CompileTiming(label, eager, compiled, compile_overhead_s(compiled))


# -- what dynamo did -------------------------------------------------------------------
@dataclass(frozen=True)
class GraphBreaks:
    """``torch._dynamo.explain`` of one call: ``graphs`` captured, ``breaks`` between
    them, ``reasons`` (one line each, with the user code line), ``ops`` in the graphs,
    ``lines``: the user source line of each break, stripped ("" where the source is not
    available), in the order dynamo met them."""

    graphs: int
    breaks: int
    reasons: tuple[str, ...]
    ops: int
    lines: tuple[str, ...] = ()


def graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GraphBreaks:
    """Trace ``fn(*args, **kwargs)`` with ``torch._dynamo.explain`` (no compiler runs).

    Deterministic: the counts depend on the code and the input types, not on timing.
    ``explain`` resets dynamo's caches first.
    """
    import torch._dynamo

    e = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons, lines = [], []
    for r in e.break_reasons:
        where, line = "", ""
        if r.user_stack:
            fr = r.user_stack[-1]
            line = (fr.line or "").strip()
            where = f" at {fr.name} line {fr.lineno}: {line}"
        reasons.append(f"{str(r.reason).splitlines()[0]}{where}")
        lines.append(line)
    return GraphBreaks(e.graph_count, e.graph_break_count, tuple(reasons), e.op_count,
                       tuple(lines))


@dataclass(frozen=True)
class CompileCount:
    """What dynamo compiled over a sequence of calls (``torch._dynamo.utils.counters``).

    Attributes:
        calls: calls made. frames: frames compiled (``counters["frames"]["ok"]``).
        graphs: graphs captured (``counters["stats"]["unique_graphs"]``).
        recompiles: graphs captured after the first call (a guard failed, so dynamo
            compiled again). reasons: the guard failures that caused them.
    """

    calls: int
    frames: int
    graphs: int
    recompiles: int
    reasons: tuple[str, ...] = field(default=())


def count_compiles(fn: Callable[..., Any], inputs: Sequence[tuple], *,
                   dynamic: bool | None = None, backend: str = "eager") -> CompileCount:
    """Compile ``fn`` once and call it on each argument tuple of ``inputs``; count.

    Dynamo is reset first. ``backend="eager"`` runs dynamo only (the captured graphs run
    eagerly), which is enough to count compiles and fast; pass "inductor" to generate
    code too. ``dynamic`` is ``torch.compile``'s (None: specialise on the first
    shapes, recompile once with dynamic shapes when they change).

    Raises:
        ValueError: ``inputs`` is empty.
    """
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    if not inputs:
        raise ValueError("count_compiles needs at least one argument tuple in inputs")
    torch._dynamo.reset()
    counters.clear()
    guard_failures.clear()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    compiled(*inputs[0])
    first = counters["stats"]["unique_graphs"]
    for args in inputs[1:]:
        compiled(*args)
    graphs = counters["stats"]["unique_graphs"]
    # the first line of each failure, without dynamo's source comment
    reasons = tuple(" ".join(r.splitlines()[0].split("#")[0].split())
                    for rs in guard_failures.values() for r in rs)
    return CompileCount(calls=len(inputs), frames=counters["frames"]["ok"], graphs=graphs,
                        recompiles=graphs - first, reasons=reasons)


# -- what inductor generated -----------------------------------------------------------
def generated_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call ``fn`` (which compiles with inductor inside) and return (its result, the
    Python source of every graph inductor generated), via
    ``torch._inductor.utils.run_and_get_code``. Dynamo is reset first, so ``fn``
    compiles anew (from inductor's on-disk cache when warm)."""
    from torch._inductor.utils import run_and_get_code

    return run_and_get_code(fn, *args, **kwargs)


_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.M)
_LIBRARY_CALL = re.compile(r"\b(extern_kernels\.\w+|torch\.ops\.\w+\.\w+)(?:\.\w+)?\(")


@dataclass(frozen=True)
class KernelSummary:
    """Kernels in inductor's generated code.

    Attributes:
        fused: names of the kernels inductor generated (``cpp_fused_*``, ``triton_*``),
            each doing the work of one or more ATen operators in one pass.
        library: library kernels called (e.g. ``extern_kernels.convolution``: oneDNN /
            cuDNN convolutions inductor does not generate) -> number of calls.
    """

    fused: tuple[str, ...]
    library: dict[str, int]

    @property
    def library_calls(self) -> int:
        return sum(self.library.values())

    def __repr__(self) -> str:
        lib = ", ".join(f"{k} x{v}" for k, v in sorted(self.library.items())) or "none"
        return f"KernelSummary({len(self.fused)} generated kernels; library calls: {lib})"


def kernel_summary(code: str | Sequence[str]) -> KernelSummary:
    """Count generated and library kernels in inductor output code (one or many graphs).

    Only calls inside the ``call`` functions count as library calls (kernel definitions
    and imports are skipped).
    """
    codes = [code] if isinstance(code, str) else list(code)
    fused: list[str] = []
    library: Counter[str] = Counter()
    for src in codes:
        fused += _KERNEL_DEF.findall(src)
        body = src[src.find("def call("):] if "def call(" in src else ""
        library.update(m for m in _LIBRARY_CALL.findall(body)
                       if not m.startswith("torch.ops.inductor"))
    return KernelSummary(tuple(fused), dict(library))


def op_time_share(fn: Callable[[], Any], substrings: Sequence[str],
                  device: torch.device | str = "cpu") -> float:
    """Share (0..1) of one ``fn()`` call's operator self time spent in operators whose
    name contains any of ``substrings`` (e.g. ``("convolution",)``), from
    ``torch.profiler``'s ``key_averages`` (self CPU time; self device time on CUDA).
    Run ``fn`` once before, so one-time costs are not profiled."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = prof.key_averages()
    total = sum(getattr(e, attr) for e in events)
    part = sum(getattr(e, attr) for e in events if any(s in e.key for s in substrings))
    return part / total if total else 0.0
