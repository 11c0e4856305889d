"""Every check cell of solutions/ is graded on hidden cases (perflab.course.cases) and is
tried on real wrong answers in its lab's test file; no graded part, judge or reference
reaches labs/; no judge reads a live clock.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from perflab.course.answers import assemble, autograded
from perflab.course.checks import split_check

ROOT = Path(__file__).resolve().parents[2]



def _real_answers() -> set[tuple[str, str]]:
    """(lab, grade_id) of the checks whose lab test file runs real wrong answers through
    them: its ``CHECKS_TESTED`` (Labs 00-02) or ``GRADED_TESTED`` (Labs 03-09)."""
    import importlib

    out = set()
    for path in sorted((ROOT / "tests" / "labs").glob("test_lab[0-9][0-9]_checks.py")):
        lab = path.stem[len("test_lab"):][:2]
        module = importlib.import_module(f"tests.labs.{path.stem}")
        names = getattr(module, "GRADED_TESTED", None) or getattr(module, "CHECKS_TESTED", ())
        out |= {(lab, g) for g in names}
    return out


REAL_ANSWERS = _real_answers()


def _checks() -> dict[tuple[str, str], str]:
    out = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        assemble(nb, {})  # every check cell splits
        for gid in autograded(nb):
            cell = next(c for c in nb.cells
                        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid)
            out[path.name[:2], gid] = cell.source
    return out


CHECKS = _checks()


def test_every_check_is_graded_on_hidden_cases_and_tried_on_wrong_answers():
    # every check grades the student's answers on hidden cases (no judge ships in
    # labs/), and its lab's test file runs real wrong answers through it
    old = [key for key, src in CHECKS.items() if split_check(src).graded is None]
    assert old == [], f"checks still in the probe / judge format: {old}"
    assert set(CHECKS) == REAL_ANSWERS


def _grader_code(source: str) -> str:
    """What the grader itself executes of a graded block: every statement but the
    imports (shared with the sandbox) and ``def student_answer`` (run in the sandbox,
    where launching the student's ranks for a correctness case is allowed)."""
    import ast
    tree = ast.parse(source)
    keep = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))
            and not (isinstance(n, ast.FunctionDef) and n.name == "student_answer")]
    return "\n".join(ast.unparse(n) for n in keep)


def test_no_check_grades_a_live_timing():
    """The judges read no live clock and start no ranks: hidden_cases, judge_answer and
    the helpers they call use neither time nor perflab's timing or launch tools."""
    for key, src in CHECKS.items():
        check = split_check(src)
        judge = _grader_code(check.graded.grader_source) if check.graded else check.judge
        for word in ("perf_counter", "Stopwatch", "run_interleaved", "time.", "launch_",
                     "_on_ranks"):
            assert word not in judge, (key, word)


def test_the_grader_code_excludes_only_the_sandbox_side():
    src = ("from perflab.distributed.launch import launch_fn\n"
           "def hidden_cases(rng):\n    return [1]\n"
           "def student_answer(case):\n    return launch_fn(f, 2)\n"
           "def judge_answer(case, got):\n    assert got == time.perf_counter()\n")
    code = _grader_code(src)
    assert "launch_fn" not in code and "hidden_cases" in code and "perf_counter" in code


def _norm(source: str) -> list[str]:
    """A cell's code lines, stripped, without blanks, comments and imports."""
    return [ln.strip() for ln in source.splitlines()
            if ln.strip() and not ln.strip().startswith(("#", "import ", "from "))]


def _graded_lines() -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """Per graded check: (its 3-line windows, its assert lines): what would give a
    reference away. Single common lines (``optimizer.step()``) are not secrets."""
    out = {}
    for key, src in CHECKS.items():
        check = split_check(src)
        if check.graded is not None:
            lines = _norm(check.graded.grader_source + "\n" + check.graded.answer_source)
            windows = {"\n".join(lines[k:k + 3]) for k in range(len(lines) - 2)}
            asserts = {ln for ln in lines if ln.startswith("assert ") and len(ln) > 20}
            out[key] = (windows, asserts)
    return out


def _cells(folder: str) -> dict[tuple[str, str], str]:
    out = {}
    for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
        for c in nbformat.read(str(path), as_version=4).cells:
            gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid:
                out[path.name[:2], gid] = c.source
    return out


def test_no_graded_part_or_solution_reaches_labs():
    """No graded part (its cases, answer, judge: the references; any three consecutive
    lines of it, or any of its assertions) is in a notebook under labs/, and no line of a
    lab's reference solutions (three consecutive lines) is in the self-check a student
    sees of a graded check."""
    import re

    text = "\n".join(p.read_text() for p in sorted((ROOT / "labs").rglob("*")) if p.is_file())
    assert "### GRADED" not in text
    cells = [_norm(c.source) for p in sorted((ROOT / "labs").glob("*.ipynb"))
             for c in nbformat.read(str(p), as_version=4).cells if c.cell_type == "code"]
    shown = {"\n".join(lines[k:k + 3]) for lines in cells for k in range(len(lines) - 2)}
    shown_lines = {ln for lines in cells for ln in lines}
    graded = _graded_lines()
    assert graded, "no graded check found"
    for key, (windows, asserts) in graded.items():
        assert not windows & shown, (key, sorted(windows & shown)[:3])
        assert not asserts & shown_lines, (key, sorted(asserts & shown_lines)[:3])
    student = _cells("labs")
    solutions: dict[str, set[str]] = {}
    for (lab, _), src in _cells("solutions").items():
        for block in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", src, re.S):
            lines = _norm(block)
            solutions.setdefault(lab, set()).update(
                "\n".join(lines[k:k + 3]) for k in range(len(lines) - 2))
    for key in graded:
        lines = _norm(student[key])
        seen = {"\n".join(lines[k:k + 3]) for k in range(len(lines) - 2)}
        assert not seen & solutions.get(key[0], set()), (key, sorted(seen & solutions[key[0]])[:2])
