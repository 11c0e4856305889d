"""perflab.analysis.trace's per-rank analyses against HolisticTraceAnalysis (HTA) on real GPU traces,
on a synthetic nanosecond-resolution GPU trace, and on CPU traces recorded here.

Reference values (the HTA_* constants) were computed once with HTA 0.6.1 (PyPI
``traceinsight==0.6.1``, with pandas 3.1.1, in a throwaway venv beside this project's):

    from hta.trace_analysis import TraceAnalysis
    a = TraceAnalysis(trace_dir=FOLDER)
    a.get_temporal_breakdown(visualize=False)
    a.get_comm_comp_overlap(visualize=False)
    a.get_idle_time_breakdown(ranks=a.t.get_ranks(), visualize=False)[0]

with FOLDER = ../shared/fixtures/gpu-traces/two-rank-ddp and .../single-gpu-alexnet (HTA's
own MIT-licensed test traces), and a folder holding ``rank-0.json`` =
``json.dump(synthetic_gpu_trace())`` from this file. They are HTA's results, not ours.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from perflab.core.result import PHASES
from perflab.analysis.trace import RankTrace, load_ranks, load_trace, phase_times
from perflab.analysis.trace_analysis import (
    comm_comp_overlap, idle_time_breakdown, phase_breakdown, plot_breakdown,
    temporal_breakdown,
)
from perflab.analysis.trace_analysis import IDLE_COLUMNS, OVERLAP_COLUMNS, TEMPORAL_COLUMNS
from tests.synthetic import record_tiny_cpu_trace

GPU_TRACES = Path(__file__).resolve().parents[2].parent / "shared/fixtures/gpu-traces"

# HTA 0.6.1 get_temporal_breakdown: rank -> (idle_time(us), compute_time(us),
# non_compute_time(us), kernel_time(us), idle_time_pctg, compute_time_pctg,
# non_compute_time_pctg)
HTA_TEMPORAL = {
    "two-rank-ddp": {0: (321378.0, 106252.0, 172428.0, 600058.0, 53.56, 17.71, 28.74),
                     1: (328671.0, 135548.0, 136455.0, 600674.0, 54.72, 22.57, 22.72)},
    "single-gpu-alexnet": {0: (12929684.0, 10630.0, 55697.0, 12996011.0, 99.49, 0.08,
                               0.43)},
}
# HTA 0.6.1 get_comm_comp_overlap: rank -> comp_comm_overlap_pctg
HTA_OVERLAP = {"two-rank-ddp": {0: 11.81, 1: 20.05}}
# HTA 0.6.1 get_idle_time_breakdown(ranks=all)[0]: (rank, stream, idle_category) ->
# (idle_time, idle_time_ratio); HTA rounds to 2 decimals and lists only the categories
# that occur on a stream.
HTA_IDLE = {
    "two-rank-ddp": {
        (0, 23, "host_wait"): (596037.0, 1.00), (0, 23, "kernel_wait"): (70.0, 0.00),
        (0, 23, "other"): (34.0, 0.00), (0, 84, "host_wait"): (148934.0, 1.00),
        (0, 84, "kernel_wait"): (6.0, 0.00), (0, 84, "other"): (0.0, 0.00),
        (0, 25, "kernel_wait"): (9.0, 0.00), (0, 25, "other"): (47865.0, 1.00),
        (0, 7, "host_wait"): (213825.0, 0.45), (0, 7, "kernel_wait"): (1985.0, 0.00),
        (0, 7, "other"): (261740.0, 0.55), (0, 203, "other"): (0.0, math.nan),
        (1, 23, "host_wait"): (596313.0, 1.00), (1, 23, "kernel_wait"): (100.0, 0.00),
        (1, 23, "other"): (0.0, 0.00), (1, 25, "kernel_wait"): (9.0, 0.00),
        (1, 25, "other"): (53028.0, 1.00), (1, 7, "host_wait"): (156827.0, 0.36),
        (1, 7, "kernel_wait"): (1816.0, 0.00), (1, 7, "other"): (281064.0, 0.64),
        (1, 84, "host_wait"): (251860.0, 0.92), (1, 84, "other"): (23247.0, 0.08),
        (1, 203, "other"): (0.0, math.nan)},
    "single-gpu-alexnet": {
        (0, 7, "host_wait"): (12855007.0, 1.0), (0, 7, "kernel_wait"): (104.0, 0.0),
        (0, 7, "other"): (0.0, 0.0), (0, 20, "host_wait"): (12011718.0, 1.0),
        (0, 20, "kernel_wait"): (3.0, 0.0), (0, 20, "other"): (0.0, 0.0)},
}


def fixture_dir(name: str) -> Path:
    folder = GPU_TRACES / name
    if not folder.is_dir():
        pytest.skip(f"shared GPU trace fixtures not found at {folder} (the ../shared "
                    "folder beside the repo holds HolisticTraceAnalysis's test traces)")
    return folder


def synthetic_gpu_trace() -> dict:
    """A small Kineto-shaped GPU trace with float (ns-resolution) timestamps: 3 profiler
    steps, each launching a GEMM and a memcpy on stream 7 and an NCCL allreduce on
    stream 20 that partly overlaps the GEMM; the host launches late in step 2."""
    ev: list[dict] = []
    corr = 100
    for step in range(3):
        t0 = 1000.0 + 400.0 * step
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": 390.25, "args": {}})
        launches = [("ampere_sgemm_128x64_nn", 7, 10.4, 120.3),
                    ("Memcpy DtoD (Device -> Device)", 7, 20.7, 15.5),
                    ("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 30.2, 150.6)]
        gpu_t = t0 + 50.5 + (90.0 if step == 2 else 0.0)
        for name, stream, launch_at, dur in launches:
            corr += 1
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": 1, "tid": 1, "ts": t0 + launch_at + (90.0 if step == 2
                                                                   else 0.0),
                       "dur": 5.3, "args": {"correlation": corr}})
            start = gpu_t if stream == 20 else gpu_t + (0.0 if cat == "kernel" else 125.1)
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                       "ts": start + 40.0 * (stream == 20), "dur": dur,
                       "args": {"stream": stream, "correlation": corr, "device": 0}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": ev}


# HTA 0.6.1 on synthetic_gpu_trace() (see the module docstring).
HTA_SYNTHETIC_TEMPORAL = (210.0, 238.0, 142.0, 590.0, 35.59, 40.34, 24.07)
HTA_SYNTHETIC_OVERLAP = 52.67
HTA_SYNTHETIC_IDLE = {(0, 7, "host_wait"): (260.0, 0.96), (0, 7, "kernel_wait"): (12.0, 0.04),
                      (0, 7, "other"): (0.0, 0.00), (0, 20, "host_wait"): (250.0, 1.00),
                      (0, 20, "other"): (0.0, 0.00)}


def check_temporal(ours: pd.DataFrame, hta: dict) -> None:
    assert list(ours.index) == sorted(hta)
    for rank, (idle, comp, non, span, idle_pct, comp_pct, non_pct) in hta.items():
        row = ours.loc[rank]
        assert row["device"] == "gpu" and row["note"] == ""
        assert (row["idle_us"], row["compute_us"], row["non_compute_us"],
                row["span_us"]) == pytest.approx((idle, comp, non, span), abs=1e-6)
        assert (row["idle_pct"], row["compute_pct"], row["non_compute_pct"]) == \
            pytest.approx((idle_pct, comp_pct, non_pct), abs=0.005 + 1e-9)


def check_idle(ours: pd.DataFrame, hta: dict) -> None:
    mine = ours.set_index(["rank", "stream", "idle_category"])
    for key, (idle_us, ratio) in hta.items():
        assert mine.loc[key, "idle_us"] == pytest.approx(idle_us, abs=1e-6), key
        if math.isnan(ratio):
            assert math.isnan(mine.loc[key, "idle_ratio"]), key
        else:
            assert mine.loc[key, "idle_ratio"] == pytest.approx(ratio, abs=0.005 + 1e-9)
    # categories HTA leaves out never occurred: no idle time in them
    missing = mine.index.difference(pd.MultiIndex.from_tuples(list(hta)))
    assert (mine.loc[missing, "idle_us"] == 0).all()


@pytest.mark.parametrize("name", sorted(HTA_TEMPORAL))
def test_temporal_breakdown_agrees_with_hta(name):
    check_temporal(temporal_breakdown(fixture_dir(name)), HTA_TEMPORAL[name])


def test_comm_comp_overlap_agrees_with_hta():
    ours = comm_comp_overlap(fixture_dir("two-rank-ddp"))
    assert list(ours.columns) == list(OVERLAP_COLUMNS)
    for rank, pct in HTA_OVERLAP["two-rank-ddp"].items():
        assert ours.loc[rank, "overlap_pct"] == pytest.approx(pct, abs=0.005 + 1e-9)
        assert 0 < ours.loc[rank, "overlap_us"] < ours.loc[rank, "comm_us"]


def test_overlap_without_comm_kernels_is_nan():
    ours = comm_comp_overlap(fixture_dir("single-gpu-alexnet"))
    assert math.isnan(ours.loc[0, "overlap_pct"]) and ours.loc[0, "comm_us"] == 0
    assert "no communication kernels" in ours.loc[0, "note"]


@pytest.mark.parametrize("name", sorted(HTA_IDLE))
def test_idle_time_breakdown_agrees_with_hta(name):
    ranks = load_ranks(fixture_dir(name))
    check_idle(idle_time_breakdown(ranks, by_stream=True), HTA_IDLE[name])
    per_rank = idle_time_breakdown(ranks)
    assert list(per_rank.columns) == list(IDLE_COLUMNS)
    for rank in ranks:
        hta = {k: v for k, v in HTA_IDLE[name].items() if k[0] == rank}
        for cat in ("host_wait", "kernel_wait", "other"):
            assert per_rank.loc[rank, f"{cat}_us"] == pytest.approx(
                sum(v[0] for k, v in hta.items() if k[2] == cat))
        assert per_rank.loc[rank, ["host_wait_pct", "kernel_wait_pct", "other_pct"]
                            ].sum() == pytest.approx(100)


def test_two_ranks_found_by_distributed_info():
    ranks = load_ranks(fixture_dir("two-rank-ddp"))
    assert list(ranks) == [0, 1] and all(isinstance(r, RankTrace) for r in ranks.values())
    assert "rank=1, GPU" in repr(ranks[1])


def test_synthetic_ns_trace_agrees_with_hta():
    trace = synthetic_gpu_trace()
    check_temporal(temporal_breakdown(trace), {0: HTA_SYNTHETIC_TEMPORAL})
    assert comm_comp_overlap(trace).loc[0, "overlap_pct"] == pytest.approx(
        HTA_SYNTHETIC_OVERLAP, abs=0.005 + 1e-9)
    check_idle(idle_time_breakdown(trace, by_stream=True), HTA_SYNTHETIC_IDLE)


# --- CPU traces recorded here ------------------------------------------------------------

ACTIVE = 3


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    """A real CPU-only Chrome trace of ACTIVE PhaseTimer-annotated steps of a tiny MLP."""
    return record_tiny_cpu_trace(tmp_path_factory.mktemp("cpu-trace") / "trace.json", ACTIVE)


def test_cpu_trace_temporal_breakdown(cpu_trace):
    ranks = load_ranks(cpu_trace)
    assert list(ranks) == [0] and not ranks[0].on_gpu
    t = temporal_breakdown(ranks)
    assert list(t.columns) == list(TEMPORAL_COLUMNS)
    row = t.loc[0]
    assert row["device"] == "cpu" and "CPU-only" in row["note"]
    assert row["span_us"] > 0 and row["compute_us"] > 0 and row["idle_us"] >= 0
    assert row["non_compute_us"] == 0  # no collective calls in a single-process trace
    assert row["compute_us"] + row["non_compute_us"] + row["idle_us"] == pytest.approx(
        row["span_us"])
    assert row[["compute_pct", "non_compute_pct", "idle_pct"]].sum() == pytest.approx(100)
    # the span lies inside the profiled steps (ProfilerStep ranges)
    ev = ranks[0].events
    step_us = (ev[ev["step"]]["end"] - ev[ev["step"]]["ts"]).sum()
    assert row["span_us"] <= step_us


def test_cpu_trace_gpu_only_quantities_are_nan_with_a_note(cpu_trace):
    overlap = comm_comp_overlap(cpu_trace).loc[0]
    assert math.isnan(overlap["overlap_pct"]) and "not applicable" in overlap["note"]
    idle = idle_time_breakdown(cpu_trace).loc[0]
    assert math.isnan(idle["host_wait_us"]) and "not applicable" in idle["note"]
    assert idle_time_breakdown(cpu_trace, by_stream=True).empty


def test_phase_breakdown_per_rank(cpu_trace, tmp_path):
    other = json.loads(Path(cpu_trace).read_text())
    other["distributedInfo"] = {"rank": 1}
    (tmp_path / "b.json").write_text(json.dumps(other))
    phases = phase_breakdown([cpu_trace, tmp_path / "b.json"])
    assert list(phases.index) == [0, 1] and list(phases.columns) == list(PHASES)
    expected = phase_times(cpu_trace)["per_step_ms"]
    assert phases.loc[0].tolist() == pytest.approx(expected.tolist())
    assert phases.loc[1].tolist() == pytest.approx(expected.tolist())


def test_phase_breakdown_without_perflab_ranges():
    phases = phase_breakdown(synthetic_gpu_trace())
    assert list(phases.index) == [0] and phases.columns.empty


def _op(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_cpu_collective_calls_are_non_compute():
    # one op [0, 100) holding an allreduce call [40, 70); a gap [100, 150); an op to 200
    trace = {"traceEvents": [_op("aten::mm", 0, 100), _op("c10d::allreduce_", 40, 30),
                             _op("record_param_comms", 45, 10), _op("aten::add", 150, 50)]}
    row = temporal_breakdown(trace).loc[0]
    assert (row["span_us"], row["compute_us"], row["non_compute_us"], row["idle_us"]) == \
        pytest.approx((200.0, 120.0, 30.0, 50.0))


def test_trace_without_cpu_ops_is_nan():
    row = temporal_breakdown({"traceEvents": [_op("x", 0, 5, cat="user_annotation")]}).loc[0]
    assert math.isnan(row["span_us"]) and "no cpu_op" in row["note"]


# --- loading and bad input ---------------------------------------------------------------

def test_load_ranks_forms(cpu_trace, tmp_path):
    (tmp_path / "rank-3.json").write_text(Path(cpu_trace).read_text())
    (tmp_path / "notes.txt").write_text("not a trace")
    assert list(load_ranks(tmp_path)) == [3]  # rank from the file name
    assert list(load_ranks({5: cpu_trace, 2: load_trace(cpu_trace)})) == [2, 5]
    ranks = load_ranks([load_trace(cpu_trace)])
    assert list(ranks) == [0] and load_ranks(ranks) == ranks  # prepared: returned as is


def test_load_ranks_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="no \\*.json"):
        load_ranks(tmp_path)


@pytest.mark.parametrize("empty", [[], {}])
def test_load_ranks_empty_list(empty):
    with pytest.raises(ValueError, match="at least one trace"):
        load_ranks(empty)


def test_load_ranks_duplicate_rank(cpu_trace, tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rank-1.json").write_text(Path(cpu_trace).read_text())
    with pytest.raises(ValueError, match="two traces for rank 1"):
        load_ranks([tmp_path / "a" / "rank-1.json", tmp_path / "b" / "rank-1.json"])


def test_load_ranks_dict_without_events():
    with pytest.raises(ValueError, match="traceEvents"):
        load_ranks({0: {"schemaVersion": 1}})


@pytest.mark.parametrize("delay", [-1, "30", float("nan"), True])
def test_idle_breakdown_rejects_bad_delay(delay):
    with pytest.raises(ValueError, match="consecutive_kernel_delay_us"):
        idle_time_breakdown(synthetic_gpu_trace(), consecutive_kernel_delay_us=delay)


def test_plot_breakdown(cpu_trace):
    t = pd.concat([temporal_breakdown(synthetic_gpu_trace()),
                   temporal_breakdown(cpu_trace).rename(index={0: 1})])
    fig = plot_breakdown(t)
    ax = fig.axes[0]
    assert [len(c) for c in ax.containers] == [2, 2, 2]
    widths = [[bar.get_width() for bar in c] for c in ax.containers]
    assert [sum(w) for w in zip(*widths)] == pytest.approx([100, 100])
    assert fig._repr_png_()[:4] == b"\x89PNG"


@pytest.mark.parametrize("bad", [pd.DataFrame(), pd.DataFrame({"x": [1]}), [1, 2]])
def test_plot_breakdown_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="temporal_breakdown"):
        plot_breakdown(bad)
