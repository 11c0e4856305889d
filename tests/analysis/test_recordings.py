"""perflab.analysis.recordings: the GPU traces and nccl-tests tables shipped as package
data load, hold what their SOURCES.md says, and ship (package data globs, licenses).

The nccl-tests checks are consistency checks of real data: every row's busbw must be
algbw * 2(n-1)/n (nccl-tests' doc/PERFORMANCE.md) to the two decimals printed, with n the
number of ranks the source states, and algbw must be size / time to the digits printed.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from perflab.analysis.recordings import (NCCL_TABLE_NRANKS, NCCL_TESTS_COLUMNS, gpu_trace,
                                         gpu_trace_names, nccl_table_names, read_nccl_tests)
from perflab.analysis.trace import load_ranks
from perflab.analysis.trace_analysis import (comm_comp_overlap, idle_time_breakdown,
                                             temporal_breakdown)
from perflab.course.release import PACKAGE_DATA

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "perflab" / "recordings"

#: What SOURCES.md says of each trace: ranks, and the GPU in deviceProperties (None: the
#: trace records none).
TRACES = {"single-gpu-resnet50": ([0], "Tesla V100-SXM2-32GB"),
          "two-rank-ddp": ([0, 1], None)}


@pytest.fixture(scope="module", params=sorted(TRACES))
def trace(request):
    name = request.param
    return name, load_ranks(gpu_trace(name))


def test_the_traces_are_shipped():
    assert gpu_trace_names() == sorted(TRACES)
    for name in TRACES:
        folder = gpu_trace(name)
        assert folder.is_dir() and folder.parent == RECORDINGS / "gpu"
        assert sorted(p.name for p in folder.iterdir()) == [
            f"rank-{r}.json.gz" for r in TRACES[name][0]]


def test_each_trace_is_a_gpu_training_step_with_the_ranks_and_gpu_its_sources_give(trace):
    name, ranks = trace
    want_ranks, gpu = TRACES[name]
    assert list(ranks) == want_ranks
    for rank, rt in ranks.items():
        assert rt.on_gpu
        raw = json.loads(gzip.decompress((gpu_trace(name) / f"rank-{rank}.json.gz")
                                         .read_bytes()))
        names = [p["name"] for p in raw.get("deviceProperties", [])]
        assert (names[0] if names else None) == gpu
        kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
        assert len(kernels) > 1000
        cats = {e.get("cat") for e in raw["traceEvents"]}
        assert {"cpu_op", "cuda_runtime", "kernel"} <= cats
        backward = [e for e in raw["traceEvents"] if "Backward" in str(e.get("name"))]
        assert backward  # a training step: autograd ran


def test_the_resnet_trace_runs_forward_backward_and_an_sgd_step():
    raw = json.loads(gzip.decompress((gpu_trace("single-gpu-resnet50") / "rank-0.json.gz")
                                     .read_bytes()))
    events = raw["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 5
    convs = sum(e["name"] == "aten::conv2d" for e in events)
    assert convs == 5 * 53  # ResNet-50's convolutions, per step
    assert sum(e["name"] == "Optimizer.step#SGD.step" for e in events
               if e.get("cat") == "user_annotation") == 5
    assert raw["distributedInfo"]["world_size"] == 1


def test_the_breakdowns_run_on_every_trace(trace):
    name, ranks = trace
    temporal = temporal_breakdown(ranks)
    assert list(temporal.index) == TRACES[name][0]
    assert (temporal["device"] == "gpu").all()
    assert (temporal["span_us"] > 0).all()
    shares = temporal[["compute_pct", "non_compute_pct", "idle_pct"]].sum(axis=1)
    assert shares.sub(100).abs().max() < 1e-6
    assert (temporal["compute_us"] > 0).all()
    idle = idle_time_breakdown(ranks)
    assert (idle["idle_us"] > 0).all()  # CPU-side gaps: the streams wait on the host
    overlap = comm_comp_overlap(ranks)
    if name == "two-rank-ddp":
        assert (overlap["comm_us"] > 0).all() and overlap["overlap_pct"].between(0, 100).all()
    else:
        assert (overlap["comm_us"] == 0).all()  # one rank: no NCCL kernel


def test_the_resnet_trace_is_mostly_compute():
    t = temporal_breakdown(gpu_trace("single-gpu-resnet50")).loc[0]
    assert t["compute_pct"] > 90 and 0 < t["idle_pct"] < 10


@pytest.mark.parametrize("name", sorted(NCCL_TABLE_NRANKS))
def test_each_nccl_table_parses_into_rows_over_message_sizes(name):
    table = read_nccl_tests(name)
    assert tuple(table.columns) == NCCL_TESTS_COLUMNS
    assert len(table) >= 10
    assert table["size_bytes"].is_monotonic_increasing and table["size_bytes"].is_unique
    assert table["size_bytes"].iloc[0] == 8 and table["size_bytes"].iloc[-1] >= 2 ** 31
    assert table["size_bytes"].dtype == "int64" and table["count"].dtype == "int64"
    assert (table["size_bytes"] == 4 * table["count"]).all()  # float: 4 bytes
    assert set(table["dtype"]) == {"float"} and set(table["redop"]) == {"sum"}
    for col in NCCL_TESTS_COLUMNS[4:]:
        assert table[col].dtype == "float64" and (table[col] >= 0).all()
    assert table.attrs == {"nranks": NCCL_TABLE_NRANKS[name],
                           "source": f"perflab/recordings/nccl/{name}.txt"}


@pytest.mark.parametrize("name", sorted(NCCL_TABLE_NRANKS))
def test_busbw_is_algbw_times_2_n_minus_1_over_n_to_the_printed_precision(name):
    table = read_nccl_tests(name)
    n = table.attrs["nranks"]
    factor = 2 * (n - 1) / n
    for suffix in ("", "_inplace"):
        algbw, busbw = table[f"algbw_GBps{suffix}"], table[f"busbw_GBps{suffix}"]
        # each printed with two decimals: each is off by at most 0.005
        assert (busbw - factor * algbw).abs().max() <= 0.005 * (1 + factor) + 1e-9
        # algbw = size / time (GB/s = 1e9 bytes/s; time printed with 4-5 digits)
        exact = table["size_bytes"] / (table[f"time_us{suffix}"] * 1e-6) / 1e9
        assert ((exact - algbw).abs() <= 0.005 + 5e-4 * exact).all()


def test_nranks_comes_from_the_rank_lines_when_the_output_has_them():
    # 2 x p4d: nccl-tests' older rank lines ("#   Rank  0 Pid ...", no Group), tagged by
    # mpirun, and NCCL's INFO log ("... rank 1 nranks 16 ...")
    text = (RECORDINGS / "nccl" / "aws-p4d-2node-16gpu-efa.txt").read_text()
    assert read_nccl_tests(text).attrs == {"nranks": 16, "source": "text"}
    no_rank_lines = [ln for ln in text.splitlines() if "Rank" not in ln]
    assert read_nccl_tests("\n".join(no_rank_lines)).attrs["nranks"] == 16   # from the log
    table_only = "\n".join(ln for ln in no_rank_lines if "nranks" not in ln)
    assert read_nccl_tests(table_only).attrs["nranks"] is None
    log = "host:1:2 [0] NCCL INFO comm 0x5 rank 0 nranks 4 cudaDev 0 - Init COMPLETE\n"
    assert read_nccl_tests(log + table_only).attrs["nranks"] == 4
    # newer rank lines carry a Group (made-up hosts and a made-up row)
    newer = "".join(f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on node-{r // 2} device  {r % 2} "
                    f"[0000:04:00] NVIDIA H100 80GB HBM3\n" for r in range(6))
    row = "           8             2     float     sum      -1    20.00    0.00    0.00      0    20.00    0.00    0.00      0\n"
    assert read_nccl_tests(newer + row).attrs["nranks"] == 6


def test_older_and_tagged_formats_parse():
    older = (  # nccl-tests before 2.x: no root column, an error column instead of #wrong
        "#       size         count    type   redop     time   algbw   busbw  error     time"
        "   algbw   busbw  error\n"
        "           8             2   float     sum    48.46    0.00    0.00  1e-07    48.17"
        "    0.00    0.00  1e-07\n"
        "   134217728      33554432   float     sum   1818.8   73.80  129.14  2e-07   1821.9"
        "   73.67  128.92  2e-07\n")
    table = read_nccl_tests(older)
    assert table["size_bytes"].tolist() == [8, 134217728]
    assert table["busbw_GBps"].tolist() == [0.0, 129.14]
    assert table["time_us_inplace"].tolist() == [48.17, 1821.9]
    tagged = ("[1,0]<stdout>:     1048576        262144     float     sum      -1    28.56"
              "   36.71   64.24      0    28.37   36.96   64.68      0\n")
    assert read_nccl_tests(tagged)["algbw_GBps_inplace"].tolist() == [36.96]
    assert len(read_nccl_tests(tagged.strip())) == 1  # one row, no newline


@pytest.mark.parametrize("text", [
    "#  size  count  type  redop  root  time  algbw  busbw  #wrong\n# Avg bus bandwidth : 1\n",
    "NCCL INFO Bootstrap : Using eth0\nsomething else\n",
    "     8    2   float   sum   -1   12.9   0.00\n"])  # a row cut short
def test_text_without_result_rows_is_refused(text):
    with pytest.raises(ValueError, match="no nccl-tests result rows"):
        read_nccl_tests(text)


def test_unknown_names_are_refused_listing_the_shipped_ones():
    with pytest.raises(ValueError, match="aws-p5-1node-8gpu"):
        read_nccl_tests("dgx-h100")
    with pytest.raises(ValueError, match="not a file name"):
        read_nccl_tests("all_reduce.txt")
    with pytest.raises(ValueError, match="no shipped nccl-tests table ''"):
        read_nccl_tests("")
    with pytest.raises(ValueError, match="single-gpu-resnet50"):
        gpu_trace("alexnet")
    with pytest.raises(ValueError, match="two-rank-ddp"):
        gpu_trace("../nccl")


def test_the_names_list_what_ships():
    assert nccl_table_names() == sorted(NCCL_TABLE_NRANKS)
    assert sorted(p.stem for p in (RECORDINGS / "nccl").glob("*.txt")) == nccl_table_names()


def test_sources_and_licenses_sit_beside_the_recordings_and_ship():
    gpu, nccl = RECORDINGS / "gpu", RECORDINGS / "nccl"
    gpu_sources = (gpu / "SOURCES.md").read_text()
    nccl_sources = (nccl / "SOURCES.md").read_text()
    assert "MIT License" in (gpu / "LICENSE-HolisticTraceAnalysis").read_text()
    for licence in ("LICENSE-awsome-distributed-training", "LICENSE-aws-efa-eks"):
        assert "Amazon.com" in (nccl / licence).read_text()
    assert "no longer shipped" in nccl_sources   # the unlicensed table it replaced, said so
    for name in gpu_trace_names():
        assert f"`{name}/" in gpu_sources
    for name in nccl_table_names():
        assert f"`{name}.txt`" in nccl_sources
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["perflab"]
    assert tuple(globs) == PACKAGE_DATA
    for path in [*gpu.rglob("*"), *nccl.rglob("*")]:
        if path.is_file():
            rel = path.relative_to(ROOT / "perflab").as_posix()
            assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


def test_everything_shipped_stays_small():
    size = sum(p.stat().st_size for folder in ("gpu", "nccl")
               for p in (RECORDINGS / folder).rglob("*") if p.is_file())
    assert size < 1.5e6


def test_a_table_reads_as_a_frame_for_an_alpha_beta_fit():
    table = read_nccl_tests("aws-p5-2node-16gpu-efa")
    big = table[table["size_bytes"] >= 2 ** 28]
    assert isinstance(table, pd.DataFrame)
    assert (big["busbw_GBps"] > 300).all()  # 2 x p5.48xlarge: EFA at 3,200 Gbps
