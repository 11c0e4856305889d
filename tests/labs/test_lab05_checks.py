"""Lab 05's check cells: each judge passes right facts and fails wrong ones, and real wrong
answers — typical mistakes and answers that only delegate to perflab — fail their check
when the lab's own cells run with them.

The lab's graded path (every code cell grading runs: set-up, given code, the reference
answers) runs once per module in this process; each wrong answer then runs in a copy of
that namespace, followed by its check's probe and judge (facts through JSON, as in
grading). Inductor's compiles go to a temporary cache, so after the first compile of a
function the others hit its FX graph cache.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import assert_judge_decides
from perflab.course.answers import SKIP_TAG
from perflab.course.checks import run_judge, split_check

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "05_torch_compile.ipynb"

_NB = nbformat.read(str(LAB), as_version=4)


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


CHECKS = {_nbg(c)["grade_id"]: c.source for c in _NB.cells
          if _nbg(c).get("grade") and c.cell_type == "code"}


def _facts(check, ns: dict) -> dict:
    facts = {n: ns[n] for n in check.names if n in ns}
    return json.loads(json.dumps(
        facts, default=lambda o: o.tolist() if hasattr(o, "tolist") else
        sorted(o) if isinstance(o, (set, frozenset)) else repr(o)[:500]))


def judge_in(ns: dict, gid: str):
    """Run check ``gid``'s probe in ``ns`` and its judge on the facts (a raising probe fails)."""
    from perflab.course.checks import JudgeResult

    check = split_check(CHECKS[gid])
    try:
        exec(compile(check.probe, f"<probe {gid}>", "exec"), ns)  # noqa: S102
    except Exception as e:  # noqa: BLE001 - in grading a probe that raises fails its check
        return JudgeResult(False, f"{type(e).__name__}: {e}")
    return run_judge(check, _facts(check, ns), name=gid)


# --- judges on hand-made facts ---------------------------------------------------------

_LINES = ["if torch.isnan(s).any():", "peak = s.abs().max().item()"]
_B = {"graphs": 3, "breaks": 2, "lines": _LINES}
_B0 = {"graphs": 1, "breaks": 0, "lines": []}
_B1 = {"graphs": 2, "breaks": 1, "lines": ["n = len([v for v in x.sum(-1).tolist() if v > 0])"]}


def _bcase(mine, ref, delegated=()):
    return {"mine": mine, "ref": ref, "delegated": list(delegated)}


_BREAKS = {"Scorer": _bcase(_B, _B), "no_break": _bcase(_B0, _B0), "to_list": _bcase(_B1, _B1)}
_COUNTS = {"graphs": 1, "frames": 1, "breaks": 0, "unsupported": 0}
_GRAPHS = {"one shape": {"mine": 1, "ref": 1, "delegated": []},
           "two shapes": {"mine": 2, "ref": 2, "delegated": []},
           "four shapes": {"mine": 2, "ref": 2, "delegated": []},
           "dtypes": {"mine": 2, "ref": 2, "delegated": []},
           "widths": {"mine": 2, "ref": 2, "delegated": []}}
_DYN = {"normalize_rows": {"graphs": 1, "calls": 4, "same": [True] * 4, "delegated": []},
        "softmax": {"graphs": 1, "calls": 3, "same": [True] * 3, "delegated": []}}
_K1 = ["cpp_fused_add_gelu_mul_native_layer_norm_tanh_0"]
_K2 = ["cpp_fused_add_mul_relu_0", "cpp_fused_add_tanh_1"]
_K3 = ["cpp_fused__softmax_cos_mul_sin_0"]
_KERNELS = {"pointwise_chain": {"mine": _K1, "ref": _K1, "delegated": []},
            "act_matmul_act": {"mine": _K2, "ref": _K2, "delegated": []},
            "scaled_softmax": {"mine": _K3, "ref": _K3, "delegated": []}}

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)]), the
#: format of tests/labs/test_grading_checks.py's FACTS (which can import this table)
FACTS = {
    ("05", "check_find_breaks"): (
        {"breaks_got": _BREAKS},
        [({"breaks_got": {**_BREAKS, "Scorer": _bcase(_B, _B, ["graph_breaks"])}}, False),
         ({"breaks_got": {**_BREAKS, "Scorer": _bcase({**_B, "breaks": 3}, _B)}}, False),
         ({"breaks_got": {**_BREAKS, "Scorer": _bcase({**_B, "graphs": 2}, _B)}}, False),
         ({"breaks_got": {**_BREAKS, "Scorer": _bcase({**_B, "lines": ["generic_jump"] * 2},
                                                      _B)}}, False),
         ({"breaks_got": {**_BREAKS, "Scorer": _bcase({"returned": "(3, 2)"}, _B)}}, False),
         ({"breaks_got": {**_BREAKS, "to_list": _bcase(_B0, _B1)}}, True)]),
    ("05", "check_scorer_nobreak"): (
        {"nobreak_counts": _COUNTS, "nobreak_same": [True] * 3},
        [({"nobreak_counts": {**_COUNTS, "graphs": 5, "frames": 5, "breaks": 2,
                              "unsupported": 1}, "nobreak_same": [True] * 3}, False),
         ({"nobreak_counts": {**_COUNTS, "graphs": 0, "frames": 0},
           "nobreak_same": [True] * 3}, False),
         ({"nobreak_counts": {**_COUNTS, "frames": 2}, "nobreak_same": [True] * 3}, False),
         ({"nobreak_counts": _COUNTS, "nobreak_same": [True, True, False]}, False)]),
    ("05", "check_count_graphs"): (
        {"graphs_got": _GRAPHS},
        [({"graphs_got": {**_GRAPHS, "four shapes": {"mine": 4, "ref": 2, "delegated": []}}},
          False),
         ({"graphs_got": {**_GRAPHS, "one shape": {"mine": 1, "ref": 1,
                                                    "delegated": ["count_compiles"]}}}, False),
         ({"graphs_got": {**_GRAPHS, "dtypes": {"mine": 1, "ref": 2, "delegated": []}}}, True)]),
    ("05", "check_no_recompiles"): (
        {"dynamic_got": _DYN},
        [({"dynamic_got": {**_DYN, "normalize_rows": {**_DYN["normalize_rows"], "graphs": 2}}},
          False),
         ({"dynamic_got": {**_DYN, "normalize_rows": {**_DYN["normalize_rows"], "graphs": 0}}},
          False),
         ({"dynamic_got": {**_DYN, "normalize_rows": {**_DYN["normalize_rows"],
                                                      "same": [True, False, True, True]}}},
          False),
         ({"dynamic_got": {**_DYN, "normalize_rows": {**_DYN["normalize_rows"], "same": []}}},
          False),
         ({"dynamic_got": {**_DYN, "normalize_rows": {**_DYN["normalize_rows"],
                                                      "delegated": ["count_compiles"]}}}, False),
         ({"dynamic_got": {**_DYN, "softmax": {**_DYN["softmax"], "graphs": 2}}}, True)]),
    ("05", "check_generated_kernels"): (
        {"kernels_got": _KERNELS},
        [({"kernels_got": {**_KERNELS, "pointwise_chain": {"mine": _K1 * 2, "ref": _K1,
                                                           "delegated": []}}}, False),
         ({"kernels_got": {**_KERNELS, "act_matmul_act": {"mine": ["async_compile", *_K2],
                                                          "ref": _K2, "delegated": []}}}, False),
         ({"kernels_got": {**_KERNELS, "pointwise_chain": {"mine": _K1, "ref": _K1,
                                                           "delegated": ["generated_code"]}}},
          False),
         ({"kernels_got": {**_KERNELS, "pointwise_chain": {"mine": "1", "ref": _K1,
                                                           "delegated": []}}}, False),
         ({"kernels_got": {**_KERNELS, "act_matmul_act": {"mine": _K2[::-1], "ref": _K2,
                                                          "delegated": []}}}, False),
         ({"kernels_got": {**_KERNELS, "scaled_softmax": {"mine": [], "ref": _K3,
                                                          "delegated": []}}}, True)]),
}


@pytest.mark.parametrize("key", sorted(FACTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_judge_passes_right_facts_and_fails_wrong_ones(key):
    assert_judge_decides(CHECKS[key[1]], *FACTS[key], name=key[1])


def test_every_check_has_judge_tests():
    assert {("05", gid) for gid in CHECKS} == set(FACTS)


# --- the lab's own cells with real answers ---------------------------------------------

@pytest.fixture(scope="module")
def lab_ns(tmp_path_factory):
    """The namespace after the lab's graded path ran with the reference answers (checks
    not run), at the tiny preset, with results and inductor's cache in a temporary folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFLAB_PRESET", "tiny")
        mp.setenv("MPLBACKEND", "Agg")
        mp.setenv("PERFLAB_RESULTS", str(tmp_path_factory.mktemp("results")))
        ns: dict = {"__name__": "__lab__", "display": lambda *a, **k: None}
        for cell in _NB.cells:
            meta = _nbg(cell)
            if (cell.cell_type != "code" or meta.get("grade")
                    or (SKIP_TAG in cell.metadata.get("tags", []) and not meta.get("solution"))):
                continue
            exec(compile(cell.source, f"<cell {meta.get('grade_id', '')}>", "exec"), ns)  # noqa: S102
        yield ns


_DELEGATE_BREAKS = '''
def find_breaks(fn, *args):
    from perflab import graph_breaks
    g = graph_breaks(fn, *args)
    return {"graphs": g.graphs, "breaks": g.breaks, "lines": list(g.lines)}
'''
_BREAKS_ARE_GRAPHS = '''
def find_breaks(fn, *args):
    e = torch._dynamo.explain(fn)(*args)
    return {"graphs": e.graph_count, "breaks": e.graph_count,
            "lines": [(r.user_stack[-1].line or "").strip() for r in e.break_reasons]}
'''
_REASON_TEXT = '''
def find_breaks(fn, *args):
    e = torch._dynamo.explain(fn)(*args)
    return {"graphs": e.graph_count, "breaks": e.graph_break_count,
            "lines": [str(r.reason).splitlines()[0] for r in e.break_reasons]}
'''
_HARD_CODED = '''
def find_breaks(fn, *args):
    return {"graphs": 3, "breaks": 2,
            "lines": ["if torch.isnan(s).any():", "peak = s.abs().max().item()"]}
'''
_STILL_BREAKS = '''
class ScorerNoBreak(Scorer):
    pass
'''
_DISABLED = '''
class ScorerNoBreak(Scorer):
    @torch._dynamo.disable
    def forward(self, x):
        return Scorer.forward(self, x)
'''
_ALWAYS_DIVIDES = '''
class ScorerNoBreak(Scorer):
    def forward(self, x):
        s = torch.nan_to_num(self.proj(x).squeeze(-1), nan=0.0)
        return torch.tanh(s / s.abs().max()) * 2
'''
_COUNT_SHAPES = '''
def count_graphs(fn, batches):
    return len({(tuple(b.shape), b.dtype) for b in batches})
'''
_NO_RESET = '''
from torch._dynamo.utils import counters

def count_graphs(fn, batches):
    compiled = torch.compile(fn, backend="eager")
    for b in batches:
        compiled(b)
    return counters["stats"]["unique_graphs"]
'''
_DELEGATE_COUNT = '''
def count_graphs(fn, batches):
    return count_compiles(fn, [(b,) for b in batches]).graphs
'''
_PLAIN_COMPILE = '''
def run_without_recompiles(fn, batches):
    compiled = torch.compile(fn, backend="eager")
    return [compiled(b) for b in batches]
'''
_WRONG_DIM = '''
def run_without_recompiles(fn, batches):
    compiled = torch.compile(fn, backend="eager")
    torch._dynamo.mark_dynamic(batches[0], 1)
    return [compiled(b) for b in batches]
'''
_EAGER_ONLY = '''
def run_without_recompiles(fn, batches):
    return [fn(b) for b in batches]
'''
_DYNAMIC_TRUE = '''
def run_without_recompiles(fn, batches):
    compiled = torch.compile(fn, backend="eager", dynamic=True)
    return [compiled(b) for b in batches]
'''
_EVERY_MENTION = '''
import re
from torch._inductor.utils import run_and_get_code

def generated_kernels(fn, *args):
    _, codes = run_and_get_code(torch.compile(fn), *args)
    return [name for code in codes for name in re.findall(r"cpp_fused_\\w+|triton_\\w+", code)]
'''
_CALL_SITES = '''
import re
from torch._inductor.utils import run_and_get_code

def generated_kernels(fn, *args):
    _, codes = run_and_get_code(torch.compile(fn), *args)
    return [name for code in codes
            for name in re.findall(r"^\\s+(\\w+)\\(", code[code.index("def call("):], re.M)]
'''
_DELEGATE_KERNELS = '''
def generated_kernels(fn, *args):
    _, codes = generated_code(torch.compile(fn), *args)
    return list(kernel_summary(codes).fused)
'''
_NOT_COMPILED = '''
from torch._inductor.utils import run_and_get_code

def generated_kernels(fn, *args):
    _, codes = run_and_get_code(fn, *args)
    return []
'''

#: name -> (wrong answer, the check it must fail)
WRONG = {
    "breaks: delegates to perflab.graph_breaks": (_DELEGATE_BREAKS, "check_find_breaks"),
    "breaks: graph count as break count": (_BREAKS_ARE_GRAPHS, "check_find_breaks"),
    "breaks: reason text, not the source line": (_REASON_TEXT, "check_find_breaks"),
    "breaks: hard-coded for Scorer": (_HARD_CODED, "check_find_breaks"),
    "no-break: the original forward": (_STILL_BREAKS, "check_scorer_nobreak"),
    "no-break: forward hidden from dynamo": (_DISABLED, "check_scorer_nobreak"),
    "no-break: always divides by the peak": (_ALWAYS_DIVIDES, "check_scorer_nobreak"),
    "count: distinct shapes": (_COUNT_SHAPES, "check_count_graphs"),
    "count: no reset": (_NO_RESET, "check_count_graphs"),
    "count: delegates to perflab.count_compiles": (_DELEGATE_COUNT, "check_count_graphs"),
    "dynamic: plain compile": (_PLAIN_COMPILE, "check_no_recompiles"),
    "dynamic: marks the wrong dimension": (_WRONG_DIM, "check_no_recompiles"),
    "dynamic: not compiled": (_EAGER_ONLY, "check_no_recompiles"),
    "kernels: every mention of a kernel": (_EVERY_MENTION, "check_generated_kernels"),
    "kernels: every call in call()": (_CALL_SITES, "check_generated_kernels"),
    "kernels: delegates to perflab": (_DELEGATE_KERNELS, "check_generated_kernels"),
    "kernels: nothing compiled": (_NOT_COMPILED, "check_generated_kernels"),
}


@slow
def test_reference_answers_pass_every_check(lab_ns):
    ns = dict(lab_ns)
    verdicts = {gid: judge_in(ns, gid) for gid in CHECKS}
    assert all(v.passed for v in verdicts.values()), {
        g: v.message for g, v in verdicts.items() if not v.passed}


@slow
def test_dynamic_true_also_passes(lab_ns):
    ns = dict(lab_ns)
    exec(compile(_DYNAMIC_TRUE, "<answer>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, "check_no_recompiles")
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_its_check(name, lab_ns):
    source, gid = WRONG[name]
    ns = dict(lab_ns)
    exec(compile(source, f"<answer {name}>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, gid)
    assert not verdict.passed, f"{name!r} passed {gid}"
    assert verdict.message
