"""Grader-only: hidden GPU traces for the trace-reading exercises (Labs 01, 06, 08) and
the references that judge them.

A hidden case is a window of a **real** recorded trace shipped in
``perflab/recordings/gpu/`` (HolisticTraceAnalysis's MIT-licensed test traces, see the
SOURCES.md there), prepared as HTA prepares it (:func:`perflab.analysis.trace.load_ranks`)
and then perturbed by the grader so that no answer can be read off a file: kernels
dropped, stretched into the gap after them and shifted inside their gap, and the whole
window moved in time. The stream order of the kernels is kept (a stream runs its
kernels one after another), so every quantity stays well defined; what changes is which
gaps are host waits, which are short kernel waits, how long each stream is busy and how
much communication runs under computation.

The references are perflab's analyses, which equal HTA 0.6.1 on the shipped traces
(``tests/analysis/test_trace_analysis.py``): :func:`perflab.analysis.trace_analysis.
idle_time_breakdown`, ``temporal_breakdown`` and ``comm_comp_overlap``, called on the
perturbed events here, in the grader.
"""
from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["EVENT_FIELDS", "hidden_trace", "events_of", "reference_stream_idle",
           "reference_temporal", "reference_overlap"]

#: The columns of a hidden case's ``events`` records (those of
#: :attr:`perflab.analysis.trace.RankTrace.events`), in order.
EVENT_FIELDS = ("name", "cat", "ts", "end", "stream", "correlation", "on_device", "kernel")


@functools.lru_cache(maxsize=4)
def _load(name: str, rank: int) -> pd.DataFrame:   # read-only below: every use copies
    from perflab.analysis.recordings import gpu_trace
    from perflab.analysis.trace import load_ranks

    return load_ranks(gpu_trace(name))[rank].events


def hidden_trace(rng: random.Random, name: str, rank: int = 0, *, max_kernels: int = 160,
                 drop: float = 0.1, stretch: float = 0.25, shift: float = 0.25
                 ) -> list[list[Any]]:
    """A perturbed window of a shipped real GPU trace, as JSON-ready rows.

    Args:
        rng: the case's random generator (the grader's draw).
        name: a trace folder of ``perflab/recordings/gpu`` (``gpu_trace_names()``).
        rank: which rank's file.
        max_kernels: at most this many device kernels (kernel, memcpy, memset) in the
            window: a contiguous run of the rank's kernels in start order, at a random
            place.
        drop, stretch, shift: per-kernel probabilities: dropped; its end moved a random
            part of the way to the next kernel's start on its stream; moved a random
            part of its gap, earlier or later, never before its launch (the host event
            with its correlation id) and never over a neighbour.

    Returns:
        Rows ``[name, cat, ts, end, stream, correlation, on_device, kernel]``
        (:data:`EVENT_FIELDS`; times in whole microseconds as floats): the window's
        kernels, their launches, the other device events (e.g. ``gpu_user_annotation``
        ranges) and host events that fall in the window, in start order.
    """
    ev = _load(name, rank)
    dev = ev[(ev["stream"] != -1) & ev["kernel"]].sort_values("ts", kind="stable")
    n = len(dev)
    first = rng.randrange(0, max(1, n - max_kernels + 1))
    window = dev.iloc[first:first + max_kernels]
    t0, t1 = window["ts"].min(), window["end"].max()
    host = ev[~ev["on_device"]]
    launch = host[host["correlation"].isin(set(window["correlation"]))]
    launch_ts = dict(zip(launch["correlation"], launch["ts"]))
    others = ev[~ev.index.isin(window.index) & ~ev.index.isin(launch.index)
                & (ev["ts"] >= t0) & (ev["end"] <= t1)]
    others = others[others["correlation"] == -1]   # no orphaned device event or launch
    kernels = []
    for _, k in window.groupby("stream", sort=True):
        rows = [r for r in k.sort_values("ts").to_dict("records") if rng.random() >= drop]
        for i, r in enumerate(rows):
            nxt = rows[i + 1]["ts"] if i + 1 < len(rows) else r["end"]
            if rng.random() < stretch and nxt > r["end"]:
                r["end"] = float(r["end"] + np.floor(rng.random() * (nxt - r["end"])))
            if rng.random() < shift:
                lo = max(rows[i - 1]["end"] if i else r["ts"],
                         launch_ts.get(r["correlation"], r["ts"]) + 1)
                hi = nxt - (r["end"] - r["ts"]) if i + 1 < len(rows) else r["ts"]
                if hi > lo:
                    move = float(np.floor(lo + rng.random() * (hi - lo))) - r["ts"]
                    r["ts"], r["end"] = r["ts"] + move, r["end"] + move
        kernels += rows
    kept = {r["correlation"] for r in kernels}
    table = pd.concat([pd.DataFrame(kernels), launch[launch["correlation"].isin(kept)],
                       others], ignore_index=True)
    offset = float(np.floor(t0)) - rng.randrange(0, 10_000)
    table["ts"] -= offset
    table["end"] -= offset
    table = table.sort_values(["ts", "end"], kind="stable")
    return [[str(r.name), str(r.cat), float(r.ts), float(r.end), int(r.stream),
             int(r.correlation), bool(r.on_device), bool(r.kernel)]
            for r in table.itertuples(index=False)]


def events_of(rows: list[list[Any]]) -> pd.DataFrame:
    """The rows of :func:`hidden_trace` as the events DataFrame a student's function
    gets (:data:`EVENT_FIELDS` columns, ``stream``/``correlation`` int64, ``ts``/``end``
    float64 microseconds, ``on_device``/``kernel`` bool)."""
    df = pd.DataFrame(rows, columns=list(EVENT_FIELDS))
    return df.astype({"ts": "float64", "end": "float64", "stream": "int64",
                      "correlation": "int64", "on_device": "bool", "kernel": "bool"})


def _ranks(rows: list[list[Any]]) -> dict:
    from perflab.analysis.trace import RankTrace

    ev = events_of(rows)
    ev["step"] = False
    on_gpu = bool((ev["on_device"] & ev["kernel"]).any())
    return {0: RankTrace(rank=0, events=ev, on_gpu=on_gpu, trace={}, path=None)}


def reference_stream_idle(rows: list[list[Any]], delay_us: float) -> pd.DataFrame:
    """Lab 01's reference: per device stream, ``kernels`` (count), ``busy_us`` (their
    summed durations), and HTA's idle categories ``host_wait_us``, ``kernel_wait_us``,
    ``other_us`` (:func:`perflab.analysis.trace_analysis.idle_time_breakdown`,
    ``by_stream=True``, ``consecutive_kernel_delay_us=delay_us``). Index: ``stream``,
    sorted; microseconds."""
    from perflab.analysis.trace_analysis import idle_time_breakdown

    ev = events_of(rows)
    k = ev[(ev["stream"] != -1) & ev["kernel"]]
    out = pd.DataFrame({"kernels": k.groupby("stream").size(),
                        "busy_us": (k["end"] - k["ts"]).groupby(k["stream"]).sum()})
    idle = idle_time_breakdown(_ranks(rows), by_stream=True,
                               consecutive_kernel_delay_us=delay_us)
    wide = idle.pivot_table(index="stream", columns="idle_category", values="idle_us",
                            aggfunc="sum")
    for cat in ("host_wait", "kernel_wait", "other"):
        out[f"{cat}_us"] = wide[cat] if cat in wide else 0.0
    return out.fillna(0.0).sort_index()


def reference_temporal(rows: list[list[Any]]) -> dict[str, float]:
    """Lab 08's reference: HTA's temporal breakdown of the rows (``span_us``,
    ``compute_us``, ``non_compute_us``, ``idle_us``; :func:`perflab.analysis.
    trace_analysis.temporal_breakdown`)."""
    from perflab.analysis.trace_analysis import temporal_breakdown

    row = temporal_breakdown(_ranks(rows)).iloc[0]
    return {k: float(row[k]) for k in ("span_us", "compute_us", "non_compute_us", "idle_us")}


def reference_overlap(rows: list[list[Any]]) -> dict[str, float]:
    """Lab 06's reference: communication time, the part of it under computation and its
    share (``comm_us``, ``overlap_us``, ``overlap_pct``; :func:`perflab.analysis.
    trace_analysis.comm_comp_overlap`)."""
    from perflab.analysis.trace_analysis import comm_comp_overlap

    row = comm_comp_overlap(_ranks(rows)).iloc[0]
    return {k: float(row[k]) for k in ("comm_us", "overlap_us", "overlap_pct")}
