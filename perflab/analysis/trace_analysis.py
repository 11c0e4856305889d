"""Per-rank analysis of torch.profiler traces: where the time went, with HTA's definitions.

The quantities are those of Meta's HolisticTraceAnalysis (HTA, github.com/
facebookresearch/HolisticTraceAnalysis, ``hta/analyzers/breakdown_analysis.py`` and
``communication_analysis.py``; docs at hta.readthedocs.io), computed here from the same
events so the numbers agree with ``TraceAnalysis.get_temporal_breakdown``,
``get_comm_comp_overlap`` and ``get_idle_time_breakdown`` on GPU traces (the tests check
this against values HTA 0.6.1 computed). Written here rather than imported because HTA
pulls in JupyterLab, plotly and a multiprocess parser, raises on CPU-only traces, and is
slower on small traces; ``benchmarks/trace_vs_hta.py`` times both. The traces are read
and prepared as HTA prepares them by :func:`perflab.analysis.trace.load_ranks` (its module
docstring lists the rules); every function here accepts what ``load_ranks`` accepts.

On CPU-only traces (no device events, where HTA raises) the temporal breakdown uses the
``cpu_op`` events of the profiled steps instead, and the quantities that only exist on an
accelerator (overlap of communication and compute kernels, the idle-time split into
host wait / kernel wait) are NaN with the reason in the ``note`` column.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Iterable, Mapping, Union

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure


from perflab.viz.figures import InlineFigure
from perflab.analysis.trace import RankTrace, load_ranks, phase_times

__all__ = ["temporal_breakdown", "comm_comp_overlap", "idle_time_breakdown",
           "phase_breakdown", "plot_breakdown", "TEMPORAL_COLUMNS", "OVERLAP_COLUMNS",
           "IDLE_COLUMNS", "IDLE_CATEGORIES"]

#: Columns of :func:`temporal_breakdown` (index: ``rank``).
TEMPORAL_COLUMNS = ("device", "span_us", "compute_us", "non_compute_us", "idle_us",
                    "compute_pct", "non_compute_pct", "idle_pct", "note")
#: Columns of :func:`comm_comp_overlap` (index: ``rank``).
OVERLAP_COLUMNS = ("device", "comm_us", "overlap_us", "overlap_pct", "note")
#: HTA's idle-time categories (``IdleTimeType``), in order.
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
#: Columns of :func:`idle_time_breakdown` (index: ``rank``).
IDLE_COLUMNS = ("device", "idle_us", *(f"{c}_us" for c in IDLE_CATEGORIES),
                *(f"{c}_pct" for c in IDLE_CATEGORIES), "note")

# HTA's kernel classification (hta/common/types.py), tried in this order: communication,
# memory, computation (a kernel none of these patterns excludes), other. ``re.match``.
_COMM = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
_MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
_NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)"
    r"|(cuda.*LaunchKernel)|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)"
    r"|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)")
# Host-side collective calls on CPU traces (torch.distributed's profiler ranges).
_CPU_COMM = re.compile(r"^(c10d::|gloo:|nccl:|record_param_comms)")
_CPU_ONLY = "CPU-only trace: analysed on cpu_op events"
#: Bar colours of :func:`plot_breakdown` (Okabe-Ito, as perflab.viz.plots).
_COLORS = {"compute": "#0072B2", "non_compute": "#E69F00", "idle": "#B0B0B0"}

Ranks = Union[str, os.PathLike[str], Mapping[Any, Any], Iterable[Any]]


def _load(source: Ranks) -> dict[int, RankTrace]:
    # Imported here, not at the top, because perflab.analysis.trace re-exports this module.
    return load_ranks(source)


def _union(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals [ts, end) into disjoint sorted ones (HTA's merge_kernel_intervals:
    an interval joins the previous group unless it starts after every earlier end)."""
    if len(ts) == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.empty(len(ts), dtype=bool)
    new[0], new[1:] = True, ts[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    starts = ts[new]
    ends = np.full(len(starts), -np.inf)
    np.maximum.at(ends, group, end)
    return starts, ends


def _length(starts: np.ndarray, ends: np.ndarray) -> float:
    return float(np.sum(ends - starts)) if len(starts) else 0.0


def _intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
                  ) -> float:
    """Total length of the intersection of two disjoint sorted interval sets."""
    total, i, j = 0.0, 0, 0
    (a0, a1), (b0, b1) = a, b
    while i < len(a0) and j < len(b0):
        total += max(0.0, min(a1[i], b1[j]) - max(a0[i], b0[j]))
        if a1[i] < b1[j]:
            i += 1
        else:
            j += 1
    return total


def _kernel_type(names: pd.Series) -> pd.Series:
    uniq = pd.Series(names.unique())
    kind = np.where(uniq.str.match(_COMM), "comm", np.where(
        uniq.str.match(_MEMORY), "memory",
        np.where(uniq.str.match(_NOT_COMPUTE), "other", "compute")))
    return names.map(dict(zip(uniq, kind)))


def _rows(ranks: Mapping[int, RankTrace], fn: Callable[[RankTrace], tuple],
          columns: Iterable[str]) -> pd.DataFrame:
    return pd.DataFrame([fn(rt) for rt in ranks.values()], columns=list(columns),
                        index=pd.Index(list(ranks), name="rank"))


def _temporal(rt: RankTrace) -> tuple:
    ev = rt.events
    if rt.on_gpu:
        dev = ev[ev["stream"] != -1]
        busy = _union(dev["ts"].to_numpy(), dev["end"].to_numpy())
        comp = dev[_kernel_type(dev["name"]) == "compute"]
        compute = _length(*_union(comp["ts"].to_numpy(), comp["end"].to_numpy()))
        span = float(busy[1][-1] - busy[0][0])
        idle = span - _length(*busy)
        non_compute, note = span - compute - idle, ""
    else:
        ops = ev[ev["cat"] == "cpu_op"]
        steps = ev[(ev["cat"] == "user_annotation") & ev["step"]]
        if len(steps):  # the profiled steps only (ProfilerStep ranges)
            ops = ops[(ops["ts"] >= steps["ts"].min()) & (ops["ts"] < steps["end"].max())]
        if ops.empty:
            return ("cpu", *[math.nan] * 7, "no cpu_op events in this trace")
        busy = _union(ops["ts"].to_numpy(), ops["end"].to_numpy())
        comm = ops[ops["name"].str.match(_CPU_COMM)]
        non_compute = _length(*_union(comm["ts"].to_numpy(), comm["end"].to_numpy()))
        span = float(busy[1][-1] - busy[0][0])
        idle = span - _length(*busy)
        compute = _length(*busy) - non_compute
        note = (f"{_CPU_ONLY}: compute = time inside cpu ops but outside collective "
                "calls (c10d/gloo), idle = no cpu op running on any thread")
    pct = [100 * x / span if span > 0 else math.nan for x in (compute, non_compute, idle)]
    return ("gpu" if rt.on_gpu else "cpu", span, compute, non_compute, idle, *pct, note)


def temporal_breakdown(source: Ranks
                       ) -> pd.DataFrame:
    """Compute / non-compute / idle time of each rank (HTA's ``get_temporal_breakdown``).

    GPU traces: ``span_us`` is HTA's ``kernel_time(us)``: from the first device event's
    start to the last one's end (events with a stream). ``idle_us``: time in the span with
    no device event running (span minus the union of the events). ``compute_us``: the
    union of computation kernels (not NCCL, memcpy/memset, sync). ``non_compute_us`` =
    span - compute - idle (communication, memory copies, syncs when no compute kernel
    runs). CPU-only traces: the same over ``cpu_op`` events of the profiled steps, with
    collective calls (``c10d::``, ``gloo:``, ``record_param_comms``) as non-compute;
    ``note`` says so. Shares ``*_pct`` are of ``span_us`` (percent, not rounded).

    Args:
        source: anything :func:`perflab.analysis.trace.load_ranks` accepts.

    Returns:
        DataFrame indexed by ``rank`` with :data:`TEMPORAL_COLUMNS` (microseconds).

    Raises:
        see :func:`perflab.analysis.trace.load_ranks`.
    """
    return _rows(_load(source), _temporal, TEMPORAL_COLUMNS)


def _overlap(rt: RankTrace) -> tuple:
    if not rt.on_gpu:
        return ("cpu", math.nan, math.nan, math.nan,
                f"{_CPU_ONLY}: not applicable, gloo runs collectives on background "
                "threads that the CPU profiler does not record")
    dev = rt.events[rt.events["stream"] != -1]
    kind = _kernel_type(dev["name"])
    comm = _union(dev["ts"][kind == "comm"].to_numpy(), dev["end"][kind == "comm"].to_numpy())
    comp = _union(dev["ts"][kind == "compute"].to_numpy(),
                  dev["end"][kind == "compute"].to_numpy())
    comm_us = _length(*comm)
    if comm_us == 0:
        return ("gpu", 0.0, 0.0, math.nan, "no communication kernels in this trace")
    overlap = _intersection(comm, comp)
    return ("gpu", comm_us, overlap, 100 * overlap / comm_us, "")


def comm_comp_overlap(source: Ranks
                      ) -> pd.DataFrame:
    """Share of communication time overlapped by computation (HTA's
    ``get_comm_comp_overlap``).

    ``comm_us``: union of communication (NCCL) kernel intervals; ``overlap_us``: the part
    of it during which a computation kernel also runs; ``overlap_pct`` = 100 *
    overlap_us / comm_us (HTA's ``comp_comm_overlap_pctg``; NaN without communication
    kernels). NaN with a note on CPU-only traces.

    Returns:
        DataFrame indexed by ``rank`` with :data:`OVERLAP_COLUMNS` (microseconds, %).

    Raises:
        see :func:`perflab.analysis.trace.load_ranks`.
    """
    return _rows(_load(source), _overlap, OVERLAP_COLUMNS)


def _idle_by_stream(rt: RankTrace, delay_us: float) -> pd.DataFrame:
    ev = rt.events
    host = ev[~ev["on_device"] & (ev["correlation"] != -1)]
    launch_ts = host.drop_duplicates("correlation", keep="last").set_index(
        "correlation")["ts"]
    k = ev[(ev["stream"] != -1) & ev["kernel"]]
    k = k.sort_values(["stream", "ts"], kind="stable")
    prev_end = k.groupby("stream")["end"].shift(1)
    gap = k["ts"] - prev_end
    host_wait = k["correlation"].map(launch_ts) > prev_end
    cat = np.where(host_wait, "host_wait", np.where(gap < delay_us, "kernel_wait", "other"))
    table = gap.groupby([k["stream"], cat]).sum().unstack(fill_value=0.0)
    return table.reindex(columns=list(IDLE_CATEGORIES), fill_value=0.0)


def _idle(rt: RankTrace, delay_us: float, by_stream: bool):
    if not rt.on_gpu:
        note = (f"{_CPU_ONLY}: not applicable, host wait / kernel wait are gaps between "
                "kernels on a device stream")
        if by_stream:
            return pd.DataFrame(columns=["stream", "idle_category", "idle_us",
                                         "idle_ratio"])
        return ("cpu", *[math.nan] * 7, note)
    table = _idle_by_stream(rt, delay_us)
    if by_stream:
        long = table.stack().rename("idle_us").reset_index()
        long.columns = ["stream", "idle_category", "idle_us"]
        total = long.groupby("stream")["idle_us"].transform("sum")
        long["idle_ratio"] = long["idle_us"] / total.where(total > 0)
        return long
    sums = table.sum()
    idle = float(sums.sum())
    pct = [100 * sums[c] / idle if idle > 0 else math.nan for c in IDLE_CATEGORIES]
    return ("gpu", idle, *(float(sums[c]) for c in IDLE_CATEGORIES), *pct, "")


def idle_time_breakdown(source: Ranks, *,
                        consecutive_kernel_delay_us: float = 30.0,
                        by_stream: bool = False) -> pd.DataFrame:
    """Why the device streams sat idle (HTA's ``get_idle_time_breakdown``).

    On each stream the kernels (kernel, memcpy, memset) are taken in start order; the gap
    before a kernel is *host wait* when its launch (the host event with the same
    correlation id) started after the previous kernel ended (the host was too slow to
    enqueue work), else *kernel wait* when shorter than ``consecutive_kernel_delay_us``
    (launch overhead between back-to-back kernels), else *other* (e.g. waiting for an
    event from another stream).

    Args:
        source: anything :func:`perflab.analysis.trace.load_ranks` accepts.
        consecutive_kernel_delay_us: kernel-wait threshold, microseconds (HTA's
            ``consecutive_kernel_delay``, default 30). HTA's docstring and its docs page
            "Idle Time Breakdown" call that default 30 nanoseconds, but HTA compares it
            with gaps computed from the trace's ``ts`` and ``dur``, which are Kineto's
            microseconds (``hta/analyzers/breakdown_analysis.py``; HTA relabelled its
            outputs from ns to us in PR #51, 2023, and the threshold's doc kept the old
            unit): the threshold HTA applies is 30 us, as here.
        by_stream: False: one row per rank, categories summed over streams; True: HTA's
            long layout, one row per (rank, stream, category).

    Returns:
        by_stream False: DataFrame indexed by ``rank`` with :data:`IDLE_COLUMNS` (``*_pct``
        of the rank's summed idle time; NaN with a note on CPU-only traces). by_stream
        True: columns ``rank, stream, idle_category, idle_us, idle_ratio`` (the category's
        share of the stream's idle time; NaN when the stream never idles).

    Raises:
        ValueError: ``consecutive_kernel_delay_us`` negative or not a number (checked
            first); see :func:`perflab.analysis.trace.load_ranks`.
    """
    if (isinstance(consecutive_kernel_delay_us, bool)
            or not isinstance(consecutive_kernel_delay_us, (int, float))
            or not consecutive_kernel_delay_us >= 0):
        raise ValueError("consecutive_kernel_delay_us must be a number >= 0 (microseconds;"
                         f" HTA's default is 30), got {consecutive_kernel_delay_us!r}")
    ranks = _load(source)
    if not by_stream:
        return _rows(ranks, lambda rt: _idle(rt, consecutive_kernel_delay_us, False),
                     IDLE_COLUMNS)
    parts = [_idle(rt, consecutive_kernel_delay_us, True).assign(rank=r)
             for r, rt in ranks.items()]
    cols = ["rank", "stream", "idle_category", "idle_us", "idle_ratio"]
    return pd.concat([p[cols] for p in parts], ignore_index=True)


def phase_breakdown(source: Ranks) -> pd.DataFrame:
    """Time inside each ``perflab:<phase>`` range (``record_function``) per rank.

    Returns:
        DataFrame indexed by ``rank``, one column per phase (``data``, ``forward``,
        ``backward``, ``optimizer``, then others such as ``comm``): milliseconds per
        profiled step (:func:`perflab.analysis.trace.phase_times`' ``per_step_ms``); NaN where a
        rank has no such range. Empty columns when no trace has perflab ranges.

    Raises:
        see :func:`perflab.analysis.trace.load_ranks`.
    """
    ranks = _load(source)
    per_rank = {r: phase_times(rt.trace)["per_step_ms"] for r, rt in ranks.items()}
    df = pd.DataFrame(per_rank).T if any(len(s) for s in per_rank.values()) else \
        pd.DataFrame(index=list(per_rank))
    df.index.name, df.columns.name = "rank", "phase"
    return df.astype("float64")


def plot_breakdown(temporal: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Per-rank stacked bars of :func:`temporal_breakdown`: compute, non-compute and idle
    shares (percent of each rank's span), one bar per rank, the device in the label.

    Args:
        temporal: a DataFrame from :func:`temporal_breakdown`.
        ax: draw into this Axes; None -> a new figure.

    Returns:
        The Figure; ``ax.containers`` holds one ``BarContainer`` per category (compute,
        non_compute, idle) with one bar per rank.

    Raises:
        ValueError: ``temporal`` is empty or lacks the ``*_pct`` columns.
    """
    need = ["compute_pct", "non_compute_pct", "idle_pct"]
    if not isinstance(temporal, pd.DataFrame) or temporal.empty or any(
            c not in temporal.columns for c in need):
        raise ValueError("plot_breakdown needs the non-empty DataFrame that "
                         f"temporal_breakdown() returns (columns {need})")
    if ax is None:
        ax = InlineFigure(figsize=(6.0, 1.4 + 0.5 * len(temporal)),
                           layout="constrained").add_subplot()
    ys = np.arange(len(temporal))
    left = np.zeros(len(temporal))
    for key in ("compute", "non_compute", "idle"):
        width = temporal[f"{key}_pct"].fillna(0.0).to_numpy()
        ax.barh(ys, width, left=left, height=0.6, color=_COLORS[key],
                label=key.replace("_", "-"), edgecolor="white", linewidth=0.5)
        left += width
    ax.set_yticks(ys, [f"rank {r} ({d})" for r, d in
                       zip(temporal.index, temporal.get("device", [""] * len(temporal)))])
    ax.set_ylim(len(temporal) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the trace's span (%)")
    ax.set_title("temporal breakdown per rank (HTA's definitions)", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, frameon=False,
              fontsize="small")
    return ax.figure
