"""perflab.analysis.profiling: diagnose() on hand-built results (every branch and threshold edge),
and smoke tests of the four profilers on a tiny ImageFolder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from perflab.analysis import profiling
from perflab.core.config import RunConfig
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.analysis.diagnosis import (
    COMM_SHARE, DATA_WAIT_SHARE, MEMORY_FRACTION, OPTIMIZER_SHARE, diagnose,
)
from perflab.analysis.profiling import TOP_OPS_COLUMNS, profile
from perflab.core.result import PHASES, RunResult

CUDA_PEAK = "CUDA allocator peak (allocated tensors)"


@dataclass(frozen=True, kw_only=True)
class DDPConfig(RunConfig):
    """A RunConfig with the world_size field later labs add."""

    world_size: int = 2


def make_result(data=0.1, forward=0.3, backward=0.4, optimizer=0.1, comm=None, *,
                device="cpu", peak_bytes=2**30, kind="process RSS (CPU)", config=None):
    """A RunResult whose step is exactly 1.0 s, so each phase's share is its seconds."""
    secs = {"data": data, "forward": forward, "backward": backward, "optimizer": optimizer}
    if comm is not None:
        secs["comm"] = comm
    secs["other"] = max(0.0, 1.0 - sum(secs.values()))  # times are never negative
    secs["step"] = 1.0
    phases = {k: Measurement(label=k, times_s=(v, v), samples_per_step=32)
              for k, v in secs.items()}
    return RunResult(config=config or RunConfig(), phases=phases, losses=(2.3, 2.2),
                     peak_memory=PeakMemory(peak_bytes, kind),
                     env={"device": device, "device_name": "test device"}, num_classes=10,
                     wall_s=1.0)


# -- diagnose ---------------------------------------------------------------------------
def test_thresholds_are_the_documented_ones():
    d = diagnose(make_result())
    assert d.thresholds == {"data_wait_share": 0.20, "memory_fraction": 0.90,
                            "comm_share": 0.20, "optimizer_share": 0.25}
    assert (DATA_WAIT_SHARE, MEMORY_FRACTION, COMM_SHARE, OPTIMIZER_SHARE) == (
        0.20, 0.90, 0.20, 0.25)


@pytest.mark.parametrize("data, expected", [(0.20, "input pipeline"), (0.19, "compute")])
def test_data_wait_edge(data, expected):
    d = diagnose(make_result(data=data))
    assert d.bottleneck == expected
    assert d.shares["data"] == pytest.approx(data)
    if expected == "input pipeline":
        assert d.labs == ("Lab 02: Fix data loading",)
        assert "20%" in d.reason
    else:
        assert d.labs == ("Lab 03: Mixed precision", "Lab 05: torch.compile")
        assert "19%" in d.reason and "backward" in d.reason


def test_dominant_phase_is_the_largest_of_the_four():
    assert diagnose(make_result(data=0.5, forward=0.2, backward=0.2)).dominant_phase == "data"
    assert diagnose(make_result(forward=0.5, backward=0.2)).dominant_phase == "forward"
    d = diagnose(make_result())
    assert d.dominant_phase == "backward" and set(PHASES) <= set(d.shares)


@pytest.mark.parametrize("peak, expected", [(900, "memory"), (899, "compute")])
def test_memory_edge_on_cuda(peak, expected):
    r = make_result(device="cuda:0", peak_bytes=peak, kind=CUDA_PEAK)
    d = diagnose(r, device_total_bytes=1000)
    assert d.bottleneck == expected
    if expected == "memory":
        assert d.labs == ("Lab 04: Activation checkpointing",) and "90%" in d.reason


def test_memory_is_not_judged_on_cpu():
    d = diagnose(make_result(peak_bytes=999), device_total_bytes=1000)
    assert d.bottleneck == "compute"


def test_data_wait_wins_over_memory():
    r = make_result(data=0.3, device="cuda", peak_bytes=990, kind=CUDA_PEAK)
    assert diagnose(r, device_total_bytes=1000).bottleneck == "input pipeline"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_memory_unknown_without_gpu_is_a_note():
    d = diagnose(make_result(device="cuda", peak_bytes=10**12, kind=CUDA_PEAK))
    assert d.bottleneck == "compute"
    assert any("memory not checked" in n for n in d.notes)


@pytest.mark.parametrize("comm, world, expected", [
    (0.20, 2, "communication"), (0.19, 2, "compute"), (0.5, 1, "compute")])
def test_communication_edge(comm, world, expected):
    r = make_result(forward=0.2, backward=0.2, comm=comm,
                    config=DDPConfig(world_size=world))
    d = diagnose(r)
    assert d.bottleneck == expected
    assert d.shares["comm"] == pytest.approx(comm)
    if expected == "communication":
        assert d.labs == ("Lab 06: DDP overlap",) and "world_size=2" in d.reason


def test_comm_without_world_size_field_is_compute():
    assert diagnose(make_result(comm=0.15, forward=0.1)).bottleneck == "compute"


@pytest.mark.parametrize("opt, noted", [(0.25, True), (0.24, False)])
def test_optimizer_note_edge(opt, noted):
    d = diagnose(make_result(optimizer=opt, data=0.05))
    assert d.bottleneck == "compute"
    assert any("optimizer" in n and "25%" in n for n in d.notes) is noted


def test_diagnosis_repr_is_readable():
    text = repr(diagnose(make_result(optimizer=0.3, data=0.05, backward=0.35)))
    assert text.startswith("Diagnosis: compute bound (dominant phase: backward 35 %)")
    assert "note:" in text and "thresholds:" in text and "0x" not in text


# -- profilers on a tiny dataset --------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> RunConfig:
    from perflab.data.dataset import build_dataset

    root = tmp_path_factory.mktemp("profiling-data")
    build_dataset(root, train_per_class=2, val_per_class=1, min_side=40, max_side=48,
                  processes=1, progress=False)
    return RunConfig(model="tiny", image_size=32, batch_size=4, steps=2, warmup_steps=0,
                     dataset=str(root / "photo-patches"))


@pytest.fixture(scope="module")
def summary(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    return profile(tiny_config, trace_dir=out, progress=False)


def test_profile_writes_a_trace_with_the_phases(summary):
    path = Path(summary.trace_path)
    assert path.is_file() and path.suffix == ".json"
    assert list(summary.phases.index) == list(PHASES)
    assert (summary.phases["count"] == 3).all()  # active=3 profiled steps
    assert (summary.phases["total_ms"] > 0).all()
    assert summary.result.step.n == 3 and summary.result.config.warmup_steps == 2


def test_profile_top_ops(summary):
    ops = summary.top_ops
    assert list(ops.columns) == list(TOP_OPS_COLUMNS) and 0 < len(ops) <= 15
    assert not ops["name"].str.startswith(("perflab:", "ProfilerStep")).any()
    assert ops["self_cpu_ms"].is_monotonic_decreasing
    assert (ops["self_device_ms"] == 0).all()  # CPU run
    assert ops["name"].str.startswith("aten::").any()


def test_profile_opens_in_perfetto_and_tensorboard_is_refused(summary, tiny_config, tmp_path):
    """The TensorBoard profiler plugin is gone: the trace opens in Perfetto, and asking for
    TensorBoard output fails before any work, naming where each of its views went."""
    assert "ui.perfetto.dev" in summary.how_to_open()
    assert "temporal_breakdown" in summary.how_to_open()
    with pytest.raises(ValueError, match="tensorboard=True.*perfetto.*Operator -> summary.top_ops"):
        profile(tiny_config, trace_dir=tmp_path / "never", tensorboard=True, progress=False)
    assert not (tmp_path / "never").exists()
    text = repr(summary)
    assert text.startswith("ProfileSummary") and "0x" not in text
    assert summary.diagnosis.bottleneck in {"input pipeline", "compute"}


def test_profile_active_one(tiny_config, tmp_path):
    s = profile(tiny_config, wait=0, warmup=1, active=1, row_limit=3, trace_dir=tmp_path,
                progress=False)
    assert (s.phases["count"] == 1).all() and len(s.top_ops) == 3
    assert "TensorBoard" not in s.how_to_open()


@pytest.mark.parametrize("kwargs, name", [
    (dict(wait=-1), "wait"), (dict(warmup=-1), "warmup"), (dict(active=0), "active"),
    (dict(row_limit=0), "row_limit"), (dict(active=1.5), "active")])
def test_profile_rejects_bad_schedule_before_work(kwargs, name, tmp_path):
    out = tmp_path / "traces"
    with pytest.raises(ValueError, match=f"^{name} must be an int"):
        profile(RunConfig(model="tiny"), trace_dir=out, **kwargs)
    assert not out.exists()


def test_cprofile_loader(tiny_config):
    df = profiling.cprofile_loader(tiny_config, batches=2)
    assert list(df.columns) == ["function", "ncalls", "tottime_s", "cumtime_s",
                                "percall_ms"]
    assert 0 < len(df) <= 20 and df["tottime_s"].is_monotonic_decreasing
    assert (df["ncalls"] >= 1).all()
    with pytest.raises(ValueError, match="batches"):
        profiling.cprofile_loader(tiny_config, batches=0)


def test_line_profile_dataset(tiny_config):
    df = profiling.line_profile_dataset(tiny_config, samples=4)
    assert list(df.columns) == ["function", "lineno", "hits", "time_ms", "per_hit_us",
                                "pct_of_function", "source"]
    assert df["function"].str.contains("__getitem__").any()
    assert df["function"].str.contains("random_resized_crop").any()
    assert (df["hits"] >= 1).all() and (df["source"] != "").all()
    for _, pct in df.groupby("function")["pct_of_function"]:
        assert pct.sum() == pytest.approx(100)
    with pytest.raises(ValueError, match="samples"):
        profiling.line_profile_dataset(tiny_config, samples=0)


def test_memory_profile_step(tiny_config):
    df = profiling.memory_profile_step(tiny_config)
    assert list(df.columns) == ["lineno", "mem_usage_mib", "increment_mib", "occurrences",
                                "source"]
    assert len(df) > 0 and (df["mem_usage_mib"] > 0).all()
    assert df["source"].str.contains(".backward()", regex=False).any()


# --- Lab 01 support: step_ranges, count_host_syncs, FakeAsyncDevice, tiny_training ---

def test_step_ranges_reads_steps_ranges_and_ops(tmp_path):
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, record_function, schedule

    from perflab.analysis.profiling import quiet_native_stderr, step_ranges
    from perflab.train.workloads import tiny_training

    parts = tiny_training(batches=3)
    batches, path = iter(zip(parts.x, parts.y)), tmp_path / "t.json"
    with quiet_native_stderr(), torch.profiler.profile(
            activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=2),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(3):
            with record_function("forward"):
                loss = F.cross_entropy(parts.model(next(batches)[0]), parts.y[0])
            with record_function("backward"):
                loss.backward()
            prof.step()
    steps = step_ranges(str(path), ["forward", "backward"])
    assert [s["step"] for s in steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    for s in steps:
        assert [r["name"] for r in s["ranges"]] == ["forward", "backward"]
        assert "aten::convolution" in s["ranges"][0]["ops"]
        assert "aten::convolution_backward" in s["ranges"][1]["ops"]


def test_count_host_syncs_counts_item_and_bool():
    from perflab.analysis.diagnosis import count_host_syncs

    x = torch.arange(4.0)
    with count_host_syncs() as syncs:
        x.sum().item()
        bool(x.max() > 1)
        y = x * 2  # no sync
    assert syncs.count == 2 and syncs.ops == ["aten._local_scalar_dense"] * 2
    assert y.shape == (4,)


def test_fake_async_device_models_launch_queue_and_cold_call():
    from perflab.train.workloads import FakeAsyncDevice

    dev = FakeAsyncDevice(work_s=0.004, launch_s=0.001, cold_s=0.1)
    dev.step()                       # cold: queues 0.1 s, returns after 0.001 s
    assert dev.clock() == pytest.approx(0.001)
    dev.sync()
    assert dev.clock() == pytest.approx(0.101)
    t = dev.clock(); dev.step(); dev.sync()
    assert dev.clock() - t == pytest.approx(0.005) and dev.calls == 2
    with pytest.raises(ValueError, match="must be >= 0"):
        FakeAsyncDevice(work_s=-1)


def test_tiny_training_is_seeded_and_validates():
    from perflab.train.workloads import tiny_training

    a, b = tiny_training(seed=3, batches=2), tiny_training(seed=3, batches=2)
    assert torch.equal(a.x, b.x) and a.x.shape == (2, 8, 3, 16, 16)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    with pytest.raises(ValueError, match="batches must be >= 1"):
        tiny_training(batches=0)


def test_train_on_batches_times_phases_and_validates():
    import itertools

    from perflab.train.workloads import tiny_training, train_on_batches

    parts = tiny_training(batches=1)
    batch = (parts.x[0], parts.y[0])
    m = train_on_batches(parts.model, parts.optimizer, itertools.repeat(batch), steps=2,
                         warmup=1, device="cpu", samples_per_step=8)
    assert m["step"].n == 2 and {"data", "forward", "backward", "optimizer"} <= set(m)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        train_on_batches(parts.model, parts.optimizer, iter([]), steps=0, warmup=0,
                         device="cpu", samples_per_step=8)


def _roof(bf16, fp16, fp32=100.0, device="cpu"):
    from perflab.analysis.roofline import MatmulRoof, Roofline
    return Roofline(device=device, device_name="x", threads=2, bandwidth_gb_s=10.0, copy_mib=64,
                    matmul=(MatmulRoof("fp32", fp32, 512), MatmulRoof("bf16", bf16, 512),
                            MatmulRoof("fp16", fp16, 512)))


def test_compute_bound_not_pointed_at_amp_where_low_precision_is_slower():
    d = diagnose(make_result(), roofline=_roof(bf16=1.5, fp16=None))
    assert d.bottleneck == "compute" and d.labs == ("Lab 05: torch.compile",)
    (note,) = [n for n in d.notes if n.startswith("not Lab 03")]
    assert "bf16 matmul runs at 0.015x of fp32 here (1.5 vs 100 GFLOP/s)" in note
    assert "torch.compile" in note and "channels_last" in note


def test_compute_bound_keeps_amp_where_low_precision_is_faster_or_unmeasured():
    assert diagnose(make_result(), roofline=_roof(bf16=300, fp16=300)).labs == (
        "Lab 03: Mixed precision", "Lab 05: torch.compile")
    # a roofline of another device type says nothing about this run's device
    assert diagnose(make_result(), roofline=_roof(1.0, 1.0, device="cuda:0")).labs[0].startswith("Lab 03")
    assert diagnose(make_result()).labs[0].startswith("Lab 03")
    amp_run = make_result(config=RunConfig(amp="bf16"))
    d = diagnose(amp_run)
    assert d.labs == ("Lab 05: torch.compile",) and any("already uses autocast" in n for n in d.notes)
