"""Write the grading results: ``scores.csv``, students' feedback, instructor-only files.

``scores.csv`` has one row per student and one column per autograded check, named
``NN:grade_id`` (lab number, then nbgrader's grade_id, so labs never collide), then
``total``, ``max_total``, ``review`` (for the instructor to look at, never a deduction:
answer lines that reach into the machinery, facts records that were missing, duplicated or
malformed, folder names that look alike) and ``error`` (why a lab could not be run, or was
refused). :class:`ScoreTable` rewrites it atomically after every student, so a batch
stopped at any moment leaves a valid table of everyone graded so far, and ``--resume``
continues from it.

Every CSV the course writes (:func:`write_csv`) quotes every cell and escapes each *text*
cell that a spreadsheet would run as a formula (OWASP's CSV-injection rule,
:func:`escape_csv_text`); the number cells are the grader's own (``-1`` stays a number).
Beside ``scores.csv`` a manifest (:func:`manifest_path`) records the seed, the shard and the
students; :func:`merge_scores` joins the tables of several shards into the one a single
machine would have written.

Feedback never leaks: ``feedback/<student>.md`` lists each check, its points and the
check's own message, shortened (student-provided values included), and for a hidden
test only that one failed. The instructor folder gets everything else: nbval's log,
the full messages (hidden tests and reference values), flags with their source lines,
and ``answers/<lab>.md`` with every student's written answers. Their file names come
from the student's id (:func:`student_file_stem`), never from the raw folder name.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import tempfile
import unicodedata
from pathlib import Path
from typing import Sequence

from perflab.course.grading import NAME_FLAG, LabGrade, flag_text, shard_slice

__all__ = ["ScoreTable", "write_scores_csv", "write_feedback", "write_answers",
           "student_message", "student_file_stem", "escape_csv_text",
           "unescape_csv_text", "write_csv", "read_csv", "manifest_path",
           "write_manifest", "read_manifest", "merge_scores", "MANIFEST_VERSION"]

#: Longest message (characters) a student's feedback shows for one check.
MAX_STUDENT_MESSAGE = 300
#: Version of the manifest beside scores.csv (``"version"``); merge refuses others.
MANIFEST_VERSION = 1

#: First characters that make a spreadsheet read a cell as a formula (OWASP: ``=``,
#: ``+``, ``-``, ``@``, tab, carriage return), and the quote that escapes them.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_STEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short temp name whatever the file's name (a long one would pass NAME_MAX); text
    # that is not UTF-8 (a surrogate-escaped file name in a message) is written escaped.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def escape_csv_text(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that starts with ``=``, ``+``, ``-``,
    ``@``, a tab or a carriage return gets a leading ``'`` (OWASP's CSV-injection rule),
    and so does one that starts with ``'`` already, so :func:`unescape_csv_text` undoes
    it exactly."""
    return "'" + text if text.startswith(_FORMULA_START + ("'",)) else text


def unescape_csv_text(text: str) -> str:
    """The text :func:`escape_csv_text` escaped."""
    return text[1:] if text.startswith("'") and text[1:].startswith(
        _FORMULA_START + ("'",)) else text


def write_csv(path: str | Path, header: Sequence[str], rows: Sequence[Sequence[str]], *,
              text_columns: Sequence[str]) -> Path:
    """Write a CSV atomically: every cell quoted (no separator in a cell can start a new
    one, whatever separator a spreadsheet assumes), the ``text_columns`` and the header
    escaped with :func:`escape_csv_text`; the other cells must be the grader's own
    numbers and are written as they are.

    Raises:
        ValueError: a name in ``text_columns`` is not in ``header``, a row has another
            length than the header, or a cell of another column is not a number (text
            there would be written unescaped).
    """
    missing = [c for c in text_columns if c not in header]
    if missing:
        raise ValueError(f"text_columns {missing} are not columns of the table {list(header)}")
    text = {i for i, c in enumerate(header) if c in text_columns}
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow([escape_csv_text(h) for h in header])
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row has {len(row)} cells, the header {len(header)}: {row!r}")
        for i, v in enumerate(row):
            if i not in text and v != "" and not _is_number(v):
                raise ValueError(f"column {header[i]!r} holds {v[:40]!r}, not a number; "
                                 "list the column in text_columns to write text there")
        w.writerow([escape_csv_text(v) if i in text else v for i, v in enumerate(row)])
    _atomic_write(Path(path), buf.getvalue())
    return Path(path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text == text.strip()


def read_csv(path: str | Path, *, text_columns: Sequence[str]) -> tuple[list[str],
                                                                        list[list[str]]]:
    """(header, rows) of a CSV written by :func:`write_csv`, escapes undone."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [unescape_csv_text(h) for h in next(reader, [])]
        text = {i for i, c in enumerate(header) if c in text_columns}
        rows = [[unescape_csv_text(v) if i in text else v for i, v in enumerate(row)]
                for row in reader if row]
    return header, rows


#: The columns of scores.csv that hold text (the others are the grader's numbers).
_TEXT_COLUMNS = ("student", "review", "error")


def _row(student: str, labs: Sequence[LabGrade], columns: list[str]) -> list[str]:
    pts = {f"{g.lab}:{c.grade_id}": c.points for g in labs for c in g.checks}
    names = list(dict.fromkeys(flag_text(f) for g in labs for f in g.flags
                               if f.grade_id == NAME_FLAG))  # once, not once per lab
    return [student, *(f"{pts.get(col, 0):g}" for col in columns),
            f"{sum(g.points for g in labs):g}", f"{sum(g.max_points for g in labs):g}",
            "; ".join(names + [f"lab {g.lab}: {flag_text(f)}" for g in labs for f in g.flags
                               if f.grade_id != NAME_FLAG]),
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
        """``student id -> row``, unescaped (escaped only when written)."""
        self.resumed: set[str] = set()
        if resume and self.path.exists():
            header, rows = read_csv(self.path, text_columns=_TEXT_COLUMNS)
            if header != self.header:
                raise ValueError(f"--resume: {self.path} was written for other labs or "
                                 f"checks ({header}); use another --out or drop --resume")
            self.rows = {row[0]: row for row in rows}
            self.resumed = set(self.rows)

    @classmethod
    def from_header(cls, path: str | Path, header: Sequence[str]) -> "ScoreTable":
        """An empty table with a header read from another table (``student``, the
        check columns, ``total``, ``max_total``, ``review``, ``error``).

        Raises:
            ValueError: the header is not a score table's.
        """
        header = list(header)
        if header[:1] != ["student"] or header[-4:] != ["total", "max_total", "review",
                                                        "error"]:
            raise ValueError(f"not a score table's header: {header}")
        table = cls(path, {})
        table.columns, table.header = header[1:-4], header
        return table

    def students(self) -> set[str]:
        """The students with a row."""
        return set(self.rows)

    def add(self, student: str, labs: Sequence[LabGrade]) -> None:
        """Add (or replace) a student's row and rewrite the file atomically."""
        self.rows[student] = _row(student, labs, self.columns)
        self.flush()

    def flush(self) -> None:
        """Rewrite the file atomically with the rows so far (sorted by student)."""
        write_csv(self.path, self.header, [self.rows[name] for name in sorted(self.rows)],
                  text_columns=_TEXT_COLUMNS)


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


def student_file_stem(student: str) -> str:
    """The file-name stem of a student's files under ``feedback/`` and ``instructor/``.

    The id itself when it is plain ASCII (letters, digits, ``_ . -``; not starting with
    ``.`` or ``-``; at most 64 characters): ``ada`` -> ``ada``. Any other id gives an ASCII
    rendering of its first 32 characters, ``~`` and 12 hex digits of its sha256
    (``José Ruiz`` -> ``Jose_Ruiz~<hash>``): short, safe on every file system, and two
    ids never share a stem (a plain stem holds no ``~``).
    """
    if _PLAIN_STEM.fullmatch(student):
        return student
    ascii_ = unicodedata.normalize("NFKD", student[:32]).encode("ascii", "ignore").decode()
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", ascii_).lstrip(".-")
    digest = hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{readable or 'student'}~{digest}"


# -- the manifest beside scores.csv, and merging shards ---------------------------------

def manifest_path(scores: str | Path) -> Path:
    """The manifest beside a score table: ``scores.csv`` -> ``scores.manifest.json``."""
    return Path(scores).with_suffix(".manifest.json")


def write_manifest(scores: str | Path, *, seed: int, shard: tuple[int, int],
                   header: Sequence[str], class_ids: Sequence[str],
                   students: Sequence[str], complete: bool,
                   merged_from: Sequence[str] = ()) -> Path:
    """Write the manifest of a grading run's score table: the seed of the hidden cases,
    the shard ``(K, N)``, the table's columns, the ids of the whole class and of the
    students this run grades, and whether it finished (``complete``).
    :func:`merge_scores` reads it.

    Returns:
        The manifest's path (:func:`manifest_path`).
    """
    path = manifest_path(scores)
    doc = {"version": MANIFEST_VERSION, "scores": Path(scores).name, "seed": seed,
           "shard": list(shard), "complete": complete, "columns": list(header),
           "class": sorted(class_ids), "students": sorted(students)}
    if merged_from:
        doc["merged_from"] = list(merged_from)
    _atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


_FIELDS = {"version": int, "scores": str, "seed": int, "shard": list, "complete": bool,
           "columns": list, "class": list, "students": list}
_KINDS = {int: "an integer", str: "a string", list: "a list", bool: "true or false"}


def read_manifest(path: str | Path) -> dict:
    """A manifest written by :func:`write_manifest`, its fields checked.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: it is not JSON, a field is missing or of the wrong type, or it is of
            another :data:`MANIFEST_VERSION`.
    """
    manifest = Path(path)
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{manifest} is not valid JSON ({e}); grade that shard again") \
            from None
    for field, kind in _FIELDS.items():
        if not isinstance(doc, dict) or not isinstance(doc.get(field), kind) or (
                kind is int and isinstance(doc.get(field), bool)):
            raise ValueError(f"{manifest}: field {field!r} is missing or not "
                             f"{_KINDS[kind]}; it was not written by `perflab course "
                             "grade` or was edited: grade that shard again")
    if doc["version"] != MANIFEST_VERSION:
        raise ValueError(f"{manifest}: field 'version' is {doc['version']}, this perflab "
                         f"reads version {MANIFEST_VERSION}; grade every shard with the "
                         "same perflab")
    return doc


def _shard_output(source: Path) -> tuple[Path, dict, Path]:
    """(manifest path, manifest, score table path) of one shard's output."""
    if source.is_dir():
        found = sorted(source.glob("*.manifest.json"))
        if len(found) != 1:
            raise ValueError(
                f"{source}: {'no' if not found else len(found)} *.manifest.json in the "
                f"folder{': ' + ', '.join(p.name for p in found) if found else ''}; pass "
                "the shard's scores.csv itself (its manifest, NAME.manifest.json, is written "
                "beside it by `perflab course grade`)")
        manifest = found[0]
    elif source.name.endswith(".manifest.json"):
        manifest = source
    else:
        manifest = manifest_path(source)
    if not manifest.exists():
        raise FileNotFoundError(f"{source}: no manifest {manifest} (written beside the "
                                "score table by `perflab course grade`); grade that shard "
                                "again with this version of perflab")
    doc = read_manifest(manifest)
    return manifest, doc, manifest.parent / Path(doc["scores"]).name


def merge_scores(sources: Sequence[str | Path], out: str | Path) -> Path:
    """Join the score tables of the shards of one class into ``out`` (and its manifest):
    the table one machine would have written with the same seed.

    Args:
        sources: each shard's output: its score table, its manifest or the folder that
            holds them (with exactly one manifest).
        out: the merged score table; its manifest is written beside it.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: a source or its manifest does not exist.
        ValueError: no source; a manifest is malformed or from another version; the
            shards differ in seed, number of slices, columns or class; a slice is given
            twice or is missing; a shard did not finish; a table's rows or header differ
            from its manifest; a student is in two tables. Each message names the manifest
            field and the fix.
    """
    if not sources:
        raise ValueError("merge needs the outputs of the shards (OUT1 OUT2 ...)")
    shards = []
    for source in map(Path, sources):
        if not source.exists():
            raise FileNotFoundError(f"no shard output {source}")
        shards.append((source, *_shard_output(source)))
    first_src, _, first, _ = shards[0]
    n = first["shard"][1] if len(first["shard"]) == 2 else None
    by_slice: dict[int, Path] = {}
    owner: dict[str, Path] = {}
    rows: dict[str, list[str]] = {}
    for source, manifest, doc, table in shards:
        if len(doc["shard"]) != 2 or not all(isinstance(v, int) for v in doc["shard"]) \
                or not 0 <= doc["shard"][0] < doc["shard"][1]:
            raise ValueError(f"{manifest}: field 'shard' is {doc['shard']}, not [K, N] with "
                             "0 <= K < N; grade that shard again")
        k, nk = doc["shard"]
        if doc["seed"] != first["seed"]:
            raise ValueError(f"field 'seed': {source} was graded with seed {doc['seed']}, "
                             f"{first_src} with {first['seed']}; the hidden cases must be "
                             "the same for the whole class: grade every shard with the same "
                             "--seed")
        if nk != n:
            raise ValueError(f"field 'shard': {source} is slice {k}/{nk}, {first_src} is "
                             f"slice {first['shard'][0]}/{n}; cut the class the same way on "
                             "every machine (the same N in --shard K/N)")
        if doc["columns"] != first["columns"]:
            only = sorted(set(doc["columns"]) ^ set(first["columns"]))
            raise ValueError(f"field 'columns': {source} and {first_src} have different "
                             f"columns (differing: {only[:6] or 'their order'}); grade every "
                             "shard with the same --labs and --reference")
        if doc["class"] != first["class"]:
            diff = sorted(set(doc["class"]) ^ set(first["class"]))
            raise ValueError(f"field 'class': {source} saw {len(doc['class'])} student "
                             f"folders, {first_src} saw {len(first['class'])} (differing: "
                             f"{', '.join(map(ascii, diff[:3])) or 'their order'}); give "
                             "every machine the same submissions folder and grade again")
        if k in by_slice:
            raise ValueError(f"field 'shard': {by_slice[k]} and {source} are both slice "
                             f"{k}/{n}; pass each slice's output once")
        by_slice[k] = source
        if doc["students"] != shard_slice(doc["class"], (k, nk)):
            raise ValueError(f"field 'students': {manifest} does not list slice {k}/{nk} of "
                             "its class; it was edited or written by another perflab: grade "
                             "that shard again")
        if not doc["complete"]:
            raise ValueError(f"field 'complete': shard {k}/{nk} ({source}) did not finish; "
                             "run its `perflab course grade ... --shard "
                             f"{k}/{nk}` again with --resume, then merge")
        header, table_rows = read_csv(table, text_columns=_TEXT_COLUMNS)
        if header != doc["columns"]:
            raise ValueError(f"field 'columns': {table} has other columns than its manifest "
                             f"{manifest}; grade that shard again into a fresh --out")
        ids = [r[0] for r in table_rows]
        expected = set(doc["students"])
        extra = sorted(set(ids) - expected)
        if extra:
            raise ValueError(f"field 'students': {table} has rows for students outside "
                             f"slice {k}/{nk} ({', '.join(map(ascii, extra[:3]))}); grade "
                             "that shard again into a fresh --out (not --resume on another "
                             "run's table)")
        lacking = sorted(expected - set(ids))
        if lacking:
            raise ValueError(f"field 'students': {table} has no row for {len(lacking)} of "
                             f"the {len(expected)} students of slice {k}/{nk} (e.g. "
                             f"{ascii(lacking[0])}); run that shard again with --resume")
        for row in table_rows:
            if row[0] in owner:
                raise ValueError(f"field 'students': {ascii(row[0])} is in {owner[row[0]]} "
                                 f"and {source}; pass each slice's output once")
            owner[row[0]] = source
            rows[row[0]] = row
    lost = sorted(set(range(n)) - set(by_slice))
    if lost:
        raise ValueError(f"field 'shard': slice(s) {', '.join(f'{k}/{n}' for k in lost)} "
                         f"missing; grade them (--shard K/{n} --seed {first['seed']}) and "
                         "pass their outputs too")
    out = Path(out)
    table = ScoreTable.from_header(out, first["columns"])
    table.rows = rows
    table.flush()
    write_manifest(out, seed=first["seed"], shard=(0, 1), header=first["columns"],
                   class_ids=first["class"], students=sorted(rows), complete=True,
                   merged_from=[str(s) for s, *_ in shards])
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
        out += ["## Review (not deducted)", ""] + [f"- `{flag_text(f)}`: `{f.text}`"
                                                    for f in g.flags] + [""]
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
    """``<folder>/<stem>.md`` per student (safe to hand out), and in ``instructor``
    (default: ``instructor`` beside ``folder``) ``<stem>-NN.md`` (full messages,
    flags) and ``<stem>-NN.log`` (nbval's output) per lab; ``<stem>`` is
    :func:`student_file_stem` of the student's id.

    Returns:
        The students' feedback files written.
    """
    folder = Path(folder)
    instructor = Path(instructor) if instructor else folder.parent / "instructor"
    folder.mkdir(parents=True, exist_ok=True)
    instructor.mkdir(parents=True, exist_ok=True)
    written = []
    for student, labs in _by_student(grades).items():
        stem = student_file_stem(student)
        path = folder / f"{stem}.md"
        _atomic_write(path, _feedback(student, labs))
        written.append(path)
        for g in labs:
            _atomic_write(instructor / f"{stem}-{g.lab}.md", _instructor(student, g))
            if g.log:
                _atomic_write(instructor / f"{stem}-{g.lab}.log", g.log)
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
