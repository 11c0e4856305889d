"""Grade a folder of submissions: answers into the reference, a sandbox, verdicts outside.

Layout (one folder per student, one notebook per lab, matched to its lab by the
two-digit prefix of the file name)::

    SUBMISSIONS/<student>/NN_*.ipynb      e.g. submissions/ada/01_profile_resnet18.ipynb
    REFERENCE/NN_*.ipynb                  the solution notebooks (solutions/)

A submission runs arbitrary Python: each notebook is graded on its own in a sandbox by
:func:`perflab.course.submission.grade_notebook` (answers into the reference, the graded
calls in a fresh grading process in the sandbox, verdicts judged outside), giving a
:class:`~perflab.course.submission.LabGrade`.

A student is graded under the *id* of their folder (:func:`student_folders`): the folder
name, checked by :func:`check_student_name` (UTF-8, NFC, printable, at most
:data:`MAX_NAME_CHARS` characters, no path separator). A name that fails is graded as
``invalid-name-<hash>`` with an error row saying what to rename, and the batch goes on;
names that look alike (:func:`name_skeleton`) are graded and both flagged for review.
Every other entry of the submissions folder gets an error row too (a file at the top, a
folder whose name starts with ``.``, a named pipe, a symbolic link), except the hidden
files that tools leave there (:data:`IGNORED_NAMES`). The listing reads names and
``lstat`` only: it never opens, and never follows a link into, what it lists.

:func:`grade_submissions` grades a whole folder (``jobs`` sandboxes in parallel), or one
slice of it (``shard``, :func:`shard_slice`), calling back as each student finishes so
``scores.csv`` grows row by row (:mod:`perflab.course.report`). Anything that fails while
one student is graded or recorded becomes that student's error row; the rows do not
depend on ``jobs``. :mod:`perflab.course.command` is the ``perflab course grade`` command.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import stat
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Literal, Sequence

import nbformat

from perflab.course.answers import Flag, assemble, autograded
from perflab.course.sandbox import SandboxUnavailable, memory_cap_mechanism, sandbox_status
# Limits, LabGrade, lab_key and autograded stay importable from here (the grade command
# and the report import them with grade_submissions).
from perflab.course.submission import (_SOLUTIONS, LabGrade, Limits, NotebookRun, error_grade,
                                       grade_notebook, hideable, lab_key, notebook_run_mode)
from perflab.course.warm import build_inductor_headers, uses_compile

__all__ = ["grade_submissions", "reference_notebooks", "StudentFolder", "student_folders",
           "submitted_labs", "check_student_name", "name_skeleton", "shard_slice",
           "flag_text", "MAX_NAME_CHARS", "INVALID_PREFIX", "NAME_FLAG", "IGNORED_NAMES"]

#: Longest student id, in characters (a longer folder name is refused: rename it).
MAX_NAME_CHARS = 64
#: The id of a folder whose name is refused: this, then 10 hex digits of the sha256 of
#: the name's bytes. Folder names that start with it are refused too (reserved).
INVALID_PREFIX = "invalid-name-"
#: The ``grade_id`` of a review flag about the folder name (a look-alike of another
#: folder's name): the score table shows it once per student, not once per lab.
NAME_FLAG = "folder name"

#: Names at the top of a submissions folder that are no submission and get no row: what
#: Jupyter, git and file browsers leave there. So are names starting with ``.Trash``
#: (a desktop's trash) or ``._`` (macOS's AppleDouble files). Any other name starting
#: with ``.`` (``.ada``, ``...``) gets an error row: a dot hides a folder from ``ls``,
#: file browsers and shell globs.
IGNORED_NAMES = frozenset({".DS_Store", ".ipynb_checkpoints", ".git", ".gitkeep",
                           ".gitignore"})
_IGNORED_PREFIXES = (".Trash", "._")

_SEPARATORS = sorted({"/", "\\", os.sep} | ({os.altsep} if os.altsep else set()))
_FIX = "rename the folder (e.g. to the student's login) and grade again"

# Look-alike letters of other scripts mapped to the Latin letter they are mistaken for
# (both cases; NFKC already folds full-width, mathematical and ligature forms). Unicode's
# own skeleton (UTS #39) needs the 6,000-line confusables.txt, which no standard-library
# module ships, and a package for it would be a new dependency of the grader for one
# review hint: this small map covers the Cyrillic and Greek letters that pass for Latin
# ones in a folder name. A miss costs a review hint, never a grade.
_HOMOGLYPHS = str.maketrans({
    # Cyrillic
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "Х": "X", "У": "Y", "Ѕ": "S", "І": "I", "Ј": "J", "Ԛ": "Q",
    "Ԝ": "W", "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x",
    "ѕ": "s", "і": "i", "ј": "j", "ԁ": "d", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w",
    "ё": "e",
    # Greek
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "ο": "o", "α": "a",
    "ν": "v", "ρ": "p", "ι": "i", "κ": "k", "υ": "u",
    # Latin look-alikes NFKC keeps
    "ı": "i", "ȷ": "j",
})


def _escaped(text: str) -> str:
    """``text`` quoted, every character that is not printable ASCII escaped (``\\xe9``,
    ``\\u0430``, ``\\t``): look-alike letters and invisible ones show."""
    return "'" + "".join(c if c.isascii() and c.isprintable()
                         else c.encode("unicode_escape").decode("ascii") for c in text) + "'"


def _shown(raw: bytes) -> str:
    """A folder name for a message: printable ASCII, shortened; bytes that are not UTF-8
    as ``\\xff``."""
    text = raw.decode("utf-8", "backslashreplace")
    return _escaped(text if len(text) <= 40 else text[:40] + "...")


def _file_name(path: Path) -> str:
    """A file's name for a message: itself when it is printable UTF-8, else escaped."""
    text = os.fsencode(path.name).decode("utf-8", "backslashreplace")
    return text if text.isprintable() else ascii(text)[1:-1]


def check_student_name(name: str | bytes) -> str:
    """The student id of a submission folder's name: the name in Unicode NFC.

    ``name`` is the folder name as :meth:`pathlib.Path.iterdir` gives it (a name that is
    not UTF-8 holds surrogate escapes there) or its bytes.

    Raises:
        ValueError: the name is not valid UTF-8, is empty, ``.`` or ``..``, is longer than
            :data:`MAX_NAME_CHARS` characters, holds a path separator (``/``, ``\\``) or a
            character that does not print (a control character, tab, newline, an
            invisible format character), or starts with :data:`INVALID_PREFIX`
            (reserved). The message names the problem and says to rename the folder.
    """
    try:
        raw = name if isinstance(name, bytes) else os.fsencode(name)
    except UnicodeError:  # a lone surrogate that is no surrogate escape
        raw = name.encode("utf-8", "surrogatepass")
    shown = _shown(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the folder name {shown} is not valid UTF-8 (byte "
                         f"0x{raw[e.start]:02x} at byte {e.start}); {_FIX}, using UTF-8 "
                         "characters only") from None
    text = unicodedata.normalize("NFC", text)
    if text in ("", ".", ".."):
        raise ValueError(f"the folder name {shown} is not a name; {_FIX}")
    if len(text) > MAX_NAME_CHARS:
        raise ValueError(f"the folder name {shown} has {len(text)} characters, more than "
                         f"{MAX_NAME_CHARS}; {_FIX}")
    seps = [s for s in _SEPARATORS if s in text]
    if seps:
        raise ValueError(f"the folder name {shown} holds a path separator {seps[0]!r}; "
                         f"{_FIX}")
    bad = next((ch for ch in text if not ch.isprintable()), None)
    if bad is not None:
        what = " ".join(filter(None, [f"U+{ord(bad):04X}", unicodedata.name(bad, "")]))
        raise ValueError(f"the folder name {shown} holds a character that does not print "
                         f"({what} at character {text.index(bad)}); {_FIX}, with letters, "
                         "digits, '-' or '_'")
    if text.startswith(INVALID_PREFIX):
        raise ValueError(f"the folder name {shown} starts with {INVALID_PREFIX!r}, which "
                         f"the grader reserves for names it refuses; {_FIX}")
    return text


def flag_text(flag: Flag) -> str:
    """A review flag on one line: ``grade_id line N: what`` for an answer's line,
    ``folder name: what`` for a :data:`NAME_FLAG`."""
    return f"{flag.grade_id}: {flag.key}" if flag.grade_id == NAME_FLAG else str(flag)


def name_skeleton(student_id: str) -> str:
    """What a name looks like: NFKC, look-alike Cyrillic and Greek letters mapped to
    Latin ones, case folded. Two folders with the same skeleton are both flagged."""
    return unicodedata.normalize("NFKC", student_id).translate(_HOMOGLYPHS).casefold()


@dataclasses.dataclass(frozen=True)
class StudentFolder:
    """One entry of a submissions folder (a student folder, or anything else found there)
    and the id it is graded under."""

    id: str
    """The entry's name in NFC (:func:`check_student_name`); ``invalid-name-<hash>`` when
    the name is refused; ``<name>~<hash>`` when another entry's name has the same NFC
    form (the one whose name already is NFC keeps the plain id). A file at the top keeps
    its own name (``01_x.ipynb``), so its row says which file it is."""
    path: Path
    error: str = ""
    """Why the entry is refused (its labs are not run), with the fix; empty for a student
    folder that is graded. Refused: a name that fails :func:`check_student_name`, a
    folder whose name starts with ``.``, a symbolic link, a file or a named pipe, socket
    or device at the top of the submissions folder."""
    twins: tuple[str, ...] = ()
    """The ids of the other graded folders whose names look the same
    (:func:`name_skeleton`)."""


def _digest(raw: bytes, n: int) -> str:
    return hashlib.sha256(raw).hexdigest()[:n]


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.startswith(_IGNORED_PREFIXES)


def _entry_problem(path: Path, subs: Path) -> str:
    """Why an entry of the submissions folder is not a student folder to grade ("" when it
    is one), from its ``lstat``: nothing is opened or followed."""
    shown = _shown(os.fsencode(path.name))
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        return f"refused: {shown} could not be read ({e.strerror}); make it readable"
    if stat.S_ISLNK(mode):
        return f"refused: the student folder {shown} is a symbolic link; submit a real folder"
    if stat.S_ISDIR(mode):
        if path.name.startswith("."):
            return (f"refused: the folder name {shown} starts with '.', which hides it (ls, "
                    f"file browsers, shell globs); {_FIX}")
        return ""
    if stat.S_ISREG(mode):
        return (f"refused: {shown} is a file at the top of the submissions folder, not a "
                f"student folder; put it in a folder named after the student "
                f"({subs.name}/<student>/{_file_name(path)}) and grade again")
    kind = next((k for test, k in _KINDS if test(mode)), "not a folder")
    return (f"refused: {shown} is {kind} at the top of the submissions folder, not a student "
            "folder; remove it and put each student's notebooks in a folder named after "
            "the student")


def student_folders(submissions_dir: str | Path) -> list[StudentFolder]:
    """Every entry of ``submissions_dir`` with its id, sorted by id; the ids are distinct.

    A sub-folder is a student folder, graded. Any other entry gets a row that is not run
    (``error`` says why and what to do): a folder whose name starts with ``.`` (``.ada``,
    ``...``), a symbolic link, a file (``01_x.ipynb`` at the top, under its own name), a
    named pipe, socket or device, or a name :func:`check_student_name` refuses. The
    hidden files tools leave there (:data:`IGNORED_NAMES`, ``.Trash*``, ``._*``) are
    skipped. Only names and ``lstat`` are read: nothing listed is opened or followed.

    Raises:
        FileNotFoundError: no submissions folder, or nothing in it but hidden files.
    """
    subs = Path(submissions_dir)
    if not subs.is_dir():
        raise FileNotFoundError(f"no submissions folder {subs}")
    entries = [(p, _entry_problem(p, subs)) for p in sorted(subs.iterdir())
               if not _ignored(p.name)]
    if not entries:
        raise FileNotFoundError(f"no student folders in {subs}; expected "
                                f"{subs}/<student>/NN_*.ipynb")
    named: dict[str, list[tuple[Path, bytes, str]]] = {}
    refused: list[StudentFolder] = []
    for p, problem in entries:
        raw = os.fsencode(p.name)
        try:
            named.setdefault(check_student_name(p.name), []).append((p, raw, problem))
        except ValueError as e:
            refused.append(StudentFolder(INVALID_PREFIX + _digest(raw, 10), p,
                                         error=problem or f"refused: {e}"))
    taken = {f.id for f in refused} | set(named)
    graded: list[tuple[str, Path, str, str]] = []  # (id, entry, NFC name, problem)
    for nfc, group in named.items():
        for p, raw, problem in group:
            sid = nfc
            if len(group) > 1 and p.name != nfc:  # an NFC twin: both graded, apart
                n = 8
                while (sid := f"{nfc}~{_digest(raw, n)}") in taken:
                    n += 8
                taken.add(sid)
            graded.append((sid, p, nfc, problem))
    looks: dict[str, list[str]] = {}
    for sid, _, nfc, problem in graded:
        if not problem:
            looks.setdefault(name_skeleton(nfc), []).append(sid)
    folders = [StudentFolder(sid, p, error=problem,
                             twins=() if problem else tuple(sorted(
                                 o for o in looks[name_skeleton(nfc)] if o != sid)))
               for sid, p, nfc, problem in graded]
    return sorted(folders + refused, key=lambda f: f.id)


def _notebooks(folder: StudentFolder) -> list[Path]:
    """The ``*.ipynb`` names in a graded student folder (names only: none is opened).

    Raises:
        OSError: the folder cannot be listed.
    """
    return sorted(folder.path.glob("*.ipynb"))


def submitted_labs(folders: Sequence[StudentFolder]) -> set[str]:
    """The labs someone submitted: ``NN`` of every ``NN_*.ipynb`` in a graded student
    folder (a refused entry is not listed, a folder that cannot be listed adds nothing)
    and of a refused entry named ``NN_*.ipynb`` (a notebook put at the top of the
    submissions folder: its row says to move it)."""
    labs = {lab_key(f.path) for f in folders if f.error}
    for f in folders:
        if not f.error and not f.path.is_symlink():
            try:
                labs |= {lab_key(nb) for nb in _notebooks(f)}
            except OSError:
                pass
    return labs - {None}


def shard_slice(ids: Sequence[str], shard: tuple[int, int]) -> list[str]:
    """The ``K``-th of ``N`` slices of the students: sorted by id, the ``i``-th student
    (from 0) goes to slice ``i mod N``, so slices differ in size by one at most and
    every machine that lists the same folder cuts it the same way.

    Raises:
        ValueError: ``shard`` is not ``(K, N)`` with ``0 <= K < N``.
    """
    k, n = shard
    if not (isinstance(k, int) and isinstance(n, int) and 0 <= k < n):
        raise ValueError(f"shard must be (K, N) with 0 <= K < N, got {shard!r}")
    return sorted(ids)[k::n]


def reference_notebooks(reference_dir: Path) -> dict[str, Path]:
    """``lab -> path`` of ``REFERENCE/NN_*.ipynb``.

    Raises:
        FileNotFoundError: there is none.
    """
    refs = {lab_key(p): p for p in sorted(reference_dir.glob("[0-9][0-9]_*.ipynb"))}
    if not refs:
        raise FileNotFoundError(f"no reference notebooks (NN_*.ipynb) in {reference_dir}")
    return refs



class _Say:
    """``progress`` for one line, or nothing; a terminal that cannot show a student's
    name gets the line in ASCII (backslash escapes)."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress

    def __call__(self, line: str) -> None:
        if self.progress is None:
            return
        try:
            self.progress(line)
        except UnicodeError:
            self.progress(line.encode("ascii", "backslashreplace").decode("ascii"))


def _find_notebooks(folders: dict[str, StudentFolder], say: Callable[[str], None]
                    ) -> tuple[dict[str, dict], dict[str, str]]:
    """Each student's notebooks by lab (``{sid: {lab: [paths]}}``; files not named
    ``NN_*.ipynb`` under the key None, said), and why a student cannot be graded at all
    (``{sid: reason}``: a refused entry, a symbolic link, an unreadable folder)."""
    found: dict[str, dict] = {sid: {} for sid in folders}
    problem = {sid: f.error for sid, f in folders.items() if f.error}
    for sid, f in folders.items():
        if f.error:
            continue
        if f.path.is_symlink():
            problem[sid] = (f"refused: the student folder {_shown(os.fsencode(f.path.name))} "
                            "is a symbolic link; submit a real folder")
            continue
        try:
            notebooks = _notebooks(f)
        except OSError as e:
            problem[sid] = (f"could not list the folder ({type(e).__name__}: {e.strerror}); "
                            "make it readable by the grader")
            continue
        for nb in notebooks:
            if lab_key(nb) is None:
                say(f"{sid:<20} ignored {_file_name(nb)}: not named NN_*.ipynb")
            found[sid].setdefault(lab_key(nb), []).append(nb)
    return found, problem


def _check_sandbox(sandbox: str, limits: Limits, say: Callable[[str], None]) -> bool:
    """Whether submissions run sandboxed; raise :class:`SandboxUnavailable` when
    ``sandbox="bwrap"`` and bubblewrap does not work here; warn when ``"auto"`` falls
    back to plain subprocesses; say how the memory cap is held."""
    works, why = sandbox_status()
    if sandbox == "bwrap" and not works:
        raise SandboxUnavailable(f"sandbox required but unavailable: {why}; install "
                                 "bubblewrap (apt-get install bubblewrap) or pass "
                                 "--sandbox auto")
    if sandbox == "auto" and not works:
        say(f"WARNING: {why}. Submissions will run WITHOUT a sandbox "
            "(plain subprocesses with rlimits): a submission could read and change "
            "your files. Install bubblewrap, or pass --sandbox bwrap to refuse.")
    if limits.total_memory_gib is not None:
        say(f"memory cap per notebook: {limits.total_memory_gib:g} GiB for its processes "
            f"together, held by {memory_cap_mechanism()}")
    return sandbox != "none" and works


def _prepare_sandboxes(reference_dir: Path, hide: tuple[Path, ...], sandbox: str,
                       sandboxed: bool, compiling: set[str], say: Callable[[str], None]
                       ) -> Path | None:
    """Before any student: the sandbox self-test (:mod:`perflab.course.selftest`;
    :class:`SandboxLeak` stops the batch, naming every readable answer) and, beside it,
    Inductor's precompiled header for the labs that compile (:mod:`perflab.course.warm`,
    lent read-only to every sandbox: 5-6 s less per submission). Returns the header's
    folder, or None (not sandboxed, no lab compiles, or it could not be built)."""
    builder = None
    if sandboxed and compiling:
        warm_pool = ThreadPoolExecutor(max_workers=1)
        builder = warm_pool.submit(build_inductor_headers)
        warm_pool.shutdown(wait=False)   # the one task runs on; no thread is left after it
    if sandboxed:
        from perflab.course.selftest import course_references, self_test

        t0 = time.monotonic()
        self_test(course_references(reference_dir, _SOLUTIONS),
                  hide=(*hide, *hideable(_SOLUTIONS)), mode=sandbox)
        say(f"sandbox self-test passed ({time.monotonic() - t0:.0f} s): no reference "
            "solution, hidden test, solution marker or git object store is readable inside")
    headers = builder.result() if builder is not None else None
    if builder is not None:
        say("Inductor's precompiled header: " + (
            "built once, lent to every sandbox" if headers else
            "could not be built here; each sandbox compiles its own"))
    return headers


@dataclasses.dataclass
class _Batch:
    """The judging, recording and merging stages of :func:`grade_submissions`: each
    (student, lab) graded in a sandbox slot of its own (``jobs`` at once), each student
    recorded (``on_student``) as soon as all their labs are in, in the calling thread,
    so the rows are the same whatever ``jobs`` is and no exception vanishes in a
    worker's callback."""

    folders: dict[str, StudentFolder]
    found: dict[str, dict]
    problem: dict[str, str]
    refs: dict[str, Path]
    ref_nbs: dict[str, nbformat.NotebookNode]
    wanted: list[str]
    order: list[str]
    on_student: Callable[[str, list[LabGrade]], None] | None
    say: Callable[[str], None]
    jobs: int
    run_kwargs: dict
    headers: Path | None
    compiling: set[str]
    results: dict[tuple[str, str], LabGrade] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = {s: len(self.wanted) for s in self.order}
        self.lock = threading.Lock()
        self.free_slots = list(range(self.jobs))

    def grade(self, student: str, lab: str, graded: dict[str, float]) -> LabGrade:
        """One submission in a free sandbox slot (or its error row: no notebook, two)."""
        if student in self.problem:
            return error_grade(student, lab, None, graded, self.problem[student])
        nbs = self.found[student].get(lab, [])
        if len(nbs) != 1:
            return error_grade(student, lab, None, graded,
                               f"no {lab}_*.ipynb submitted" if not nbs else
                               f"{len(nbs)} notebooks for lab {lab} ("
                               + ", ".join(map(_file_name, nbs))
                               + "); submit exactly one")
        with self.lock:
            slot = self.free_slots.pop()
        try:
            return grade_notebook(
                nbs[0], self.refs[lab], student=student, slot=slot,
                reference=self.ref_nbs[lab],
                inductor_headers=self.headers if lab in self.compiling else None,
                **self.run_kwargs)
        finally:
            with self.lock:
                self.free_slots.append(slot)

    def one(self, student: str, lab: str) -> LabGrade:
        """:meth:`grade`, with any failure of the grader itself turned into that
        submission's error row, and the look-alike-name flag added."""
        graded = autograded(self.ref_nbs[lab])
        try:
            g = self.grade(student, lab, graded)
        except SandboxUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - one hostile notebook never stops the batch
            g = error_grade(student, lab, (self.found[student].get(lab) or [None])[0],
                            graded, f"grading failed: {type(e).__name__}: {str(e)[:300]}")
        twins = self.folders[student].twins
        if twins:
            g.flags.append(Flag(NAME_FLAG, 0, f"looks like {', '.join(map(_escaped, twins))} "
                                "(the same after Unicode normalization, case folding and "
                                "look-alike letters): check that they are different students",
                                text=_escaped(student)))
        return g

    def record(self, student: str) -> None:
        """on_student, in this thread; a failure makes the student's rows error rows."""
        grades = [self.results[(student, lab)] for lab in self.wanted]
        if self.on_student is None:
            return
        try:
            self.on_student(student, grades)
            return
        except Exception as e:  # noqa: BLE001 - a full disk, a bad name: this student only
            why = (f"recording the grade failed ({type(e).__name__}: {str(e)[:200]}), so "
                   "no points are kept; fix the cause and grade this student again "
                   "(delete their row before --resume)")
        grades = [dataclasses.replace(
            error_grade(student, g.lab, None, {c.grade_id: c.max_points for c in g.checks},
                        why), flags=list(g.flags)) for g in grades]
        for g in grades:
            self.results[(student, g.lab)] = g
        self.say(f"{student:<20} {why}")
        try:
            self.on_student(student, grades)
        except Exception as e:  # noqa: BLE001 - the returned grades still say it
            self.say(f"{student:<20} could not record the error row either "
                     f"({type(e).__name__}: {str(e)[:200]})")

    def done(self, g: LabGrade) -> None:
        """Merge one grade; record its student once all their labs are in."""
        self.results[(g.student, g.lab)] = g
        self.pending[g.student] -= 1
        self.say(f"{g.student:<20} lab {g.lab}: {g.points:g}/{g.max_points:g} points"
                 + (f" ({g.wall_s:.0f} s)" if g.wall_s else "")
                 + (f"  [{g.error}]" if g.error else "")
                 + (f"  [flagged: {'; '.join(map(flag_text, g.flags))}]" if g.flags else "")
                 + (f"  [{g.warning}]" if g.warning else ""))
        if self.pending[g.student] == 0:
            self.record(g.student)

    def run(self) -> list[LabGrade]:
        """Every (student, lab) of the batch, students in id order."""
        tasks = [(s, lab) for s in self.order for lab in self.wanted]
        if self.jobs == 1:
            for s, lab in tasks:
                self.done(self.one(s, lab))
        else:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                futures = [pool.submit(self.one, s, lab) for s, lab in tasks]
                try:
                    for fut in as_completed(futures):
                        self.done(fut.result())
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
        return [self.results[(s, lab)] for s in self.order for lab in self.wanted]


def grade_submissions(submissions_dir: str | Path, reference_dir: str | Path, *,
                      limits: Limits = Limits(), sanitize: str | Path | None = None,
                      labs: list[str] | None = None,
                      progress: Callable[[str], None] | None = None, jobs: int = 1,
                      sandbox: Literal["auto", "bwrap", "none"] = "auto",
                      skip: set[str] | frozenset[str] = frozenset(),
                      on_student: Callable[[str, list[LabGrade]], None] | None = None,
                      hide: tuple[Path, ...] = (),
                      seed: int | None = None,
                      shard: tuple[int, int] | None = None,
                      notebook_run: NotebookRun | bool = "on-failure") -> list[LabGrade]:
    """Grade ``SUBMISSIONS/<student>/NN_*.ipynb`` against ``REFERENCE/NN_*.ipynb``.

    Args:
        limits: per-notebook limits (validated when constructed).
        sanitize: ignored (kept for old callers).
        labs: lab numbers to grade (``["01"]``); None: every lab someone submitted (in
            the whole folder, also when grading one shard).
        progress: called with one line per graded notebook (e.g. ``print``).
        jobs: sandboxes run in parallel (>= 1); the rows do not depend on it.
        sandbox: see :func:`grade_notebook`.
        skip: student ids not to grade (``--resume``: already in scores.csv).
        on_student: called with (student id, their grades) as soon as all their labs are
            graded (in completion order, always from the calling thread): how scores.csv
            and the feedback are written row by row. If it raises, the student's grades
            become error rows saying why, and it is called once more with those.
        hide: more host folders to hide in the sandbox (the output folders).
        seed: the seed the hidden cases are drawn from (with each student's id and
            check); None: a fresh random one, printed through ``progress`` so a re-grade
            can draw the same cases.
        shard: ``(K, N)``: grade only the K-th of N slices of the students
            (:func:`shard_slice`); None: all of them.
        notebook_run: when each notebook also runs under nbval for the instructor's log
            (:func:`grade_notebook`'s ``notebook_run``); no point comes from it.

    Returns:
        One LabGrade per student and lab, students in id order; a lab a student did
        not submit (or submitted twice) is an error row with no points; a refused
        entry of the submissions folder (:func:`student_folders`: a refused name, a
        file at the top, a dot-folder, a named pipe), a submission that breaks the
        grader itself, a run stopped at a cap (memory, output) or a failure while
        recording the student is an error row naming the reason.

    Raises:
        FileNotFoundError: no submissions folder, no student folders, or no references.
        ValueError: a requested lab has no reference notebook, ``jobs`` < 1, ``shard``
            is not ``(K, N)`` with ``0 <= K < N``, or a reference notebook is malformed.
        SandboxUnavailable: ``sandbox="bwrap"`` and bubblewrap does not work here (the
            only error a submission's contents cannot cause).
        SandboxLeak: the sandbox self-test (:func:`perflab.course.selftest.self_test`,
            run before any student whenever a sandbox is used) found an answer readable
            inside; nobody was graded.
    """
    notebook_run = notebook_run_mode(notebook_run)   # a bad value fails before any work
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if shard is not None:
        shard_slice([], shard)  # validates it
    say = _Say(progress)
    subs, refs = Path(submissions_dir), reference_notebooks(Path(reference_dir))
    # 1. names checked: every entry of the folder gets an id (and an error if refused)
    folders = {f.id: f for f in student_folders(subs)}
    found, problem = _find_notebooks(folders, say)
    wanted = labs or sorted(k for k in submitted_labs(list(folders.values())) if k in refs)
    missing = [k for k in wanted if k not in refs]
    if missing:
        raise ValueError(f"no reference notebook for lab(s) {missing} in {reference_dir}; "
                         f"labs there: {sorted(refs)}")
    sandboxed = _check_sandbox(sandbox, limits, say)
    if seed is None:
        seed = secrets.randbits(48)
    say(f"hidden cases drawn with seed {seed} (--seed {seed} draws them again)")
    # 2. assembled: every reference read once, before any student code runs
    ref_nbs = {lab: nbformat.read(str(refs[lab]), as_version=4) for lab in wanted}
    for lab, nb in ref_nbs.items():
        assemble(nb, {})  # a malformed reference check fails here, before any work
    hide = tuple(hideable(Path(reference_dir), subs, *hide))
    compiling = {lab for lab, nb in ref_nbs.items() if uses_compile(nb)}
    # 3. sandboxed: the self-test before any student, Inductor's header built beside it
    headers = _prepare_sandboxes(Path(reference_dir), hide, sandbox, sandboxed, compiling,
                                 say)
    # 4. sharded: this machine's slice of the class, less the students already graded
    mine = set(shard_slice(list(folders), shard)) if shard else set(folders)
    order = [sid for sid in folders if sid in mine and sid not in skip]
    if shard:
        say(f"shard {shard[0]}/{shard[1]}: {len(mine)} of {len(folders)} students")
    # 5. judged, 6. recorded, 7. merged (_Batch)
    batch = _Batch(
        folders=folders, found=found, problem=problem, refs=refs, ref_nbs=ref_nbs,
        wanted=wanted, order=order, on_student=on_student, say=say, jobs=jobs,
        run_kwargs=dict(limits=limits, sandbox=sandbox, hide=hide,
                        threads=max(1, (os.cpu_count() or 1) // jobs), seed=seed,
                        inside=subs, notebook_run=notebook_run),
        headers=headers, compiling=compiling)
    return batch.run()
