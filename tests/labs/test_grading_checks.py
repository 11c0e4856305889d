"""Every check cell of solutions/: in the probe / judge format, its judge passes on right
facts and fails on wrong ones (no kernel: judges run on plain JSON values, as in grading);
a graded check (hidden cases, perflab.course.cases) is tried on real wrong answers in its
lab's test file. No graded part, judge or reference reaches labs/.
"""
from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest

from tests.labs.labcheck import assert_judge_decides
from perflab.course.answers import assemble, autograded
from perflab.course.checks import split_check

ROOT = Path(__file__).resolve().parents[2]
INF = math.inf


#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)]) for
#: checks still in the probe / judge format; the labs' own files judge theirs.
FACTS: dict = {}
OWN_FACTS = dict(FACTS)
from tests.labs.test_lab09_checks import FACTS_09  # noqa: E402 - Lab 09's facts live beside its code tests

FACTS.update(FACTS_09)
from tests.labs.test_lab06_checks import FACTS_06  # noqa: E402 - Lab 06's facts live beside its code tests

FACTS.update(FACTS_06)
from tests.labs.test_lab07_checks import FACTS_07  # noqa: E402 - Lab 07's facts live beside its code tests

FACTS.update(FACTS_07)
from tests.labs.test_lab05_checks import FACTS as FACTS_05  # noqa: E402 - Lab 05's facts live beside its code tests

FACTS.update(FACTS_05)
from tests.labs.test_lab03_checks import FACTS as FACTS_03  # noqa: E402 - Labs 03/04's facts live beside
from tests.labs.test_lab04_checks import FACTS as FACTS_04  # noqa: E402 - their real-answer tests

FACTS.update(FACTS_03)
FACTS.update(FACTS_04)
from tests.labs.test_lab08_checks import FACTS as FACTS_08  # noqa: E402 - Lab 08's facts live beside its tests

FACTS.update(FACTS_08)
from tests.labs.test_lab01_checks import CHECKS_TESTED as REAL_01  # noqa: E402 - Labs 01/02: judges
from tests.labs.test_lab02_checks import CHECKS_TESTED as REAL_02  # noqa: E402 - run on real answers' facts
from tests.labs.test_lab00_checks import CHECKS_TESTED as REAL_00  # noqa: E402 - graded checks
#: Checks whose wrong answers run through the real probes in their own test files.
REAL_ANSWERS = {("01", g) for g in REAL_01} | {("02", g) for g in REAL_02} | \
    {("00", g) for g in REAL_00}


def _graded_tested() -> set[tuple[str, str]]:
    """Graded checks (hidden cases) whose lab test file tries them on real wrong answers:
    its ``GRADED_TESTED`` tuple of grade_ids."""
    import importlib

    out = set()
    for lab in ("03", "04", "05", "06", "07", "08", "09"):
        module = importlib.import_module(f"tests.labs.test_lab{lab}_checks")
        out |= {(lab, g) for g in getattr(module, "GRADED_TESTED", ())}
    return out


REAL_ANSWERS |= _graded_tested()


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


def test_every_check_has_right_and_wrong_facts():
    # every check grades a student's answer: none only checks the lab's own machinery
    assert set(CHECKS) == set(FACTS) | REAL_ANSWERS


@pytest.mark.parametrize("key", sorted(OWN_FACTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_judge_passes_right_facts_and_fails_wrong_ones(key):
    assert_judge_decides(CHECKS[key], *OWN_FACTS[key], name=key[1])


def test_no_check_grades_a_live_timing():
    """The judges read no live clock: none imports time or perflab's timing tools."""
    for key, src in CHECKS.items():
        check = split_check(src)
        judge = check.graded.grader_source if check.graded else check.judge
        for word in ("perf_counter", "Stopwatch", "run_interleaved", "time.", "launch_"):
            assert word not in judge, (key, word)


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
