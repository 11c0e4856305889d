"""Write the grading results: ``scores.csv``, students' feedback, instructor-only files.

``scores.csv`` has one row per student and one column per autograded check, named
``NN:grade_id`` (lab number, then nbgrader's grade_id, so labs never collide), then
``total``, ``max_total``, ``review`` (for the instructor to look at, never a deduction:
answer lines that reach into the machinery, facts records that were missing, duplicated or
malformed) and ``error`` (why a lab could not be run, or was refused). :class:`ScoreTable` rewrites it
atomically after every student, so a batch stopped at any moment leaves a valid table
of everyone graded so far, and ``--resume`` continues from it.

Feedback never leaks: ``feedback/<student>.md`` lists each check, its points and the
check's own message, shortened (student-provided values included), and for a hidden
test only that one failed. The instructor folder gets everything else: nbval's log,
the full messages (hidden tests and reference values), flags with their source lines,
and ``answers/<lab>.md`` with every student's written answers.
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path
from typing import Sequence

from perflab.course.grading import LabGrade

__all__ = ["ScoreTable", "write_scores_csv", "write_feedback", "write_answers",
           "student_message"]

#: Longest message (characters) a student's feedback shows for one check.
MAX_STUDENT_MESSAGE = 300


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _row(student: str, labs: Sequence[LabGrade], columns: list[str]) -> list[str]:
    pts = {f"{g.lab}:{c.grade_id}": c.points for g in labs for c in g.checks}
    return [student, *(f"{pts.get(col, 0):g}" for col in columns),
            f"{sum(g.points for g in labs):g}", f"{sum(g.max_points for g in labs):g}",
            "; ".join(f"lab {g.lab}: {f}" for g in labs for f in g.flags),
            "; ".join(f"lab {g.lab}: {g.error}" for g in labs if g.error)]


class ScoreTable:
    """``scores.csv``, rewritten atomically (temp file + rename) after each student.

    Args:
        path: the CSV file.
        columns: ``lab -> [grade_id, ...]`` of the autograded checks, in order.
        resume: keep the rows already in ``path`` (their students are not graded again).

    Raises:
        ValueError: ``resume`` and the existing table has other columns (other labs).
    """

    def __init__(self, path: str | Path, columns: dict[str, list[str]], *,
                 resume: bool = False) -> None:
        self.path = Path(path)
        self.columns = [f"{lab}:{gid}" for lab, gids in columns.items() for gid in gids]
        self.header = ["student", *self.columns, "total", "max_total", "review", "error"]
        self.rows: dict[str, list[str]] = {}
        self.resumed: set[str] = set()
        if resume and self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header != self.header:
                    raise ValueError(f"--resume: {self.path} was written for other labs or "
                                     f"checks ({header}); use another --out or drop --resume")
                for row in reader:
                    if row:
                        self.rows[row[0]] = row
            self.resumed = set(self.rows)

    def students(self) -> set[str]:
        """The students with a row."""
        return set(self.rows)

    def add(self, student: str, labs: Sequence[LabGrade]) -> None:
        """Add (or replace) a student's row and rewrite the file atomically."""
        self.rows[student] = _row(student, labs, self.columns)
        self.flush()

    def flush(self) -> None:
        """Rewrite the file atomically with the rows so far."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.header)
        for name in sorted(self.rows):
            w.writerow(self.rows[name])
        _atomic_write(self.path, buf.getvalue())


def write_scores_csv(grades: Sequence[LabGrade], path: str | Path) -> Path:
    """The whole table at once: one row per student, one column per ``NN:grade_id``."""
    columns: dict[str, list[str]] = {}
    for g in grades:
        for c in g.checks:
            if c.grade_id not in columns.setdefault(g.lab, []):
                columns[g.lab].append(c.grade_id)
    table = ScoreTable(path, columns)
    for student, labs in _by_student(grades).items():
        table.rows[student] = _row(student, labs, table.columns)
    table.flush()
    return Path(path)


def _by_student(grades: Sequence[LabGrade]) -> dict[str, list[LabGrade]]:
    out: dict[str, list[LabGrade]] = {}
    for g in grades:
        out.setdefault(g.student, []).append(g)
    return out


def _fenced(text: str) -> str:
    return "```text\n" + text.replace("```", "'''").strip() + "\n```"


def student_message(check) -> str:
    """What a student may see of a check's message: a hidden test's message never, any
    other shortened to :data:`MAX_STUDENT_MESSAGE` characters (it may quote their
    values)."""
    if check.hidden:
        return (getattr(check, "student", "") or
                "a hidden test failed: your code gives a wrong result on a case the "
                "visible checks do not try")
    msg = (check.message or "no message").strip()
    return msg if len(msg) <= MAX_STUDENT_MESSAGE else msg[:MAX_STUDENT_MESSAGE] + " [...]"


def _feedback(student: str, labs: Sequence[LabGrade]) -> str:
    total, most = sum(g.points for g in labs), sum(g.max_points for g in labs)
    out = [f"# Feedback for {student}", "", f"**Total: {total:g} / {most:g} points.**", "",
           "Your answers (the solution cells) were run inside the reference notebook, so "
           "edited checks or other cells you changed or added do not count.", ""]
    for g in labs:
        name = g.notebook.name if g.notebook else f"{g.lab}_*.ipynb"
        out += [f"## Lab {g.lab} ({name}): {g.points:g} / {g.max_points:g} points", ""]
        if g.error:
            out += [f"**Not graded:** {g.error[:MAX_STUDENT_MESSAGE]}", ""]
        out += ["| check | points | result |", "|---|---|---|"]
        out += [f"| `{c.grade_id}` | {c.points:g} / {c.max_points:g} | {c.status} |"
                for c in g.checks]
        failed = [c for c in g.checks if c.status != "passed" and not g.error]
        if failed:
            out += ["", "### What went wrong", ""]
            for c in failed:
                out += [f"**`{c.grade_id}`** ({c.status}, 0 / {c.max_points:g} points):", "",
                        _fenced(student_message(c)), ""]
        elif not g.error:
            out += ["", "Every check passed."]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _instructor(student: str, g: LabGrade) -> str:
    out = [f"# {student}, lab {g.lab}: {g.points:g} / {g.max_points:g} points", "",
           f"notebook: {g.notebook}", f"wall time: {g.wall_s:.1f} s",
           f"sandboxed: {'yes' if g.sandboxed else 'NO'}" + (f" ({g.warning})" if g.warning
                                                             else ""), ""]
    if g.error:
        out += [f"**error:** {g.error}", ""]
    if g.flags:
        out += ["## Review (not deducted)", ""] + [f"- `{f}`: `{f.text}`" for f in g.flags] + [""]
    if g.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in g.notes] + [""]
    out += ["## Checks", ""]
    for c in g.checks:
        out += [f"**`{c.grade_id}`** {c.status} {c.points:g} / {c.max_points:g}"
                + (" (hidden test)" if c.hidden else ""), ""]
        if c.message:
            out += [_fenced(c.message), ""]
    return "\n".join(out).rstrip() + "\n"


def write_feedback(grades: Sequence[LabGrade], folder: str | Path,
                   instructor: str | Path | None = None) -> list[Path]:
    """``<folder>/<student>.md`` per student (safe to hand out), and in ``instructor``
    (default: ``instructor`` beside ``folder``) ``<student>-NN.md`` (full messages,
    flags) and ``<student>-NN.log`` (nbval's output) per lab.

    Returns:
        The students' feedback files written.
    """
    folder = Path(folder)
    instructor = Path(instructor) if instructor else folder.parent / "instructor"
    folder.mkdir(parents=True, exist_ok=True)
    instructor.mkdir(parents=True, exist_ok=True)
    written = []
    for student, labs in _by_student(grades).items():
        path = folder / f"{student}.md"
        _atomic_write(path, _feedback(student, labs))
        written.append(path)
        for g in labs:
            _atomic_write(instructor / f"{student}-{g.lab}.md", _instructor(student, g))
            if g.log:
                _atomic_write(instructor / f"{student}-{g.lab}.log", g.log)
    return written


def write_answers(grades: Sequence[LabGrade], folder: str | Path) -> list[Path]:
    """``<folder>/<lab>.md``: every student's written ("predict, then explain") answers
    for the lab, question by question, with the numbers their own run printed beside.

    Returns:
        The files written (none for labs without written answers).
    """
    folder = Path(folder)
    by_lab: dict[str, dict[str, list[tuple[str, dict]]]] = {}
    for g in grades:
        for w in g.written:
            by_lab.setdefault(g.lab, {}).setdefault(w["grade_id"], []).append((g.student, w))
    written = []
    for lab, questions in sorted(by_lab.items()):
        out = [f"# Lab {lab}: written answers", "",
               "Graded by hand. Each answer is followed by the numbers that student's own "
               "notebook printed just before it (their run, as submitted; not re-measured).",
               ""]
        for gid, entries in questions.items():
            first = entries[0][1]
            out += [f"## `{gid}` ({first['points']:g} points)", "",
                    "> " + first["question"].strip().replace("\n", "\n> "), ""]
            if first.get("rubric", "").strip():
                out += ["<details><summary>Rubric and model answer (instructors only)"
                        "</summary>", "", first["rubric"].strip(), "", "</details>", ""]
            for student, w in entries:
                out += [f"### {student}", "", w["answer"].strip() or "*(no answer)*", ""]
                if w["measured"]:
                    out += ["Their measured numbers:", "",
                            _fenced("\n---\n".join(w["measured"])), ""]
        path = folder / f"{lab}.md"
        _atomic_write(path, "\n".join(out).rstrip() + "\n")
        written.append(path)
    return written
