"""Four profilers on the same training step, and a diagnosis of what to fix first (Lab 01).

:func:`profile` (``torch.profiler``: operators, kernels, a timeline trace),
:func:`cprofile_loader` (``cProfile``: Python functions of the input pipeline),
:func:`line_profile_dataset` (``line_profiler``: lines of ``__getitem__`` and the
transform), :func:`memory_profile_step` (``memory_profiler``: RSS line by line through a
step), :func:`diagnose` (bottleneck of a RunResult and the lab that fixes it). No profiler
is written here: these drive the libraries and return pandas DataFrames.
"""
from __future__ import annotations

import cProfile
import contextlib
import linecache
import os
import pstats
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from perflab.core.config import RunConfig
from perflab.data.loader import infinite_batches, make_loader
from perflab.analysis.diagnosis import Diagnosis, diagnose
from perflab.core.result import RunResult
from perflab.core.paths import default_results_dir
from perflab.train.step import build_training, train_step
from perflab.analysis.trace import events_frame, load_trace, phase_times
from perflab.experiment import run

__all__ = ["profile", "ProfileSummary", "cprofile_loader", "line_profile_dataset",
           "memory_profile_step", "TOP_OPS_COLUMNS", "step_ranges", "quiet_native_stderr"]

#: Columns of :attr:`ProfileSummary.top_ops` (times in milliseconds, shares in percent).
TOP_OPS_COLUMNS = ("name", "calls", "self_cpu_ms", "cpu_total_ms", "self_cpu_pct",
                   "self_device_ms", "device_total_ms")
#: Why ``tensorboard=True`` is refused, and where each view of the TensorBoard profiler
#: plugin (torch-tb-profiler) is now: PyTorch deprecated the plugin in favour of Perfetto
#: and it was removed from the kineto repository in 2026.
TENSORBOARD_GONE = (
    "the TensorBoard profiler plugin (torch-tb-profiler) is deprecated and no longer "
    "maintained (removed from pytorch/kineto): open the Chrome trace in https://ui.perfetto.dev "
    "instead; its views are here: Overview (step time by kind) -> summary.phases and "
    "perflab.temporal_breakdown(summary.trace_path); Operator -> summary.top_ops; GPU "
    "Kernel -> top_ops' self_device_ms and perflab.idle_time_breakdown; Trace -> Perfetto; "
    "Memory -> perflab.memory_breakdown and torch.cuda.memory._record_memory_history; "
    "Distributed -> perflab.comm_comp_overlap over the ranks' traces. Drop --tensorboard "
    "(tensorboard=True)")


@dataclass(frozen=True, eq=False)
class ProfileSummary:
    """What :func:`profile` recorded: ``top_ops`` (DataFrame, ms), ``trace_path`` (Chrome
    trace JSON), ``phases`` (:func:`perflab.analysis.trace.phase_times` of the trace, ms),
    ``result`` (the profiled run, profiler overhead included) and ``diagnosis``
    (:func:`diagnose` of it)."""

    top_ops: pd.DataFrame
    trace_path: str
    phases: pd.DataFrame
    result: RunResult
    diagnosis: Diagnosis

    def how_to_open(self) -> str:
        """How to look at the trace (text)."""
        return (f"Timeline: drag {self.trace_path} into https://ui.perfetto.dev (or Load "
                "it in chrome://tracing); each step shows the perflab:data / forward / "
                "backward / optimizer ranges with their operators. Busy / idle / "
                "communication time from the same file: perflab.temporal_breakdown(path), "
                "perflab.idle_time_breakdown(path).")

    def __repr__(self) -> str:
        key = "self_device_ms" if self.top_ops["self_device_ms"].sum() > 0 else "self_cpu_ms"
        phases = ", ".join(f"{p} {r.per_step_ms:.1f} ms ({r.share_pct:.0f} %)"
                           for p, r in self.phases.iterrows())
        top = self.top_ops.head(5)[["name", "calls", key, "self_cpu_pct"]]
        return "\n".join([
            f"ProfileSummary {self.result.label!r} on {self.result.env.get('device')}",
            f"  phases per profiled step: {phases}", f"  top operators by {key}:",
            *("    " + line for line in top.to_string(index=False).splitlines()),
            *("  " + line for line in repr(self.diagnosis).splitlines()),
            *("  " + line for line in self.how_to_open().splitlines())])


def _check(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _top_ops(prof: torch.profiler.profile, row_limit: int, on_gpu: bool) -> pd.DataFrame:
    events = prof.key_averages()
    total_self_cpu = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [(e.key, e.count, e.self_cpu_time_total / 1e3, e.cpu_time_total / 1e3,
             100 * e.self_cpu_time_total / total_self_cpu, e.self_device_time_total / 1e3,
             e.device_time_total / 1e3)
            for e in events if not e.key.startswith(("perflab:", "ProfilerStep"))]
    df = pd.DataFrame(rows, columns=list(TOP_OPS_COLUMNS))
    df = df.sort_values("self_device_ms" if on_gpu else "self_cpu_ms", ascending=False)
    return df.head(row_limit).reset_index(drop=True)


def profile(config: RunConfig, *, wait: int = 1, warmup: int = 1, active: int = 3,
            trace_dir: str | os.PathLike[str] | None = None, tensorboard: bool = False,
            row_limit: int = 15, progress: bool = True) -> ProfileSummary:
    """Profile ``config``'s training loop with ``torch.profiler`` and summarise it.

    Runs :func:`perflab.experiment.run` (the loop every measurement uses) for ``wait + warmup``
    warm-up and ``max(active, 2)`` measured steps under ``torch.profiler.schedule(wait,
    warmup, active, repeat=1)``; activities CPU, plus CUDA on CUDA. The Chrome trace goes
    to ``<trace_dir>/<label>-<UTC time>.json`` (default ``default_results_dir() /
    "traces"``). ``tensorboard=True`` is refused (:data:`TENSORBOARD_GONE`: the plugin is
    gone; the message says where each of its views is).

    ``top_ops`` (``prof.key_averages()`` without perflab:* and ProfilerStep* ranges):
    name, calls, self_cpu_ms, cpu_total_ms, self_cpu_pct (of all self CPU time recorded),
    self_device_ms, device_total_ms (0 on CPU); ``row_limit`` rows by self device time on
    CUDA, else self CPU time. Python work that is no torch op (JPEG decoding) is self time
    of its range (``enumerate(DataLoader)...``, ``perflab:data``).

    Raises:
        ValueError: ``wait`` or ``warmup`` < 0, ``active`` or ``row_limit`` < 1,
            ``tensorboard=True`` (checked before any work); a bad dataset (from
            :func:`perflab.experiment.run`).
    """
    if tensorboard:
        raise ValueError(f"tensorboard=True: {TENSORBOARD_GONE}")
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0),
                             ("active", active, 1), ("row_limit", row_limit, 1)):
        _check(name, value, low)

    on_gpu = config.resolved_device().type == "cuda"
    out = Path(trace_dir) if trace_dir is not None else default_results_dir() / "traces"
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", config.display_label())[:60]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path, n = out / f"{slug}-{stamp}.json", 1
    while path.exists():
        n += 1
        path = out / f"{slug}-{stamp}-{n}.json"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))
                                ) as prof:
        result = run(config.replace(warmup_steps=wait + warmup, steps=max(active, 2)),
                     profiler=prof, save=False, progress=progress)
    if not path.is_file():
        raise RuntimeError(f"torch.profiler did not write {path}")
    return ProfileSummary(top_ops=_top_ops(prof, row_limit, on_gpu), trace_path=str(path),
                          phases=phase_times(load_trace(path)), result=result,
                          diagnosis=diagnose(result))


def _main_process(config: RunConfig) -> RunConfig:
    return config.replace(num_workers=0, persistent_workers=False, prefetch_factor=None,
                          pin_memory=False)


def _short(path: str) -> str:
    """Path for tables: after site-packages, relative to perflab's parent, or last 2 parts."""
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.split(marker)[-1]
    root = Path(__file__).resolve().parents[2].as_posix() + "/"
    return p[len(root):] if p.startswith(root) else "/".join(p.split("/")[-2:])


def cprofile_loader(config: RunConfig, *, batches: int = 5, top: int = 20) -> pd.DataFrame:
    """``cProfile`` over loading ``batches`` batches of ``config``'s training data.

    cProfile sees only the calling process, so the loader loads in this one:
    ``num_workers=0``, ``persistent_workers=False``, ``prefetch_factor=None``,
    ``pin_memory=False``. Building the loader is not profiled. cProfile records Python
    functions only: time in C (JPEG decode, resize, tensor ops) is attributed to the
    builtin or C-extension call that ran it.

    Returns:
        The ``top`` rows by own time: ``function`` ("file:line(name)", path shortened;
        builtins as ``{built-in method ...}``), ``ncalls``, ``tottime_s`` (own time, s),
        ``cumtime_s`` (with callees, s), ``percall_ms`` (tottime / ncalls, ms).

    Raises:
        ValueError: ``batches`` or ``top`` < 1; a bad dataset (see ``make_loader``).
    """
    _check("batches", batches, 1)
    _check("top", top, 1)

    it = infinite_batches(make_loader(_main_process(config)))
    try:
        with cProfile.Profile() as prof:
            for _ in range(batches):
                next(it)
    finally:
        it.close()
    rows = [(pstats.func_std_string((file if file == "~" else _short(file), line, name)),
             nc, tt, ct, 1e3 * tt / nc if nc else 0.0)
            for (file, line, name), (_, nc, tt, ct, _) in pstats.Stats(prof).stats.items()]
    df = pd.DataFrame(rows, columns=["function", "ncalls", "tottime_s", "cumtime_s",
                                     "percall_ms"])
    return df.sort_values("tottime_s", ascending=False).head(top).reset_index(drop=True)


def line_profile_dataset(config: RunConfig, *, samples: int = 32) -> pd.DataFrame:
    """``line_profiler`` timings of the dataset's ``__getitem__`` and the train transform.

    Profiles ``type(dataset).__getitem__``, ``type(dataset.transform).__call__`` and
    :mod:`perflab.data.loader`'s ``random_resized_crop``, ``to_tensor`` and ``normalize`` while
    ``dataset[i % len(dataset)]`` runs for ``i < samples`` in this process. A line's time
    includes the calls it makes, so a caller's line also counts its callees' lines.

    Returns:
        One row per executed line, functions in registration order: ``function``
        ("file:line(qualname)"), ``lineno``, ``hits``, ``time_ms``, ``per_hit_us``,
        ``pct_of_function`` (% of the function's summed line times), ``source`` (the
        stripped line). Times converted with ``get_stats().unit`` (seconds per tick).

    Raises:
        ValueError: ``samples`` < 1; a bad dataset (see ``make_loader``).
    """
    _check("samples", samples, 1)
    import line_profiler

    from perflab.data import loader as data

    dataset = data.make_loader(_main_process(config)).dataset
    funcs = [type(dataset).__getitem__]
    if callable(getattr(dataset, "transform", None)):
        funcs.append(type(dataset.transform).__call__)
    funcs += [getattr(data, n) for n in ("random_resized_crop", "to_tensor", "normalize")
              if hasattr(data, n)]
    lp = line_profiler.LineProfiler()
    for f in funcs:
        lp.add_callable(f)
    with lp:
        for i in range(samples):
            dataset[i % len(dataset)]
    stats = lp.get_stats()
    rows = []
    for (file, first, name), entries in stats.timings.items():
        total = sum(t for _, _, t in entries)
        rows += [(f"{_short(file)}:{first}({name})", lineno, hits, t * stats.unit * 1e3,
                  t * stats.unit * 1e6 / hits if hits else 0.0,
                  100 * t / total if total else 0.0, linecache.getline(file, lineno).strip())
                 for lineno, hits, t in sorted(entries)]
    return pd.DataFrame(rows, columns=["function", "lineno", "hits", "time_ms",
                                       "per_hit_us", "pct_of_function", "source"])


def memory_profile_step(config: RunConfig) -> pd.DataFrame:
    """``memory_profiler``'s line-by-line memory of :func:`perflab.train.step.train_step`.

    The first step of a fresh model (:func:`perflab.train.step.build_training`, one batch loaded
    in this process) runs under ``memory_profiler.LineProfiler`` (psutil backend), which
    reads the process's resident set size (RSS) at each line. RSS shows only what the OS
    gives the process: allocators keep freed memory for reuse, so a line that frees
    tensors (backward releasing activations) may show no decrease. GPU memory is not in
    RSS; on CUDA use ``torch.cuda.memory_stats`` (Lab 04).

    Returns:
        One row per executed line: ``lineno``, ``mem_usage_mib`` (RSS after the line,
        MiB), ``increment_mib`` (change over the line, MiB), ``occurrences``, ``source``.
        The first row (the ``def`` line) is the RSS on entry: memory_profiler counts its
        increment from 0, so it equals ``mem_usage_mib``.

    Raises:
        ValueError: a bad dataset (see ``make_loader``).
    """
    import memory_profiler


    loader, model, optimizer, device = build_training(_main_process(config))
    x, y = next(iter(loader))  # (B, 3, S, S) float32, (B,) int64
    x, y = x.to(device), y.to(device)
    mp = memory_profiler.LineProfiler(backend="psutil")
    mp.add_function(train_step)
    previous_trace = sys.gettrace()
    try:
        with mp:
            train_step(model, x, y, optimizer)
    finally:
        sys.settrace(previous_trace)  # memory_profiler restores it too; be sure
    rows = [(lineno, mem[1], mem[0], mem[2], linecache.getline(file, lineno).strip())
            for file, lines in mp.code_map.items() for lineno, mem in lines if mem]
    return pd.DataFrame(rows, columns=["lineno", "mem_usage_mib", "increment_mib",
                                       "occurrences", "source"])


def step_ranges(trace: Any, names: tuple[str, ...] | list[str]) -> list[dict]:
    """Which named ranges each profiled step holds, in order, and the ATen ops in each.

    Reads the CPU events of a Chrome trace (``export_chrome_trace``): the
    ``ProfilerStep#N`` ranges that ``prof.step()`` marks, the ``record_function`` ranges
    named in ``names`` (category ``user_annotation``), and the ``cpu_op`` events. A range
    belongs to the step whose span contains it; an op to the range that contains it on
    the same thread (CPU autograd runs backward on the calling thread).

    Args:
        trace: a dict from :func:`perflab.analysis.trace.load_trace`, or a path.
        names: range names to look for (e.g. ``("data", "forward", "backward",
            "optimizer")``).

    Returns:
        Plain values (JSON-ready): one dict per step, in order, ``{"step":
        "ProfilerStep#N", "ranges": [{"name", "ops"}, ...]}`` with the step's ranges in
        start order and ``ops`` the sorted distinct ``aten::`` op names inside; ranges
        in no step come last under ``"step": None``.

    Raises:
        ValueError / FileNotFoundError: see :func:`perflab.analysis.trace.load_trace`.
    """
    ev = events_frame(trace)
    ev = ev.assign(end_us=ev["ts_us"] + ev["dur_us"])
    ann = ev[ev["cat"] == "user_annotation"]
    steps = ann[ann["name"].str.match(r"ProfilerStep#\d+$")].sort_values("ts_us")
    ranges = ann[ann["name"].isin(list(names))].sort_values("ts_us")
    ops = ev[(ev["cat"] == "cpu_op") & ev["name"].str.startswith("aten::")]
    eps = 1e-3  # microseconds: ranges written with the same clock nest exactly

    def inside(df, outer):
        return df[(df["ts_us"] >= outer.ts_us - eps) & (df["end_us"] <= outer.end_us + eps)
                  & (df["tid"] == outer.tid)]

    out, used = [], set()
    for st in steps.itertuples():
        held = inside(ranges, st)
        used.update(held.index)
        out.append({"step": st.name, "ranges": [
            {"name": r.name, "ops": sorted(set(inside(ops, r)["name"]))}
            for r in held.itertuples()]})
    rest = ranges.drop(index=list(used))
    if len(rest):
        out.append({"step": None, "ranges": [
            {"name": r.name, "ops": sorted(set(inside(ops, r)["name"]))}
            for r in rest.itertuples()]})
    return out


@contextlib.contextmanager
def quiet_native_stderr():
    """Send what C++ code writes to file descriptor 2 to ``/dev/null`` inside the block.

    torch.profiler (Kineto) writes a timestamped ``USDT: ... profiler_start`` /
    ``profiler_stop`` line to the process's stderr at every session; a Jupyter kernel
    captures it as cell output, and a graded cell whose stored output must match would
    fail on the timestamp. Python's ``sys.stderr`` (warnings, tracebacks) is untouched:
    only the native descriptor is redirected, and restored on exit.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
