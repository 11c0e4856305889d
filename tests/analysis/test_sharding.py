"""perflab.analysis.sharding (bytes per rank, collective bytes), perflab.labs.lab09 (ZeRO-1 /
ZeroRedundancyOptimizer / FSDP2 on gloo ranks), perflab.analysis.scaling and the Lab 09
plots. The multi-rank tests run the Lab 09 solution's own ZeRO-1 file on 2 gloo ranks."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist

from tests.conftest import slow
from perflab.distributed import launch_fn
from perflab.analysis.sharding import (
    COLLECTIVE_KINDS, count_collectives, local_nbytes, state_bytes,
)
from perflab.course.references.lab09 import unsharded_adamw
from perflab.labs.lab09 import SHARDING_METHODS, sharding_rank, tasks_rank
from perflab.models import mlp, mlp_batches
from perflab.analysis.scaling import (
    core_label, scaling_configs, scaling_curve, scaling_efficiency, scaling_table,
)

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "09_sharding_and_scaling.ipynb"
SIZES, BATCH, STEPS = [32] * 9, 8, 6


def solution_file() -> str:
    """The Lab 09 solution's %%writefile cell, as the Python file it writes."""
    nb = nbformat.read(str(LAB), as_version=4)
    (src,) = [c.source for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") == "zero1_file"]
    lines = src.splitlines()
    assert lines[0] == "%%writefile zero1_student.py"
    return "\n".join(ln for ln in lines[1:] if "### " not in ln) + "\n"


@pytest.fixture
def student(tmp_path, monkeypatch):
    """Write a student module into tmp_path (importable by the spawned ranks)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(text)
        return name

    return write


@pytest.fixture
def one_rank(tmp_path):
    """A 1-rank gloo process group in this process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


# -- bytes from the tensors ---------------------------------------------------------------
def test_local_nbytes_counts_elements_times_size():
    assert local_nbytes(torch.zeros(3, 5)) == 60
    assert local_nbytes(torch.zeros(7, dtype=torch.float16)) == 14
    assert local_nbytes(torch.zeros(2, 2)[:, 0]) == 8  # a view: its own elements
    assert local_nbytes(None) == 0 and local_nbytes(3.0) == 0


def test_state_bytes_of_adamw_after_a_step():
    model = mlp([8, 16, 4], seed=3)          # 4 tensors, 212 parameters
    opt = torch.optim.AdamW(model.parameters())
    assert state_bytes(model, opt) == {"params_bytes": 848, "grads_bytes": 0,
                                       "optimizer_bytes": 0, "total_bytes": 848}
    torch.nn.functional.cross_entropy(model(torch.ones(2, 8)), torch.tensor([0, 1])).backward()
    opt.step()
    got = state_bytes(model, opt)
    # exp_avg + exp_avg_sq (fp32) per parameter + one fp32 scalar step per tensor
    assert got == {"params_bytes": 848, "grads_bytes": 848, "optimizer_bytes": 2 * 848 + 16,
                   "total_bytes": 848 * 4 + 16}
    assert state_bytes(model)["optimizer_bytes"] == 0


@pytest.mark.parametrize("model, opt, message", [
    ("not a model", None, "model must be a torch.nn.Module"),
    (torch.nn.Linear(2, 2), object(), "optimizer must be a torch.optim.Optimizer"),
])
def test_state_bytes_rejects_bad_input(model, opt, message):
    with pytest.raises(ValueError, match=message):
        state_bytes(model, opt)


# -- counting collectives -------------------------------------------------------------------
def test_count_collectives_by_kind_and_bytes(one_rank):
    original = dist.all_reduce
    t = torch.ones(100)
    with count_collectives() as comm:
        dist.all_reduce(t)
        dist.all_reduce(tensor=t)
        dist.broadcast(torch.ones(10), src=0)
        dist.all_gather_into_tensor(torch.empty(50), torch.ones(50))
        dist.reduce_scatter_tensor(torch.empty(20), torch.ones(20))
        dist.all_gather([torch.empty(5)], torch.ones(5))
    assert dist.all_reduce is original  # put back
    assert dict(comm.calls) == {"all_reduce": 2, "broadcast": 1, "all_gather": 2,
                                "reduce_scatter": 1}
    assert dict(comm.bytes) == {"all_reduce": 800, "broadcast": 40, "all_gather": 220,
                                "reduce_scatter": 80}
    assert comm.total_bytes == 1140
    assert comm.summary(2) == {"all_reduce": 400, "broadcast": 20, "all_gather": 110,
                               "reduce_scatter": 40, "total": 570}
    assert list(comm.summary())[:-1] == list(COLLECTIVE_KINDS)
    assert repr(comm).startswith("count_collectives(all_reduce: 2 calls 800 B")
    dist.all_reduce(t)
    assert comm.calls["all_reduce"] == 2  # nothing counted after closing


def test_count_collectives_counts_a_nested_call_once(one_rank):
    if not hasattr(dist, "all_gather_single"):
        pytest.skip("torch has no all_gather_single")
    with count_collectives() as comm:
        dist.all_gather_single(torch.empty(8), torch.ones(8))
    assert dict(comm.calls) == {"all_gather": 1} and comm.bytes["all_gather"] == 32


def test_count_collectives_counts_by_phase(one_rank):
    """Where each collective was issued (how Lab 09 tells a ZeRO-2 that reduce-scatters
    during backward from one that does it in step())."""
    with count_collectives() as comm:
        comm.phase = "backward"
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))
        comm.phase = "step"
        dist.all_gather_into_tensor(torch.empty(4), torch.ones(4))
        comm.phase = ""
        dist.all_reduce(torch.ones(2))
    assert {k: dict(v) for k, v in comm.phase_calls.items()} == {
        "backward": {"reduce_scatter": 2}, "step": {"all_gather": 1}, "": {"all_reduce": 1}}


def test_held_gradient_bytes_counts_each_storage_once_and_no_parameter_or_state():
    from perflab.labs.lab09 import held_gradient_bytes
    from perflab.models import mlp

    model = mlp([4, 8, 2])                       # 58 parameters
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()                                   # state (exp_avg, ...) is not a gradient
    assert held_gradient_bytes(model, opt, opt) == 4 * 58   # DDP-like: every p.grad

    class Hand:                                  # a hand-written optimizer's buffers
        def __init__(self):
            self.params = list(model.parameters())          # parameters: not counted
            self.flat = torch.zeros(30)
            self.views = [self.flat[:10], self.flat[10:]]   # views of flat: counted once
            self.pending = {"bucket": (None, torch.zeros(5, dtype=torch.float64))}
            self.local_optimizer = opt

    for p in model.parameters():
        p.grad = None
    assert held_gradient_bytes(model, Hand(), opt) == 4 * 30 + 8 * 5


def test_count_collectives_errors():
    comm = count_collectives()
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        comm.summary(0)
    with comm:
        with pytest.raises(RuntimeError, match="already open"):
            comm.__enter__()
    assert repr(comm) == "count_collectives(nothing counted)"


# -- the model, data and reference -------------------------------------------------------------
def test_ranks_together_see_the_global_batch():
    per_rank = [mlp_batches(SIZES, 4, 2, r) for r in range(2)]
    assert per_rank[0][0][0].shape == (4, 32) and per_rank[0][0][1].dtype == torch.int64
    assert not torch.equal(per_rank[0][0][0], per_rank[1][0][0])
    assert torch.equal(mlp(SIZES)[0].weight, mlp(SIZES)[0].weight)  # seeded
    with pytest.raises(ValueError, match="sizes must list >= 2"):
        mlp([4])
    with pytest.raises(ValueError, match="batch and steps must be >= 1"):
        mlp_batches(SIZES, 0, 2, 0)


def test_unsharded_reference_is_deterministic():
    a = unsharded_adamw(SIZES, 2, BATCH, 2)
    assert a == unsharded_adamw(SIZES, 2, BATCH, 2)
    assert len(a) == sum(p.numel() for p in mlp(SIZES).parameters()) == 8448


def test_sharding_rank_rejects_bad_input(one_rank):
    with pytest.raises(ValueError, match="unknown methods"):
        sharding_rank(["zero9"], SIZES, 2, 2)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        sharding_rank(["ddp"], SIZES, 2, 1)
    with pytest.raises(ValueError, match="need student_module"):
        sharding_rank(["zero1"], SIZES, 2, 2)
    with pytest.raises(ValueError, match="unknown task"):
        tasks_rank([("nope", (), {})])


def test_one_rank_ddp_in_process(one_rank):
    (out,) = tasks_rank([("sharding", (["ddp", "fsdp2"], [8, 8, 4], 4, 2), {})])
    for m in ("ddp", "fsdp2"):
        assert out[m]["state"]["params_bytes"] == 4 * (8 * 8 + 8 + 8 * 4 + 4)
        assert out[m]["peak_bytes"] > 0 and out[m]["peak_label"]
    assert out["ddp"]["comm_per_step"]["all_reduce"] == out["ddp"]["param_bytes"]


# -- on 2 gloo ranks: ZeRO-1 (the lab's solution), ZeroRedundancyOptimizer, FSDP2 ------------
@slow
def test_methods_on_two_gloo_ranks_match_unsharded_adamw(student):
    name = student("zero1_ref", solution_file())
    ranks = launch_fn(sharding_rank, 2, device="cpu", timeout_s=300,
                      args=(list(SHARDING_METHODS), SIZES, BATCH, STEPS, name))
    ref = torch.tensor(unsharded_adamw(SIZES, 2, BATCH, STEPS))
    P = 4 * 8448
    full_opt = ranks[0]["ddp"]["state"]["optimizer_bytes"]
    assert full_opt == 2 * P + 4 * 16
    for method in ("ddp", "zero1", "zero_redundancy", "fsdp2"):
        for r in ranks:
            # the stated tolerance: fp32, averaged gradients vs one global batch
            assert (torch.tensor(r[method]["params"]) - ref).abs().max() <= 1e-5, method
            assert r[method]["student_optimizer_bytes"] == r[method]["state"]["optimizer_bytes"]
    for method in ("zero1", "zero_redundancy"):
        per_rank = [r[method]["state"]["optimizer_bytes"] for r in ranks]
        assert sum(per_rank) == full_opt
        assert all(abs(b - full_opt / 2) <= 2 * 4 * 1024 + 4 for b in per_rank), per_rank
        assert ranks[0][method]["state"]["grads_bytes"] == P  # stage 1: grads not sharded
    for r in ranks:  # FSDP2 (fully_shard) on gloo: params, grads and state are DTensor shards
        s = r["fsdp2"]["state"]
        assert (s["params_bytes"], s["grads_bytes"]) == (P // 2, P // 2)
        assert s["optimizer_bytes"] == P + 4 * 16  # step scalars are not sharded
    comm = {m: ranks[0][m]["comm_per_step"] for m in SHARDING_METHODS}
    assert comm["ddp"] == {"all_reduce": P, "broadcast": 0, "all_gather": 0,
                           "reduce_scatter": 0, "total": P}
    assert comm["ddp_fp16"]["all_reduce"] == P / 2
    assert comm["ddp_powersgd"]["all_reduce"] < P
    for m in ("zero1", "zero_redundancy"):
        assert (comm[m]["all_reduce"], comm[m]["broadcast"]) == (P, P)
    assert (comm["fsdp2"]["all_gather"], comm["fsdp2"]["reduce_scatter"]) == (2 * P, P)


# -- scaling -----------------------------------------------------------------------------------
def test_scaling_efficiency_exact_and_ci():
    e, lo, hi = scaling_efficiency([0.1] * 5, [0.1] * 5, 2, 32, 64)   # weak, perfect
    assert (e, lo, hi) == (1.0, 1.0, 1.0)
    e, lo, hi = scaling_efficiency([0.1] * 5, [0.1] * 5, 2, 64, 64)   # strong, no gain
    assert e == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    t1, t2 = 0.1 + rng.uniform(0, .01, 20), 0.125 + rng.uniform(0, .01, 20)
    e, lo, hi = scaling_efficiency(t1, t2, 2, 32, 64)
    assert lo <= e <= hi and 0.7 < e < 0.9
    assert (e, lo, hi) == scaling_efficiency(t1, t2, 2, 32, 64)   # seeded


@pytest.mark.parametrize("args, message", [
    (([], [0.1], 2, 1, 1), "non-empty lists of positive seconds"),
    (([0.1], [-1.0], 2, 1, 1), "non-empty lists of positive seconds"),
    (([0.1], [0.1], 0, 1, 1), "n and the global batches must be >= 1"),
])
def test_scaling_efficiency_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        scaling_efficiency(*args)


def test_core_label_names_oversubscription():
    assert core_label(2, cores=2) == "2 ranks on 2 cores"
    assert core_label(1, cores=2) == "1 rank on 2 cores"
    assert core_label(4, cores=2) == "4 ranks on 2 cores (oversubscribed)"
    # ranks that sleep their compute still share the cores for their real all-reduces:
    # named, and oversubscribed whatever is simulated (issue 44)
    assert core_label(8, cores=2, simulated_compute=True) == (
        "8 ranks on 2 cores, simulated compute (oversubscribed)")
    assert core_label(2, cores=2, simulated_compute=True) == "2 ranks on 2 cores, simulated compute"
    with pytest.raises(ValueError, match="must be >= 1"):
        core_label(0)


def test_scaling_configs_and_errors():
    cfg = scaling_configs(4, links=[None], per_rank_batch=16, global_batch=64)
    assert [(c["mode"], c["batch"]) for c in cfg] == [("weak", 16), ("strong", 16)]
    with pytest.raises(ValueError, match="must be divisible by world_size"):
        scaling_configs(3, global_batch=64)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        scaling_configs(2, steps=1)
    assert all(c["compute_s_per_sample"] is None for c in cfg)   # real compute by default
    sim = scaling_configs(2, links=[None], compute_s_per_sample=2e-5)
    assert {c["compute_s_per_sample"] for c in sim} == {2e-5}
    for bad in (0, -1e-5, "fast", True):
        with pytest.raises(ValueError, match="compute_s_per_sample must be None"):
            scaling_configs(2, compute_s_per_sample=bad)


def test_scaling_table_labels_simulated_compute():
    launches = [[[{**cfg, "compute_s_per_sample": 1e-4} for cfg in rank] for rank in _launch(ws, [0.2, 0.2])]
                for ws in (1, 4)]
    table = scaling_table(launches).set_index(["mode", "world_size"])
    assert set(table.compute) == {"simulated"}
    # slept compute, but 4 processes on fewer cores still share them: oversubscribed
    assert bool(table.oversubscribed["weak", 4]) == (4 > core_count())
    assert table.cores["weak", 4].startswith("4 ranks on") and ", simulated compute" in (
        table.cores["weak", 4])
    real = scaling_table([_launch(1, [0.1, 0.1]), _launch(2, [0.2, 0.2])])
    assert set(real.compute) == {"measured"}


@pytest.mark.slow
def test_scaling_curve_with_simulated_compute_sleeps_the_batch():
    from perflab.core.simulated import LINK_PRESETS

    per_sample = 2e-3   # 8 samples: 16 ms slept per weak step, on every rank count
    table = scaling_curve((1, 2), links=[LINK_PRESETS["1gbe"]], sizes=(16, 32, 4), per_rank_batch=8,
                          global_batch=16, steps=3, warmup=1, compute_s_per_sample=per_sample)
    assert set(table.compute) == {"simulated"}
    assert not table.oversubscribed.any() or core_count() < 2   # 1 and 2 ranks
    weak = table[table["mode"] == "weak"].set_index("world_size")
    strong = table[table["mode"] == "strong"].set_index("world_size")
    assert weak.step_ms[1] >= 8 * per_sample * 1e3 and strong.step_ms[1] >= 16 * per_sample * 1e3
    assert strong.step_ms[2] < strong.step_ms[1]   # half the batch slept per rank


def _launch(ws, step_s, batch=8):
    return [[{"mode": mode, "link": "x", "batch": batch if mode == "weak" else 16 // ws,
              "world_size": ws, "step_s": [s * (1 + r / 10) for s in step_s]}
             for mode in ("weak", "strong")] for r in range(ws)]


def test_scaling_table_from_launches():
    table = scaling_table([_launch(1, [0.1, 0.1]), _launch(2, [0.2, 0.2]),
                           _launch(4, [0.2, 0.2])])
    assert list(table["mode"]) == ["weak"] * 3 + ["strong"] * 3
    weak = table[table["mode"] == "weak"].set_index("world_size")
    assert weak.efficiency[1] == 1.0
    # slowest rank: 0.2 * 1.1 at 2 ranks, 0.2 * 1.3 at 4; global batch 16 / 32
    assert weak.efficiency[2] == pytest.approx((16 / 0.22) / (2 * 8 / 0.1))
    assert weak.global_batch[4] == 32 and weak.step_ms[4] == pytest.approx(260)
    assert bool(weak.oversubscribed[4]) == (4 > core_count())
    assert "oversubscribed" in weak.cores[4] or 4 <= core_count()
    with pytest.raises(ValueError, match="no world_size 1 run"):
        scaling_table([_launch(2, [0.2, 0.2])])


def core_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# -- the faces ---------------------------------------------------------------------------------
def test_plots_and_panel_build():
    from perflab.viz.scaling_plots import plot_scaling, plot_state_bytes
    from perflab.ui.scaling_panel import scaling_panel

    table = scaling_table([_launch(1, [0.1, 0.1]), _launch(2, [0.2, 0.2])])
    fig = plot_scaling(table, title="t")
    assert len(fig.axes) == 4
    rows = pd.DataFrame([{"method": "ddp", "params_bytes": 10, "grads_bytes": 10,
                          "optimizer_bytes": 20, "peak_bytes": 2**20, "peak_label": "RSS"}])
    assert plot_state_bytes(rows).axes[0].get_ylabel() == "model-state KiB on one rank"
    panel = scaling_panel("10gbe", presets=("1gbe",))
    assert "perflab-panel" in panel.widget._dom_classes
    with pytest.raises(ValueError, match="unknown link preset"):
        scaling_panel("10gbe", presets=("carrier-pigeon",))
    with pytest.raises(ValueError, match="must be a scaling_table"):
        plot_scaling(pd.DataFrame({"x": [1]}))
    with pytest.raises(ValueError, match="rows need columns"):
        plot_state_bytes(pd.DataFrame({"x": [1]}))


def test_plot_step_prediction_marks_the_held_out_point():
    from perflab.viz.scaling_plots import plot_step_prediction

    recorded = pd.DataFrame({"link": ["a"] * 3 + ["b"] * 3, "world_size": [1, 2, 4] * 2,
                             "step_ms": [10.0, 7.0, 6.0, 12.0, 9.0, 8.0]})
    model = pd.DataFrame({"link": ["a"] * 4, "world_size": [1, 2, 3, 4],
                          "model_ms": [10.0, 7.0, 6.0, 5.5]})   # link b: its fit failed
    fig = plot_step_prediction(recorded, model, held_out=4, compute="simulated", title="t")
    ax = fig.axes[0]
    assert "compute: simulated" in ax.get_title() and "4 ranks held out" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["model: predicted 5.5 ms, recorded 6.0 ms (-8%)"]
    labels = ax.get_legend_handles_labels()[1]
    assert "b: recorded (fit failed: no model)" in labels and "a: model" in labels
    second = pd.DataFrame({"link": ["b"] * 2, "world_size": [1, 4], "model_ms": [12.0, 9.0]})
    ax = plot_step_prediction(recorded, model, held_out=4, compute="simulated", second=second,
                              second_label="+ all-reduce").axes[0]
    assert [t.get_text() for t in ax.texts] == ["model: predicted 5.5 ms, recorded 6.0 ms (-8%)",
                                                "+ all-reduce: predicted 9.0 ms, recorded 8.0 ms (+12%)"]
    assert "b: + all-reduce" in ax.get_legend_handles_labels()[1]
    with pytest.raises(ValueError, match="not a recorded world_size"):
        plot_step_prediction(recorded, model, held_out=8, compute="simulated")
    with pytest.raises(ValueError, match="recorded needs columns"):
        plot_step_prediction(pd.DataFrame({"x": [1]}), model, held_out=4, compute="simulated")


def test_solution_file_is_extracted_whole():
    text = solution_file()
    assert "class MyZero1" in text and "def my_state_bytes" in text
    assert not re.search(r"BEGIN SOLUTION|%%writefile", text)
    compile(text, "zero1_student.py", "exec")
