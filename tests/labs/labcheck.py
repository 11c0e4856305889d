"""Run a lab's real check cells on wrong answers, as grading runs them: the hidden cases
drawn apart, the (wrong) student code's ``student_answer`` in this process, its answers
as JSON, the judge apart.

Used by the tests/labs/test_labNN_checks.py files and tests/labs/test_grading_checks.py.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from perflab.course.cases import draw_cases, judge_answers
from perflab.course.checks import (CheckCell, JudgeResult, graded_functions, graded_probe,
                                   parse_facts, split_check)

ROOT = Path(__file__).resolve().parents[2]

#: The seeds at which the tests judge a lab's reference answers. Not seed 0: nbval runs
#: every solution with its hidden tests, each check's graded part on the cases drawn at
#: seed 0, so a test at seed 0 repeated that run; here, one other draw and a grading seed.
REFERENCE_SEEDS = (1, "grade:ada")


def _gid(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


class Lab:
    """A solution notebook's cells by grade_id, and a namespace its set-up cell ran in."""

    def __init__(self, lab: str) -> None:
        (self.path,) = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
        self.nb = nbformat.read(str(self.path), as_version=4)
        self.cells = {_gid(c): c.source for c in self.nb.cells if _gid(c)}
        self.setup = next(c.source for c in self.nb.cells if c.cell_type == "code")

    def namespace(self) -> dict:
        ns: dict = {"__name__": "__main__"}
        exec(compile(self.setup, "<setup>", "exec"), ns)
        return ns

    def run_code(self, ns: dict, source: str, name: str = "<cell>") -> None:
        exec(compile(source, name, "exec"), ns)

    def verdict(self, ns: dict, code: str, check: str) -> JudgeResult:
        """Run ``code`` (an answer) in a copy of ``ns``, then the check ``check`` on it."""
        scope = dict(ns)
        self.run_code(scope, code)
        return self.judge(scope, check)

    def solution(self, gid: str) -> str:
        return self.cells[gid]

    def judge(self, ns: dict, check_gid: str, seed: int | str = 0) -> JudgeResult:
        """Run a check as grading runs it: its ``student_answer`` in ``ns`` on cases drawn
        at ``seed``, its ``hidden_cases`` and ``judge_answer`` apart, answers as JSON.

        Raises:
            ValueError: the check has no graded part.
        """
        check = split_check(self.cells[check_gid])
        if check.graded is None:
            raise ValueError(f"{check_gid} has no graded part (### GRADED)")
        return graded_verdict(check, ns, check_gid, seed)


def graded_verdict(check: CheckCell, ns: dict, name: str, seed: int | str = 0) -> JudgeResult:
    """A graded check on the answers in ``ns``, the way grading does it: cases drawn
    from ``seed`` in the grader, the sandbox's probe (``answer`` + the facts line) run
    in ``ns``, the printed facts parsed and judged apart."""
    import contextlib
    import io

    cases_fn, judge = graded_functions(check.graded, name)
    cases = draw_cases(cases_fn, seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(graded_probe(check.graded, cases), f"<probe {name}>", "exec"), ns)
    facts, why = parse_facts(out.getvalue())
    if facts is None:
        return JudgeResult(False, why)
    outcome = judge_answers(judge, cases, facts)
    return JudgeResult(outcome.passed, outcome.message, hidden=not outcome.passed)


def grade_wrong(lab_path: Path, tmp_path: Path, gid: str, old: str, new: str,
                wall_timeout_s: float = 1200):
    """Grade lab ``lab_path`` once in the sandbox, with ``old`` replaced by ``new`` in
    answer cell ``gid`` (a wrong answer) and every other answer the reference's.

    One grading, not two: every check but the broken one (and those that depend on it)
    passing in the sandbox is the reference graded there, and the broken check's reference
    passes under nbval with the same judge; a second grading of the whole lab cost CI
    50-100 s per lab.

    Returns:
        (the submission's grade, {grade_id: check result}).
    """
    import shutil

    from perflab.course.grading import grade_submissions
    from perflab.course.submission import Limits

    ref, subs = tmp_path / "reference", tmp_path / "subs"
    ref.mkdir()
    shutil.copy(lab_path, ref / lab_path.name)
    nb = nbformat.read(str(lab_path), as_version=4)
    (cell,) = [c for c in nb.cells if _gid(c) == gid]
    assert old in cell.source, f"{old!r} is not in answer cell {gid}"
    cell.source = cell.source.replace(old, new)
    (subs / "wrong").mkdir(parents=True)
    nbformat.write(nb, str(subs / "wrong" / lab_path.name))
    # jobs=2 for one submission: its sandbox gets cores / 2 threads (one here), as the
    # test run's own workers have; jobs=1 gave it both cores, oversubscribed by the other
    # pytest worker (Lab 08's grading: 190 s in CI against 98 s for two at jobs=2)
    # notebook_run="never": every point comes from the grading process; the notebook's own
    # run under nbval (the instructor's log) would double the test's time for no verdict
    (grade,) = grade_submissions(
        subs, ref, limits=Limits(cell_timeout_s=600, wall_timeout_s=wall_timeout_s), jobs=2,
        notebook_run="never")
    return grade, {c.grade_id: c for c in grade.checks}


def notebook_points(lab_path: Path) -> int:
    """The points of the notebook's autograded checks (graded code cells, nbgrader
    metadata); the written answers' points are the instructor's, not grading's."""
    nb = nbformat.read(str(lab_path), as_version=4)
    return sum(c.metadata["nbgrader"].get("points", 0) for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"))


def hidden_configs(lab: "Lab", gid: str, seed) -> list[dict]:
    """The ``"configs"`` of check ``gid``'s hidden launch at ``seed``, drawn as the check
    draws them (its one non-None case): what a shared test launch runs for it."""
    cases_fn, _ = graded_functions(split_check(lab.cells[gid]).graded, gid)
    (configs,) = [c["configs"] for c in draw_cases(cases_fn, seed) if c is not None]
    return configs


class LaunchedTasks:
    """What one real launch of a lab's ``tasks_rank`` (a list of tasks per rank, e.g.
    :func:`perflab.labs.lab09.tasks_rank`) recorded, by key: ``tasks`` maps each key to
    the tasks a separate launch would have run, in the order they were run together, and
    ``modules`` each key's student module name. One launch serves many tests (each
    costs seconds); each key's records are what its own launch would have returned."""

    def __init__(self, modules: dict, tasks: dict, ranks: list):
        self.modules, self.tasks = modules, tasks
        spans, at = {}, 0
        for key, run in tasks.items():
            spans[key] = range(at, at + len(run))
            at += len(run)
        self._records = {key: [[rank[i] for i in span] for rank in ranks]
                         for key, span in spans.items()}

    def answer(self, key) -> list:
        """What ``launch_fn(tasks_rank, world, args=(self.tasks[key],))`` returned: per
        rank, the tasks' results (a copy, as a launch unpickles a fresh one)."""
        import copy

        return copy.deepcopy(self._records[key])

    def lab(self, key) -> list:
        """Per rank, the result of ``key``'s one task (what launching its rank body
        returns)."""
        (_,) = self.tasks[key]
        return [rank[0] for rank in self.answer(key)]


def launch_tasks(folder: Path, modules: dict, tasks: dict, rank_fn, world_size: int = 2,
                 timeout_s: float = 600):
    """A generator for a module-scoped fixture: ONE real launch of ``rank_fn`` (a lab's
    ``tasks_rank``) on every key's tasks, run in ``folder`` (the ranks import the
    students' files from their working folder), the folder on ``sys.path`` here too
    while the fixture lives (the tests import the same files); yields the
    :class:`LaunchedTasks`."""
    import importlib
    import os

    import pytest

    from perflab.distributed import launch_fn

    mp = pytest.MonkeyPatch()
    try:
        mp.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        here = os.getcwd()
        os.chdir(folder)
        try:
            ranks = launch_fn(rank_fn, world_size, device="cpu", timeout_s=timeout_s,
                              args=([t for run in tasks.values() for t in run],))
        finally:
            os.chdir(here)
        yield LaunchedTasks(modules, tasks, ranks)
    finally:
        mp.undo()
