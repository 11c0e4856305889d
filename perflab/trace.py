"""Read torch.profiler's Chrome/Kineto traces and total perflab's phases in them.

A trace is the JSON that ``torch.profiler.profile.export_chrome_trace`` (or
``torch.profiler.tensorboard_trace_handler``) writes: the Chrome Trace Event Format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), with
Kineto's additions (``deviceProperties``, ``distributedInfo``). Every timed range is a
"complete" event (``"ph": "X"``) with a start ``ts`` and a duration ``dur``, both in
microseconds (floats in recent Kineto versions).

:class:`~perflab.timing.PhaseTimer` wraps each phase of a step in
``torch.profiler.record_function("perflab:<phase>")``; in the trace these are CPU events
of category ``user_annotation`` (on CUDA, Kineto also writes a copy of each range on the
GPU timeline with category ``gpu_user_annotation``; :func:`phase_times` uses the CPU
ones). The profiler's schedule marks each step with a ``ProfilerStep#N`` range.

The functions here take the parsed trace (a dict), so the same code reads traces made on
this machine and traces recorded elsewhere (for example on a GPU cluster).
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Mapping, Union

import pandas as pd

from perflab.result import PHASES

__all__ = ["load_trace", "events_frame", "phase_times", "PHASE_PREFIX", "EVENT_COLUMNS",
           "PHASE_COLUMNS"]

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
                                "perflab.profiling.profile() or torch.profiler's "
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
