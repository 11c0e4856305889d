"""perflab course grade: restore the reference checks, run under nbval, score, report.

Most cases use a small synthetic lab (a kernel start and a few cells each); one slow
test grades a doctored copy of the real Lab 01 end to end. Submissions are generated
here from the reference with ``build_lab`` (the student version) plus edits.
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import nbformat
import psutil
import pytest

from conftest import slow
from perflab.cli import main
from perflab.course.build import build_lab
from perflab.course.grading import (Limits, grade_notebook, grade_submissions, lab_key,
                             protected_cells, restore_checks)
from perflab.course.report import write_feedback, write_scores_csv

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"
FAST = Limits(cell_timeout_s=20, wall_timeout_s=120, memory_gib=8)


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


def _solution(gid, src):
    return _code(src, grade=False, solution=True, locked=False, grade_id=gid)


def reference_nb() -> nbformat.NotebookNode:
    """A 4-point lab: two exercises, one check with hidden tests, one independent check."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Lab 09 — synthetic"),
        _code("base = 10"),
        _solution("my_answer", "### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION"),
        _check("check_answer", 2, 'assert answer == 42, f"answer is {answer}, expected 42"\n'
               'print("PASS: answer is 42")', "PASS: answer is 42\n"),
        _solution("my_double", "### BEGIN SOLUTION\ndef double(v):\n    return 2 * v\n"
                  "### END SOLUTION"),
        _check("check_double", 1, 'assert double(2) == 4, "double(2) should be 4"\n'
               '### BEGIN HIDDEN TESTS\nassert double(-3) == -6, "double(-3) should be -6"\n'
               '### END HIDDEN TESTS\nprint("PASS: double doubles")', "PASS: double doubles\n"),
        _check("check_base", 1, 'assert base == 10\nprint("PASS: took 1.5 s")',
               "PASS: took 2.0 s\n"),  # the sanitize file masks the timing
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
               double="def double(v):\n    return 2 * v") -> nbformat.NotebookNode:
    """The student version of the reference, with the two exercises filled in."""
    nb = nbformat.reads(build_lab(reference / "09_synthetic.ipynb"), as_version=4)
    for c in nb.cells:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid == "my_answer":
            c.source = answer
        elif gid == "my_double":
            c.source = double
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


# -- restoring the reference checks (no kernel) -----------------------------------------

def test_restore_replaces_edited_and_reinserts_deleted_checks(reference):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = student_nb(reference)
    _drop(nb, "check_answer")
    _edit(nb, "check_double", 'print("PASS: double doubles")')  # hidden tests gone too
    nb.cells.append(nbformat.v4.new_code_cell("scratch = 1"))
    out = restore_checks(nb, ref)
    order = [_gid(c) or c.source for c in out.cells if c.cell_type == "code"]
    assert order == ["base = 10", "my_answer", "check_answer", "my_double", "check_double",
                     "check_base", "scratch = 1"]
    by_gid = {_gid(c): c for c in out.cells if _gid(c)}
    for gid, ref_cell in protected_cells(ref).items():
        assert by_gid[gid].source == ref_cell.source
        assert by_gid[gid].outputs == ref_cell.outputs  # nbval compares against these
    assert "### BEGIN HIDDEN TESTS" in by_gid["check_double"].source
    assert by_gid["my_answer"].source == "answer = 42"  # the student's own code stays


def test_restore_anchors_on_cell_ids_and_drops_duplicates(reference):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = student_nb(reference)
    check = next(c for c in nb.cells if _gid(c) == "check_answer")
    nb.cells.append(check)  # a pasted copy of a check earns nothing twice
    assert [_gid(c) for c in restore_checks(nb, ref).cells].count("check_answer") == 1
    # with its exercise deleted too, the check goes back after 'base = 10' (matched by id)
    nb.cells = [c for c in nb.cells if _gid(c) not in ("my_answer", "check_answer")]
    out = restore_checks(nb, ref)
    assert [c.source for c in out.cells][1:3] == ["base = 10", ref.cells[3].source]


def test_restore_clears_student_outputs_and_grade_claims(reference):
    ref = nbformat.read(str(reference / "09_synthetic.ipynb"), as_version=4)
    nb = student_nb(reference)
    fake = _code('print("PASS: answer is 42")', out="PASS: answer is 42\n", grade=True,
                 grade_id="my_bonus", points=100)
    nb.cells.append(fake)
    out = restore_checks(nb, ref)
    last = out.cells[-1]
    assert last.outputs == [] and last.execution_count is None
    assert last.metadata.nbgrader["grade"] is False


def test_lab_key():
    assert lab_key("x/01_profile_resnet18.ipynb") == "01"
    assert lab_key("01-profile.ipynb") is None and lab_key("1_x.ipynb") is None


def test_limits_reject_bad_values():
    with pytest.raises(ValueError, match="timeouts must be > 0"):
        Limits(cell_timeout_s=0)
    with pytest.raises(ValueError, match="memory_gib must be > 0"):
        Limits(memory_gib=0)


# -- grading a batch (one kernel per submission) ----------------------------------------

def _write(folder: Path, student: str, nb_or_text, name="09_synthetic.ipynb") -> Path:
    d = folder / student
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(nb_or_text, str):
        (d / name).write_text(nb_or_text)
    else:
        nbformat.write(nb_or_text, str(d / name))
    return d / name


def test_grade_batch_scores_csv_and_feedback(reference, tmp_path):
    subs = tmp_path / "submissions"
    _write(subs, "a_correct", student_nb(reference))
    _write(subs, "b_wrong", student_nb(reference, answer="answer = 41"))
    tamper = student_nb(reference, double="def double(v):\n    return v + 2")
    _drop(tamper, "check_answer")
    _edit(tamper, "check_double", 'print("PASS: double doubles")')
    _write(subs, "c_tamper", tamper)
    _write(subs, "d_hang", student_nb(reference, double="while True:\n    pass"))
    _write(subs, "e_invalid", "{ this is not json")
    (subs / "f_nothing").mkdir()
    lines: list[str] = []
    grades = grade_submissions(subs, reference, sanitize=SANITIZE, progress=lines.append,
                               limits=Limits(cell_timeout_s=3, wall_timeout_s=120))
    score = {g.student: g.points for g in grades}
    assert score == {"a_correct": 4, "b_wrong": 2, "c_tamper": 3, "d_hang": 2,
                     "e_invalid": 0, "f_nothing": 0}
    g = {g.student: g for g in grades}
    wrong = {c.grade_id: c for c in g["b_wrong"].checks}
    assert wrong["check_answer"].status == "failed"
    assert "AssertionError: answer is 41, expected 42" in wrong["check_answer"].message
    tampered = {c.grade_id: c for c in g["c_tamper"].checks}
    assert tampered["check_answer"].status == "passed"  # restored, and it passes
    assert "double(-3) should be -6" in tampered["check_double"].message  # hidden test back
    hang = {c.grade_id: c for c in g["d_hang"].checks}
    assert hang["check_answer"].status == "passed"
    assert hang["check_double"].status == hang["check_base"].status == "not run"
    assert "code cell 4 ('while True:') stopped the notebook: Timeout of 3 seconds" \
        in hang["check_double"].message
    assert "is not a valid notebook" in g["e_invalid"].error
    assert g["f_nothing"].error == "no 09_*.ipynb submitted"
    assert len(lines) == 6 and lines[0].startswith("a_correct")

    out = write_scores_csv(grades, tmp_path / "scores.csv")
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["student", "09:check_answer", "09:check_double", "09:check_base",
                             "total", "max_total", "errors"]
    assert [(r["student"], r["total"], r["max_total"]) for r in rows] == [
        ("a_correct", "4", "4"), ("b_wrong", "2", "4"), ("c_tamper", "3", "4"),
        ("d_hang", "2", "4"), ("e_invalid", "0", "4"), ("f_nothing", "0", "4")]
    assert rows[1]["09:check_answer"] == "0" and rows[1]["09:check_double"] == "1"
    assert "not a valid notebook" in rows[4]["errors"] and rows[0]["errors"] == ""

    written = write_feedback(grades, tmp_path / "feedback")
    assert [p.name for p in written] == [f"{s}.md" for s in score]
    fb = (tmp_path / "feedback" / "b_wrong.md").read_text()
    assert "**Total: 2 / 4 points.**" in fb and "answer is 41, expected 42" in fb
    assert "| `check_answer` | 0 / 2 | failed |" in fb
    assert "Every check passed." in (tmp_path / "feedback" / "a_correct.md").read_text()
    assert (tmp_path / "feedback" / "a_correct-09.log").exists()


def test_grade_memory_limit_applies_to_the_kernel(reference, tmp_path):
    # 6 GiB of untouched zero pages fit any machine, not a 4 GiB address space: a
    # MemoryError in the student's cell, so the check that needs it fails (NameError);
    # the independent one still passes.
    nb = student_nb(reference, answer="blob = bytearray(6 * 2**30)\nanswer = 42")
    path = _write(tmp_path / "subs", "greedy", nb)
    g = grade_notebook(path, reference / "09_synthetic.ipynb", sanitize=SANITIZE,
                       limits=Limits(cell_timeout_s=30, wall_timeout_s=120, memory_gib=4))
    checks = {c.grade_id: c for c in g.checks}
    assert "NameError" in checks["check_answer"].message
    assert checks["check_base"].status == "passed" and g.points == 2


def test_grade_wall_clock_limit_kills_the_run(reference, tmp_path):
    pid_file = tmp_path / "kernel.pid"
    nb = student_nb(reference, double=f"import os, time\nopen({str(pid_file)!r}, 'w')"
                    ".write(str(os.getpid()))\ntime.sleep(120)")
    path = _write(tmp_path / "subs", "slowpoke", nb)
    g = grade_notebook(path, reference / "09_synthetic.ipynb", sanitize=SANITIZE,
                       limits=Limits(cell_timeout_s=120, wall_timeout_s=10))
    checks = {c.grade_id: c for c in g.checks}
    assert checks["check_answer"].status == "passed"
    assert "wall-clock limit (10 s)" in checks["check_double"].message
    assert g.points == 2 and g.wall_s < 40
    kernel = int(pid_file.read_text())  # the kernel runs in its own session: killed too
    assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == "zombie"


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


def test_grade_two_notebooks_for_one_lab_is_an_error_row(reference, tmp_path):
    subs = tmp_path / "subs"
    _write(subs, "ada", student_nb(reference), name="09_a.ipynb")
    _write(subs, "ada", student_nb(reference), name="09_b.ipynb")
    _write(subs, "ada", student_nb(reference), name="notes.ipynb")
    lines: list[str] = []
    (g,) = grade_submissions(subs, reference, progress=lines.append)
    assert g.error.startswith("2 notebooks for lab 09 (09_a.ipynb, 09_b.ipynb)")
    assert "ignored notes.ipynb" in lines[0]


def test_cli_course_grade(reference, tmp_path, capsys):
    subs = tmp_path / "subs"
    _write(subs, "ada", "not json")
    out = tmp_path / "out" / "scores.csv"
    assert main(["course", "grade", str(subs), "--reference", str(reference),
                 "--out", str(out), "--labs", "9", "--memory-gib", "none"]) == 0
    text = capsys.readouterr().out
    assert "ada" in text and "1 notebook(s) could not be graded" in text
    assert (tmp_path / "out" / "feedback" / "ada.md").exists()
    assert main(["course", "grade", str(tmp_path / "missing")]) == 2
    assert "no submissions folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["course", "grade", str(subs), "--labs", "one"])


# -- end to end on the real Lab 01 --------------------------------------------------------

@slow
def test_grade_lab01_end_to_end(tmp_path):
    """The solution, with one wrong answer, one deleted check and one gutted check."""
    sol = ROOT / "solutions" / "01_profile_resnet18.ipynb"
    nb = nbformat.read(str(sol), as_version=4)
    _edit(nb, "my_dominant_phase", 'my_dominant_phase = "not a phase"')
    _drop(nb, "check_throughput")
    _edit(nb, "check_phase_sum", 'print("PASS: your four phases add up to the step time '
          'within 5 %")')
    subs = tmp_path / "subs"
    _write(subs, "ada", nb, name=sol.name)
    ref = tmp_path / "reference"
    ref.mkdir()
    shutil.copy(sol, ref / sol.name)
    (g,) = grade_submissions(subs, ref, sanitize=SANITIZE,
                             limits=Limits(cell_timeout_s=300, wall_timeout_s=900))
    checks = {c.grade_id: c for c in g.checks}
    assert {k: c.status for k, c in checks.items()} == {
        "check_phase_sum": "passed", "check_throughput": "passed",
        "check_dominant_phase": "failed"}, g.log[-3000:]
    assert "you named 'not a phase'" in checks["check_dominant_phase"].message
    assert (g.points, g.max_points) == (3, 4)
