"""perflab course grade: answers into the reference, a sandbox, verdicts judged outside.

Most cases use a small synthetic lab (a kernel start and a few cells each) or no kernel
at all; the attacks are in test_grading_attacks.py, the sandbox in
test_grading_sandbox.py. Submissions are generated from the reference with
``build_lab`` (the student version) plus edits.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import nbformat
import pytest

from perflab.course.answers import SKIP_TAG, Flag, answers_of, assemble, scan_answer
from perflab.course.written import written_answers
from perflab.course.build import build_lab
from perflab.course.checks import (FACTS_MARKER, judge_names, parse_facts, run_judge,
                                   split_check)
from perflab.course.command import add_grade_arguments, grade_command
from perflab.course.grading import grade_submissions
from perflab.course.report import ScoreTable, write_answers, write_feedback, write_scores_csv
from perflab.course.submission import CheckResult, LabGrade, Limits, lab_key

ROOT = Path(__file__).resolve().parents[2]
FAST = Limits(cell_timeout_s=20, wall_timeout_s=120, memory_gib=8)

DOUBLE_CHECK = ('got = {"2": double(2)}\n'
                '### BEGIN HIDDEN TESTS\ngot["-3"] = double(-3)\n### END HIDDEN TESTS\n'
                '### JUDGE\n'
                'assert got["2"] == 4, f"double(2) returned {got[\'2\']!r}, expected 4"\n'
                '### BEGIN HIDDEN TESTS\nassert got["-3"] == -6, "double(-3) should be -6"\n'
                '### END HIDDEN TESTS\nprint("PASS: double doubles")')


#: check_double in the graded format: a self-check on the examples (double(2) == 4), the
#: grade on hidden cases drawn at grade time, judged in the grader.
GRADED_DOUBLE = ('assert double(2) == 4, f"double(2) returned {double(2)!r}, expected 4"\n'
                 'print("PASS: double doubles")\n'
                 '### BEGIN HIDDEN TESTS\n### GRADED\n'
                 'def hidden_cases(rng):\n    return [rng.randint(-10**6, 10**6) for _ in range(5)]\n\n'
                 'def student_answer(case):\n    return double(case)\n\n'
                 'def judge_answer(case, got):\n    assert got == 2 * case, "SECRET-JUDGE wrong"\n\n'
                 'from perflab.course.cases import run_cases\n'
                 'run_cases(hidden_cases, student_answer, judge_answer)\n### END HIDDEN TESTS')
#: check_answer in the graded format: one fixed "case" (a constant question; the kit's
#: labs grade predictions on hidden variants instead).
GRADED_ANSWER = ('assert answer == 42, f"answer is {answer}, expected 42"\n'
                 'print("PASS: answer is 42")\n'
                 '### BEGIN HIDDEN TESTS\n### GRADED\n'
                 'def hidden_cases(rng):\n    return [None]\n\n'
                 'def student_answer(case):\n    return answer\n\n'
                 'def judge_answer(case, got):\n    assert got == 42, f"answer is {got!r}"\n\n'
                 'from perflab.course.cases import run_cases\n'
                 'run_cases(hidden_cases, student_answer, judge_answer)\n### END HIDDEN TESTS')


def _code(src, *, out=None, tags=None, **nbg):
    c = nbformat.v4.new_code_cell(src)
    if nbg:
        c.metadata["nbgrader"] = {"schema_version": 3, "task": False, **nbg}
    if tags:
        c.metadata["tags"] = tags
    if out is not None:  # a check cell: its stored output is nbval's reference
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)]
        c.execution_count = 1
    return c


def _check(gid, points, src, out):
    return _code(src, out=out, tags=["nbval-check-output"], grade=True, solution=False,
                 locked=True, grade_id=gid, points=points)


def _solution(gid, src, allow=None):
    c = _code(src, grade=False, solution=True, locked=False, grade_id=gid)
    if allow:
        c.metadata["perflab"] = {"allow": allow}
    return c


def reference_nb(allow=None) -> nbformat.NotebookNode:
    """A 4-point lab: two exercises (one with hidden tests), one independent check, a
    skipped slow cell and a written answer."""
    written = nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nBecause the reference "
                                            "says SECRET-WRITTEN.\n### END SOLUTION")
    written.metadata["nbgrader"] = {"schema_version": 3, "grade": True, "solution": True,
                                    "locked": False, "grade_id": "explain", "points": 1}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Lab 09 — synthetic"),
        _code("base = 10"),
        _solution("my_answer", "### BEGIN SOLUTION\nanswer = 42  # SECRET-SOLUTION\n"
                  "### END SOLUTION", allow),
        _check("check_answer", 2, GRADED_ANSWER,
               "PASS: answer is 42\nPASS (graded part): 1 case drawn at seed 0\n"),
        _code("import time\ntime.sleep(60)\nslow = 1", tags=[SKIP_TAG]),
        _solution("my_double", "### BEGIN SOLUTION\ndef double(v):\n    return 2 * v\n"
                  "### END SOLUTION"),
        _check("check_double", 1, GRADED_DOUBLE,
               "PASS: double doubles\nPASS (graded part): 5 cases drawn at seed 0\n"),
        _check("check_base", 1, 'assert base == 10\nprint("PASS: base is 10")',
               "PASS: base is 10\n"),
        nbformat.v4.new_markdown_cell("Predict, then explain: why 42?"),
        written,
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}
    return nb


@pytest.fixture
def reference(tmp_path) -> Path:
    ref = tmp_path / "reference"
    ref.mkdir()
    nbformat.write(reference_nb(), str(ref / "09_synthetic.ipynb"))
    return ref


def student_nb(reference: Path, answer="answer = 42",
               double="def double(v):\n    return 2 * v",
               explain="It is the answer.") -> nbformat.NotebookNode:
    """The student version of the reference, with the exercises filled in."""
    nb = nbformat.reads(build_lab(reference / "09_synthetic.ipynb"), as_version=4)
    for c in nb.cells:
        gid = _gid(c)
        if gid == "my_answer":
            c.source = answer
        elif gid == "my_double":
            c.source = double
        elif gid == "explain":
            c.source = explain
    return nb


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _drop(nb, gid):
    nb.cells = [c for c in nb.cells if _gid(c) != gid]
    return nb


def _edit(nb, gid, src):
    for c in nb.cells:
        if _gid(c) == gid:
            c.source = src
    return nb


def _write(folder: Path, student: str, nb_or_text, name="09_synthetic.ipynb") -> Path:
    d = folder / student
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(nb_or_text, str):
        (d / name).write_text(nb_or_text)
    else:
        nbformat.write(nb_or_text, str(d / name))
    return d / name


# -- the check-cell format (no kernel) ----------------------------------------------------

def test_split_check_cuts_at_judge_and_finds_the_facts():
    check = split_check(DOUBLE_CHECK)
    assert check.probe.startswith('got = {"2": double(2)}') and "### JUDGE" not in check.probe
    assert check.judge.startswith("### JUDGE") and check.names == ("got",)
    assert check.judge_hidden_lines == frozenset({4})  # the hidden assertion, 1-based
    whole = split_check('import math\nassert math.isclose(x, y), f"{x} vs {y}"')
    assert whole.probe == "" and whole.names == ("x", "y")
    assert judge_names("for k in d:\n    assert k in e\nf = lambda z: z") == ("d", "e")


@pytest.mark.parametrize("src, match", [
    ("### JUDGE\n### JUDGE", "2 '### JUDGE' lines"),
    ("### BEGIN HIDDEN TESTS\nx = 1", "without an END"),
    ("### END HIDDEN TESTS", "without a BEGIN"),
    ("### JUDGE\nassert (", "not valid Python"),
])
def test_split_check_rejects_malformed_checks(src, match):
    with pytest.raises(ValueError, match=match):
        split_check(src)


def test_run_judge_right_wrong_hidden_and_missing_facts():
    check = split_check(DOUBLE_CHECK)
    assert run_judge(check, {"got": {"2": 4, "-3": -6}}).passed
    wrong = run_judge(check, {"got": {"2": 5, "-3": -6}})
    assert not wrong.passed and not wrong.hidden
    assert wrong.message == "AssertionError: double(2) returned 5, expected 4"
    hidden = run_judge(check, {"got": {"2": 4, "-3": 3}})
    assert not hidden.passed and hidden.hidden and "double(-3)" in hidden.message
    missing = run_judge(check, {})
    assert "'got' is not defined when the check runs" in missing.message
    # only the names the judge reads get in, and a judge's own prints go nowhere
    assert run_judge(split_check("assert 'x' not in dir()"), {"x": 1}).passed


def test_parse_facts_needs_exactly_one_json_line():
    assert parse_facts(f'noise\n{FACTS_MARKER}{{"a": 1}}\n') == ({"a": 1}, "")
    assert "0 fact lines" in parse_facts("PASS: forged")[1]
    two = parse_facts(f'{FACTS_MARKER}{{"a": 1}}\n{FACTS_MARKER}{{"a": 2}}')
    assert two[0] is None and "tampering" in two[1]
    assert "not valid JSON" in parse_facts(f"{FACTS_MARKER}{{nope")[1]
    assert "not a JSON object" in parse_facts(f"{FACTS_MARKER}[1]")[1]
    # a line nested 3,000 deep raises RecursionError in json.loads: "tampered or crashed"
    deep = parse_facts(FACTS_MARKER + "[" * 3000 + "]" * 3000)
    assert deep[0] is None and "tampered or crashed" in deep[1]


# -- answers, assembly, flags (no kernel) -------------------------------------------------

def test_assemble_runs_only_the_answers_and_sends_no_secret(reference):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = student_nb(reference)
    _edit(nb, "check_double", 'print("PASS: double doubles")')  # an edited check
    for c in nb.cells:
        if c.source == "base = 10":
            c.source = "base = 10\nanswer = 42"  # edited outside a solution cell
    nb.cells.append(nbformat.v4.new_code_cell("scratch = 1"))  # added
    answers, notes = answers_of(nb, ref)
    assert answers == {"my_answer": "answer = 42",
                       "my_double": "def double(v):\n    return 2 * v"} and notes == []
    out = assemble(ref, answers)
    text = nbformat.writes(out.notebook)
    for secret in ("SECRET-SOLUTION", "SECRET-WRITTEN", "SECRET-JUDGE", "expected 4",
                   "def judge_answer", "def hidden_cases", "PASS:", "time.sleep(60)",
                   "scratch = 1", "answer = 42\\nanswer"):
        assert secret not in text, secret
    codes = [c.source for c in out.notebook.cells if c.cell_type == "code"]
    assert codes[0] == "base = 10" and codes[1] == "answer = 42"
    # the graded probe: the student's double on the hidden cases drawn in the grader
    assert "return double(case)" in codes[4] and "answer_cases" in codes[4]
    assert repr(json.dumps(out.cases["check_double"])) in codes[4]
    assert len(out.cases["check_double"]) == 5 and set(out.judges) == {"check_answer",
                                                                       "check_double"}
    # another seed (another grading run, another student) draws other cases
    assert assemble(ref, answers, seed="1:ada").cases["check_double"] != out.cases["check_double"]
    assert all(not c.get("outputs") for c in out.notebook.cells if c.cell_type == "code")
    assert out.points == {"check_answer": 2, "check_double": 1, "check_base": 1}
    assert out.after == {"my_answer": ["check_answer", "check_double", "check_base"],
                         "my_double": ["check_double", "check_base"]}
    assert out.skipped == 1


def test_missing_and_duplicated_answers(reference):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = _drop(student_nb(reference), "my_double")
    nb.cells.append(_solution("my_answer", "answer = 0"))
    answers, notes = answers_of(nb, ref)
    assert answers == {"my_answer": "answer = 42"}
    assert notes == ["answer cell 'my_answer' appears more than once; the first is graded",
                     "answer cell 'my_double' is missing from the submission"]
    codes = [c.source for c in assemble(ref, answers).notebook.cells if c.cell_type == "code"]
    assert "no answer for 'my_double' in the submission" in codes[3]


@pytest.mark.parametrize("src, keys", [
    ("import os\nos.system('ls')", ["attribute os.system", "IPython system"]),
    ("import sys\nsys.modules['json'].dumps", ["attribute sys.modules"]),
    ("import ctypes as c, gc", ["import ctypes", "import gc"]),
    ("import _pickle", ["import _pickle"]),
    ("from unittest import mock", ["import unittest"]),
    ("f = getattr(json, '__dict__')", ["getattr __dict__"]),
    ("get_ipython().events.register('pre_run_cell', f)", ["IPython events", "name get_ipython"]),
    ("!ls /", ["IPython system", "name get_ipython"]),
    ("%matplotlib inline", ["IPython run_line_magic", "name get_ipython"]),
    ("%%writefile mod.py\nimport json\njson.dumps = str", ["module attribute json.dumps"]),
    ("m = __import__('o' + 's')", ["name __import__"]),
    ("().__class__.__base__.__subclasses__()",
     ["attribute __base__", "attribute __class__", "attribute __subclasses__"]),
    ("perflab.measure = lambda *a: 1", ["module attribute perflab.measure"]),
    ("import json\njson.dumps = str", ["module attribute json.dumps"]),
    ("setattr(torch, 'compile', f)", ["name setattr"]),
    ("open('x.txt', 'w').write('1')", ["open for writing"]),
    ("exec('x = 1')", ["name exec"]),
])
def test_scan_answer_flags_reaching_into_the_machinery(src, keys):
    flags = scan_answer("ex", src if src.startswith("%%") else "x = 1\n" + src)
    assert sorted(f.key for f in flags) == sorted(keys)
    last = 1 + src.count("\n") + (0 if src.startswith("%%") else 1)
    assert all(f.line == last and f.grade_id == "ex" for f in flags)


@pytest.mark.parametrize("src", [
    "import os\nthreads = os.cpu_count()\npath = os.path.join('a', 'b')",
    "class A:\n    def __repr__(self):\n        return f'{self.__class__.__name__}()'",
    "%time loss = step()", "%timeit -n 3 -r 2 step()", "%%time\nloss = step()",
    "import sys\nsize = sys.getsizeof(x)", "from pathlib import Path\np = Path('a')",
    "torch.save(model.state_dict(), 'model.pt')",
    "%%writefile my_ddp.py\nimport os\nimport torch.distributed as dist\n"
    "def rank():\n    return dist.get_rank()",
])
def test_scan_answer_leaves_honest_idioms_alone(src):
    assert scan_answer("ex", src) == []


def test_scan_answer_leaves_ordinary_answers_alone_and_honours_allow():
    ordinary = ("import math\nimport torch\nfrom dataclasses import replace\n"
                "def f(x):\n    return math.sqrt(x)\nmodel.fc = torch.nn.Linear(2, 2)\n"
                "open('data.txt').read()\ncfg = replace(cfg, batch_size=8)\n"
                "class A:\n    def __init__(self):\n        super().__init__()\n"
                "not valid python (")
    assert scan_answer("ex", ordinary[:-len("not valid python (")]) == []
    assert scan_answer("ex", ordinary) == []  # a syntax error fails when it runs
    src = "import gc\ntorch.backends.cudnn.benchmark = True"
    assert scan_answer("ex", src, allow=["import gc", "module attribute torch.backends"]) == []
    assert [str(f) for f in scan_answer("ex", src, allow=["import gc"])] == [
        "ex line 2: module attribute torch.backends.cudnn.benchmark"]


def test_lab_key():
    assert lab_key("x/01_profile_resnet18.ipynb") == "01"
    assert lab_key("01-profile.ipynb") is None and lab_key("1_x.ipynb") is None


@pytest.mark.parametrize("field", ["cell_timeout_s", "wall_timeout_s", "memory_gib", "nproc",
                                   "cpu_s"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf])
def test_limits_reject_nan_zero_and_infinite_values(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number > 0"):
        Limits(**{field: value})
    assert Limits(memory_gib=None, cpu_s=None).memory_gib is None


# -- reports (no kernel) ------------------------------------------------------------------

def _grade(student, points, *, hidden=False, message="m", lab="09") -> LabGrade:
    return LabGrade(student, lab, Path(f"{lab}_x.ipynb"), [
        CheckResult("check_a", 2, points, "passed" if points else "failed", message, hidden),
        CheckResult("check_b", 1, 1, "passed")], log="nbval log with hidden source")


def test_score_table_rows_are_atomic_and_resumable(tmp_path):
    path = tmp_path / "scores.csv"
    table = ScoreTable(path, {"09": ["check_a", "check_b"]})
    table.add("bo", [_grade("bo", 2)])
    first = list(csv.DictReader(path.open()))
    assert first == [{"student": "bo", "09:check_a": "2", "09:check_b": "1", "total": "3",
                      "max_total": "3", "review": "", "error": ""}]
    g = _grade("al", 0)
    g.flags.append(Flag("my_x", 3, "import os"))
    g.error = ""
    table.add("al", [g])
    rows = list(csv.DictReader(path.open()))
    assert [r["student"] for r in rows] == ["al", "bo"]
    assert rows[0]["review"] == "lab 09: my_x line 3: import os"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".scores")]  # no temp left
    again = ScoreTable(path, {"09": ["check_a", "check_b"]}, resume=True)
    assert again.students() == {"al", "bo"} == again.resumed
    with pytest.raises(ValueError, match="written for other labs"):
        ScoreTable(path, {"01": ["check_z"]}, resume=True)
    assert ScoreTable(path, {"01": ["check_z"]}).students() == set()  # no resume: fresh


def test_feedback_never_leaks_hidden_tests_reference_values_or_logs(tmp_path):
    long = "AssertionError: you gave " + "REFERENCE-ANSWER " * 40
    grades = [_grade("ada", 0, message=long), _grade("bob", 0, hidden=True,
                                                    message="expected -6 (SECRET)")]
    write_feedback(grades, tmp_path / "feedback", tmp_path / "instructor")
    ada = (tmp_path / "feedback" / "ada.md").read_text()
    assert "**Total: 1 / 3 points.**" in ada and "| `check_a` | 0 / 2 | failed |" in ada
    assert ada.count("REFERENCE-ANSWER") < 20 and "[...]" in ada
    bob = (tmp_path / "feedback" / "bob.md").read_text()
    assert "SECRET" not in bob and "a hidden test failed" in bob
    assert sorted(p.name for p in (tmp_path / "feedback").iterdir()) == ["ada.md", "bob.md"]
    inst = tmp_path / "instructor"
    assert "expected -6 (SECRET)" in (inst / "bob-09.md").read_text()
    assert (inst / "bob-09.log").read_text() == "nbval log with hidden source"
    out = write_scores_csv(grades, tmp_path / "all.csv")
    assert [r["total"] for r in csv.DictReader(out.open())] == ["1", "1"]


def test_written_answers_collected_with_measured_numbers(reference, tmp_path):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = student_nb(reference, explain="Forty-two, as I measured.")
    base = next(c for c in nb.cells if c.source == "base = 10")
    base.outputs = [nbformat.v4.new_output("stream", name="stdout", text="step 0.123 s\n")]
    (w,) = written_answers(nb, ref)
    assert w["answer"] == "Forty-two, as I measured." and w["question"].startswith("Predict")
    assert w["measured"] == ["step 0.123 s"] and w["points"] == 1
    g = _grade("ada", 2)
    g.written = [w]
    (path,) = write_answers([g], tmp_path / "answers")
    text = path.read_text()
    assert path.name == "09.md" and "### ada" in text and "step 0.123 s" in text
    # the instructor grades by the reference's rubric, shown once per question
    assert w["rubric"] == next(c.source for c in ref.cells
                               if c.metadata.get("nbgrader", {}).get("grade_id") == w["grade_id"])
    assert w["rubric"].strip() and w["rubric"].strip() in text
    assert text.count("Rubric and model answer") == 1


# -- grading with a kernel ------------------------------------------------------------------

@pytest.mark.slow
def test_grade_batch_rows_feedback_and_summary(reference, tmp_path, capsys):
    subs = tmp_path / "submissions"
    _write(subs, "a_correct", student_nb(reference))
    _write(subs, "b_wrong", student_nb(reference, answer="answer = 41",
                                        double="def double(v):\n    return v + 2"))
    tamper = student_nb(reference, answer="answer = 41")
    _edit(tamper, "check_answer", 'answer = 42\nprint("PASS: answer is 42")')
    _drop(tamper, "check_double")
    tamper.cells.append(nbformat.v4.new_code_cell("answer = 42"))
    _write(subs, "c_tamper", tamper)
    # named to be graded first (folders are graded in name order): its 5 s cell timeout
    # runs beside the other notebooks instead of after them (the same six notebooks and
    # assertions; the grading phase took 7.5 s here against 8.8 s with it last)
    _write(subs, "a_hang", student_nb(reference, double="def double(v):\n    while True:\n        pass"))
    _write(subs, "e_invalid", "{ this is not json")
    (subs / "f_nothing").mkdir()
    args = argparse.ArgumentParser()
    add_grade_arguments(args)
    out = tmp_path / "out" / "scores.csv"
    argv = [str(subs), "--reference", str(reference), "--out", str(out), "--jobs", "2",
            "--cell-timeout", "5", "--wall-timeout", "120"]
    assert grade_command(args.parse_args(argv)) == 0
    text = capsys.readouterr().out
    assert "graded 4, errored 2, 0 notebook(s) to review" in text
    assert "limits per notebook:" in text and "hidden cases drawn with seed" in text
    assert (tmp_path / "out" / "instructor" / "seed.txt").read_text().strip().isdigit()
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    assert {s: r["total"] for s, r in rows.items()} == {
        "a_correct": "4", "b_wrong": "1", "c_tamper": "2", "a_hang": "2", "e_invalid": "0",
        "f_nothing": "0"}
    assert rows["b_wrong"]["09:check_answer"] == "0" and rows["b_wrong"]["09:check_base"] == "1"
    assert "not a valid notebook" in rows["e_invalid"]["error"]
    assert rows["f_nothing"]["error"] == "lab 09: no 09_*.ipynb submitted"
    fb = (tmp_path / "out" / "feedback" / "b_wrong.md").read_text()
    # a hidden case's failure: which case and what kind, never the case or its answer
    assert "hidden case 1 of 1: wrong result" in fb and "41" not in fb
    assert "hidden case 1 of 5: wrong result" in fb and "SECRET-JUDGE" not in fb
    instructor = (tmp_path / "out" / "instructor" / "b_wrong-09.md").read_text()
    assert "SECRET-JUDGE wrong" in instructor and "answer is 41" in instructor
    assert "| `check_double` | 0 / 1 | failed |" in fb
    hang = (tmp_path / "out" / "instructor" / "a_hang-09.md").read_text()
    assert "check 'check_double' ran past the per-cell limit (5 s), which stopped the " \
        "grading process" in hang
    # the log: the grading process (the points), then, where points were lost, the
    # notebook's run under nbval (no points); full marks skip it (--notebook-run)
    log = (tmp_path / "out" / "instructor" / "b_wrong-09.log").read_text()
    assert log.index("== the grading process (points) ==") < log.index(
        "== the notebook under nbval (no points) ==") and "passed" in log
    assert "not run (full marks" in (tmp_path / "out" / "instructor"
                                     / "a_correct-09.log").read_text()
    answers = (tmp_path / "out" / "instructor" / "answers" / "09.md").read_text()
    assert "It is the answer." in answers
    # --resume grades nobody again
    assert grade_command(args.parse_args(argv + ["--resume"])) == 0
    assert "graded 0, errored 0, 0 notebook(s) to review" in capsys.readouterr().out


@pytest.mark.slow
def test_grade_reference_five_times_gives_full_marks(reference, tmp_path):
    """The reference's own answers, graded 5 times in parallel sandboxes: 4/4 each time."""
    subs = tmp_path / "subs"
    for i in range(5):
        _write(subs, f"ref{i}", nbformat.read(str(reference / "09_synthetic.ipynb"),
                                              as_version=4))
    grades = grade_submissions(subs, reference, limits=FAST, jobs=2)
    assert [g.points for g in grades] == [4] * 5, [g.checks for g in grades]


def test_notebook_run_choices(reference, tmp_path):
    from perflab.course.submission import notebook_run_mode

    assert [notebook_run_mode(v) for v in (True, False, "on-failure")] == [
        "always", "never", "on-failure"]
    with pytest.raises(ValueError, match="'always', 'on-failure' or 'never', got 'sometimes'"):
        grade_submissions(tmp_path, reference, notebook_run="sometimes")


def test_grade_errors_name_the_fix(reference, tmp_path):
    with pytest.raises(FileNotFoundError, match="no submissions folder"):
        grade_submissions(tmp_path / "nope", reference)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no student folders"):
        grade_submissions(tmp_path / "empty", reference)
    with pytest.raises(FileNotFoundError, match="no reference notebooks"):
        grade_submissions(tmp_path / "empty", tmp_path / "empty")
    _write(tmp_path / "subs", "ada", student_nb(reference))
    with pytest.raises(ValueError, match=r"no reference notebook for lab\(s\) \['03'\]"):
        grade_submissions(tmp_path / "subs", reference, labs=["03"])
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        grade_submissions(tmp_path / "subs", reference, jobs=0)


def test_grade_two_notebooks_for_one_lab_is_an_error_row(reference, tmp_path):
    subs = tmp_path / "subs"
    _write(subs, "ada", student_nb(reference), name="09_a.ipynb")
    _write(subs, "ada", student_nb(reference), name="09_b.ipynb")
    _write(subs, "ada", student_nb(reference), name="notes.ipynb")
    lines: list[str] = []
    (g,) = grade_submissions(subs, reference, progress=lines.append)
    assert g.error.startswith("2 notebooks for lab 09 (09_a.ipynb, 09_b.ipynb)")
    assert "ignored notes.ipynb" in lines[0]


def test_grade_command_rejects_bad_limits_before_any_work(reference, tmp_path):
    args = argparse.ArgumentParser()
    add_grade_arguments(args)
    for flag, value in [("--wall-timeout", "nan"), ("--cell-timeout", "inf"),
                        ("--memory-gib", "0"), ("--nproc", "0")]:
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            grade_command(args.parse_args([str(tmp_path / "missing"), flag, value]))
    with pytest.raises(ValueError, match="--jobs must be >= 1"):
        grade_command(args.parse_args([str(tmp_path / "missing"), "--jobs", "0"]))


def test_grade_command_refuses_without_the_required_sandbox(tmp_path, monkeypatch):
    from perflab.course import sandbox

    monkeypatch.setattr(sandbox, "sandbox_status", lambda: (False, "bwrap is not installed"))
    args = argparse.ArgumentParser()
    add_grade_arguments(args)
    with pytest.raises(ValueError, match="--sandbox bwrap: bwrap is not installed"):
        grade_command(args.parse_args([str(tmp_path), "--sandbox", "bwrap"]))


def test_uses_compile_counts_only_cells_grading_runs():
    """Inductor's header is built for a batch only when a cell grading runs compiles: a
    measurement cell tagged grading-skip (Lab 11's timings) does not count."""
    from perflab.course.warm import uses_compile

    def nb(tags):
        cell = nbformat.v4.new_code_cell("f = torch.compile(g)")
        cell.metadata["tags"] = tags
        return {"cells": [nbformat.v4.new_markdown_cell("torch.compile"), cell]}

    assert uses_compile(nb([])) and uses_compile(nb(["nbval-ignore-output"]))
    assert not uses_compile(nb(["nbval-ignore-output", "grading-skip"]))
