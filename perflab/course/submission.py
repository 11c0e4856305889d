"""Grade one submitted notebook: answers into the reference, a sandbox, verdicts outside.

For each notebook :func:`grade_notebook`

1. refuses a notebook that is a symbolic link or lies outside the submissions folder;
   keeps only the student's *answers* (solution cells, by ``grade_id``), scans them for
   the review column (:func:`perflab.course.answers.scan_answer`: findings are for the
   instructor, never deducted), and puts them into the reference notebook's own cells;
   each graded check becomes its ``student_answer`` on hidden cases drawn here from the
   grading run's seed, the student's name and the check (:mod:`perflab.course.cases`),
   an older check its *probe*; cells tagged ``grading-skip`` are left out
   (:func:`perflab.course.answers.assemble`);
2. runs the *grading process* (:mod:`perflab.course.grading_process`) in a bubblewrap
   sandbox (:mod:`perflab.course.sandbox`: read-only file system, no network, own
   namespaces, size-limited tmpfs scratch, /tmp and /dev/shm, a memory cap for the
   submission's processes together, limits; the reference and other submissions out of
   sight): a plain interpreter that runs the answer cells and the given cells the
   checks read, then each check's ``student_answer`` on its hidden cases, with what the
   check forbids absent, and writes the raw answers on a file descriptor the grader
   opened. Every point comes from it;
3. judges each check *outside* the sandbox: a graded check's raw answers against its
   ``judge_answer`` on the same cases (:func:`perflab.course.cases.judge_answers`), an
   older check's facts with its judge (:func:`perflab.course.checks.run_judge`). A check
   earns its points when exactly one readable record came back and the judge passed; a
   missing, duplicated or malformed record is "tampered or crashed" (0 points, a review
   note);
4. where the grading process left points unearned (``notebook_run``), runs the notebook
   itself, its check cells left out, under nbval in the same sandbox, for the
   instructor's log of what the student's cells print (a pytest plugin reports each cell
   on a file descriptor the kernel cannot reach, :mod:`perflab.course.nbval_channel`);
   no point comes from it.

The result is a :class:`LabGrade` of :class:`CheckResult` rows, within :class:`Limits`.
A whole folder of submissions is :mod:`perflab.course.grading`.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Literal

import nbformat

from perflab.course.answers import (SKIP_TAG, Flag, allowances, answers_of, assemble,
                                    autograded, forbidden_names, scan_answer, scan_forbidden)
from perflab.course.cases import judge_answers
from perflab.course.checks import parse_facts, run_judge
from perflab.course.grading_process import ENV_FD as PROCESS_FD
from perflab.course.grading_process import SPEC_NAME, kernel_notebook, plan_process, read_records
from perflab.course.sandbox import SANDBOX_WORK, SandboxLimits, run_sandboxed
from perflab.course.warm import HEADERS_ENV, SANDBOX_USER
from perflab.course.written import written_answers

__all__ = ["Limits", "CheckResult", "LabGrade", "lab_key", "grade_notebook", "error_grade",
           "read_submitted_notebook", "MAX_NOTEBOOK_BYTES", "READ_TIMEOUT_S",
           "hideable"]

_LAB_NAME = re.compile(r"^(\d\d)_.*\.ipynb$")
_LOG_TAIL = 200_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Limits on one submitted notebook's run. Every value must be finite and > 0."""

    cell_timeout_s: float = 600.0
    """nbval's per-cell timeout, seconds: a cell running longer ends the run."""
    wall_timeout_s: float = 1800.0
    """Wall-clock limit of the whole notebook, seconds; the sandbox is killed after it."""
    memory_gib: float | None = 8.0
    """Address-space limit (RLIMIT_AS) of each process, GiB; None: no limit. CUDA maps
    far more virtual memory than it uses: grade GPU labs with None."""
    nproc: int = 256
    """Processes and threads the submission may have at once (RLIMIT_NPROC)."""
    cpu_s: float | None = None
    """CPU seconds per process (RLIMIT_CPU); None: ``wall_timeout_s``."""
    disk_gib: float = 1.0
    """Size of each writable file system in the sandbox (scratch, ``/tmp``, ``/dev/shm``:
    tmpfs, so RAM beside the per-process ``memory_gib``), GiB."""
    total_memory_gib: float | None = 6.0
    """Memory of all the run's processes together, GiB; None: no cap. A cgroup where the
    grader can make one, else a watchdog on their resident memory
    (:func:`perflab.course.sandbox.memory_cap_mechanism`); above it the run is stopped
    and the row says so."""
    output_mib: float = 64.0
    """Output of a run, MiB: what its processes write to the log (stdout, stderr) and
    what the kernel sends nbval (held in memory); above it the run is stopped."""

    def describe(self) -> str:
        """One line for the grading header."""
        mem = "no limit" if self.memory_gib is None else f"{self.memory_gib:g} GiB"
        total = "no cap" if self.total_memory_gib is None else f"{self.total_memory_gib:g} GiB"
        return (f"limits per notebook: {self.wall_timeout_s:g} s wall, {self.cell_timeout_s:g} s "
                f"per cell, address space {mem} per process, {total} for its processes "
                f"together, {self.output_mib:g} MiB of output, {self.nproc} processes, "
                f"scratch, /tmp and /dev/shm {self.disk_gib:g} GiB each (tmpfs)")

    def __post_init__(self) -> None:
        optional = ("memory_gib", "cpu_s", "total_memory_gib")
        for name in ("cell_timeout_s", "wall_timeout_s", "memory_gib", "nproc", "cpu_s",
                     "disk_gib", "total_memory_gib", "output_mib"):
            v = getattr(self, name)
            if v is None and name in optional:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0"
                                 + (" (or None for no limit)" if name in optional
                                    else "") + f", got {v!r}")


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One graded check of one submission."""

    grade_id: str
    max_points: float
    points: float
    status: Literal["passed", "failed", "not run"]
    message: str = ""
    """For the instructor: the full message (hidden tests and reference values too)."""
    hidden: bool = False
    """The failure came from a hidden test: the student sees only that one failed."""
    student: str = ""
    """What the student may see of a hidden failure (which hidden case, what kind of
    failure; never the case or its expected value). Empty: a generic line."""


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
    flags: list[Flag] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    sandboxed: bool = True
    warning: str = ""
    written: list[dict] = dataclasses.field(default_factory=list)
    """The student's written answers (see :func:`perflab.course.written.written_answers`)."""
    process_s: float = 0.0
    """Wall seconds of the grading process (where the points come from); ``wall_s`` adds
    the notebook's run under nbval when there was one."""
    cell_seconds: list[tuple[int, str, float]] = dataclasses.field(default_factory=list)
    """(cell number, first line, seconds) of each cell the grading process ran: where a
    lab's grading time goes (``benchmarks/grading.py``)."""

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


def error_grade(student: str, lab: str, notebook: Path | None, graded: dict[str, float],
                error: str) -> LabGrade:
    """A grade with ``error`` set and every check of ``graded`` (grade_id -> points)
    "not run": nothing of the submission could be run."""
    checks = [CheckResult(gid, pts, 0.0, "not run", error) for gid, pts in graded.items()]
    return LabGrade(student, lab, notebook, checks, error=error)


def _tail(path: Path) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _LOG_TAIL))
        return f.read().decode("utf-8", errors="replace")


#: How the sandbox starts pytest. jsonschema (under nbformat, under nbval) imports
#: rfc3987_syntax when it is installed, only to validate IRI formats that notebooks never
#: use; building its grammar costs 1-6 s per process on a loaded 2-core machine, so the
#: grading run does without it.
_PYTEST_BOOT = ("import sys; sys.modules['rfc3987_syntax'] = None; "
                "from perflab.course.warm import seed_from_env; seed_from_env(); import pytest; "
                "sys.exit(pytest.main(sys.argv[1:]))")

#: How the sandbox starts the grading process (:mod:`perflab.course.grading_process`):
#: ``__main__`` is this ``-c`` program, as a kernel's namespace is ``__main__``, so the
#: cells run in it and spawned ranks find no script to re-import.
_PROCESS_BOOT = ("import sys; sys.modules['rfc3987_syntax'] = None; "
                 "from perflab.course.warm import seed_from_env; seed_from_env(); "
                 "from perflab.course.grading_process import main; sys.exit(main())")

#: Where Inductor's precompiled headers (:mod:`perflab.course.warm`) appear inside.
_HEADERS_INSIDE = f"{SANDBOX_WORK}/.inductor-headers"

#: The course's own solutions folder, hidden even when grading against another reference.
_SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def hideable(*paths: Path) -> list[Path]:
    """The paths that exist and can be hidden without hiding what the notebook needs
    (Python, the venv, perflab, the data): never one of their folders or parents."""
    needed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
              Path(__file__).resolve().parents[1], Path("/tmp")]
    out = []
    for p in paths:
        p = Path(p).resolve()
        if not p.exists() or p == Path("/") or any(n == p or p in n.parents for n in needed):
            continue
        if p not in out:
            out.append(p)
    return out


def _env(scratch: Path, fd: int, threads: int | None) -> dict[str, str]:
    # No PYTHONSAFEPATH: the pytest process runs with -P (a file in scratch cannot shadow
    # pytest, nbval or the channel plugin), but the kernel inherits this environment, and
    # IPython >= 9 honours PYTHONSAFEPATH by leaving the notebook's folder off sys.path:
    # the labs' %%writefile modules (Lab 06's MyDDP, Lab 07's detector, Lab 09's ZeRO-1)
    # would not import, as they do in a student's Jupyter. Verdicts are judged outside.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch / "home"),
           "LANG": "C.UTF-8", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "MPLCONFIGDIR": str(scratch / "home" / ".mpl"),
           "PERFLAB_RESULTS": str(scratch / "results"), "PERFLAB_VERDICT_FD": str(fd),
           "JUPYTER_PLATFORM_DIRS": "1"}
    for k in ("PERFLAB_PRESET", "CUDA_VISIBLE_DEVICES"):
        if k in os.environ:
            env[k] = os.environ[k]
    from perflab.core.paths import default_data_root

    env["PERFLAB_DATA"] = str(default_data_root().resolve())  # HOME differs in the sandbox
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


#: The largest submitted notebook the grader reads, bytes (a larger file is refused).
MAX_NOTEBOOK_BYTES = 50 * 2**20
#: Seconds the grader waits for a submitted notebook's bytes (a stalled network or FUSE
#: file system): after it the file is refused.
READ_TIMEOUT_S = 60.0
_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"))


def read_submitted_notebook(path: str | Path, max_bytes: int = MAX_NOTEBOOK_BYTES,
                            timeout_s: float = READ_TIMEOUT_S) -> nbformat.NotebookNode:
    """A submitted notebook, read as the grader reads every submission: a regular file
    only, never through a symbolic link, at most ``max_bytes``, within ``timeout_s``.

    The file is opened with ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY`` (a named
    pipe opens without waiting for a writer) after an ``lstat`` (a device is never
    opened), checked with ``fstat``, read up to ``max_bytes + 1`` bytes in a helper
    thread (a read that stalls is abandoned after ``timeout_s``) and parsed with
    :func:`nbformat.reads` (version 4).

    Raises:
        ValueError: ``path`` is not a regular file (a named pipe, socket, device, folder
            or symbolic link), is larger than ``max_bytes``, could not be read within
            ``timeout_s``, or is not UTF-8; nbformat's own ``ValueError`` subclasses
            (``NotJSONError``) when it is not a notebook. Each message names the file
            and what to do.
        OSError: the file cannot be opened (missing, no permission).
    """
    path = Path(path)
    name = path.name

    def refuse(mode: int) -> None:
        kind = next((k for test, k in _NOT_REGULAR if test(mode)), "not a regular file")
        raise ValueError(f"{name} is {kind}, not a notebook file; the grader reads only "
                         "regular files: put the notebook file itself (NN_*.ipynb) there")

    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        refuse(st.st_mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link since the lstat
            refuse(stat.S_IFLNK)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            refuse(st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    too_big = (f"{name} is larger than the {max_bytes / 2**20:.3g} MiB ({max_bytes:,} bytes) "
               "the grader reads (MAX_NOTEBOOK_BYTES); clear its outputs (Jupyter: Edit > "
               "Clear Outputs of All Cells), save and submit it again")
    if st.st_size > max_bytes:
        os.close(fd)
        raise ValueError(too_big)
    chunks: list[bytes] = []
    errors: list[OSError] = []
    done = threading.Event()

    def read() -> None:
        try:
            n = 0
            while n <= max_bytes:
                chunk = os.read(fd, min(2**20, max_bytes + 1 - n))
                if not chunk:
                    break
                chunks.append(chunk)
                n += len(chunk)
        except OSError as e:
            errors.append(e)
        finally:
            os.close(fd)
            done.set()

    threading.Thread(target=read, name="read-notebook", daemon=True).start()
    if not done.wait(timeout_s):
        raise ValueError(f"{name} could not be read within {timeout_s:g} s; copy the "
                         "submissions onto a local disk and grade again")
    if errors:
        raise errors[0]
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while being read
        raise ValueError(too_big)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not UTF-8 text (byte 0x{data[e.start]:02x} at byte "
                         f"{e.start}); save the notebook from Jupyter again") from None
    return nbformat.reads(text, as_version=4)


#: When the notebook also runs under nbval (for the log): see :func:`grade_notebook`.
NotebookRun = Literal["always", "on-failure", "never"]


def notebook_run_mode(value: NotebookRun | bool) -> NotebookRun:
    """``value`` as one of :data:`NotebookRun` (``True``: ``"always"``, ``False``:
    ``"never"``).

    Raises:
        ValueError: anything else, naming the choices.
    """
    if value is True or value is False:
        return "always" if value else "never"
    if value not in ("always", "on-failure", "never"):
        raise ValueError(f"notebook_run must be 'always', 'on-failure' or 'never', got {value!r}")
    return value


def grade_notebook(path: str | Path, reference_path: str | Path, *, student: str = "",
                   limits: Limits = Limits(), sanitize: str | Path | None = None,
                   sandbox: Literal["auto", "bwrap", "none"] = "auto",
                   hide: tuple[Path, ...] = (), slot: int = 0, threads: int | None = None,
                   skip_tag: str = SKIP_TAG,
                   reference: nbformat.NotebookNode | None = None,
                   seed: str | int = 0, inside: str | Path | None = None,
                   inductor_headers: Path | None = None,
                   notebook_run: NotebookRun | bool = "on-failure") -> LabGrade:
    """Grade one submitted notebook against its reference notebook.

    Args:
        path: the submitted notebook.
        reference_path: the reference (solution) notebook; read once by the caller and
            passed as ``reference`` in batches, so a submission cannot change it.
        student: the name on the grade.
        limits: time, memory and process limits of the run.
        sanitize: ignored (outputs are no longer compared; kept for old callers).
        sandbox: ``"bwrap"`` requires bubblewrap; ``"auto"`` falls back to a plain
            subprocess with a loud warning in ``LabGrade.warning``; ``"none"`` never
            sandboxes.
        hide: more host folders to make invisible in the sandbox (the reference folder,
            the submissions folder and this lab's reference are always hidden).
        slot: parallel slot (an unprivileged uid per slot when running as root).
        threads: CPU threads for the notebook (OMP_NUM_THREADS); None: the default.
        skip_tag: cells with this tag do not run.
        inside: the submissions folder: a notebook that is a symbolic link, or resolves
            outside it, is refused (None: only symbolic links are).
        seed: the grading run's seed; the hidden cases of each graded check are drawn
            from it, the student's name and the check's grade_id.
        inductor_headers: Inductor's precompiled headers, built by the grader
            (:func:`perflab.course.warm.build_inductor_headers`), lent read-only to the
            sandbox; None: the notebook compiles them itself if it needs them.
        notebook_run: also run the notebook (its check cells left out) under nbval in a
            kernel, for the instructor's log of what the student's cells print; no point
            comes from it (:mod:`perflab.course.grading_process` earns them all).
            ``"on-failure"`` (default): only when the grading process left points
            unearned (the log then shows where); ``"always"``; ``"never"``. ``True`` and
            ``False`` mean ``"always"`` and ``"never"``.

    Returns:
        A :class:`LabGrade`. Never raises for anything the submission does: an
        unreadable file or a broken run is a grade with ``error`` set.

    Raises:
        ValueError: the reference notebook is malformed (instructor error).
        RuntimeError: ``sandbox="bwrap"`` and bubblewrap does not work here.
    """
    del sanitize
    notebook_run = notebook_run_mode(notebook_run)
    path, reference_path = Path(path), Path(reference_path)
    if reference is None:
        reference = nbformat.read(str(reference_path), as_version=4)
    graded = autograded(reference)
    lab = lab_key(reference_path) or reference_path.stem
    outside = inside is not None and Path(inside).resolve() not in path.resolve().parents
    if path.is_symlink() or outside:
        return error_grade(student, lab, path, graded,
                           f"refused: {path.name} is a symbolic link or lies outside the "
                           "submissions folder; submit the notebook file itself")
    try:
        submission = read_submitted_notebook(path)
        if not isinstance(submission.get("cells"), list):
            raise ValueError("it has no list of cells")
        answers, notes = answers_of(submission, reference)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the student's error row
        return error_grade(student, lab, path, graded,
                           f"{path.name} is not a valid notebook ({type(e).__name__}: "
                           f"{str(e)[:200]}); nothing was run")
    allow, forbid = allowances(reference), forbidden_names(reference)
    flags = [f for gid, src in answers.items() for f in (
        scan_answer(gid, src, allow.get(gid, ())) + scan_forbidden(gid, src, forbid.get(gid, ())))]
    assembled = assemble(reference, answers, skip_tag=skip_tag, seed=f"{seed}:{student}")
    grade = LabGrade(student, lab, path, [], flags=flags, notes=notes,
                     written=written_answers(submission, reference))
    plan = plan_process(assembled, cell_timeout_s=limits.cell_timeout_s)
    with tempfile.TemporaryDirectory(prefix="perflab-grade-") as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o711)  # bwrap, as the slot's uid, must reach scratch/ to bind it
        hidden = hideable(reference_path.resolve().parent, tmp.parent, _SOLUTIONS, *hide)
        binds, extra_env = [], {}
        if inductor_headers is not None:
            binds.append((inductor_headers, _HEADERS_INSIDE))
            extra_env = {HEADERS_ENV: _HEADERS_INSIDE, "LOGNAME": SANDBOX_USER}
        sandbox_limits = SandboxLimits(
            wall_timeout_s=limits.wall_timeout_s, memory_gib=limits.memory_gib,
            cpu_s=limits.cpu_s, nproc=limits.nproc, tmpfs_gib=limits.disk_gib,
            total_memory_gib=limits.total_memory_gib, output_mib=limits.output_mib)

        def sandboxed(cmd: list[str], scratch: Path, fd: int, env: dict, log: Path):
            try:
                return run_sandboxed(cmd, scratch=scratch, env={**env, **extra_env},
                                     log_path=log, ro_binds=binds, hide=hidden,
                                     pass_fds=[fd], slot=slot, mode=sandbox,
                                     limits=sandbox_limits)
            finally:
                os.close(fd)

        # 1. The points: the graded calls in a fresh process (no kernel, no IPython),
        # its own scratch folder, the plan's hidden cases in and raw answers out on a
        # private file descriptor (perflab.course.grading_process).
        process_scratch = tmp / "grading"
        (process_scratch / "home").mkdir(parents=True)
        plan_file = process_scratch / SPEC_NAME
        plan_file.write_text(json.dumps(plan))
        process_channel = tmp / "grading.jsonl"
        fd = os.open(process_channel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        env = _env(process_scratch, fd, threads)
        env[PROCESS_FD] = env.pop("PERFLAB_VERDICT_FD")
        run = sandboxed([sys.executable, "-P", "-c", _PROCESS_BOOT, str(plan_file)],
                        process_scratch, fd, env, tmp / "grading-log.txt")
        by_check, cell_records, bad = read_records(process_channel)
        grade.cell_seconds = [(r["cell"], str(r.get("first_line", "")), float(r["seconds"]))
                              for r in cell_records if isinstance(r.get("cell"), int)
                              and isinstance(r.get("seconds"), (int, float))]
        log = "== the grading process (points) ==\n" + _tail(tmp / "grading-log.txt")
        grade.wall_s = grade.process_s = run.wall_s
        grade.sandboxed, grade.warning = run.sandboxed, run.warning
        if run.stopped:
            grade.error = f"stopped: {run.stopped}"
        if bad:
            grade.notes.append(f"{bad} line(s) of the grading process's records were not "
                               "JSON records (ignored)")
        _score(grade, assembled, graded, by_check, cell_records, run.timed_out, limits,
               stopped=run.stopped, returncode=run.returncode)
        # 2. The notebook under nbval in a kernel, its checks left out: the log of what
        # the student's cells print and where one stops. No point comes from it.
        if notebook_run == "always" or (notebook_run == "on-failure" and (
                grade.points < grade.max_points or grade.error)):
            scratch = tmp / "scratch"
            (scratch / "home").mkdir(parents=True)
            nb_path = scratch / reference_path.name
            nbformat.write(kernel_notebook(assembled), str(nb_path))
            ini = scratch / "pytest.ini"
            ini.write_text("[pytest]\n")  # keep any project's addopts/conftest out
            channel = tmp / "channel.jsonl"
            fd = os.open(channel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            cmd = [sys.executable, "-P", "-c", _PYTEST_BOOT, str(nb_path), "-c", str(ini),
                   "--rootdir", str(scratch), "-p", "nbval", "-p",
                   "perflab.course.nbval_channel", "-p", "no:cacheprovider", "-q",
                   "--color=no", "--nbval-lax", "--nbval-current-env",
                   f"--nbval-cell-timeout={limits.cell_timeout_s:g}",
                   f"--perflab-output-mib={limits.output_mib:g}"]
            kernel_run = sandboxed(cmd, scratch, fd, _env(scratch, fd, threads),
                                   tmp / "log.txt")
            log += ("\n== the notebook under nbval (no points) ==\n" + _tail(tmp / "log.txt"))
            grade.wall_s += kernel_run.wall_s
            if kernel_run.stopped:
                grade.notes.append(f"the notebook under nbval was stopped: {kernel_run.stopped}")
        else:
            log += ("\n== the notebook under nbval: not run (" + (
                "--notebook-run never" if notebook_run == "never" else
                "full marks; --notebook-run always runs it") + ") ==\n")
        grade.log = log
    return grade


def _score(grade: LabGrade, assembled, graded: dict[str, float],
           by_check: dict[str, list[dict]], cell_records: list[dict], hit_wall: bool,
           limits: Limits, stopped: str = "", returncode: int | None = None) -> None:
    """Judge the grading process's records (:func:`perflab.course.grading_process.main`)
    outside the sandbox: each check earns its points when exactly one record came back
    and its answers pass the judge on every hidden case."""
    stop = next((r for r in cell_records if r.get("stopped")), None)
    last = max((r["cell"] for r in cell_records if isinstance(r.get("cell"), int)),
               default=None)
    why_not_run = (f"not run: the wall-clock limit ({limits.wall_timeout_s:g} s) was "
                   "reached" if hit_wall else
                   f"not run: {stop['message']}, which stopped the grading process"
                   if stop is not None else
                   f"not run: the grader stopped the grading process ({stopped})"
                   + (f" after cell {last + 1}" if last is not None else "")
                   if stopped else
                   "not run: the grading process stopped before this check"
                   + (f" (exit status {returncode}"
                      + (f", killed by signal {-returncode}" if returncode < 0 else "")
                      + ")" if returncode else "")
                   + (f" (the last cell it finished was cell {last + 1}; see the log)"
                      if last is not None else " (see the log)"))
    for gid, pts in graded.items():
        recs = by_check.get(gid, [])
        if not recs:
            grade.checks.append(CheckResult(gid, pts, 0.0, "not run", why_not_run))
            continue
        if len(recs) > 1:
            why = f"{len(recs)} answer records for one check (tampered or crashed)"
            grade.flags.append(Flag(gid, 0, f"answers record: {why}"))
            grade.checks.append(CheckResult(gid, pts, 0.0, "failed", why))
            continue
        r = recs[0]
        if gid not in assembled.judges:   # an older check: its probe's facts, its judge
            facts, why = parse_facts("\n".join(map(str, r.get("facts_lines", []))))
            if facts is None:
                grade.flags.append(Flag(gid, 0, f"facts record: {why}"))
                grade.checks.append(CheckResult(gid, pts, 0.0, "failed",
                                                str(r.get("error", "")) or why))
                continue
            verdict = run_judge(assembled.checks[gid], facts, name=gid)
            grade.checks.append(CheckResult(gid, pts, pts if verdict.passed else 0.0,
                                            "passed" if verdict.passed else "failed",
                                            verdict.message, verdict.hidden))
            continue
        if "error" in r:
            why = f"the check's graded call could not start: {str(r['error'])[:300]}"
            grade.checks.append(CheckResult(gid, pts, 0.0, "failed", why))
            continue
        outcome = judge_answers(assembled.judges[gid], assembled.cases[gid],
                                {k: r.get(k) for k in ("got", "delegated") if k in r})
        if outcome.tampered:
            grade.flags.append(Flag(gid, 0, f"answers record: {outcome.message}"))
        grade.checks.append(CheckResult(
            gid, pts, pts if outcome.passed else 0.0,
            "passed" if outcome.passed else "failed", outcome.message,
            hidden=not outcome.passed, student=outcome.student))
