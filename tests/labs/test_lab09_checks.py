"""Lab 09's check cells: each judge passes the right facts and fails wrong ones (the
``FACTS_09`` table, merged into tests/labs/test_grading_checks.py), and wrong *student code*
(a ZeRO-1 that does not broadcast or does not shard, a state counter that counts elements
or a DTensor's global size) run on 2 gloo ranks fails its check through the probe."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import torch

from tests.conftest import slow
from tests.labs.labcheck import assert_judge_decides, grade_reference_and_wrong
from perflab.course.checks import run_judge, split_check
from perflab.distributed import launch_fn
from perflab.models import mlp
from perflab.labs.lab09 import sharding_rank, unsharded_adamw

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "09_sharding_and_scaling.ipynb"

_REF = unsharded_adamw([32] * 9, 2, 8, 6, lr=1e-2, weight_decay=0.01)
_FULL = 2 * 4 * 8448 + 4 * 16
_ZERO1 = {"params": [_REF, _REF], "opt_bytes": [_FULL // 2 - 16, _FULL // 2 + 16],
          "full_opt_bytes": _FULL, "largest_state_bytes": 2 * 4 * 1024 + 4}
_COUNTS = {"adamw": 2 * 212 * 4 + 16, "sgd": 212 * 4, "amsgrad": 3 * 212 * 4 + 16}
_RANKS = [["ddp", 0, 67648, 67648], ["fsdp2", 1, 33856, 33856]]
_P = 33792
_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def _per_step(n):
    return {"ddp": {"all_reduce": n}, "ddp_fp16": {"all_reduce": n / 2},
            "zero1": {"all_reduce": n, "broadcast": n},
            "zero_redundancy": {"all_reduce": n, "broadcast": n},
            "fsdp2": {"all_gather": 2 * n, "reduce_scatter": n}}


def _counted(n):
    return {m: {**{k: float(d.get(k, 0)) for k in _KINDS}, "total": float(sum(d.values()))}
            for m, d in _per_step(n).items()}


def _ef(feedback=True):
    gen = torch.Generator().manual_seed(9)
    grads = [torch.randn(16, generator=gen) for _ in range(5)]
    residual, sent = torch.zeros(16), []
    for g in grads:
        acc = g + residual if feedback else g
        out = torch.zeros(16)
        idx = acc.abs().topk(4).indices
        out[idx] = acc[idx]
        residual = acc - out if feedback else residual + (acc - out)
        sent.append(out)
    return {"grads": [g.tolist() for g in grads], "sent": [s.tolist() for s in sent],
            "residual": (residual if feedback else torch.zeros(16)).tolist()}


_stale = list(_REF)
_stale[:512] = [v + 1e-3 for v in _stale[:512]]  # rank 1 never received rank 0's params

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)])
FACTS_09 = {
    ("09", "check_state_bytes"): (
        {"local_counts": _COUNTS, "on_ranks": _RANKS},
        [({"local_counts": {k: v // 4 for k, v in _COUNTS.items()}, "on_ranks": _RANKS}, False),
         ({"local_counts": {**_COUNTS, "adamw": _COUNTS["adamw"] - 16}, "on_ranks": _RANKS}, False),
         ({"local_counts": _COUNTS, "on_ranks": [["fsdp2", 1, 67648, 33856]]}, False),
         ({"local_counts": {**_COUNTS, "amsgrad": _COUNTS["adamw"]}, "on_ranks": _RANKS}, True)]),
    ("09", "check_zero1"): (
        {"zero1_facts": _ZERO1},
        [({"zero1_facts": {**_ZERO1, "params": [_REF, _stale]}}, False),
         ({"zero1_facts": {**_ZERO1, "opt_bytes": [_FULL, _FULL]}}, False),
         ({"zero1_facts": {**_ZERO1, "opt_bytes": [_FULL, 0]}}, False),
         ({"zero1_facts": {**_ZERO1, "params": [_REF[:-1], _REF[:-1]]}}, False)]),
    ("09", "check_predict_bytes"): (
        {"P": _P, "counted": _counted(_P), "mine": _per_step(_P), "other": _per_step(4_000_000)},
        [({"P": _P, "counted": _counted(_P),
           "mine": {**_per_step(_P), "fsdp2": {"all_gather": _P, "reduce_scatter": _P}},
           "other": _per_step(4_000_000)}, False),
         ({"P": _P, "counted": _counted(_P),
           "mine": {**_per_step(_P), "zero1": {"all_reduce": _P}}, "other": _per_step(4_000_000)},
          False),
         ({"P": _P, "counted": _counted(_P), "mine": _per_step(_P), "other": _per_step(_P)}, True)]),
    ("09", "check_error_feedback"): (
        {"ef": _ef()}, [({"ef": _ef(feedback=False)}, False),
                        ({"ef": {**_ef(), "residual": [0.0] * 16}}, False)]),
}


def _cell(gid: str) -> str:
    nb = nbformat.read(str(LAB), as_version=4)
    (src,) = [c.source for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade_id") == gid]
    return src


@pytest.mark.parametrize("key", sorted(FACTS_09), ids=lambda k: f"{k[0]}-{k[1]}")
def test_lab09_judges(key):
    assert_judge_decides(_cell(key[1]), *FACTS_09[key], name=key[1])


# -- wrong student code, run on ranks, judged through the lab's own probe ----------------------
_GOOD_COUNTER = '''
def my_state_bytes(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, DTensor):
                value = value.to_local()
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total
'''
_HEAD = "import torch\nimport torch.distributed as dist\nfrom torch.distributed.tensor import DTensor\n"
_ZERO1_INIT = '''
class MyZero1:
    def __init__(self, params, lr=1e-3, weight_decay=0.01):
        self.params = list(params)
        rank, ws = dist.get_rank(), dist.get_world_size()
        load, self.owner = [0] * ws, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            self.owner[i] = load.index(min(load))    # balanced: largest first
            load[self.owner[i]] += self.params[i].numel()
        mine = [p for p, r in zip(self.params, self.owner) if r == rank]
        self.local_optimizer = torch.optim.AdamW({mine}, lr=lr, weight_decay=weight_decay)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.local_optimizer.step()
{broadcast}
'''
_BROADCAST = ("        for p, r in zip(self.params, self.owner):\n"
              "            dist.broadcast(p.data, src=r)\n")

_ROUND_ROBIN = _ZERO1_INIT.format(mine="mine", broadcast=_BROADCAST).replace(
    "self.owner[i] = load.index(min(load))", "self.owner[i] = i % ws")

WRONG = {
    # round-robin by tensor index puts every weight on rank 0 and every bias on rank 1
    "round_robin": (_ROUND_ROBIN, _GOOD_COUNTER, {"check_zero1"}),
    # steps its own shard but never sends it: the ranks drift apart from AdamW
    "no_broadcast": (_ZERO1_INIT.format(mine="mine", broadcast=""), _GOOD_COUNTER,
                     {"check_zero1"}),
    # every rank keeps the state of every parameter: right parameters, no saving
    "unsharded": (_ZERO1_INIT.format(mine="self.params", broadcast=""), _GOOD_COUNTER,
                  {"check_zero1"}),
    # counts elements, not bytes
    "numel_counter": (_ZERO1_INIT.format(mine="mine", broadcast=_BROADCAST),
                      _GOOD_COUNTER.replace(" * value.element_size()", ""),
                      {"check_state_bytes"}),
    # a DTensor's global size (numel of the DTensor itself) instead of the local shard
    "global_dtensor": (_ZERO1_INIT.format(mine="mine", broadcast=_BROADCAST),
                       _GOOD_COUNTER.replace("value = value.to_local()", "pass"),
                       {"check_state_bytes"}),
}


def _judge_with_probe(gid: str, namespace: dict) -> bool:
    check = split_check(_cell(gid))
    exec(check.probe, namespace)  # noqa: S102 - the lab's own probe, on test data
    facts = json.loads(json.dumps({n: namespace[n] for n in check.names if n in namespace}))
    return run_judge(check, facts, name=gid).passed


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_student_code_fails_its_check(name, tmp_path, monkeypatch):
    import importlib

    zero1, counter, failing = WRONG[name]
    module = f"zero1_wrong_{name}"
    (tmp_path / f"{module}.py").write_text(_HEAD + counter + zero1)
    monkeypatch.syspath_prepend(str(tmp_path))
    ranks = launch_fn(sharding_rank, 2, device="cpu", timeout_s=300,
                      args=(["ddp", "zero1", "fsdp2"], [32] * 9, 8, 6, module))
    student = importlib.import_module(module)
    for gid in ("check_state_bytes", "check_zero1"):
        ns = {"small2": ranks, "zero1_student": student, "mlp": mlp, "torch": torch}
        assert _judge_with_probe(gid, ns) == (gid not in failing), (name, gid)


@slow
def test_lab09_graded_in_the_sandbox(tmp_path):
    """The real Lab 09 graded as a submission: the %%writefile answer is written in the
    sandbox's scratch folder and imported by the spawned ranks; the reference gets full
    marks, a ZeRO-1 that never broadcasts loses check_zero1 and nothing before it."""
    g, wrong = grade_reference_and_wrong(LAB, tmp_path, "zero1_file",
                                         "dist.broadcast(p.data, src=r)", "pass")
    assert g.points == g.max_points > 0, [(c.grade_id, c.message) for c in g.checks
                                          if c.status != "passed"]
    assert wrong["check_zero1"].status == "failed" and wrong["check_zero1"].points == 0
    assert wrong["check_state_bytes"].status == "passed"
