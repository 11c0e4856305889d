"""Grade a folder of submissions: answers into the reference, a sandbox, verdicts outside.

Layout (one folder per student, one notebook per lab, matched to its lab by the
two-digit prefix of the file name)::

    SUBMISSIONS/<student>/NN_*.ipynb      e.g. submissions/ada/01_profile_resnet18.ipynb
    REFERENCE/NN_*.ipynb                  the solution notebooks (solutions/)

A submission runs arbitrary Python: each notebook is graded on its own in a sandbox by
:func:`perflab.course.submission.grade_notebook` (answers into the reference, nbval in
the sandbox, verdicts judged outside), giving a
:class:`~perflab.course.submission.LabGrade`.

:func:`grade_submissions` grades a whole folder (``jobs`` sandboxes in parallel), calling
back as each student finishes so ``scores.csv`` grows row by row
(:mod:`perflab.course.report`). :mod:`perflab.course.command` is the
``perflab course grade`` command.
"""
from __future__ import annotations

import os
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Literal

import nbformat

from perflab.course.answers import assemble, autograded
from perflab.course.sandbox import SandboxUnavailable, sandbox_status
# Limits, LabGrade, lab_key and autograded stay importable from here (the grade command
# and the report import them with grade_submissions).
from perflab.course.submission import (LabGrade, Limits, error_grade, grade_notebook,
                                       hideable, lab_key)

__all__ = ["grade_submissions", "reference_notebooks"]


def reference_notebooks(reference_dir: Path) -> dict[str, Path]:
    """``lab -> path`` of ``REFERENCE/NN_*.ipynb``.

    Raises:
        FileNotFoundError: there is none.
    """
    refs = {lab_key(p): p for p in sorted(reference_dir.glob("[0-9][0-9]_*.ipynb"))}
    if not refs:
        raise FileNotFoundError(f"no reference notebooks (NN_*.ipynb) in {reference_dir}")
    return refs


def grade_submissions(submissions_dir: str | Path, reference_dir: str | Path, *,
                      limits: Limits = Limits(), sanitize: str | Path | None = None,
                      labs: list[str] | None = None,
                      progress: Callable[[str], None] | None = None, jobs: int = 1,
                      sandbox: Literal["auto", "bwrap", "none"] = "auto",
                      skip: set[str] | frozenset[str] = frozenset(),
                      on_student: Callable[[str, list[LabGrade]], None] | None = None,
                      hide: tuple[Path, ...] = (),
                      seed: int | None = None) -> list[LabGrade]:
    """Grade ``SUBMISSIONS/<student>/NN_*.ipynb`` against ``REFERENCE/NN_*.ipynb``.

    Args:
        limits: per-notebook limits (validated when constructed).
        sanitize: ignored (kept for old callers).
        labs: lab numbers to grade (``["01"]``); None: every lab someone submitted.
        progress: called with one line per graded notebook (e.g. ``print``).
        jobs: sandboxes run in parallel (>= 1).
        sandbox: see :func:`grade_notebook`.
        skip: students not to grade (``--resume``: already in scores.csv).
        on_student: called with (student, their grades) as soon as all their labs are
            graded (in completion order): how scores.csv is written row by row.
        hide: more host folders to hide in the sandbox (the output folders).
        seed: the seed the hidden cases are drawn from (with each student's name and
            check); None: a fresh random one, printed through ``progress`` so a re-grade
            can draw the same cases.

    Returns:
        One LabGrade per student and lab, students in name order; a lab a student did
        not submit (or submitted twice) is an error row with no points; a submission
        that breaks the grader itself is an error row naming the reason.

    Raises:
        FileNotFoundError: no submissions folder, no student folders, or no references.
        ValueError: a requested lab has no reference notebook, ``jobs`` < 1, or a
            reference notebook is malformed.
        SandboxUnavailable: ``sandbox="bwrap"`` and bubblewrap does not work here (the
            only error a submission's contents cannot cause).
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    subs, refs = Path(submissions_dir), reference_notebooks(Path(reference_dir))
    if not subs.is_dir():
        raise FileNotFoundError(f"no submissions folder {subs}")
    students = sorted(p for p in subs.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(f"no student folders in {subs}; expected "
                                f"{subs}/<student>/NN_*.ipynb")
    found: dict[str, dict] = {s.name: {} for s in students}
    for s in students:
        for nb in sorted(s.glob("*.ipynb")) if not s.is_symlink() else []:
            if lab_key(nb) is None and progress:
                progress(f"{s.name:<20} ignored {nb.name}: not named NN_*.ipynb")
            found[s.name].setdefault(lab_key(nb), []).append(nb)
    wanted = labs or sorted({k for f in found.values() for k in f if k in refs})
    missing = [k for k in wanted if k not in refs]
    if missing:
        raise ValueError(f"no reference notebook for lab(s) {missing} in {reference_dir}; "
                         f"labs there: {sorted(refs)}")
    if sandbox == "bwrap" and not sandbox_status()[0]:
        raise SandboxUnavailable(f"sandbox required but unavailable: {sandbox_status()[1]}; "
                                 "install bubblewrap (apt-get install bubblewrap) or pass "
                                 "--sandbox auto")
    if sandbox == "auto" and not sandbox_status()[0] and progress:
        progress(f"WARNING: {sandbox_status()[1]}. Submissions will run WITHOUT a sandbox "
                 "(plain subprocesses with rlimits): a submission could read and change "
                 "your files. Install bubblewrap, or pass --sandbox bwrap to refuse.")
    if seed is None:
        seed = secrets.randbits(48)
    if progress:
        progress(f"hidden cases drawn with seed {seed} (--seed {seed} draws them again)")
    # Read every reference once, before any student code runs.
    ref_nbs = {lab: nbformat.read(str(refs[lab]), as_version=4) for lab in wanted}
    for lab, nb in ref_nbs.items():
        assemble(nb, {})  # a malformed reference check fails here, before any work
    hide = tuple(hideable(Path(reference_dir), subs, *hide))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    tasks = [(s, lab) for s in found if s not in skip for lab in wanted]
    results: dict[tuple[str, str], LabGrade] = {}
    pending = {s: len(wanted) for s in found if s not in skip}
    lock, report_lock = threading.Lock(), threading.Lock()
    free_slots = list(range(jobs))

    def one(student: str, lab: str) -> LabGrade:
        nbs = found[student].get(lab, [])
        graded = autograded(ref_nbs[lab])
        if (subs / student).is_symlink():
            return error_grade(student, lab, None, graded,
                               f"refused: the student folder {student}/ is a symbolic link; "
                               "submit a real folder")
        if len(nbs) != 1:
            return error_grade(student, lab, None, graded,
                               f"no {lab}_*.ipynb submitted" if not nbs else
                               f"{len(nbs)} notebooks for lab {lab} "
                               f"({', '.join(p.name for p in nbs)}); submit exactly one")
        with lock:
            slot = free_slots.pop()
        try:
            return grade_notebook(nbs[0], refs[lab], student=student, limits=limits,
                                  sandbox=sandbox, hide=hide, slot=slot, threads=threads,
                                  reference=ref_nbs[lab], seed=seed,
                                  inside=subs)
        except SandboxUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - one hostile notebook never stops the batch
            return error_grade(student, lab, nbs[0], graded,
                               f"grading failed: {type(e).__name__}: {str(e)[:300]}")
        finally:
            with lock:
                free_slots.append(slot)

    def done(g: LabGrade) -> None:
        with lock:
            results[(g.student, g.lab)] = g
            pending[g.student] -= 1
            finished = pending[g.student] == 0
        if progress:
            progress(f"{g.student:<20} lab {g.lab}: {g.points:g}/{g.max_points:g} points"
                     + (f" ({g.wall_s:.0f} s)" if g.wall_s else "")
                     + (f"  [{g.error}]" if g.error else "")
                     + (f"  [flagged: {'; '.join(map(str, g.flags))}]" if g.flags else "")
                     + (f"  [{g.warning}]" if g.warning else ""))
        if finished and on_student:
            with report_lock:  # one writer at a time: scores.csv and feedback files
                on_student(g.student, [results[(g.student, lab)] for lab in wanted])

    if jobs == 1:
        for s, lab in tasks:
            done(one(s, lab))
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, s, lab) for s, lab in tasks]
            for fut in futures:
                fut.add_done_callback(lambda f: done(f.result()))
            for fut in futures:
                fut.result()
    return [results[(s, lab)] for s in found if s not in skip for lab in wanted]
