"""Write the grading results: ``scores.csv`` and one Markdown feedback file per student.

``scores.csv`` has one row per student and one column per graded cell, named
``NN:grade_id`` (lab number, then nbgrader's grade_id, so labs never collide), then
``total``, ``max_total`` and ``errors`` (why a lab could not be run, empty when all ran).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from perflab.course.grading import LabGrade

__all__ = ["write_scores_csv", "write_feedback"]


def _by_student(grades: Sequence[LabGrade]) -> dict[str, list[LabGrade]]:
    out: dict[str, list[LabGrade]] = {}
    for g in grades:
        out.setdefault(g.student, []).append(g)
    return out


def write_scores_csv(grades: Sequence[LabGrade], path: str | Path) -> Path:
    """One row per student, one column per ``NN:grade_id``, then the totals."""
    columns: list[str] = []
    for g in grades:
        for c in g.checks:
            if f"{g.lab}:{c.grade_id}" not in columns:
                columns.append(f"{g.lab}:{c.grade_id}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *columns, "total", "max_total", "errors"])
        for student, labs in _by_student(grades).items():
            pts = {f"{g.lab}:{c.grade_id}": c.points for g in labs for c in g.checks}
            w.writerow([student, *(f"{pts.get(col, 0):g}" for col in columns),
                        f"{sum(g.points for g in labs):g}",
                        f"{sum(g.max_points for g in labs):g}",
                        "; ".join(f"lab {g.lab}: {g.error}" for g in labs if g.error)])
    return path


def _fenced(text: str) -> str:
    return "```text\n" + text.replace("```", "'''").strip() + "\n```"


def _feedback(student: str, labs: Sequence[LabGrade]) -> str:
    total, most = sum(g.points for g in labs), sum(g.max_points for g in labs)
    out = [f"# Feedback for {student}", "", f"**Total: {total:g} / {most:g} points.**", "",
           "Every check cell was restored from the reference notebook before your "
           "notebook ran, so an edited or deleted check counts as the original.", ""]
    for g in labs:
        name = g.notebook.name if g.notebook else f"{g.lab}_*.ipynb"
        out += [f"## Lab {g.lab} ({name}): {g.points:g} / {g.max_points:g} points", ""]
        if g.error:
            out += [f"**Not graded:** {g.error}", ""]
        out += ["| check | points | result |", "|---|---|---|"]
        out += [f"| `{c.grade_id}` | {c.points:g} / {c.max_points:g} | {c.status} |"
                for c in g.checks]
        failed = [c for c in g.checks if c.status != "passed" and not g.error]
        if failed:
            out += ["", "### What went wrong", ""]
            for c in failed:
                out += [f"**`{c.grade_id}`** ({c.status}, 0 / {c.max_points:g} points):", "",
                        _fenced(c.message or "no message"), ""]
        elif not g.error:
            out += ["", "Every check passed."]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_feedback(grades: Sequence[LabGrade], folder: str | Path) -> list[Path]:
    """``<folder>/<student>.md`` per student, and ``<student>-NN.log`` (nbval's output)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for student, labs in _by_student(grades).items():
        path = folder / f"{student}.md"
        path.write_text(_feedback(student, labs))
        written.append(path)
        for g in labs:
            if g.log:
                (folder / f"{student}-{g.lab}.log").write_text(g.log)
    return written
