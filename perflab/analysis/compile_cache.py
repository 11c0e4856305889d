"""Inductor's compile cache: the same compile, cold and warm, each in a fresh process.

``torch.compile`` keeps its work on disk under ``TORCHINDUCTOR_CACHE_DIR`` (the FX
graph cache, the AOTAutograd cache, compiled C++/Triton kernels), so a second process
compiling the same model skips most of the work (PyTorch tutorial, "Compile Time
Caching in torch.compile"). A fresh process is needed to see it: inside one process
dynamo's in-memory caches would hide the disk cache. :func:`run_in_fresh_process` runs
:func:`perflab.run` with ``config.compile`` in a new Python process with a given cache
directory and returns the :class:`~perflab.RunResult` and the generated kernels.

Inside one process, :func:`cache_lookups` says whether a compile came from that cache:
inductor counts its FX graph cache hits and misses in ``torch._dynamo.utils.counters``
(a hit of the AOTAutograd cache loads its graphs from the FX graph cache, so it counts
there too).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from perflab.analysis.compilation import (
    CompileTiming, KernelSummary, compile_overhead_s, generated_code, kernel_summary,
)
from perflab.core.config import RunConfig
from perflab.core.result import RunResult
from perflab.core.paths import default_results_dir
from perflab.core.timing import Stopwatch
from perflab.experiment import run

__all__ = ["inductor_cache_dir", "CacheRun", "run_in_fresh_process", "timing_from_runs",
           "CacheLookups", "cache_lookups"]


def inductor_cache_dir(name: str = "lab05", root: str | Path | None = None) -> Path:
    """``<results>/inductor-cache/<name>``: a predictable cache directory (not created).

    ``root`` defaults to :func:`perflab.core.paths.default_results_dir` (``$PERFLAB_RESULTS``
    or ``results/``), so CI can keep it between the steps of one job.
    """
    return Path(root or default_results_dir()) / "inductor-cache" / name


@dataclass(frozen=True)
class CacheLookups:
    """Inductor's FX graph cache lookups in this process, counted since it started
    (``torch._dynamo.utils.counters["inductor"]``); subtract two to count a stretch.

    Attributes:
        hits: graphs loaded from the cache (compiled before, in any process).
        misses: graphs inductor compiled and stored (the cold path: code generation and
            the C++/Triton compiler).
        bypasses: graphs inductor compiled but could not cache (cold as well).
    """

    hits: int = 0
    misses: int = 0
    bypasses: int = 0

    def __sub__(self, other: "CacheLookups") -> "CacheLookups":
        return CacheLookups(self.hits - other.hits, self.misses - other.misses,
                            self.bypasses - other.bypasses)

    @property
    def all_hits(self) -> bool:
        """True when graphs were looked up and every one came from the cache (a warm
        compile); False when any was compiled (cold) or none was looked up."""
        return self.hits > 0 and self.misses == 0 and self.bypasses == 0


def cache_lookups() -> CacheLookups:
    """The FX graph cache lookups of this process so far (all zero when nothing was
    compiled: dynamo is not even imported then, and this does not import it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return CacheLookups()
    c = utils.counters["inductor"]
    return CacheLookups(int(c["fxgraph_cache_hit"]), int(c["fxgraph_cache_miss"]),
                        int(c["fxgraph_cache_bypass"]))


@dataclass(frozen=True, eq=False)
class CacheRun:
    """One compiled run in a fresh process.

    Attributes:
        result: the run's :class:`RunResult` (``result.step.warmup_s`` holds the compile).
        cache_dir: the ``TORCHINDUCTOR_CACHE_DIR`` it used.
        cold: True when that directory was empty (or missing) before the run.
        kernels: what inductor generated for the model (forward and backward graphs).
        process_s: wall-clock seconds of the whole process (start-up and imports too).
    """

    result: RunResult
    cache_dir: str
    cold: bool
    kernels: KernelSummary
    process_s: float

    @property
    def compile_s(self) -> float:
        """Seconds of the warm-up steps beyond the steady state
        (:func:`~perflab.analysis.compilation.compile_overhead_s`)."""
        return compile_overhead_s(self.result.step)

    def __repr__(self) -> str:
        return (f"CacheRun({'cold' if self.cold else 'warm'} cache: compile "
                f"{self.compile_s:.1f} s, step {self.result.step.median * 1e3:.1f} ms, "
                f"{len(self.kernels.fused)} generated kernels, process {self.process_s:.1f} s)")


def run_in_fresh_process(config: RunConfig, cache_dir: str | Path, *, clear: bool = False,
                         timeout_s: float = 900) -> CacheRun:
    """Run ``perflab.run(config)`` in a new Python process using ``cache_dir``.

    Args:
        config: a config with ``compile`` set (anything but "off").
        cache_dir: becomes ``TORCHINDUCTOR_CACHE_DIR`` for the process (created).
        clear: delete the directory first, so the compile is cold.
        timeout_s: kill the process after this many seconds.

    Raises:
        ValueError: ``config.compile == "off"``.
        RuntimeError: the process failed (its last output lines are in the message).
        subprocess.TimeoutExpired: it ran longer than ``timeout_s``.
    """
    if config.compile == "off":
        raise ValueError("config.compile is 'off': nothing to compile; use "
                         "config.replace(compile='default')")
    cache = Path(cache_dir)
    if clear and cache.exists():
        shutil.rmtree(cache)
    cold = not cache.exists() or not any(cache.iterdir())
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache.resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-c", "from perflab.analysis.compile_cache import _worker; _worker()",
               json.dumps(config.to_dict()), str(out)]
        with Stopwatch() as sw:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"the compile run failed (exit {proc.returncode}):\n{tail}")
        d = json.loads(out.read_text())
    return CacheRun(result=RunResult.from_dict(d["result"]), cache_dir=str(cache),
                    cold=cold, kernels=KernelSummary(tuple(d["fused"]), d["library"]),
                    process_s=sw.elapsed_s)


def _worker() -> None:
    """Entry point of the child process: argv = [config JSON, output path]."""
    config = RunConfig.from_dict(json.loads(sys.argv[1]))
    result, code = generated_code(lambda: run(config, progress=False, save=False))
    k = kernel_summary(code)
    Path(sys.argv[2]).write_text(json.dumps(
        {"result": result.to_dict(), "fused": list(k.fused), "library": k.library}))


def timing_from_runs(eager: RunResult, compiled: RunResult, label: str) -> CompileTiming:
    """A :class:`~perflab.analysis.compilation.CompileTiming` from two runs of the same config,
    one with ``compile="off"`` and one compiled (whole training steps, seconds).

    Raises:
        ValueError: ``eager`` is compiled or ``compiled`` is not.
    """
    if eager.config.compile != "off" or compiled.config.compile == "off":
        raise ValueError(f"need an eager run and a compiled run, got compile="
                         f"{eager.config.compile!r} and {compiled.config.compile!r}")
    return CompileTiming(label, eager.step.relabel(f"{label} eager"),
                         compiled.step.relabel(f"{label} compiled"),
                         compile_overhead_s(compiled.step))
