"""Grading real labs: the reference solutions, graded repeatedly in parallel sandboxes on a
loaded machine, get full marks every time (only deterministic facts earn points), and a
wrong answer still loses exactly its check. Slow: each run is a real lab's kernel."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from perflab.course.grading import grade_submissions
from perflab.course.submission import Limits

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(cell_timeout_s=600, wall_timeout_s=1500)


def _edit(nb, gid, src):
    for c in nb.cells:
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            c.source = src
    return nb


@slow
@pytest.mark.parametrize("lab, copies, gid, wrong, check", [
    # (a wrong my_samples_per_s would also fail check_throughput, which uses it)
    ("00", 3, "throughput",
     "def my_throughput(batch_size, step):\n    return batch_size * step.median",
     "check_throughput"),
    # Lab 07 grades a 2-rank launch of the detector; one reference graded side by side with the
    # wrong answer (about a minute each to grade) keeps CI short; Lab 00 above is the one
    # graded repeatedly
    # ("twice as slow is 100 % slower": the extra time, not the lost share of throughput)
    ("07", 1, "predict_straggler",
     'def predict_straggler(slowdown):\n'
     '    return {"loss_at_slow": slowdown - 1, "rebalanced_speedup": (1 + slowdown) / 2}\n\n\n'
     'my_prediction = predict_straggler(2.0)', "check_prediction"),
])
def test_reference_graded_repeatedly_gets_full_marks(tmp_path, lab, copies, gid, wrong, check):
    (sol,) = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
    ref, subs = tmp_path / "reference", tmp_path / "subs"
    ref.mkdir()
    shutil.copy(sol, ref / sol.name)
    for i in range(copies):
        (subs / f"ref{i}").mkdir(parents=True)
        shutil.copy(sol, subs / f"ref{i}" / sol.name)
    (subs / "wrong").mkdir()
    nbformat.write(_edit(nbformat.read(str(sol), as_version=4), gid, wrong),
                   str(subs / "wrong" / sol.name))
    # points come from the grading process alone (the notebook's run is the log's)
    grades = {g.student: g for g in grade_submissions(subs, ref, limits=LIMITS, jobs=2,
                                                      notebook_run="never")}
    for i in range(copies):
        g = grades[f"ref{i}"]
        assert g.points == g.max_points > 0, [(c.grade_id, c.message) for c in g.checks
                                              if c.status != "passed"]
    wrong_checks = {c.grade_id: c for c in grades["wrong"].checks}
    assert wrong_checks[check].points == 0 and wrong_checks[check].status == "failed"
    # later checks that use the wrong answer fail too; checks before it are untouched
    assert grades["wrong"].points <= grades["ref0"].points - wrong_checks[check].max_points
    order = [c.grade_id for c in grades["ref0"].checks]
    before = order[:order.index(check)]
    assert all(wrong_checks[g].status == "passed" for g in before), before
