"""The sandbox self-test: before any student is graded, prove that the graded kernel
cannot read an answer.

:func:`self_test` runs a probe inside the sandbox exactly as a submission runs (the same
allow-list of folders, the same hidden paths, the same unprivileged uid). The probe walks
every readable path (everything but ``/proc``, ``/sys`` and ``/dev``, which hold no
files of the host) and reports:

* **reference solution cells**: a file holding lines of the reference notebooks' solution
  cells (code answers, written answers and their rubrics) or hidden-test regions. The
  lines looked for (:func:`leak_patterns`) are those a student cannot see anyway (not in
  any visible part of the references, not in the perflab package that is bound on
  purpose), at least :data:`MIN_LINE` characters long; a cell counts as present when
  ``min(3, its number of lines)`` of its lines are in one file (a single common line
  also found in, say, torch's own sources is not a leak);
* **solution and hidden-test markers**: a line that is only ``### BEGIN SOLUTION`` (or
  ``### END SOLUTION``, ``### BEGIN HIDDEN TESTS``, ``### END HIDDEN TESTS``), in a
  source file or as a notebook's JSON string; perflab's own course tooling, which
  documents the format, is recognised by the SHA-256 of each shipped file and allowed;
* **git object stores**: a ``.git`` entry, a folder holding ``HEAD`` beside
  ``objects/``, or an ``objects/`` folder with ``pack/`` and ``info/`` or loose-object
  folders (``objects/ab/<38 hex>``): a repository's history holds every answer ever
  committed.

The content search is GNU grep (``grep -rIlF -f``: fixed strings, Aho-Corasick over every
text file at disk speed; a Python loop over the 4 GB a venv with torch holds took
minutes), run inside the sandbox; the candidate files it names are then read by the
probe itself. Measured here (2 cores, a venv with torch and JupyterLab): about 7 s with a
warm page cache, 80 s cold. The result is kept per process for the same sandbox
configuration and the same references, so a test session pays for it once.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Literal, Sequence

from perflab.course.sandbox import (SANDBOX_WORK, SandboxLimits, SandboxUnavailable,
                                    run_sandboxed, visible_hides)

__all__ = ["SandboxLeak", "Leak", "LeakPatterns", "leak_patterns", "course_references",
           "self_test", "MIN_LINE"]

#: Shortest line (characters, stripped) of a reference answer looked for.
MIN_LINE = 24
#: Lines of one cell that must be found in one file for the cell to count as present.
CELL_QUORUM = 3
#: Lines looked for per cell (its longest): enough for the quorum, few enough that grep
#: stays fast (its time grows with the number of patterns).
LINES_PER_CELL = 8
#: The files whose contents are searched: where a course's answers live (notebooks,
#: their exports, Python, text and data formats). Binaries (``.so``, ``.pyc``, images,
#: wheels) are not read: a misplaced checkout shows in its notebooks and ``.git``.
SUFFIXES = (".ipynb", ".py", ".md", ".txt", ".json", ".rst", ".html", ".cfg", ".toml",
            ".yaml", ".yml", ".csv", ".sh", ".tex", ".bak", ".orig")
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS",
            "### END HIDDEN TESTS")
_BEGIN_SOLUTION, _END_SOLUTION = _MARKERS[0], _MARKERS[1]
_BEGIN_HIDDEN, _END_HIDDEN = _MARKERS[2], _MARKERS[3]


class SandboxLeak(SandboxUnavailable):
    """The sandbox self-test found an answer the graded kernel could read: the batch
    stops before any student is graded."""


@dataclasses.dataclass(frozen=True)
class Leak:
    """One readable file (or folder) that should not be readable in the sandbox."""

    path: str
    """The path as seen inside the sandbox (bound folders keep their host paths)."""
    reason: str
    """What was found: ``"reference solution cell lab:grade_id"``, ``"solution
    marker"``, ``"git object store"``."""


@dataclasses.dataclass(frozen=True)
class LeakPatterns:
    """What the probe looks for, built on the grader's side from the references."""

    cells: dict[str, list[str]]
    """``"NN:cell"`` -> the cell's distinctive lines (stripped)."""
    allowed_sha256: frozenset[str]
    """SHA-256 of the shipped perflab files that may mention the markers (the course
    tooling that documents the format)."""

    def digest(self) -> str:
        """A hash of the patterns: the self-test's cache key."""
        return hashlib.sha256(json.dumps([sorted(self.cells.items()),
                                          sorted(self.allowed_sha256)]).encode()).hexdigest()


def _regions(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """(lines inside ``begin``/``end`` regions, lines outside them)."""
    inside, outside, on = [], [], False
    for line in source.split("\n"):
        s = line.strip()
        if s.startswith(begin):
            on = True
        elif s.startswith(end):
            on = False
        elif s:
            (inside if on else outside).append(s)
    return inside, outside


def _package_files() -> list[Path]:
    import perflab

    root = Path(perflab.__file__).resolve().parent
    return [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def leak_patterns(references: dict[str, object]) -> LeakPatterns:
    """The lines of the reference notebooks that must be unreadable in the sandbox.

    Args:
        references: ``lab -> notebook`` (nbformat nodes, as the grader reads them).

    Returns:
        Per solution cell (code, or a written answer with its rubric) and per check
        cell's hidden-test region, its lines of at least :data:`MIN_LINE` characters
        that are neither in a visible part of any reference (what ``labs/`` shows) nor
        in a text file of the perflab package (bound into the sandbox on purpose; the
        probe's grep skips binary files); and the
        hashes of the perflab files that mention the markers.
    """
    secret: dict[str, list[str]] = {}
    visible: set[str] = set()
    for lab, nb in references.items():
        for k, cell in enumerate(nb.cells):
            src = cell.source if isinstance(cell.source, str) else "".join(cell.source)
            meta = cell.get("metadata", {}).get("nbgrader", {})
            key = f"{lab}:{meta.get('grade_id') or f'cell{k + 1}'}"
            if meta.get("solution"):
                inside, outside = _regions(src, _BEGIN_SOLUTION, _END_SOLUTION)
                if not inside and cell.cell_type != "code" or _BEGIN_SOLUTION not in src:
                    inside, outside = [ln.strip() for ln in src.split("\n") if ln.strip()], []
            else:
                inside, outside = _regions(src, _BEGIN_HIDDEN, _END_HIDDEN)
            visible.update(outside)
            if inside:
                secret.setdefault(key, []).extend(inside)
    texts, allowed = [], set()
    for p in _package_files():
        data = p.read_bytes()
        text = data.decode("utf-8", errors="replace")
        if any(m in text for m in _MARKERS):
            allowed.add(hashlib.sha256(data).hexdigest())
        # A binary file (a NUL byte: the gzipped GPU recordings) is skipped by the
        # probe's grep (-I), so no line can match there: searching its decoded bytes only
        # cost time (3.6 of 4 s here, on every batch) and never changed the patterns.
        if b"\0" not in data:
            texts.append(text)
    library = "\n".join(texts)
    shown = "\n".join(visible)
    in_cells: dict[str, int] = {}
    for lines in secret.values():
        for ln in set(lines):
            in_cells[ln] = in_cells.get(ln, 0) + 1
    cells = {}
    for key, lines in secret.items():
        # a line also in a visible part or in the bound library (as a substring: grep
        # matches substrings) is no secret; one in 3+ cells is the graded parts'
        # boilerplate (``run_cases(hidden_cases, ...)``), no sign of one cell
        keep = sorted({ln for ln in lines if len(ln) >= MIN_LINE and in_cells[ln] <= 2
                       and ln not in shown and ln not in library})
        if keep:  # the longest lines are the most telling; a few per cell suffice
            cells[key] = sorted(sorted(keep, key=lambda ln: (-len(ln), ln))[:LINES_PER_CELL])
    return LeakPatterns(cells, frozenset(allowed))


def course_references(*folders: Path) -> dict[str, object]:
    """Every reference notebook ``NN_*.ipynb`` of ``folders`` (the batch's reference
    folder and the course's own ``solutions/``), each distinct file once: what the
    self-test looks for. Any lab's answer readable in the sandbox is a leak, not only the
    batch's labs; and every batch of one process with the same course shares one probe.

    Returns:
        ``lab -> notebook`` (a second, different notebook of one lab as ``"NNb"``, ...).

    Raises:
        nbformat.reader.NotJSONError: a reference notebook is not JSON (instructor error).
    """
    import nbformat

    out: dict[str, object] = {}
    seen: set[str] = set()
    for folder in folders:
        if not Path(folder).is_dir():
            continue
        for path in sorted(Path(folder).glob("[0-9][0-9]_*.ipynb")):
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            key = path.name[:2]
            while key in out:
                key += "b"
            out[key] = nbformat.reads(data.decode("utf-8"), as_version=4)
    return out


#: Runs inside the sandbox: argv[1] = the patterns file (JSON). Prints one RESULT line.
_PROBE = r'''
import hashlib, json, os, re, subprocess, sys
spec = json.load(open(sys.argv[1]))
work = sys.argv[2]
roots = spec["roots"] or sorted("/" + e for e in os.listdir("/")
                               if e not in ("proc", "sys", "dev") and not os.path.islink("/" + e))
found = {}
def add(path, reason):
    found.setdefault(path, [])
    if reason not in found[path]:
        found[path].append(reason)
# 1. content: grep names every text file holding any pattern (fixed strings)
pats = os.path.join(work, "patterns.txt")
needles = {}  # the text searched for (as written, and as a JSON string) -> its lines
for key, lines in spec["cells"].items():
    for ln in lines:
        for form in {ln, json.dumps(ln)[1:-1]}:
            needles.setdefault(form, set()).add((key, ln))
with open(pats, "w") as f:
    f.write("\n".join(list(needles) + spec["markers"]) + "\n")
include = ["--include=*" + ext for ext in spec["suffixes"]]
# -o -H: each match as "path:matched text", so only the files that hold a marker are read
p = subprocess.run(["grep", "-rIoHF", "--no-messages", *include, "-f", pats, "--", *roots],
                   capture_output=True)
hits = {}  # path -> {cell: its distinct lines found there}
marked = set()
for row in p.stdout.decode("utf-8", "surrogateescape").splitlines():
    path, sep, text = row.partition(":")
    while sep and text not in needles and text not in spec["markers"] and ":" in text:
        head, sep, text = text.partition(":")  # a ':' in the path itself
        path = path + ":" + head
    if not sep or path.startswith(work + "/"):
        continue
    if text in spec["markers"]:
        marked.add(path)
    for key, ln in needles.get(text, ()):
        hits.setdefault(path, {}).setdefault(key, set()).add(ln)
marker_line = re.compile(r'^[ \t]*(?:"[ \t]*)?(' + "|".join(map(re.escape, spec["markers"]))
                         + r')[ \t]*(?:\\n)?(?:",?)?[ \t]*$', re.M)
for c in sorted(marked):
    try:
        data = open(c, "rb").read()
    except OSError:
        continue
    text = data.decode("utf-8", "replace")
    if marker_line.search(text) and hashlib.sha256(data).hexdigest() not in spec["allowed"]:
        add(c, "solution or hidden-test marker")
for c, cells in sorted(hits.items()):
    for key, got in sorted(cells.items()):
        if len(got) >= min(spec["quorum"], len(spec["cells"][key])):
            add(c, "reference solution cell " + key)
# 2. names: git object stores
hexdir = re.compile(r"^[0-9a-f]{2}$")
for root in roots:
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == work or dirpath.startswith(work + "/"):
            dirnames[:] = []
            continue
        names = set(dirnames) | set(filenames)
        if ".git" in names:
            add(os.path.join(dirpath, ".git"), "git object store")
        if "HEAD" in filenames and "objects" in dirnames and "refs" in dirnames:
            add(dirpath, "git object store")
        if os.path.basename(dirpath) == "objects" and (
                {"pack", "info"} <= set(dirnames) or any(
                    hexdir.match(d) and any(len(x) == 38 for x in
                                            os.listdir(os.path.join(dirpath, d)))
                    for d in dirnames if hexdir.match(d))):
            add(dirpath, "git object store")
print("RESULT " + json.dumps({"leaks": found, "grep_rc": p.returncode,
                              "files_searched_roots": roots}), flush=True)
'''


def _run_probe(patterns: LeakPatterns, *, hide: Sequence[Path], mode: str,
               timeout_s: float, roots: Sequence[str] = ()) -> tuple[list[Leak], str]:
    """Run the probe in a sandbox; (leaks, the probe's log for errors)."""
    spec = {"roots": list(roots), "cells": patterns.cells, "allowed": sorted(patterns.allowed_sha256),
            "markers": list(_MARKERS), "quorum": CELL_QUORUM, "suffixes": list(SUFFIXES)}
    with tempfile.TemporaryDirectory(prefix="perflab-selftest-") as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o711)
        scratch = tmp / "scratch"
        scratch.mkdir()
        (scratch / "spec.json").write_text(json.dumps(spec))
        log = tmp / "log.txt"
        run = run_sandboxed(
            [sys.executable, "-I", "-c", _PROBE, f"{SANDBOX_WORK}/spec.json", SANDBOX_WORK],
            scratch=scratch, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            limits=SandboxLimits(wall_timeout_s=timeout_s, memory_gib=4, nproc=64,
                                 tmpfs_gib=0.25),
            log_path=log, hide=hide, mode=mode)  # type: ignore[arg-type]
        text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if run.timed_out or run.returncode != 0 or len(lines) != 1:
        raise SandboxUnavailable(
            f"the sandbox self-test did not finish (exit {run.returncode}, "
            f"{'timed out after ' + format(timeout_s, 'g') + ' s' if run.timed_out else ''}): "
            f"{text[-800:]}")
    out = json.loads(lines[0][len("RESULT "):])
    return [Leak(path, "; ".join(reasons)) for path, reasons in sorted(out["leaks"].items())], text


#: This process's probe results: (patterns digest, visible hides, mode, roots) -> leaks.
_RESULTS: dict[tuple, tuple[Leak, ...]] = {}


def self_test(references: dict[str, object], *, hide: Iterable[Path] = (),
              mode: Literal["auto", "bwrap"] = "bwrap", timeout_s: float = 600.0,
              cache: bool = True, roots: Sequence[str | Path] = ()) -> list[Leak]:
    """Prove that a submission's sandbox cannot read an answer, before a batch.

    Args:
        references: ``lab -> notebook`` of the batch (nbformat nodes).
        hide: the host paths the batch hides (output folders): the probe runs with them.
        mode: the sandbox mode of the batch (``"none"`` has no sandbox to test).
        timeout_s: wall-clock limit of the probe, seconds.
        cache: reuse this process's result for the same references, hidden paths and
            mode (the file system is not expected to change within one process).
        roots: the folders to walk, as seen inside (default: every top-level folder but
            ``/proc``, ``/sys`` and ``/dev``); the tests narrow it.

    Returns:
        The leaks found (empty: the sandbox is sound).

    Raises:
        SandboxLeak: a file holding a reference solution cell, a hidden-test region, a
            solution marker, or a git object store is readable inside; the message names
            every path and what was found there, and the fix.
        SandboxUnavailable: the probe could not run.
    """
    patterns = leak_patterns(references)
    # what the hidden paths change inside (the cache key: a batch's output folders in
    # /tmp are not visible anyway, so every batch of a test session shares one probe)
    hide = tuple(visible_hides(list(hide)))
    roots = tuple(str(r) for r in roots)
    key = (patterns.digest(), hide, mode, roots)
    if cache and key in _RESULTS:
        leaks = list(_RESULTS[key])
    else:
        leaks = _run_probe(patterns, hide=hide, mode=mode, timeout_s=timeout_s,
                           roots=roots)[0]
        _RESULTS[key] = tuple(leaks)
    if leaks:
        shown = "\n".join(f"  {leak.path}: {leak.reason}" for leak in leaks[:20])
        more = f"\n  ... and {len(leaks) - 20} more" if len(leaks) > 20 else ""
        raise SandboxLeak(
            f"the sandbox self-test found {len(leaks)} readable path(s) holding answers; "
            f"no student was graded:\n{shown}{more}\nfix: keep the course repository (its "
            "solutions/, tests/ and .git) out of the folders the sandbox binds "
            "(perflab.course.sandbox.allowed_paths(): the system folders, the Python "
            "environment, the perflab package folder and the dataset), e.g. install "
            "perflab from a wheel or put the virtual environment outside the checkout's "
            "files, or pass the folder in hide")
    return leaks
