"""perflab.analysis.trace on a trace recorded here (tiny model, PhaseTimer phases) and, when the
shared fixtures are present, on a real GPU trace."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from perflab.core.result import PHASES
from perflab.analysis.trace import (
    EVENT_COLUMNS, PHASE_COLUMNS, events_frame, load_trace, phase_times,
)
from tests.synthetic import record_tiny_cpu_trace

GPU_TRACES = Path(__file__).resolve().parents[3] / "shared/fixtures/gpu-traces"
ACTIVE = 3


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real Chrome trace of ACTIVE PhaseTimer-annotated steps of a tiny model."""
    path = record_tiny_cpu_trace(tmp_path_factory.mktemp("trace") / "trace.json", ACTIVE)
    assert path.is_file()
    return path


def test_phase_times_of_a_recorded_trace(recorded):
    phases = phase_times(load_trace(recorded))
    assert list(phases.index) == list(PHASES)
    assert list(phases.columns) == list(PHASE_COLUMNS)
    assert (phases["count"] == ACTIVE).all()
    assert (phases["total_ms"] > 0).all()
    assert phases["per_step_ms"].tolist() == pytest.approx(
        (phases["total_ms"] / ACTIVE).tolist())
    assert phases["share_pct"].sum() == pytest.approx(100)


def test_phase_times_accepts_a_path(recorded):
    pd.testing.assert_frame_equal(phase_times(recorded), phase_times(load_trace(recorded)))


def test_events_frame_columns_and_steps(recorded):
    ev = events_frame(load_trace(recorded))
    assert list(ev.columns) == list(EVENT_COLUMNS)
    assert (ev["dur_us"] >= 0).all()
    assert ev["name"].str.match(r"ProfilerStep#\d+$").sum() == ACTIVE
    assert (ev["cat"] == "cpu_op").any()


def test_load_trace_gz(recorded, tmp_path):
    gz = tmp_path / "trace.json.gz"
    with open(recorded, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert load_trace(gz) == load_trace(recorded)


def test_load_trace_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_trace(tmp_path / "nope.json")


def test_load_trace_not_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json {")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        load_trace(bad)


def test_load_trace_broken_gzip(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": []}')[:12])
    with pytest.raises(ValueError, match="bad.json.gz.*gzip"):
        load_trace(bad)


@pytest.mark.parametrize("content", ['{"events": []}', '[1, 2]', '{"traceEvents": 3}'])
def test_load_trace_not_a_trace(tmp_path, content):
    bad = tmp_path / "other.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match="other.json.*traceEvents"):
        load_trace(bad)


def test_dict_without_events_is_rejected():
    with pytest.raises(ValueError, match="traceEvents"):
        events_frame({"schemaVersion": 1})


def _ev(name, cat, dur, ts=0.0, ph="X"):
    return {"ph": ph, "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def test_phase_times_uses_cpu_annotations_only():
    trace = {"traceEvents": [
        _ev("perflab:backward", "user_annotation", 3000.0),
        _ev("perflab:forward", "user_annotation", 1000.0),
        _ev("perflab:forward", "gpu_user_annotation", 9000.0),  # GPU copy: ignored
        _ev("perflab:forward", "user_annotation", 2000.0),
        _ev("perflab:comm", "user_annotation", 4000.0),
        _ev("process_name", None, 0.0, ph="M"),
    ]}
    phases = phase_times(trace)
    assert list(phases.index) == ["forward", "backward", "comm"]
    assert phases.loc["forward", "total_ms"] == pytest.approx(3.0)
    assert phases.loc["forward", "count"] == 2
    # no ProfilerStep ranges: per step = per range
    assert phases.loc["forward", "per_step_ms"] == pytest.approx(1.5)
    assert phases.loc["comm", "share_pct"] == pytest.approx(40.0)


def test_phase_times_empty_without_perflab_ranges():
    phases = phase_times({"traceEvents": [_ev("aten::mm", "cpu_op", 5.0)]})
    assert phases.empty and list(phases.columns) == list(PHASE_COLUMNS)
    assert events_frame({"traceEvents": []}).columns.tolist() == list(EVENT_COLUMNS)


def test_real_gpu_trace_fixture():
    path = GPU_TRACES / "single-gpu-alexnet" / "rank-0.json.gz"
    if not path.is_file():
        pytest.skip(f"shared GPU trace fixture not found at {path} (the ../shared folder "
                    "beside the repo holds HolisticTraceAnalysis's test traces)")
    trace = load_trace(path)
    ev = events_frame(trace)
    assert len(ev) > 0
    kernels = ev[ev["cat"] == "kernel"]
    assert len(kernels) > 0 and (kernels["dur_us"] > 0).all()
    assert json.dumps(trace["traceEvents"][0])  # plain JSON values


def test_load_ranks_rounds_ns_gpu_traces_inwards_as_hta():
    from perflab.analysis.trace import load_ranks

    def events(ts, dur):
        kernel = {**_ev("gemm", "kernel", dur, ts=ts), "args": {"stream": 7,
                                                              "correlation": 1}}
        return {"traceEvents": [kernel]}

    ev = load_ranks(events(1.2, 3.5))[0].events  # float timestamps: ns-resolution trace
    assert (ev.loc[0, "ts"], ev.loc[0, "end"]) == (2.0, 4.0)
    ev = load_ranks(events(1, 3.5))[0].events  # integer timestamps: kept as written
    assert (ev.loc[0, "ts"], ev.loc[0, "end"]) == (1.0, 4.5)
    cpu = load_ranks({"traceEvents": [_ev("aten::mm", "cpu_op", 3.5, ts=1.2)]})[0]
    assert (cpu.events.loc[0, "ts"], cpu.events.loc[0, "end"]) == (1.2, 4.7)  # CPU: as is


def test_load_ranks_drops_the_last_profiler_step_as_hta():
    from perflab.analysis.trace import load_ranks

    def launch(ts, corr):
        return {**_ev("cudaLaunchKernel", "cuda_runtime", 1.0, ts=ts),
                "args": {"correlation": corr}}

    def kernel(ts, corr):
        return {**_ev("gemm", "kernel", 5.0, ts=ts), "args": {"stream": 7,
                                                              "correlation": corr}}
    trace = {"traceEvents": [_ev("ProfilerStep#1", "user_annotation", 10.0, ts=0),
                             _ev("ProfilerStep#2", "user_annotation", 10.0, ts=10),
                             launch(1, 1), kernel(2, 1), launch(11, 2), kernel(12, 2)]}
    rt = load_ranks(trace)[0]
    assert rt.on_gpu
    assert rt.events["name"].tolist() == ["ProfilerStep#1", "cudaLaunchKernel", "gemm"]


def test_load_ranks_restores_the_garbage_collector(tmp_path):
    import gc

    from perflab.analysis.trace import load_ranks
    assert gc.isenabled()
    load_ranks({"traceEvents": []})
    assert gc.isenabled()
    with pytest.raises(FileNotFoundError):
        load_ranks(tmp_path / "missing.json")
    assert gc.isenabled()
