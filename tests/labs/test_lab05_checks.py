"""Lab 05's graded checks on real answers: each runs as grading runs it (the student's code
on hidden cases drawn in the grader, here in this process standing in for the kernel, the
answers as JSON, the judge apart: tests/labs/labcheck.py). The reference solutions pass at
several seeds, an honest answer written differently passes, and typical mistakes, answers
written for the examples only and answers that only delegate to perflab fail.

The lab's graded path (every code cell grading runs: set-up, given code, the reference
answers) runs once per module in this process; each answer then runs in a copy of that
namespace, followed by its check's graded part. Inductor's compiles go to a temporary
cache, so after the first compile of a function the others hit its FX graph cache.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab
from perflab.course.answers import SKIP_TAG
from perflab.course.checks import split_check

ROOT = Path(__file__).resolve().parents[2]
LAB_PATH = ROOT / "solutions" / "05_torch_compile.ipynb"
LAB = Lab("05")

_NB = nbformat.read(str(LAB_PATH), as_version=4)


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


CHECKS = {_nbg(c)["grade_id"]: c.source for c in _NB.cells
          if _nbg(c).get("grade") and c.cell_type == "code"}

#: The checks graded on hidden cases, each tried below on real wrong answers.
GRADED_TESTED = ("check_find_breaks", "check_scorer_nobreak", "check_count_graphs",
                 "check_no_recompiles", "check_generated_kernels")


def judge_in(ns: dict, gid: str, seed=0):
    """Check ``gid`` graded as in grading on the answers in ``ns``: its
    ``student_answer`` on the cases drawn at ``seed``, the judge apart."""
    return LAB.judge(ns, gid, seed=seed)


def test_every_check_has_judge_tests():
    assert {("05", gid) for gid in CHECKS} == {("05", g) for g in GRADED_TESTED}
    assert all(split_check(CHECKS[g]).graded is not None for g in GRADED_TESTED)
    forbid = {g: split_check(CHECKS[g]).graded.forbid for g in GRADED_TESTED}
    assert forbid == {"check_find_breaks": ("graph_breaks", "count_compiles"),
                      "check_scorer_nobreak": (),
                      "check_count_graphs": ("count_compiles",),
                      "check_no_recompiles": ("count_compiles",),
                      "check_generated_kernels": ("generated_code", "kernel_summary")}


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

_SCORER_EXAMPLES_ONLY = '''
def find_breaks(fn, *args):
    e = torch._dynamo.explain(fn)(*args)
    if e.graph_break_count == 0:
        return {"graphs": 1, "breaks": 0, "lines": []}
    return {"graphs": 3, "breaks": 2,
            "lines": ["if torch.isnan(s).any():", "peak = s.abs().max().item()"]}
'''
_CLAMPS_ONLY_FOR_EXAMPLES = '''
class ScorerNoBreak(Scorer):
    def forward(self, x):
        s = torch.nan_to_num(self.proj(x).squeeze(-1), nan=0.0)
        return torch.tanh(s / torch.clamp(s.abs().max(), min=0.05)) * 2
'''
_COUNT_RECOMPILES = '''
def count_graphs(fn, batches):
    shapes = [tuple(b.shape) for b in batches]
    return 1 if len(set(shapes)) == 1 else 2
'''
_NO_CLEAR = '''
from torch._dynamo.utils import counters

def count_graphs(fn, batches):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    for b in batches:
        compiled(b)
    return counters["stats"]["unique_graphs"]
'''
_RESET_PER_BATCH = '''
def run_without_recompiles(fn, batches):
    compiled = torch.compile(fn, backend="eager")
    outs = []
    for b in batches:
        outs.append(compiled(b))
        torch._dynamo.reset()
    return outs
'''

#: name -> (wrong answer, the check it must fail)
WRONG = {
    "breaks: graph count as break count": (_BREAKS_ARE_GRAPHS, "check_find_breaks"),
    "breaks: reason text, not the source line": (_REASON_TEXT, "check_find_breaks"),
    "breaks: hard-coded for Scorer": (_HARD_CODED, "check_find_breaks"),
    "breaks: the examples' answers only": (_SCORER_EXAMPLES_ONLY, "check_find_breaks"),
    "no-break: the original forward": (_STILL_BREAKS, "check_scorer_nobreak"),
    "no-break: forward hidden from dynamo": (_DISABLED, "check_scorer_nobreak"),
    "no-break: always divides by the peak": (_ALWAYS_DIVIDES, "check_scorer_nobreak"),
    "no-break: clamps at 0.05, not 1": (_CLAMPS_ONLY_FOR_EXAMPLES,
                                                        "check_scorer_nobreak"),
    "count: distinct shapes": (_COUNT_SHAPES, "check_count_graphs"),
    "count: no reset": (_NO_RESET, "check_count_graphs"),
    "count: counters not cleared": (_NO_CLEAR, "check_count_graphs"),
    "count: the examples' rule (1 or 2)": (_COUNT_RECOMPILES, "check_count_graphs"),
    "dynamic: plain compile": (_PLAIN_COMPILE, "check_no_recompiles"),
    "dynamic: marks the wrong dimension": (_WRONG_DIM, "check_no_recompiles"),
    "dynamic: not compiled": (_EAGER_ONLY, "check_no_recompiles"),
    "dynamic: a fresh compile per batch": (_RESET_PER_BATCH, "check_no_recompiles"),
    "kernels: every mention of a kernel": (_EVERY_MENTION, "check_generated_kernels"),
    "kernels: every call in call()": (_CALL_SITES, "check_generated_kernels"),
    "kernels: nothing compiled": (_NOT_COMPILED, "check_generated_kernels"),
}
#: name -> (an answer that only calls the perflab function it names, the check)
DELEGATING = {
    "breaks: delegates to perflab.graph_breaks": (_DELEGATE_BREAKS, "check_find_breaks",
                                                  "graph_breaks"),
    "count: delegates to perflab.count_compiles": (_DELEGATE_COUNT, "check_count_graphs",
                                                   "count_compiles"),
    "kernels: delegates to perflab": (_DELEGATE_KERNELS, "check_generated_kernels",
                                      "generated_code"),
}

_BREAKS_BY_GRAPHS = '''
def find_breaks(fn, *args):
    out = torch._dynamo.explain(fn)(*args)
    lines = []
    for reason in out.break_reasons:
        stack = reason.user_stack or []
        text = stack[-1].line if stack else ""
        lines.append(text.strip() if text else "")
    return dict(graphs=len(out.graphs), breaks=len(out.break_reasons), lines=lines)
'''
_NOBREAK_CLAMP_METHOD = '''
class ScorerNoBreak(Scorer):
    def forward(self, x):
        s = self.proj(x).squeeze(-1).nan_to_num(nan=0.0)
        return (s / s.abs().amax().clamp(min=1.0)).tanh() * 2
'''
_COUNT_COMPILER_RESET = '''
import torch._dynamo.utils

def count_graphs(fn, batches):
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(fn, backend="eager")
    for batch in batches:
        step(batch)
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
'''
_KERNELS_BY_LINES = '''
from torch._inductor.utils import run_and_get_code

def generated_kernels(fn, *args):
    _, codes = run_and_get_code(torch.compile(fn), *args)
    names = []
    for code in codes:
        for line in code.splitlines():
            head, sep, _ = line.partition(" = async_compile.")
            if sep and head.isidentifier() and head not in names:
                names.append(head)
    return names
'''
#: check -> an honest answer written differently from the reference
HONEST = {"check_find_breaks": _BREAKS_BY_GRAPHS,
          "check_scorer_nobreak": _NOBREAK_CLAMP_METHOD,
          "check_count_graphs": _COUNT_COMPILER_RESET,
          "check_no_recompiles": _DYNAMIC_TRUE,
          "check_generated_kernels": _KERNELS_BY_LINES}


# The reference at seed 0 passes every check: nbval runs solutions/05 with its hidden
# tests, each check's graded part on the cases drawn at seed 0 ("PASS (graded part)"), so
# no test here repeats it (it was this file's longest, 130 s of 600 s under load; each
# judge compiles). Here: the reference at a grading seed, honest variants, wrong answers.
@slow
@pytest.mark.parametrize("seed", ["grade:ada"])
@pytest.mark.parametrize("check", GRADED_TESTED)
def test_reference_passes_at_other_seeds(lab_ns, check, seed):
    verdict = judge_in(dict(lab_ns), check, seed=seed)
    assert verdict.passed, verdict.message


@slow
def test_dynamic_true_also_passes(lab_ns):
    ns = dict(lab_ns)
    exec(compile(_DYNAMIC_TRUE, "<answer>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, "check_no_recompiles")
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("check", GRADED_TESTED)
def test_honest_variant_passes(lab_ns, check):
    ns = dict(lab_ns)
    exec(compile(HONEST[check], "<answer>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, check, seed=7)
    assert verdict.passed, verdict.message


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_its_check(name, lab_ns):
    source, gid = WRONG[name]
    ns = dict(lab_ns)
    exec(compile(source, f"<answer {name}>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, gid)
    assert not verdict.passed, f"{name!r} passed {gid}"
    assert verdict.message.startswith("hidden case"), verdict.message


@slow
@pytest.mark.parametrize("name", sorted(DELEGATING))
def test_delegating_answer_fails_naming_the_function(name, lab_ns):
    source, gid, function = DELEGATING[name]
    ns = dict(lab_ns)
    exec(compile(source, f"<answer {name}>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, gid)
    assert not verdict.passed and function in verdict.message, verdict.message


# --- Exercise 2's hint: what nan_to_num does (issue 26) -------------------------------------

_NOBREAK_WHERE = '''
class ScorerNoBreak(Scorer):
    def forward(self, x):
        s = self.proj(x).squeeze(-1)
        s = torch.where(torch.isnan(s), torch.zeros_like(s), s)
        return torch.tanh(s / torch.clamp(s.abs().max(), min=1.0)) * 2
'''


def test_nan_to_num_maps_infinities_as_the_hint_says():
    """``torch.nan_to_num`` maps NaN to 0 here and +-inf to the dtype's largest and smallest
    finite values (its defaults): the hint says so, and the check's inputs hold no inf."""
    import torch

    s = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5])
    fmax = torch.finfo(torch.float32).max
    assert torch.nan_to_num(s, nan=0.0).tolist() == [0.0, fmax, -fmax, 1.5]
    hint = next(c.source for c in _NB.cells if c.source.startswith("### Exercise 2"))
    assert "`+inf`" in hint and "largest and smallest" in hint
    assert "does nothing to a tensor without NaNs" not in hint


@slow
def test_where_instead_of_nan_to_num_also_passes(lab_ns):
    ns = dict(lab_ns)
    exec(compile(_NOBREAK_WHERE, "<answer>", "exec"), ns)  # noqa: S102
    verdict = judge_in(ns, "check_scorer_nobreak", seed=3)
    assert verdict.passed, verdict.message


# --- the prediction and the GPU-only section -------------------------------------------------

def _cells_starting(prefix: str) -> list[str]:
    return [c.source for c in _NB.cells if c.cell_type == "code" and c.source.startswith(prefix)]


def test_prediction_is_recorded_and_shown_beside_the_measurement():
    (predict,) = [c.source for c in _NB.cells if _nbg(c).get("grade_id") == "predict_break_even"]
    assert 'predictions.record("break_even", my_predicted_break_even' in predict
    shown = [s for s in (c.source for c in _NB.cells) if 'predictions.beside("break_even"' in s]
    assert len(shown) == 2  # the measuring cell and the summary
    later = "".join(c.source for c in _NB.cells[_NB.cells.index(next(
        c for c in _NB.cells if _nbg(c).get("grade_id") == "predict_break_even")) + 1:]
        if c.cell_type == "code")
    assert "my_predicted_break_even" not in later  # later cells run with the prediction None


def test_gpu_sections_skip_with_the_measured_reason(capsys):
    """On a machine without CUDA the GPU-only cells skip at no cost and print the reason
    this machine reports (torch.cuda.is_available(), torch.version.cuda)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: test_gpu_sections_run_on_a_gpu runs the cells")
    sources = _cells_starting("# GPU-only")
    assert len(sources) == 3
    ns: dict = {"__name__": "__lab__"}
    exec(compile(LAB.setup, "<setup>", "exec"), ns)  # noqa: S102
    capsys.readouterr()
    for source in sources:
        exec(compile(source, "<gpu cell>", "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert out.count("Skipped:") == 2 and "torch.cuda.is_available() is False" in out
    assert f"torch.version.cuda is {torch.version.cuda}" in out
    assert ns["bench"] is None and ns["graph_diffs"] is None


from tests.conftest import requires_cuda  # noqa: E402


@requires_cuda
def test_gpu_sections_run_on_a_gpu(capsys):
    """On a CUDA GPU the cells run: cudnn.benchmark gives the same first loss, and CUDA
    graph replays (and mode="reduce-overhead") give eager's outputs."""
    ns: dict = {"__name__": "__lab__"}
    exec(compile(LAB.setup, "<setup>", "exec"), ns)  # noqa: S102
    for source in _cells_starting("# GPU-only"):
        exec(compile(source, "<gpu cell>", "exec"), ns)  # noqa: S102
    assert set(ns["bench"]) == {False, True} and len(ns["bench_losses"][True]) == 33
    assert len(ns["graph_diffs"]) == 4 and max(ns["graph_diffs"]) <= 1e-5
    assert "Skipped" not in capsys.readouterr().out
