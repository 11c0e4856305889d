"""Overlap efficiency: the formula, both ideals, tables and plots from recorded runs."""
from __future__ import annotations

import math

import pytest

from perflab.core.config import RunConfig
from perflab.core.env import env_summary
from perflab.core.simulated import SimulatedLink
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.analysis.overlap import (
    ideal_step_s, last_bucket_s, machine_bound_s, overlap_efficiency, overlap_metrics,
    overlap_table, plot_overlap, run_ddp,
)
from perflab.core.result import RunResult


def test_overlap_efficiency_limits():
    # compute 1.0, comm 0.5: nothing hidden -> 0; the ideal reached -> 1
    assert overlap_efficiency(1.0, 0.5, 1.5, 1.0) == pytest.approx(0.0)
    assert overlap_efficiency(1.0, 0.5, 1.0, 1.0) == pytest.approx(1.0)
    assert overlap_efficiency(1.0, 0.5, 1.25, 1.0) == pytest.approx(0.5)
    assert overlap_efficiency(1.0, 0.5, 2.0, 1.0) == pytest.approx(-1.0)  # contention


def test_two_ideals():
    assert ideal_step_s(1.0, 0.5) == 1.0                    # textbook max(compute, comm)
    assert ideal_step_s(1.0, 0.5, forward_s=0.3) == 1.0     # forward + comm < compute
    assert ideal_step_s(1.0, 0.9, forward_s=0.3) == pytest.approx(1.2)  # DDP bound
    # the same step is more efficient against the (reachable) DDP bound
    tb = overlap_efficiency(1.0, 0.9, 1.3, ideal_step_s(1.0, 0.9))
    ddp = overlap_efficiency(1.0, 0.9, 1.3, ideal_step_s(1.0, 0.9, 0.3))
    assert tb == pytest.approx(0.6 / 0.9) and ddp == pytest.approx(0.6 / 0.7) and ddp > tb


@pytest.mark.parametrize("args, match", [
    ((0.0, 0.5, 1.0, 0.5), "compute_s"),
    ((1.0, -0.5, 1.0, 1.0), "comm_s"),
    ((1.0, 0.5, 0.0, 1.0), "step_s"),
    ((1.0, 0.5, 1.2, 1.5), "no overlap is possible"),
])
def test_overlap_efficiency_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        overlap_efficiency(*args)


def test_ideal_rejects_negative_times():
    with pytest.raises(ValueError, match="forward_s"):
        ideal_step_s(1.0, 1.0, forward_s=-1.0)


def test_machine_bound_adds_what_cannot_overlap_here():
    # backward's end: compute 0.45 + allreduce CPU 0.05 + last bucket 0.01 = 0.51
    # the link: forward 0.13 + comm 0.36 + optimizer 0.02 = 0.51 -> the larger of the two
    assert machine_bound_s(0.45, 0.36, 0.13, 0.02, 0.05, 0.01) == pytest.approx(0.51)
    assert machine_bound_s(0.45, 0.36, 0.13, 0.02, 0.20, 0.01) == pytest.approx(0.66)
    assert machine_bound_s(0.45, 0.50, 0.13, 0.02, 0.0, 0.0) == pytest.approx(0.65)
    # never below DDP's bound max(compute, forward + comm)
    for args in [(0.45, 0.36, 0.13, 0.02, 0.05, 0.01), (1.0, 0.1, 0.5, 0.0, 0.0, 0.0)]:
        assert machine_bound_s(*args) >= ideal_step_s(args[0], args[1], args[2])
    with pytest.raises(ValueError, match="comm_cpu_s"):
        machine_bound_s(0.45, 0.36, 0.13, 0.02, -0.05, 0.01)


def test_last_bucket_is_the_highest_index_on_the_link():
    link = SimulatedLink(alpha_s=1e-3, beta_bytes_per_s=1e6)
    buckets = [{"index": 1, "nbytes": 4000}, {"index": 0, "nbytes": 1000}]
    # bucket 1 is sent last: 2 hops x 1 ms + 4000 B / 1 MB/s (2 ranks: wire bytes = message bytes)
    assert last_bucket_s(buckets, 0.5, link=link) == pytest.approx(6e-3)
    assert last_bucket_s(buckets, 0.5, link=link, compression="fp16") == pytest.approx(4e-3)
    # real backend: comm x the bucket's share of the bytes
    assert last_bucket_s(buckets, 0.5) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="buckets is empty"):
        last_bucket_s([], 0.5)


def fake_result(step_s=0.6, compute_s=0.45, comm_s=0.36, forward_s=0.13, bucket_cap_mb=1.0,
                link=SimulatedLink.preset("1gbe"), rank=0, phases=None, optimizer_s=0.02,
                comm_cpu_s=0.05):
    config = RunConfig(world_size=2, bucket_cap_mb=bucket_cap_mb, link=link, steps=3)
    times = {"step": step_s, "compute": compute_s, "comm": comm_s, "forward": forward_s,
             "optimizer": optimizer_s, "comm_cpu": comm_cpu_s}
    if phases is not None:
        times = {k: v for k, v in times.items() if k in phases}
    return RunResult(
        config=config,
        phases={k: Measurement(label=k, times_s=(v * 0.99, v, v * 1.01))
                for k, v in times.items()},
        losses=(1.0,), peak_memory=PeakMemory(peak_bytes=0, kind="test"),
        env=env_summary("cpu").to_dict(), num_classes=2, wall_s=1.0, rank=rank,
        extra={"buckets": [{"index": 0, "nbytes": 2 ** 20, "num_params": 3},
                           {"index": 1, "nbytes": 2 ** 19, "num_params": 2}]})


def test_metrics_from_a_recorded_run():
    m = overlap_metrics(fake_result())
    assert m["exposed_comm_s"] == pytest.approx(0.15)
    assert m["ideal_ddp_s"] == pytest.approx(0.49)
    assert m["overlap_eff_ddp"] == pytest.approx((0.81 - 0.6) / (0.81 - 0.49))
    assert m["overlap_eff_textbook"] == pytest.approx((0.81 - 0.6) / (0.81 - 0.45))
    assert (m["buckets"], m["bucket_mb"]) == (2, [1.0, 0.5])
    assert "simulated link 1gbe" in m["link"]
    # this machine's bound: the last bucket (index 1, 0.5 MiB) on 1 Gbit/s
    last = 2 * 50e-6 + 2 ** 19 / 125e6  # 2 ranks: a ring of 2 latency hops
    assert m["last_bucket_s"] == pytest.approx(last)
    assert m["ideal_machine_s"] == pytest.approx(max(0.45 + 0.05 + last, 0.13 + 0.36 + 0.02))
    assert m["overlap_eff_machine"] == pytest.approx(
        (0.81 - 0.6) / (0.81 - m["ideal_machine_s"]))
    assert m["overlap_eff_machine"] > m["overlap_eff_ddp"]


def test_metrics_of_a_run_without_comm_cpu_leave_the_machine_bound_out():
    m = overlap_metrics(fake_result(phases=("step", "compute", "comm", "forward")))
    assert math.isnan(m["ideal_machine_s"]) and math.isnan(m["overlap_eff_machine"])
    assert m["overlap_eff_ddp"] == pytest.approx((0.81 - 0.6) / (0.81 - 0.49))


def test_metrics_need_the_ddp_phases():
    with pytest.raises(ValueError, match="comm"):
        overlap_metrics(fake_result(phases=("step", "compute", "forward")))


def test_table_and_plot_name_the_link():
    runs = [[fake_result(bucket_cap_mb=b, rank=r) for r in (0, 1)] for b in (1.0, 25.0)]
    runs.append(fake_result(bucket_cap_mb=5.0, forward_s=0.5))  # forward >= compute
    t = overlap_table(runs)
    assert len(t) == 5 and list(t.bucket_cap_mb.unique()) == [1.0, 25.0, 5.0]
    assert t.step_ms.iloc[0] == pytest.approx(600.0)
    assert math.isnan(t.overlap_eff_ddp.iloc[-1])  # DDP bound >= compute + comm: undefined
    assert not math.isnan(t.overlap_eff_textbook.iloc[-1])
    assert "simulated link 1gbe: alpha=50 us" in t.attrs["title"]
    fig = plot_overlap(t)
    assert "simulated link 1gbe" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="column"):
        plot_overlap(t, x="nope")


def test_table_rejects_no_runs():
    with pytest.raises(ValueError, match="at least one"):
        overlap_table([])


def test_run_ddp_needs_two_ranks():
    with pytest.raises(ValueError, match="world_size >= 2"):
        run_ddp(RunConfig())


def test_panels_take_a_premeasured_baseline():
    from perflab.ui.panels import bucket_panel, link_panel

    rec = fake_result(bucket_cap_mb=25.0)
    for make in (bucket_panel, link_panel):
        panel = make(rec.config, baseline_result=rec)
        assert panel.baseline_result is rec and "perflab-run" in panel.run_button._dom_classes
        with pytest.raises(ValueError, match="baseline_result"):
            make(rec.config.replace(bucket_cap_mb=5.0), baseline_result=rec)
    assert [o[1] for o in bucket_panel(rec.config).controls["bucket_cap_mb"].options] == [
        1.0, 5.0, 25.0, 100.0]
