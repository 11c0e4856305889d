"""Lab 10's check cells, graded on hidden cases (:mod:`perflab.course.cases`): each runs
here as grading runs it (the student's code in the "kernel", the judge apart, answers as
JSON). The reference solution passes at several seeds, an honest variant written
differently passes, and wrong *student code* fails on a hidden case: a tensor-parallel
block missing the backward all-reduce (Megatron's f), one missing the forward all-reduce
(g), one adding b2 on every rank before the reduce, one built with torch's
``parallelize_module`` (right numbers: the ranks record that it ran), one that all-reduces
outside its own autograd Functions (right numbers: the ranks record where each all-reduce
came from); a ``parallel_mlp`` that does not
parallelize; an α-β model that forgets the backward all-reduce or the ring factor; a
2-D layout that sums the replicas' gradients or never all-reduces them, an accounting that
shards the replicated bias or forgets the backward all-reduce; a pipeline returning the
last micro-batch's loss or the sum, or one building its stage over all ranks instead of the
pipeline's group (caught by the hidden 2-stage runs on ranks 0-1 of the check's 4-rank
launch); a bubble formula with m and p swapped.

Checks whose ``student_answer`` launches ranks (``check_tp_hand`` on 2 ranks,
``check_pp_loss`` on 4) are tested with ONE real launch of that many ranks that runs every
variant's file on the hidden cases of every tested seed (:func:`_jobs_rank`); the check's
own ``launch_fn`` call is then answered from those records (the same cases, drawn the same
way), so the judge sees what the ranks really computed. The checks on the lab's own 4-rank
TP launch (``check_tp_dtensor``, ``check_two_d``) get the records of the 4-rank launch that
runs every tp variant file on the lab's cases.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, grade_wrong, notebook_points
from perflab.course.cases import draw_cases
from perflab.course.checks import graded_functions, split_check

ROOT = Path(__file__).resolve().parents[2]
NB = Lab("10")
GRADED_TESTED = ("check_tp_hand", "check_tp_dtensor", "check_two_d", "check_pp_loss", "check_bubble")
SEEDS = [0, 1, "grade:ada"]


def _fails_on_a_hidden_case(verdict) -> None:
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict


def _file(gid: str) -> str:
    """The solution's %%writefile cell, as the module text."""
    return NB.cells[gid].split("\n", 1)[1]


def _cell_function(gid: str) -> str:
    return NB.cells[gid]


TP_GOOD = _file("tp_file")
TP_HONEST = '''
import torch
import torch.distributed as dist


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        out = g.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, g):
        return g.clone()


class ShardedMLP(torch.nn.Module):
    def __init__(self, block, rank, world_size):
        super().__init__()
        d, hidden = block[0].in_features, block[0].out_features
        w1 = torch.chunk(block[0].weight.detach(), world_size, dim=0)[rank]
        b1 = torch.chunk(block[0].bias.detach(), world_size, dim=0)[rank]
        w2 = torch.chunk(block[2].weight.detach(), world_size, dim=1)[rank]
        self.fc1 = torch.nn.Linear(d, hidden // world_size)
        self.fc2 = torch.nn.Linear(hidden // world_size, d)
        self.fc1.weight.data, self.fc1.bias.data = w1.clone(), b1.clone()
        self.fc2.weight.data, self.fc2.bias.data = w2.clone(), block[2].bias.detach().clone()

    def forward(self, x):
        h = torch.nn.functional.gelu(_F.apply(x) @ self.fc1.weight.t() + self.fc1.bias)
        return _G.apply(h @ self.fc2.weight.t()) + self.fc2.bias


def make_mesh(shape, names=None):
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh("cpu", torch.arange(dist.get_world_size()).reshape(*shape), mesh_dim_names=names)


def parallel_mlp(block, mesh):
    from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
    block = parallelize_module(block, mesh, {"0": ColwiseParallel()})
    return parallelize_module(block, mesh, {"2": RowwiseParallel()})


def data_parallel_grads(module, dp_group):
    n = dist.get_world_size(group=dp_group)
    for p in module.parameters():
        shard = p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
        shard.div_(n)
        dist.all_reduce(shard, group=dp_group)
'''
_NO_F = ("        grad = grad.contiguous().clone()\n"
         "        dist.all_reduce(grad)            # each rank held only its slice's part of dL/dx\n"
         "        return grad\n")
_NO_G = ("        x = x.contiguous().clone()\n"
         "        dist.all_reduce(x)               # the partial sums of the row-split Linear\n"
         "        return x\n")
_BIAS_AFTER = "        return ReduceFromParallel.apply(partial) + self.fc2.bias\n"
WRONG_TP = {
    # Megatron's f without its backward all-reduce: dL/dx is only this rank's part
    "no_backward_allreduce": TP_GOOD.replace(_NO_F, "        return grad\n"),
    # g without its forward all-reduce: the output is a partial sum
    "no_forward_allreduce": TP_GOOD.replace(_NO_G, "        return x\n"),
    # b2 added on every rank before the reduce: counted world_size times
    "bias_before_reduce": TP_GOOD.replace(
        _BIAS_AFTER, "        return ReduceFromParallel.apply(partial + self.fc2.bias)\n"),
    # issue 33: torch's tensor parallelism under the student's name: every number right
    "parallelize_module": TP_GOOD + '''

class ShardedMLP(torch.nn.Module):
    def __init__(self, block, rank, world_size):
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (world_size,))
        self.block = parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        self.fc1, self.fc2 = self.block[0], self.block[2]

    def forward(self, x):
        return self.block(x)
''',
    # g's all-reduce done in place in the module's forward, outside any autograd Function
    # (identity backward by accident): right numbers, not the student's own g
    "all_reduce_outside_a_function": TP_GOOD.replace(_BIAS_AFTER, (
        "        with torch.no_grad():\n"
        "            dist.all_reduce(partial)\n"
        "        return partial + self.fc2.bias\n")),
}
#: wrong answers whose numbers are right: only what the ranks saw tells them apart
TP_RIGHT_NUMBERS = {"parallelize_module": "parallelize_module",
                    "all_reduce_outside_a_function": "the forward's all-reduces"}
_AVERAGE = "        local /= replicas\n"
WRONG_DP = {
    # sums the replicas' gradients: twice the average
    "sums_without_averaging": TP_GOOD.replace(_AVERAGE, ""),
    # never talks to the other replica: each keeps its own batch's gradient
    "no_dp_allreduce": TP_GOOD.replace(
        "        dist.all_reduce(local, group=dp_group)     # in place: to_local() shares the storage\n", ""),
}
TP_NOT_PARALLEL = TP_GOOD.replace(
    '    return parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})',
    "    return block")

PP_GOOD = _file("pp_file")
PP_HONEST = PP_GOOD.replace(
    "    per_stage = len(model) // num_stages\n"
    "    return [model[i * per_stage:(i + 1) * per_stage] for i in range(num_stages)]\n",
    "    blocks = list(model)\n"
    "    k = len(blocks) // num_stages\n"
    "    return [torch.nn.Sequential(*blocks[s * k:s * k + k]) for s in range(num_stages)]\n"
).replace("    return torch.stack(losses).mean().item() if losses else None\n",
          "    return sum(float(v) for v in losses) / len(losses) if rank == world_size - 1 else None\n")
WRONG_PP = {
    "last_micro_batch_loss": PP_GOOD.replace(
        "    return torch.stack(losses).mean().item() if losses else None\n",
        "    return losses[-1].item() if losses else None\n"),
    "summed_losses": PP_GOOD.replace(
        "    return torch.stack(losses).mean().item() if losses else None\n",
        "    return torch.stack(losses).sum().item() if losses else None\n"),
    # takes the group but builds the stage over all ranks: a 2-stage pipeline inside the
    # lab's 4-rank launch fails (PipelineStage refuses a group larger than its stages)
    "group_not_passed": PP_GOOD.replace(', torch.device("cpu"), group=group)', ', torch.device("cpu"))'),
}
#: wrong only where a 2-stage pipeline runs inside 4 ranks (its 4-stage runs pass)
PP_WRONG_ON_4_RANKS_ONLY = ("group_not_passed",)


def test_variants_differ_from_the_solution():
    for name, text in {**WRONG_TP, **WRONG_DP, "not_parallel": TP_NOT_PARALLEL}.items():
        assert text != TP_GOOD, name
    for name, text in {**WRONG_PP, "honest": PP_HONEST}.items():
        assert text != PP_GOOD, name


# -- one launch per section: every variant on every seed's hidden cases -----------------------------
def _jobs_rank(jobs):
    """Rank body (module level: spawned ranks import this test module)."""
    from perflab.labs.lab10.ranks import pp_rank, tp_rank

    out = []
    for kind, module, payload in jobs:
        if kind == "tp":
            out.append(tp_rank(payload, module, False))
        elif kind == "two_d":
            out.append(tp_rank(payload, module, True, two_d=True))
        else:
            out.append(pp_rank(payload, module))
    return out


def _hidden(gid: str, seed):
    cases_fn, _ = graded_functions(split_check(NB.cells[gid]).graded, gid)
    return draw_cases(cases_fn, seed)


LAB_TP_CASES = [{"d": 8, "batch": 2, "seq": 3, "seed": 1}, {"d": 12, "batch": 1, "seq": 5, "seed": 7}]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """variant -> seed -> per-rank records of check_tp_hand's hidden cases (2 ranks)."""
    from perflab.distributed import launch_fn

    folder = tmp_path_factory.mktemp("lab10_students")
    files = {"tp_good": TP_GOOD, "tp_honest": TP_HONEST,
             **{f"tp_{k}": v for k, v in WRONG_TP.items()}}
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    jobs, keys = [], []
    for name in files:
        for seed in SEEDS:
            jobs.append(("tp", name, _hidden("check_tp_hand", seed)[0]["cases"]))
            keys.append((name, seed))
    here = os.getcwd()
    os.chdir(folder)   # the ranks import the students' files from their working folder
    try:
        ranks = launch_fn(_jobs_rank, 2, args=(jobs,), device="cpu", timeout_s=600)
    finally:
        os.chdir(here)
    out: dict = {}
    for i, (name, seed) in enumerate(keys):
        per_rank = [r[i] for r in ranks]
        out.setdefault(name, {})[seed] = per_rank
    return out


@pytest.fixture(scope="module")
def launched4(tmp_path_factory):
    """variant -> the per-rank records of 4-rank launches: the lab's 1-D TP and 2-D layout
    for the tp_* files; for the pp_* files, seed -> check_pp_loss's hidden 2- and 4-stage
    runs."""
    from perflab.distributed import launch_fn

    folder = tmp_path_factory.mktemp("lab10_students4")
    files = {"tp_good": TP_GOOD, "tp_honest": TP_HONEST, "tp_not_parallel": TP_NOT_PARALLEL,
             **{f"tp_{k}": v for k, v in WRONG_DP.items()},
             "pp_good": PP_GOOD, "pp_honest": PP_HONEST, **{f"pp_{k}": v for k, v in WRONG_PP.items()}}
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    jobs, keys = [], []
    for name in files:
        if name.startswith("tp_"):
            jobs.append(("two_d", name, LAB_TP_CASES))
            keys.append((name, None))
        else:
            for seed in SEEDS:
                jobs.append(("pp", name, _hidden("check_pp_loss", seed)[0]["runs"]))
                keys.append((name, seed))
    here = os.getcwd()
    os.chdir(folder)
    try:
        ranks = launch_fn(_jobs_rank, 4, args=(jobs,), device="cpu", timeout_s=600)
    finally:
        os.chdir(here)
    out: dict = {}
    for i, (name, seed) in enumerate(keys):
        per_rank = [r[i] for r in ranks]
        if seed is None:
            out[name] = per_rank
        else:
            out.setdefault(name, {})[seed] = per_rank
    return out


def _judge_launched(monkeypatch, launched, gid: str, variant: str, seed, ns=None, ranks=None):
    """Run check ``gid`` at ``seed`` with its ``launch_fn`` answered from ``variant``'s records
    (``ns``: the notebook globals the check reads; ``ranks``: answer with these records)."""
    import perflab.labs.lab10.ranks

    def fake_launch(fn, world_size, *, args=(), **kwargs):
        records = launched[variant][seed] if ranks is None else ranks
        assert world_size == len(launched[variant][seed])
        return json.loads(json.dumps(records))

    monkeypatch.setattr(perflab.labs.lab10.ranks, "launch_fn", fake_launch)
    return NB.judge(dict(ns or {"__name__": "__main__"}), gid, seed=seed)


# -- check_tp_hand ----------------------------------------------------------------------------------
@slow
@pytest.mark.parametrize("seed", SEEDS)
def test_tp_hand_reference_passes(seed, launched, monkeypatch):
    verdict = _judge_launched(monkeypatch, launched, "check_tp_hand", "tp_good", seed)
    assert verdict.passed, verdict.message


@slow
def test_tp_hand_honest_variant_passes(launched, monkeypatch):
    verdict = _judge_launched(monkeypatch, launched, "check_tp_hand", "tp_honest", 1)
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("name", sorted(WRONG_TP))
def test_wrong_tp_block_fails(name, launched, monkeypatch):
    verdict = _judge_launched(monkeypatch, launched, "check_tp_hand", f"tp_{name}", "grade:ada")
    _fails_on_a_hidden_case(verdict)
    if name == "no_backward_allreduce":
        assert "dL/dx" in verdict.message, verdict.message
    if name in TP_RIGHT_NUMBERS:
        assert TP_RIGHT_NUMBERS[name] in verdict.message, verdict.message


@slow
def test_ranks_record_the_students_own_all_reduces(launched):
    """What HandTPTrace saw on the ranks: the reference's and the honest variant's f and g
    each issue one all-reduce of the output's bytes, from their own autograd.Function;
    parallelize_module's block issues none of them (DTensor's are functional collectives)
    and is named; the in-place all-reduce is seen, but not as the student's Function's."""
    for q in range(2):
        for variant in ("tp_good", "tp_honest"):
            for case, rec in zip(_hidden("check_tp_hand", 0)[0]["cases"], launched[variant][0][q]["hand"]):
                n = 4 * case["batch"] * case["seq"] * case["d"]
                assert rec["forward_all_reduces"] == rec["backward_all_reduces"] == [[n, True]], rec
                assert rec["delegated"] == [] == rec["build_all_reduces"], rec
        rec = launched["tp_parallelize_module"][0][q]["hand"][0]
        assert "torch.distributed.tensor.parallel.parallelize_module" in rec["delegated"]
        assert rec["forward_all_reduces"] == [] == rec["backward_all_reduces"]
        rec = launched["tp_all_reduce_outside_a_function"][0][q]["hand"][0]
        assert [own for _, own in rec["forward_all_reduces"]] == [False] and rec["delegated"] == []


def test_tp_hand_states_and_forbids_torchs_tensor_parallelism():
    """The exercise text names the forbidden APIs; the graded call forbids those that
    resolve by name, and the ranks watch for all of them (HAND_TP_FORBIDDEN)."""
    from perflab.labs.checking import resolve
    from perflab.labs.lab10.ranks import HAND_TP_FORBIDDEN

    forbid = split_check(NB.cells["check_tp_hand"]).graded.forbid
    assert forbid and set(forbid) <= set(HAND_TP_FORBIDDEN)
    for name in forbid:
        resolve(name)
    text = next(c.source for c in NB.nb.cells if c.cell_type == "markdown"
                and "### Exercise 1 — `ShardedMLP`" in c.source)
    for name in HAND_TP_FORBIDDEN:
        assert name.rsplit(".", 1)[-1] in text, name


@slow
def test_tp_hand_self_check_catches_the_missing_backward_reduction(launched4):
    """The visible self-check (the lab's cases) already fails the missing f backward."""
    import torch
    from perflab.labs.lab10.models import mlp_block

    probe = split_check(NB.cells["check_tp_hand"]).probe
    ns = {"__name__": "__main__", "torch": torch, "mlp_block": mlp_block, "TP_CASES": LAB_TP_CASES,
          "tp_runs": [{"hand": r["hand"]} for r in launched4["tp_good"]]}
    NB.run_code(dict(ns), probe)   # the reference passes
    wrong = json.loads(json.dumps(launched4["tp_good"]))
    for r in wrong:   # a rank's dL/dx that misses the other rank's part
        r["hand"][0]["x_grad"] = [[[2 * v for v in row] for row in mat] for mat in r["hand"][0]["x_grad"]]
    with pytest.raises(AssertionError, match="dL/dx"):
        NB.run_code(dict(ns, tp_runs=[{"hand": r["hand"]} for r in wrong]), probe)


# -- check_tp_dtensor -------------------------------------------------------------------------------
def _comm_fn(code: str | None = None) -> dict:
    ns = {"__name__": "__main__"}
    NB.run_code(ns, code or NB.solution("tp_comm_model"))
    return ns


def _dtensor_ns(launched4, variant="tp_good", comm: str | None = None) -> dict:
    return {**_comm_fn(comm), "tp_runs": json.loads(json.dumps(launched4[variant]))}


@slow
@pytest.mark.parametrize("seed", SEEDS)
def test_tp_dtensor_reference_passes(seed, launched4):
    verdict = NB.judge(_dtensor_ns(launched4), "check_tp_dtensor", seed=seed)
    assert verdict.passed, verdict.message


@slow
def test_tp_dtensor_honest_variant_passes(launched4):
    honest = '''
def tp_step_comm_s(batch, seq, d, world_size, alpha_s, beta_bytes_per_s):
    message = 4.0 * batch * seq * d
    per_rank_sent = message * 2 * (world_size - 1) / world_size
    hops = 2 * (world_size - 1)   # a ring: reduce-scatter then all-gather, each p - 1 steps
    return sum(hops * alpha_s + per_rank_sent / beta_bytes_per_s for _ in ("forward g", "backward f"))
'''
    verdict = NB.judge(_dtensor_ns(launched4, "tp_honest", honest), "check_tp_dtensor", seed=1)
    assert verdict.passed, verdict.message


@slow
def test_tp_dtensor_not_parallelized_fails(launched4):
    _fails_on_a_hidden_case(NB.judge(_dtensor_ns(launched4, "tp_not_parallel"), "check_tp_dtensor"))


WRONG_COMM = {
    "forward only": NB.solution("tp_comm_model").replace("return 2 * one", "return one"),
    "no ring factor": NB.solution("tp_comm_model").replace("2 * (world_size - 1) / world_size * ", ""),
    "hidden width": NB.solution("tp_comm_model").replace("n = batch * seq * d * 4", "n = batch * seq * 4 * d * 4"),
    "alpha once per all-reduce": NB.solution("tp_comm_model").replace(
        "one = 2 * (world_size - 1) * alpha_s", "one = alpha_s"),
}


@slow
@pytest.mark.parametrize("name", sorted(WRONG_COMM))
def test_wrong_comm_model_fails(name, launched4):
    assert WRONG_COMM[name] != NB.solution("tp_comm_model"), name
    _fails_on_a_hidden_case(NB.judge(_dtensor_ns(launched4, comm=WRONG_COMM[name]), "check_tp_dtensor"))


# -- check_two_d ------------------------------------------------------------------------------------
def _two_d_ns(launched4, variant="tp_good", code: str | None = None) -> dict:
    ns = {"__name__": "__main__", "TP_CASES": LAB_TP_CASES,
          "tp_runs": json.loads(json.dumps(launched4[variant]))}
    NB.run_code(ns, code or NB.solution("accounting_2d"))
    return ns


@slow
@pytest.mark.parametrize("seed", SEEDS)
def test_two_d_reference_passes(seed, launched4):
    verdict = NB.judge(_two_d_ns(launched4), "check_two_d", seed=seed)
    assert verdict.passed, verdict.message


@slow
def test_two_d_honest_variant_passes(launched4):
    honest = '''
def bytes_2d(batch, seq, d, tp):
    fp32 = 4
    sharded = (d * 4 * d + 4 * d) + (4 * d * d)      # W1 and b1 by rows, W2 by columns
    return {"dp_all_reduce": fp32 * (sharded // tp + d),
            "tp_all_reduce": fp32 * batch * seq * d * 2}
'''
    verdict = NB.judge(_two_d_ns(launched4, "tp_honest", honest), "check_two_d", seed=1)
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("name", sorted(WRONG_DP))
def test_wrong_data_parallel_grads_fails(name, launched4):
    _fails_on_a_hidden_case(NB.judge(_two_d_ns(launched4, f"tp_{name}"), "check_two_d"))


WRONG_2D = {
    "b2 sharded too": NB.solution("accounting_2d").replace(
        "(4 * d * d + 4 * d + 4 * d * d) // tp + d", "(4 * d * d + 4 * d + 4 * d * d + d) // tp"),
    "whole block per rank": NB.solution("accounting_2d").replace(
        "(4 * d * d + 4 * d + 4 * d * d) // tp + d", "4 * d * d + 4 * d + 4 * d * d + d"),
    "forward all-reduce only": NB.solution("accounting_2d").replace(
        '"tp_all_reduce": 2 * activation', '"tp_all_reduce": activation'),
}


@slow
@pytest.mark.parametrize("name", sorted(WRONG_2D))
def test_wrong_2d_accounting_fails(name, launched4):
    assert WRONG_2D[name] != NB.solution("accounting_2d"), name
    _fails_on_a_hidden_case(NB.judge(_two_d_ns(launched4, code=WRONG_2D[name]), "check_two_d"))


def test_2d_accounting_written_for_tp_2_only_fails():
    """Pure part: an accounting that hard-codes tp = 2 fails on the hidden tp sizes."""
    wrong = NB.solution("accounting_2d").replace("// tp + d", "// 2 + d")
    cases_fn, judge = graded_functions(split_check(NB.cells["check_two_d"]).graded, "check_two_d")
    ns = {"__name__": "__main__"}
    NB.run_code(ns, wrong)
    cases = [c for c in draw_cases(cases_fn, 0) if c is not None and c["tp"] != 2]
    assert cases
    with pytest.raises(AssertionError):
        for c in cases:
            judge(c, json.loads(json.dumps(ns["bytes_2d"](c["batch"], c["seq"], c["d"], c["tp"]))))


# -- check_pp_loss ----------------------------------------------------------------------------------
@slow
@pytest.mark.parametrize("seed", SEEDS)
def test_pp_loss_reference_passes(seed, launched4, monkeypatch):
    verdict = _judge_launched(monkeypatch, launched4, "check_pp_loss", "pp_good", seed)
    assert verdict.passed, verdict.message


@slow
def test_pp_loss_honest_variant_passes(launched4, monkeypatch):
    verdict = _judge_launched(monkeypatch, launched4, "check_pp_loss", "pp_honest", 0)
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("name", sorted(WRONG_PP))
def test_wrong_pipeline_loss_fails(name, launched4, monkeypatch):
    """Every wrong pipeline fails, the group-less one on the 2-stage runs inside the
    4-rank launch (its 4-stage records alone would pass)."""
    _fails_on_a_hidden_case(_judge_launched(monkeypatch, launched4, "check_pp_loss", f"pp_{name}", 1))
    if name in PP_WRONG_ON_4_RANKS_ONLY:
        runs = _hidden("check_pp_loss", 1)[0]["runs"]
        assert any("error" in r[k] for r in launched4[f"pp_{name}"][1]
                   for k, run in enumerate(runs) if run["stages"] == 2)
        assert not any("error" in r[k] for r in launched4[f"pp_{name}"][1]
                       for k, run in enumerate(runs) if run["stages"] == 4)


@pytest.mark.parametrize("seed", SEEDS)
def test_pp_loss_hidden_runs_cover_both_schedules_on_2_and_4_stages(seed):
    (case,) = _hidden("check_pp_loss", seed)
    runs = case["runs"]
    assert {(s, p) for s in ("gpipe", "1f1b") for p in (2, 4)} <= {(r["schedule"], r["stages"]) for r in runs}
    assert all(r["blocks"] % r["stages"] == 0 and r["batch"] % r["m"] == 0 for r in runs)
    assert all(r["m"] >= r["stages"] for r in runs if r["schedule"] == "1f1b")


@slow
def test_pp_loss_needs_every_rank(launched4, monkeypatch):
    """A launch answered with a rank missing, or with a 2-stage run on other ranks than 0-1, fails."""
    good = launched4["pp_good"][0]
    _fails_on_a_hidden_case(_judge_launched(monkeypatch, launched4, "check_pp_loss", "pp_good", 0,
                                            ranks=good[:3]))
    runs = _hidden("check_pp_loss", 0)[0]["runs"]
    k = next(k for k, run in enumerate(runs) if run["stages"] == 2)
    moved = json.loads(json.dumps(good))
    moved[0][k], moved[2][k] = moved[2][k], moved[0][k]
    moved[1][k], moved[3][k] = moved[3][k], moved[1][k]
    _fails_on_a_hidden_case(_judge_launched(monkeypatch, launched4, "check_pp_loss", "pp_good", 0,
                                            ranks=moved))


# -- check_bubble -----------------------------------------------------------------------------------
def _bubble_ns(code: str | None = None) -> dict:
    ns = {"__name__": "__main__"}
    NB.run_code(ns, code or NB.solution("bubble_formula"))
    return ns


@pytest.mark.parametrize("seed", SEEDS)
def test_bubble_reference_passes(seed):
    verdict = NB.judge(_bubble_ns(), "check_bubble", seed=seed)
    assert verdict.passed, verdict.message


def test_bubble_honest_variant_passes():
    honest = '''
def bubble_fraction(p, m):
    slots = m + p - 1            # forward (or backward) slots of a GPipe step per stage
    return 1.0 - m / slots
'''
    assert NB.judge(_bubble_ns(honest), "check_bubble", seed=1).passed


WRONG_BUBBLE = {
    "m and p swapped": "def bubble_fraction(p, m):\n    return (m - 1) / (m + p - 1)\n",
    "over m": "def bubble_fraction(p, m):\n    return (p - 1) / m\n",
    "examples only": "def bubble_fraction(p, m):\n    return {(4, 4): 3 / 7, (2, 1): 0.5}.get((p, m), 0.25)\n",
}


@pytest.mark.parametrize("name", sorted(WRONG_BUBBLE))
def test_wrong_bubble_formula_fails(name):
    _fails_on_a_hidden_case(NB.judge(_bubble_ns(WRONG_BUBBLE[name]), "check_bubble"))


def test_swapped_formula_passes_the_examples_only_where_p_equals_m():
    """The self-check's examples tell (p, m) = (2, 1) apart from the swap; the hidden pairs
    never have p == m, where a swap would be invisible."""
    cases_fn, _ = graded_functions(split_check(NB.cells["check_bubble"]).graded, "check_bubble")
    for seed in SEEDS:
        assert all(p != m for p, m in draw_cases(cases_fn, seed))


# -- the real lab, graded in the sandbox -------------------------------------------------------------
@slow
def test_lab10_graded_in_the_sandbox(tmp_path):
    """The real Lab 10 graded as a submission: the %%writefile answers are written in the
    sandbox's scratch folder and imported by the ranks the checks start; every other
    answer is the reference's and passes; a block missing f's backward all-reduce loses check_tp_hand only."""
    g, wrong = grade_wrong(NB.path, tmp_path, "tp_file", _NO_F, "        return grad\n")
    assert g.max_points == notebook_points(NB.path) > 0
    assert wrong["check_tp_hand"].status == "failed" and wrong["check_tp_hand"].points == 0
    assert all(c.status == "passed" for gid, c in wrong.items() if gid != "check_tp_hand")


# -- the notebook's texts -------------------------------------------------------------------------
def test_written_answer_is_a_rubric_with_a_model_answer():
    cell = next(c for c in NB.nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_1f1b")
    answer = cell.source.split("### BEGIN SOLUTION", 1)[1]
    assert answer.strip().startswith(f"**Rubric ({cell.metadata['nbgrader']['points']} points).**")
    assert "**A model answer, for the grader's reference** (true on any machine" in answer
    for phrase in ("in flight", "(p − 1)/(m + p − 1)", "activations"):
        assert phrase in answer, phrase


def test_no_core_count_is_typed_in_the_markdown():
    for c in NB.nb.cells:
        if c.cell_type == "markdown":
            assert not re.search(r"\b\d+\s+cores?\b", c.source), c.source[:200]
    assert "core_label(" in NB.setup


def test_student_files_use_the_torch_apis_the_issue_names():
    """Issue 28: the student writes their own collectives, parallelize_module, the
    pipelining schedules and the mesh (the mesh in the rank code, named in the text)."""
    tp, pp = NB.cells["tp_file"], NB.cells["pp_file"]
    for name in ("torch.autograd.Function", "dist.all_reduce", "parallelize_module",
                 "ColwiseParallel", "RowwiseParallel"):
        assert name in tp, name
    for name in ("PipelineStage", "ScheduleGPipe", "Schedule1F1B"):
        assert name in pp, name
    assert any("init_device_mesh" in c.source for c in NB.nb.cells if c.cell_type == "markdown")


# -- the library pieces the 4-stage runs and the link plot added ---------------------------------------
def _pp_rec(busy, step, flight):
    return {"busy_s": [busy], "step_s": [step], "peak_in_flight": flight, "losses": [None],
            "stage_layers": 1, "stages": 2}


def test_bubble_table_reads_each_runs_stages():
    """A 2-stage run on ranks 0-1 of a 4-rank launch (ranks 2-3 idle) beside a 4-stage run."""
    import math

    from perflab.labs.lab10.tables import bubble_table

    runs = [{"schedule": "gpipe", "m": 4, "stages": 2}, {"schedule": "1f1b", "m": 4, "stages": 4}]
    per_rank = [[_pp_rec(0.8, 1.0, 4), _pp_rec(0.5, 1.0, 4)], [_pp_rec(0.6, 1.0, 4), _pp_rec(0.5, 1.0, 3)],
                [{"idle": True}, _pp_rec(0.5, 1.0, 2)], [{"idle": True}, _pp_rec(0.5, 1.0, 1)]]
    t = bubble_table(runs, per_rank, lambda p, m: (p - 1) / (m + p - 1))
    assert list(t.stages) == [2, 4]
    assert t.bubble_measured[0] == pytest.approx(0.3) and t.bubble_measured[1] == pytest.approx(0.5)
    assert t.bubble_formula.tolist() == pytest.approx([1 / 5, 3 / 7])
    assert math.isnan(t.bubble_rank2[0]) and t.in_flight_rank3.isna()[0] and t.in_flight_rank3[1] == 1
    per_rank[1][1] = {"error": "RuntimeError: boom"}
    with pytest.raises(ValueError, match="p=4, m=4 failed: rank 1: RuntimeError: boom"):
        bubble_table(runs, per_rank)


def test_pp_rank_rejects_a_run_with_more_stages_than_ranks(monkeypatch):
    import torch.distributed as dist

    from perflab.labs.lab10.ranks import pp_rank

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    with pytest.raises(ValueError, match=r"stages must be in 1..2"):
        pp_rank([{"schedule": "gpipe", "m": 4, "stages": 4}])


def test_waited_awaits_an_async_collective_tensor_and_returns_others():
    from perflab.labs.lab10.ranks import _waited

    class Async:
        def wait(self):
            return "waited"

    assert _waited(Async()) == "waited" and _waited(3) == 3


@slow
def test_dtensor_leaves_no_unwaited_collective(launched4):
    """Issue 35 item 6: the ranks of the lab's TP launch end with no functional collective
    left unawaited (the 2-D case's output is awaited), so a spawned rank no longer prints
    c10d's "there are still 1 unwaited collective calls" when it destroys its group."""
    for variant in ("tp_good", "tp_honest"):
        assert [r["unwaited_collectives"] for r in launched4[variant]] == [0, 0, 0, 0]


def test_model_comm_share_matches_the_link_model_for_the_solutions_model():
    from perflab.core.simulated import LINK_PRESETS
    from perflab.labs.lab10.tables import model_comm_share, tp_comm_share

    ns = _comm_fn()
    links = list(LINK_PRESETS.values())
    batch, seq, d, p, compute_s = 4, 32, 64, 2, 5e-4
    mine = model_comm_share(lambda a, b: ns["tp_step_comm_s"](batch, seq, d, p, a, b), compute_s, links)
    counted = tp_comm_share(compute_s, [4 * batch * seq * d] * 2, links, p)
    assert mine.set_index("link").comm_share.tolist() == pytest.approx(counted.comm_share.tolist())
    assert counted.beta_bytes_per_s.tolist() == [lk.beta_bytes_per_s for lk in links]
    broken = model_comm_share(lambda a, b: 1 / 0, compute_s, links)
    assert broken.comm_share.isna().all()
    with pytest.raises(ValueError, match="compute_s must be > 0"):
        model_comm_share(lambda a, b: 1.0, 0.0, links)


def test_the_plots_draw_two_stage_counts_and_the_link_sweep_and_reject_bad_tables():
    import pandas as pd

    from perflab.viz.pipeline_plots import plot_bubble, plot_comm_share

    table = pd.DataFrame({"schedule": ["gpipe", "gpipe", "gpipe"], "m": [2, 4, 4], "stages": [2, 2, 4],
                          "bubble_measured": [0.4, 0.25, 0.45], "bubble_formula": [1 / 3, 1 / 5, 3 / 7]})
    fig = plot_bubble(table)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "(p-1)/(m+p-1), p=2" in labels and "(p-1)/(m+p-1), p=4" in labels and "gpipe, measured, p=4" in labels
    with pytest.raises(ValueError, match="table needs rows"):
        plot_bubble(table.drop(columns="m"))
    links = pd.DataFrame({"link": ["1gbe", "nvlink"], "beta_bytes_per_s": [1.25e8, 4.5e11],
                          "comm_share": [0.6, 0.01]})
    fig = plot_comm_share(links, links)
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(ValueError, match="points needs rows"):
        plot_comm_share(links, links.iloc[:0])
    with pytest.raises(ValueError, match="model needs rows"):
        plot_comm_share(links.drop(columns="comm_share"))
