"""Read torch.profiler's Chrome/Kineto traces and total perflab's phases in them.

A trace is the JSON that ``torch.profiler.profile.export_chrome_trace`` (or
``torch.profiler.tensorboard_trace_handler``) writes: the Chrome Trace Event Format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), with
Kineto's additions (``deviceProperties``, ``distributedInfo``). Every timed range is a
"complete" event (``"ph": "X"``) with a start ``ts`` and a duration ``dur``, both in
microseconds (floats in recent Kineto versions).

:class:`~perflab.core.timing.PhaseTimer` wraps each phase of a step in
``torch.profiler.record_function("perflab:<phase>")``; in the trace these are CPU events
of category ``user_annotation`` (on CUDA, Kineto also writes a copy of each range on the
GPU timeline with category ``gpu_user_annotation``; :func:`phase_times` uses the CPU
ones). The profiler's schedule marks each step with a ``ProfilerStep#N`` range.

The functions here take the parsed trace (a dict), so the same code reads traces made on
this machine and traces recorded elsewhere (for example on a GPU cluster).

:func:`load_ranks` reads one trace per rank and prepares each as Meta's
HolisticTraceAnalysis (HTA, github.com/facebookresearch/HolisticTraceAnalysis,
``hta/common/trace.py``, ``trace_parser.py``, ``trace_filter.py``) does, so that
:mod:`perflab.analysis.trace_analysis` (built on this module) gets HTA's numbers:

* events with a duration and a category, except category ``Trace``; when a GPU trace's
  timestamps are floats (nanosecond-resolution Kineto), each event is rounded inwards to
  whole microseconds (start up, end down; pytorch/pytorch#122425). CPU-only traces,
  which HTA does not analyse, keep their times as written;
* a *device event* has ``args.stream >= 0`` and ``args.correlation >= 0`` (or is named
  ``Event Sync`` / ``Context Sync``); every other event is a host (CPU) event;
* with two or more ``ProfilerStep#N`` ranges, the last profiled step is dropped: host
  events starting before the last step starts are kept, and device events whose
  correlation id matches a kept host event's.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

import numpy as np
import pandas as pd

from perflab.core.result import PHASES

__all__ = ["load_trace", "events_frame", "phase_times", "load_ranks", "RankTrace",
           "PHASE_PREFIX", "EVENT_COLUMNS", "PHASE_COLUMNS"]

#: Name prefix of PhaseTimer's ranges (``PhaseTimer.PREFIX``).
PHASE_PREFIX = "perflab:"
#: Columns of :func:`events_frame`.
EVENT_COLUMNS = ("name", "cat", "ts_us", "dur_us", "pid", "tid")
#: Columns of :func:`phase_times`.
PHASE_COLUMNS = ("total_ms", "count", "per_step_ms", "share_pct")

TraceLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a Chrome/Kineto trace file (``.json``, or gzip-compressed ``.json.gz``).

    Compression is detected from the file's first bytes (gzip magic ``1f 8b``), not from
    its name.

    Returns:
        The trace as a dict; ``trace["traceEvents"]`` is the list of events.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not (gzipped) JSON, or has no ``traceEvents`` list.
            Every message names the path.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"trace file {p} does not exist; record one with "
                                "perflab.analysis.profiling.profile() or torch.profiler's "
                                "export_chrome_trace")
    with open(p, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(p, "rt", encoding="utf-8") if gz
              else open(p, encoding="utf-8")) as f:
            trace = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, OSError) as e:
        kind = "gzip-compressed JSON" if gz else "JSON"
        raise ValueError(f"{p} is not valid {kind} ({e}); is it a Chrome trace written "
                         "by torch.profiler (export_chrome_trace)?") from e
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{p} is JSON but has no 'traceEvents' list, so it is not a "
                         "Chrome/Kineto trace; pass a file written by torch.profiler's "
                         "export_chrome_trace")
    return trace


def _as_trace(trace: TraceLike) -> Mapping[str, Any]:
    if isinstance(trace, Mapping):
        if not isinstance(trace.get("traceEvents"), list):
            raise ValueError("trace dict has no 'traceEvents' list; pass the dict that "
                             "load_trace() returns")
        return trace
    return load_trace(trace)


def events_frame(trace: TraceLike) -> pd.DataFrame:
    """The trace's complete events (``ph == "X"``), one row each, in file order.

    Args:
        trace: a dict from :func:`load_trace`, or a path to a trace file.

    Returns:
        DataFrame with columns ``name`` (str), ``cat`` (str; e.g. ``cpu_op``,
        ``user_annotation``, ``kernel``, ``gpu_memcpy``, ``cuda_runtime``; "" when
        absent), ``ts_us`` (start, microseconds since the trace's clock origin, float),
        ``dur_us`` (duration, microseconds, float), ``pid``, ``tid`` (as written: ints
        for host threads, ints or strings for GPU streams). Empty (with these columns)
        when the trace has no complete events.

    Raises:
        ValueError / FileNotFoundError: see :func:`load_trace`.
    """
    events = _as_trace(trace)["traceEvents"]
    rows = [(e.get("name", ""), e.get("cat", ""), e.get("ts", 0.0), e.get("dur", 0.0),
             e.get("pid"), e.get("tid"))
            for e in events if isinstance(e, Mapping) and e.get("ph") == "X"]
    df = pd.DataFrame.from_records(rows, columns=list(EVENT_COLUMNS))
    return df.astype({"name": str, "cat": str, "ts_us": "float64", "dur_us": "float64"})


def phase_times(trace: TraceLike) -> pd.DataFrame:
    """Time spent in each PhaseTimer phase, from the ``perflab:<phase>`` ranges.

    Only CPU-side ranges (category ``user_annotation``) count; the GPU-timeline copies
    (``gpu_user_annotation``) are ignored, so a phase is the host time from entering to
    leaving it (PhaseTimer syncs the device at each phase boundary, so device work
    launched inside a phase finishes inside it).

    Args:
        trace: a dict from :func:`load_trace`, or a path to a trace file.

    Returns:
        DataFrame indexed by phase name without the prefix (``data``, ``forward``,
        ``backward``, ``optimizer`` in that order, then any other perflab phase, such as
        ``comm``, in order of first appearance), with columns

        * ``total_ms``: summed duration of the phase's ranges, milliseconds;
        * ``count``: number of ranges;
        * ``per_step_ms``: ``total_ms`` / number of ``ProfilerStep#N`` ranges (the
          profiled steps), or / ``count`` when the trace has no step ranges;
        * ``share_pct``: ``total_ms`` as a percentage of the phases' sum (the phases
          only: time outside every phase is not in the denominator).

        Empty (with these columns) when the trace has no perflab ranges.

    Raises:
        ValueError / FileNotFoundError: see :func:`load_trace`.
    """
    ev = events_frame(trace)
    cpu = ev[ev["cat"] == "user_annotation"]
    steps = int(cpu["name"].str.match(r"ProfilerStep#\d+$").sum())
    ranges = cpu[cpu["name"].str.startswith(PHASE_PREFIX)]
    names = ranges["name"].str.slice(len(PHASE_PREFIX))
    grouped = ranges.groupby(names, sort=False)["dur_us"].agg(["sum", "count"])
    order = [p for p in PHASES if p in grouped.index]
    order += [p for p in grouped.index if p not in PHASES]
    grouped = grouped.reindex(order)
    out = pd.DataFrame({"total_ms": grouped["sum"] / 1e3,
                        "count": grouped["count"].astype("int64")},
                       index=pd.Index(order, name="phase"))
    out["per_step_ms"] = out["total_ms"] / (steps if steps else out["count"])
    total = out["total_ms"].sum()
    out["share_pct"] = 100 * out["total_ms"] / total if total > 0 else 0.0
    return out[list(PHASE_COLUMNS)]


# HTA's event classes (hta/common/types.py, trace_filter.py).
_STEP = re.compile(r"^ProfilerStep#(\d+)")
_KERNEL_CATS = {"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy",
                "mtia_ccp_events"}
_SYNC_NAMES = {"Event Sync", "Context Sync"}


@dataclass(frozen=True, eq=False)
class RankTrace:
    """One rank's trace as HTA sees it (the module docstring says how).

    ``events``: DataFrame, one row per kept event: ``name`` (str), ``cat`` (str), ``ts``
    and ``end`` (float64 microseconds), ``stream`` and ``correlation`` (int64, -1 when
    absent), ``on_device``, ``kernel`` (a kernel, memcpy or memset), ``step`` (a
    ``ProfilerStep#N`` range) (bool). ``on_gpu``: the trace has device kernels. ``trace``:
    the parsed file (for :func:`perflab.analysis.trace.phase_times`). ``path``: its file or None.
    """

    rank: int
    events: pd.DataFrame
    on_gpu: bool
    trace: Mapping[str, Any]
    path: str | None

    def __repr__(self) -> str:
        kind = "GPU" if self.on_gpu else "CPU-only"
        return f"RankTrace(rank={self.rank}, {kind}, {len(self.events)} events)"


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _prepare(trace: Mapping[str, Any], rank: int, path: str | None) -> RankTrace:
    events = trace["traceEvents"]
    rows, float_ts, empty = [], False, {}
    for e in events:  # a plain loop: json gives dicts; this is most of the load time
        if type(e) is not dict:
            continue
        ts = e.get("ts")
        if type(ts) is not int:
            float_ts = True  # a float (or missing) timestamp: HTA's ts column is float64
            if ts is None:
                continue
        cat = e.get("cat")
        if cat is None or cat == "Trace" or "dur" not in e:
            continue
        args = e.get("args")
        args = args if type(args) is dict else empty
        stream, corr = args.get("stream", -1), args.get("correlation", -1)
        rows.append((str(e.get("name", "")), str(cat), float(ts), float(e["dur"]),
                     stream if type(stream) is int else _as_int(stream),
                     corr if type(corr) is int else _as_int(corr)))
    df = pd.DataFrame.from_records(
        rows, columns=["name", "cat", "ts", "dur", "stream", "correlation"])
    df = df.astype({"ts": "float64", "dur": "float64", "stream": "int64",
                    "correlation": "int64"})
    df["end"] = df["ts"] + df["dur"]
    df["on_device"] = (((df["stream"] >= 0) & (df["correlation"] >= 0))
                       | df["name"].isin(_SYNC_NAMES))
    df["kernel"] = df["cat"].isin(_KERNEL_CATS)  # kernel, memcpy, memset
    df["step"] = df["name"].str.match(_STEP)     # ProfilerStep#N ranges
    on_gpu = bool((df["on_device"] & df["kernel"]).any())
    if float_ts and on_gpu:  # as HTA: ns-resolution GPU traces, inwards to whole us
        df["ts"], df["end"] = np.ceil(df["ts"]), np.floor(df["end"])
    is_step = df["step"]
    host = ~df["on_device"]
    if df.loc[is_step, "name"].nunique() >= 2 and host.any():
        host_steps = df["ts"][host & is_step]
        last_start = host_steps.max() if len(host_steps) else df["ts"][host].min()
        keep_host = host & (df["ts"] < last_start)
        kept = set(df.loc[keep_host, "correlation"])
        df = df[keep_host | (df["on_device"] & df["correlation"].isin(kept))]
    return RankTrace(rank=rank, events=df.drop(columns="dur").reset_index(drop=True),
                     on_gpu=on_gpu, trace=trace, path=path)


def _rank_of(trace: Mapping[str, Any], path: str | None, position: int) -> int:
    info = trace.get("distributedInfo")
    if isinstance(info, Mapping) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = re.search(r"rank[-_]?(\d+)", Path(path).name) if path else None
    return int(m.group(1)) if m else position


def load_ranks(source: TraceLike | Iterable[TraceLike] | Mapping[int, TraceLike]
               ) -> dict[int, RankTrace]:
    """Read one trace per rank and prepare each as HTA does (module docstring).

    Args:
        source: a folder (every ``*.json`` / ``*.json.gz`` file in it, one per rank, as
            ``tensorboard_trace_handler`` or a DDP job writes them), one trace file, a
            dict from :func:`perflab.analysis.trace.load_trace`, a list of these, a
            ``{rank: file or dict}`` mapping, or the result of an earlier call.

    Returns:
        ``{rank: RankTrace}`` sorted by rank. A trace's rank is its
        ``distributedInfo.rank`` (Kineto writes it under DDP), else the number after
        "rank" in its file name, else its position in ``source``.

    Raises:
        ValueError: a folder with no trace files, an empty list, or two traces of one
            rank. FileNotFoundError / ValueError: see :func:`perflab.analysis.trace.load_trace`.
    """
    if isinstance(source, Mapping) and source and all(
            isinstance(v, RankTrace) for v in source.values()):
        return dict(sorted(source.items()))
    if isinstance(source, Mapping) and "traceEvents" not in source:
        items = [(int(r), s) for r, s in source.items()]
    else:
        if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
            files = sorted(p for p in Path(source).iterdir() if p.is_file()
                           and p.name.endswith((".json", ".json.gz")))
            if not files:
                raise ValueError(f"{source} holds no *.json or *.json.gz trace files; "
                                 "pass the folder torch.profiler wrote its traces to")
            source = files
        single = isinstance(source, (str, os.PathLike, Mapping))
        items = [(None, s) for s in ([source] if single else list(source))]
    if not items:
        raise ValueError("load_ranks needs at least one trace; got an empty list or dict")
    # Parsing a trace allocates ~10^5 objects at once; the cyclic garbage collector then
    # rescans the whole heap (torch's included) several times, which costs 5-10x the
    # parse itself. None of these objects form cycles, so it is paused while reading.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _read_all(items)
    finally:
        if gc_was_on:
            gc.enable()


def _read_all(items: list[tuple[int | None, Any]]) -> dict[int, RankTrace]:
    out: dict[int, RankTrace] = {}
    for position, (rank, s) in enumerate(items):
        path = None if isinstance(s, Mapping) else str(s)
        trace = s if isinstance(s, Mapping) else load_trace(s)
        if not isinstance(trace.get("traceEvents"), list):
            raise ValueError("trace dict has no 'traceEvents' list; pass the dict that "
                             "perflab.analysis.trace.load_trace() returns")
        rank = _rank_of(trace, path, position) if rank is None else rank
        if rank in out:
            raise ValueError(f"two traces for rank {rank} ({out[rank].path or 'a dict'} "
                             f"and {path or 'a dict'}); pass one trace per rank, or a "
                             "{rank: trace} mapping")
        out[rank] = _prepare(trace, rank, path)
    return dict(sorted(out.items()))

