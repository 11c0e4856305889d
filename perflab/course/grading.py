"""Grade a folder of submissions with nbval: restore the reference checks, run, score.

Layout (one folder per student, one notebook per lab, matched to its lab by the
two-digit prefix of the file name)::

    SUBMISSIONS/<student>/NN_*.ipynb      e.g. submissions/ada/01_profile_resnet18.ipynb
    REFERENCE/NN_*.ipynb                  the solution notebooks (solutions/)

For each submitted notebook, :func:`restore_checks` puts back every graded or locked
cell of the reference by ``grade_id`` (an edited check is replaced, a deleted one goes
back after the cell that precedes it in the reference), clears the student's outputs,
and :func:`grade_notebook` runs it under nbval (``--nbval-lax``, the current
environment, a per-cell timeout) in a subprocess with a wall-clock and a memory limit. A
check earns its points when its cell ran without an exception and printed the
reference's output. A cell that raises does not stop the run (as in nbgrader): later
checks that do not need it still earn their points. A cell that hangs past the per-cell
timeout, a dead kernel or the wall-clock limit ends the run: checks after it earn
nothing. :func:`grade_submissions` grades a whole folder; :mod:`perflab.course.report`
writes ``scores.csv`` and the per-student feedback.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, Literal

import nbformat

from perflab.course.limited_run import run_limited

__all__ = ["Limits", "CheckResult", "LabGrade", "lab_key", "protected_cells",
           "restore_checks", "grade_notebook", "grade_submissions"]

_LAB_NAME = re.compile(r"^(\d\d)_.*\.ipynb$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Limits on one submitted notebook's run."""

    cell_timeout_s: float = 600.0
    """nbval's per-cell timeout: a cell running longer is interrupted and the run ends."""
    wall_timeout_s: float = 1800.0
    """Wall-clock limit of the whole notebook; the subprocess tree is killed after it."""
    memory_gib: float | None = 8.0
    """Address-space limit (RLIMIT_AS) of each process (pytest and the kernel); None: no
    limit. CUDA maps far more virtual memory than it uses: grade GPU labs with None."""

    def __post_init__(self) -> None:
        if self.cell_timeout_s <= 0 or self.wall_timeout_s <= 0:
            raise ValueError(f"timeouts must be > 0 s, got cell_timeout_s="
                             f"{self.cell_timeout_s}, wall_timeout_s={self.wall_timeout_s}")
        if self.memory_gib is not None and self.memory_gib <= 0:
            raise ValueError(f"memory_gib must be > 0 (or None for no limit), "
                             f"got {self.memory_gib}")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One graded cell of one submission."""

    grade_id: str
    max_points: float
    points: float
    status: Literal["passed", "failed", "not run"]
    message: str = ""


@dataclasses.dataclass
class LabGrade:
    """One student's result for one lab; ``error`` says why nothing could be run."""

    student: str
    lab: str
    notebook: Path | None
    checks: list[CheckResult]
    error: str = ""
    wall_s: float = 0.0
    log: str = ""

    @property
    def points(self) -> float:
        return sum(c.points for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c.max_points for c in self.checks)


def lab_key(path: str | Path) -> str | None:
    """The lab number ``"NN"`` of a notebook named ``NN_*.ipynb``, else None."""
    m = _LAB_NAME.match(Path(path).name)
    return m.group(1) if m else None


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def protected_cells(reference: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """``grade_id -> cell`` of the reference cells a student may not change: graded
    cells (which hold the hidden tests) and locked (read-only) cells."""
    out = {}
    for cell in reference.cells:
        meta = _nbgrader(cell)
        if meta.get("grade_id") and (meta.get("grade") or meta.get("locked")):
            out[meta["grade_id"]] = cell
    return out


def _position(cells: list, ref_cell) -> int | None:
    """Index in ``cells`` of the cell matching ``ref_cell`` by grade_id, else by cell id."""
    gid, cid = _nbgrader(ref_cell).get("grade_id"), ref_cell.get("id")
    for i, cell in enumerate(cells):
        if (gid and _nbgrader(cell).get("grade_id") == gid) or (
                not gid and cid and cell.get("id") == cid):
            return i
    return None


def restore_checks(submission: nbformat.NotebookNode,
                   reference: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The submission with every protected cell of the reference restored.

    A protected cell the student kept (edited or not) is replaced in place by the
    reference's, with its stored output (what nbval compares against); duplicates are
    dropped. A deleted one is inserted after the nearest preceding reference cell that
    is still in the notebook (matched by grade_id, else by cell id), or first. The
    student's own cells keep their source, lose their outputs, and cannot claim points.
    """
    protected = protected_cells(reference)
    cells, seen = [], set()
    for cell in submission.cells:
        gid = _nbgrader(cell).get("grade_id")
        if gid in protected:
            if gid not in seen:
                seen.add(gid)
                cells.append(copy.deepcopy(protected[gid]))
            continue
        cell = copy.deepcopy(cell)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if "nbgrader" in cell.get("metadata", {}):
            cell.metadata.nbgrader["grade"] = False
        cells.append(cell)
    for i, ref_cell in enumerate(reference.cells):
        gid = _nbgrader(ref_cell).get("grade_id")
        if gid not in protected or gid in seen:
            continue
        pos = 0
        for prev in reversed(reference.cells[:i]):
            j = _position(cells, prev)
            if j is not None:
                pos = j + 1
                break
        cells.insert(pos, copy.deepcopy(ref_cell))
        seen.add(gid)
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(reference.metadata))
    nb.nbformat_minor = max(reference.nbformat_minor, nb.nbformat_minor)
    nb.metadata.pop("widgets", None)
    return nb


def _graded(reference: nbformat.NotebookNode) -> dict[str, float]:
    return {_nbgrader(c)["grade_id"]: float(_nbgrader(c).get("points", 0))
            for c in reference.cells if _nbgrader(c).get("grade") and _nbgrader(c).get("grade_id")}


def _run_nbval(notebook: Path, workdir: Path, limits: Limits, sanitize: Path | None
               ) -> tuple[list[dict], str, bool]:
    """Run one notebook under nbval in a subprocess: (cell records, log, hit wall limit)."""
    outcomes = workdir / "outcomes.jsonl"
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")  # keep the project's addopts/testpaths out of the run
    cmd = [sys.executable, "-m", "pytest", str(notebook), "-c", str(ini),
           "--rootdir", str(workdir), "-p", "perflab.course.nbval_outcomes", "-p", "no:cacheprovider",
           "-q", "--color=no", "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={limits.cell_timeout_s:g}"]
    if sanitize is not None:
        cmd.append(f"--nbval-sanitize-with={sanitize}")
    env = {**os.environ, "PERFLAB_OUTCOMES": str(outcomes),
           "PERFLAB_RESULTS": str(workdir / "results")}
    log, hit_wall = run_limited(cmd, cwd=workdir, env=env, memory_gib=limits.memory_gib,
                                wall_timeout_s=limits.wall_timeout_s)
    records = []
    if outcomes.exists():
        records = [json.loads(ln) for ln in outcomes.read_text().splitlines() if ln.strip()]
    return records, log, hit_wall


def grade_notebook(path: str | Path, reference_path: str | Path, *, student: str = "",
                   limits: Limits = Limits(), sanitize: str | Path | None = None
                   ) -> LabGrade:
    """Restore the reference checks into one submitted notebook, run it, score it.

    Never raises for a bad submission: a file that is not a readable notebook gives a
    :class:`LabGrade` with ``error`` set and every check "not run".
    """
    from perflab.timing import Stopwatch

    path, reference_path = Path(path), Path(reference_path)
    reference = nbformat.read(str(reference_path), as_version=4)
    graded = _graded(reference)
    lab = lab_key(reference_path) or reference_path.stem
    grade = LabGrade(student, lab, path, [])
    try:
        submission = nbformat.read(str(path), as_version=4)
        restored = restore_checks(submission, reference)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the student's error row
        return _error_grade(student, lab, path, graded,
                            f"{path.name} is not a valid notebook ({type(e).__name__}: {e}); "
                            "nothing was run")
    sw = Stopwatch().start()
    with tempfile.TemporaryDirectory(prefix="perflab-grade-") as tmp:
        workdir = Path(tmp)
        nb_path = workdir / reference_path.name
        nbformat.write(restored, str(nb_path))
        records, grade.log, hit_wall = _run_nbval(
            nb_path, workdir, limits, Path(sanitize).resolve() if sanitize else None)
    grade.wall_s = sw.elapsed_s
    by_gid = {r["grade_id"]: r for r in records if r.get("grade_id")}
    stop = next((r for r in records if r.get("stopped")), None)
    why_not_run = (f"not run: code cell {stop['cell_num'] + 1} ({stop['first_line']!r}) "
                   f"stopped the notebook: {stop['message']}" if stop else
                   f"not run: the notebook's wall-clock limit ({limits.wall_timeout_s:g} s) "
                   "was reached" if hit_wall else
                   "not run: the notebook stopped before this cell (see the log)")
    for gid, pts in graded.items():
        r = by_gid.get(gid)
        if r is None or r["outcome"] == "skipped":
            grade.checks.append(CheckResult(gid, pts, 0.0, "not run", why_not_run))
        elif r["outcome"] == "passed":
            grade.checks.append(CheckResult(gid, pts, pts, "passed"))
        else:
            grade.checks.append(CheckResult(gid, pts, 0.0, "failed", r["message"]))
    return grade


def _error_grade(student: str, lab: str, notebook: Path | None, graded: dict[str, float],
                 error: str) -> LabGrade:
    checks = [CheckResult(gid, pts, 0.0, "not run", error) for gid, pts in graded.items()]
    return LabGrade(student, lab, notebook, checks, error=error)


def _references(reference_dir: Path) -> dict[str, Path]:
    refs = {lab_key(p): p for p in sorted(reference_dir.glob("[0-9][0-9]_*.ipynb"))}
    if not refs:
        raise FileNotFoundError(f"no reference notebooks (NN_*.ipynb) in {reference_dir}")
    return refs


def grade_submissions(submissions_dir: str | Path, reference_dir: str | Path, *,
                      limits: Limits = Limits(), sanitize: str | Path | None = None,
                      labs: list[str] | None = None,
                      progress: Callable[[str], None] | None = None) -> list[LabGrade]:
    """Grade ``SUBMISSIONS/<student>/NN_*.ipynb`` against ``REFERENCE/NN_*.ipynb``.

    Args:
        labs: lab numbers to grade (``["01"]``); None: every lab someone submitted.
        progress: called with one line per graded notebook (e.g. ``print``).

    Returns:
        One LabGrade per student and lab, students in name order; a lab a student did
        not submit (or submitted twice) is an error row with no points.

    Raises:
        FileNotFoundError: no submissions folder, no student folders, or no references.
        ValueError: a requested lab has no reference notebook.
    """
    subs, refs = Path(submissions_dir), _references(Path(reference_dir))
    if not subs.is_dir():
        raise FileNotFoundError(f"no submissions folder {subs}")
    students = sorted(p for p in subs.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(f"no student folders in {subs}; expected "
                                f"{subs}/<student>/NN_*.ipynb")
    found = {s.name: {} for s in students}
    for s in students:
        for nb in sorted(s.glob("*.ipynb")):
            if lab_key(nb) is None and progress:
                progress(f"{s.name:<20} ignored {nb.name}: not named NN_*.ipynb")
            found[s.name].setdefault(lab_key(nb), []).append(nb)
    wanted = labs or sorted({k for f in found.values() for k in f if k in refs})
    missing = [k for k in wanted if k not in refs]
    if missing:
        raise ValueError(f"no reference notebook for lab(s) {missing} in {reference_dir}; "
                         f"labs there: {sorted(refs)}")
    grades = []
    for student in found:
        for lab in wanted:
            nbs = found[student].get(lab, [])
            if len(nbs) == 1:
                g = grade_notebook(nbs[0], refs[lab], student=student, limits=limits,
                                   sanitize=sanitize)
            else:
                graded = _graded(nbformat.read(str(refs[lab]), as_version=4))
                g = _error_grade(student, lab, None, graded,
                                 f"no {lab}_*.ipynb submitted" if not nbs else
                                 f"{len(nbs)} notebooks for lab {lab} "
                                 f"({', '.join(p.name for p in nbs)}); submit exactly one")
            grades.append(g)
            if progress:
                progress(f"{student:<20} lab {lab}: {g.points:g}/{g.max_points:g} points"
                         + (f" ({g.wall_s:.0f} s)" if g.wall_s else "")
                         + (f"  [{g.error}]" if g.error else ""))
    return grades
