"""``perflab course release DIR``: the folder students get, as nbgrader's
``release_assignment`` and otter's ``assign`` write one.

The course repository holds every answer: ``solutions/``, the tests' reference and honest
answers for every check, and the grader (``perflab/course/``). A release holds only:

* ``labs/NN_*.ipynb``: the student notebooks (``perflab course build`` stripped the
  solutions, hidden tests and rubrics; the release first checks they are up to date);
* ``perflab/``: the package without :data:`GRADER_ONLY` (the course tooling and the
  grader), its ``cli/course.py`` replaced by a stub that registers no command, so that
  ``perflab --help`` works and lists the student's commands only;
* ``data/README.md``: how the dataset is built (the build code is
  :mod:`perflab.data.dataset`); never the built images;
* ``docs/STUDENTS.md`` and a generated ``README.md`` (set up, open the labs);
* ``install.py``: the one set-up command (:mod:`perflab.course.student_setup`, standard
  library only: a venv, the tested torch when none imports, perflab, data, kernel);
* ``pyproject.toml`` without the instructors' and developers' extras and the pytest
  configuration (which loads a grader plugin), so ``pip install -e .`` installs what
  the labs need.

Nothing else: no ``solutions/``, ``tests/``, ``benchmarks/``, ``Makefile``, instructor
docs or ``.git``. Before the folder appears (it is written aside and renamed into place),
every file in it is scanned: a solution or hidden-test marker, or any line (over 25
characters) of a reference solution, a hidden test or a rubric that is not also in
``labs/`` or in the perflab code that ships, refuses the release.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["ReleaseReport", "release", "add_release_arguments", "release_command",
           "GRADER_ONLY", "MARKERS"]

#: Paths under ``perflab/`` that only the grader needs (left out of a release). A
#: grader-only module added outside ``course/`` must be named here.
GRADER_ONLY = ("course/",)

#: Files under ``perflab/`` that ship besides ``*.py``: the package data of
#: pyproject.toml's ``[tool.setuptools.package-data]``.
PACKAGE_DATA = ("recordings/*.json", "recordings/README.md",
                "recordings/gpu/*/*.json.gz", "recordings/gpu/*.md", "recordings/gpu/LICENSE-*",
                "recordings/nccl/*.txt", "recordings/nccl/*.md", "recordings/nccl/LICENSE-*")

#: Markers of nbgrader regions that no released file may contain.
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS",
           "### END HIDDEN TESTS")

#: Lines shorter than this (stripped) are too common to be evidence of a leak.
MIN_LEAK_CHARS = 26

#: pyproject.toml tables a release drops: the extras (course, dev, browser) and pytest's
#: configuration, which names the tests, the solutions and a grader plugin.
DROPPED_TABLES = ("project.optional-dependencies", "tool.pytest")

#: The extras a release keeps (its ``[project.optional-dependencies]`` holds only these):
#: ``kernels`` (Triton, Lab 11), which ``install.py`` installs on Linux.
STUDENT_EXTRAS = ("kernels",)

#: Why each top-level entry of the repository that a release leaves out stays behind.
WHY_LEFT_OUT = {
    "solutions": "the reference solutions, hidden tests and rubrics",
    "tests": "the tests: reference and honest answers for every check",
    "benchmarks": "instructor and developer benchmarks",
    "Makefile": "instructor and developer targets (check-solutions, grade, test)",
    ".git": "the history, which holds every answer",
    ".ci": "continuous integration",
    ".importlinter": "the layer contracts, for developers",
    ".venv": "an environment, made on each machine",
    "results": "this machine's measurements",
}

_STUB = '''"""``perflab course``: the instructor's course tooling, which is not part of this
student release (``perflab course release`` wrote this stub in place of the command).

It registers no command, so ``perflab --help`` lists the commands for students only.
"""
from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register nothing: the course tooling stays with the instructor."""
'''

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_REGION = re.compile(r"^[ \t]*### BEGIN (SOLUTION|HIDDEN TESTS)[ \t]*\n(.*?)"
                     r"^[ \t]*### END \1", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class ReleaseReport:
    """What :func:`release` wrote and left out."""

    dest: Path
    files: tuple[str, ...]
    """Every file written, relative to ``dest`` (POSIX separators), sorted."""
    left_out: tuple[str, ...]
    """What of the repository stays behind, each with why."""
    notes: tuple[str, ...] = ()
    """Shipped perflab functions that resemble a reference solution (students get them:
    a public helper, or a grader reference to move into :data:`GRADER_ONLY`)."""

    def summary(self) -> str:
        """A few lines for the terminal."""
        labs = sum(1 for f in self.files if f.startswith("labs/"))
        lines = [f"wrote {self.dest}: {len(self.files)} files ({labs} lab notebooks, "
                 f"{sum(1 for f in self.files if f.startswith('perflab/'))} package files)",
                 "left out:", *(f"  {x}" for x in self.left_out)]
        if self.notes:
            lines += ["shipped perflab code that resembles a reference solution:",
                      *(f"  {x}" for x in self.notes)]
        return "\n".join(lines)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8")).get("cells", [])


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _notebooks(folder: Path) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def _package_files(package: Path) -> tuple[list[Path], list[str]]:
    """(files of ``perflab/`` that ship, relative; what is left out and why)."""
    ship, left = [], []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package).as_posix()
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if any(rel.startswith(g) for g in GRADER_ONLY):
            continue
        if path.suffix == ".py" or any(fnmatch.fnmatch(rel, g) for g in PACKAGE_DATA):
            ship.append(Path(rel))
        else:
            left.append(f"perflab/{rel}: neither package code nor package data")
    grader = sorted({g for g in GRADER_ONLY if (package / g).exists()})
    left[:0] = [f"perflab/{g}: grader only (the course tooling, judges and references)"
                for g in grader]
    return ship, left


def student_pyproject(text: str) -> str:
    """``pyproject.toml`` without the tables of :data:`DROPPED_TABLES` (each with the
    comment lines just above its header), then a ``[project.optional-dependencies]``
    holding only the extras of :data:`STUDENT_EXTRAS` (each line as it was, with the
    comment lines above it), when the original has any of them."""
    lines = text.splitlines(keepends=True)
    kept = _student_extras(lines)
    heads = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := _HEADER.match(ln))]
    drop: set[int] = set()
    for n, (i, name) in enumerate(heads):
        if not any(name == t or name.startswith(t + ".") for t in DROPPED_TABLES):
            continue
        start = i
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        end = heads[n + 1][0] if n + 1 < len(heads) else len(lines)
        while end > i + 1 and lines[end - 1].lstrip().startswith("#"):
            end -= 1  # the next table's own comments stay with it
        drop.update(range(start, end))
    out = "".join(ln for i, ln in enumerate(lines) if i not in drop)
    if kept:
        out = out.rstrip("\n") + "\n\n[project.optional-dependencies]\n" + "".join(kept)
    return re.sub(r"\n{3,}", "\n\n", out)


def _student_extras(lines: list[str]) -> list[str]:
    """The lines of :data:`STUDENT_EXTRAS`' entries in the optional-dependencies table
    (one-line entries, with the comment lines just above each)."""
    out: list[str] = []
    table = None
    for i, ln in enumerate(lines):
        if m := _HEADER.match(ln):
            table = m.group(1)
            continue
        name = ln.split("=", 1)[0].strip()
        if table == "project.optional-dependencies" and name in STUDENT_EXTRAS:
            start = i
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            out += lines[start:i + 1]
    return out


def _readme(labs: list[Path], version: str) -> str:
    rows = []
    for nb in labs:
        title = next((_source(c).strip().splitlines()[0].lstrip("# ").strip()
                      for c in _cells(nb) if c.get("cell_type") == "markdown"
                      and _source(c).strip()), nb.stem)
        rows.append(f"| `labs/{nb.name}` | {title} |")
    return "\n".join([
        "# perflab labs: making PyTorch training fast, measured",
        "",
        f"The student copy of the course (perflab {version}). Each lab is a JupyterLab",
        "notebook that runs real experiments on the machine you open it on.",
        "",
        "## Set up, once",
        "",
        "Python >= 3.10, Linux or macOS. From this folder, one command:",
        "",
        "```bash",
        "python3 install.py",
        "```",
        "",
        "It makes `.venv/` here (seeing a torch this machine already has, and keeping it),",
        "installs the tested torch only when none imports (on Linux without an NVIDIA GPU",
        "the CPU-only build from PyTorch's own index, not the CUDA build of several GB),",
        "then perflab, the lab dataset (see data/) and the Jupyter kernel `Python (perflab)`.",
        "It says what it runs as it goes, and can be run again. Then",
        "`.venv/bin/perflab doctor` says what this machine can show.",
        "",
        "## Open the labs",
        "",
        "```bash",
        ".venv/bin/jupyter lab labs/",
        "```",
        "",
        "Start with `labs/00_start_here.ipynb`. [docs/STUDENTS.md](docs/STUDENTS.md) says",
        "how exercises, self-checks and grading work and what to hand in;",
        "[data/README.md](data/README.md) describes the dataset.",
        "",
        "| notebook | lab |",
        "|---|---|",
        *rows,
        "",
    ])


def _secret_lines(solutions: Path) -> dict[str, str]:
    """``stripped line -> where`` of every line of a solution region, a hidden-test
    region and a written answer's rubric cell of ``solutions/``."""
    out: dict[str, str] = {}
    for nb in _notebooks(solutions):
        for cell in _cells(nb):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            where = f"{nb.name} {meta.get('grade_id') or 'cell'}"
            text = _source(cell)
            if cell.get("cell_type") == "markdown" and meta.get("solution"):
                bodies = [text]  # a rubric and a model answer
            else:
                bodies = [m.group(2) for m in _REGION.finditer(text + "\n")]
            for body in bodies:
                for line in body.splitlines():
                    if len(line.strip()) >= MIN_LEAK_CHARS:
                        out.setdefault(line.strip(), where)
    return out


def _file_text(path: Path) -> str:
    if path.suffix == ".gz":  # package data: gzipped traces, checked as the text they hold
        return gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    parts = [text]
    for cell in json.loads(text).get("cells", []):
        parts.append(_source(cell))
        for out in cell.get("outputs", []):
            for v in [out.get("text", ""), *out.get("data", {}).values()]:
                parts.append("".join(v) if isinstance(v, list) else str(v))
    return "\n".join(parts)


def _leaks(dest: Path, files: list[str], secret: dict[str, str]) -> list[str]:
    found = []
    for rel in files:
        text = _file_text(dest / rel)
        found += [f"{rel}: {m!r}" for m in MARKERS if m in text]
        lines = {ln.strip() for ln in text.splitlines()}
        found += [f"{rel}: a line of {secret[ln]}: {ln[:80]!r}"
                  for ln in sorted(lines & set(secret))]
    return found


def _check_dest(dest: Path, repo: Path) -> None:
    d, r = dest.resolve(), repo.resolve()
    if d == r or r.is_relative_to(d):
        raise ValueError(f"{dest} holds the course repository {repo}: name a new folder "
                         "outside it")
    for name in ("perflab", "labs", "solutions", "tests", "data", "docs"):
        if d.is_relative_to(r / name):
            raise ValueError(f"{dest} is inside the repository's {name}/: name a folder "
                             "outside it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} exists and is not an empty folder: name a new folder, or "
                         "remove it first")


def release(dest: Path, *, repo: Path, check_labs: bool = True) -> ReleaseReport:
    """Write the student release of the course repository ``repo`` to ``dest``.

    Args:
        dest: a new or empty folder, outside the repository's own folders.
        repo: the course repository (``labs/``, ``solutions/``, ``perflab/``, ...).
        check_labs: first rebuild ``labs/`` from ``solutions/`` in memory and refuse if
            it differs (needs nbgrader, the ``[course]`` extra).

    Returns:
        What was written and left out.

    Raises:
        FileNotFoundError: the repository lacks ``labs/NN_*.ipynb``, ``solutions/``,
            ``perflab/``, ``pyproject.toml``, ``docs/STUDENTS.md`` or ``data/README.md``.
        ValueError: ``dest`` is not new or empty, is the repository or inside one of its
            folders; ``labs/`` is out of date with ``solutions/``; or a released file
            would hold a solution marker or a line of a reference solution, hidden test
            or rubric (nothing is written then).
    """
    repo, dest = Path(repo), Path(dest)
    labs = _notebooks(repo / "labs")
    if not labs:
        raise FileNotFoundError(f"no labs/NN_*.ipynb in {repo}: run `perflab course build` "
                                "in the course repository, or pass --repo")
    for need in ("solutions", "perflab/__init__.py", "pyproject.toml", "docs/STUDENTS.md",
                 "data/README.md"):
        if not (repo / need).exists():
            raise FileNotFoundError(f"{repo / need} is missing: is {repo} the course "
                                    "repository?")
    _check_dest(dest, repo)
    if check_labs:
        from perflab.course.build import build_labs

        stale = build_labs(repo / "solutions", repo / "labs", check=True)
        if stale:
            raise ValueError("labs/ is out of date with solutions/ "
                             f"({', '.join(p.name for p in stale)}): run `perflab course "
                             "build` first")
    package, left_package = _package_files(repo / "perflab")
    init = (repo / "perflab/__init__.py").read_text(encoding="utf-8")
    version = re.search(r'^__version__ = "([^"]+)"', init, re.M)
    copies = {f"labs/{nb.name}": nb for nb in labs}
    copies.update({f"perflab/{rel.as_posix()}": repo / "perflab" / rel for rel in package})
    copies.update({"data/README.md": repo / "data/README.md",
                   "docs/STUDENTS.md": repo / "docs/STUDENTS.md",
                   "install.py": repo / "perflab/course/student_setup.py"})
    written = {"README.md": _readme(labs, version.group(1) if version else "(unknown version)"),
               "pyproject.toml": student_pyproject((repo / "pyproject.toml").read_text()),
               "perflab/cli/course.py": _STUB}
    files = sorted({*copies, *written})
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for rel in files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel in written:
                (tmp / rel).write_text(written[rel], encoding="utf-8")
            else:
                shutil.copyfile(copies[rel], tmp / rel)
        public = {ln.strip() for nb in labs for c in _cells(nb) for ln in _source(c).splitlines()}
        public |= {ln.strip() for rel in files
                   if rel.startswith("perflab/") and not rel.endswith(".gz")
                   for ln in (tmp / rel).read_text(encoding="utf-8").splitlines()}
        secret = {ln: w for ln, w in _secret_lines(repo / "solutions").items()
                  if ln not in public}
        leaks = _leaks(tmp, files, secret)
        if leaks:
            raise ValueError("refusing to release: " + "; ".join(leaks[:5])
                             + (f" (and {len(leaks) - 5} more)" if len(leaks) > 5 else ""))
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shipped = {p.name for p in dest.iterdir()}
    left_out = [f"{p.name}{'/' if p.is_dir() else ''}: "
                f"{WHY_LEFT_OUT.get(p.name, 'not for students')}"
                for p in sorted(repo.iterdir()) if p.name not in shipped
                and (p.name in WHY_LEFT_OUT or not p.name.startswith("."))]
    left_out += [f"docs/{p.name}: for instructors and developers"
                 for p in sorted((repo / "docs").iterdir()) if p.name != "STUDENTS.md"]
    left_out += [f"labs/{p.name}: not a lab notebook" for p in sorted((repo / "labs").iterdir())
                 if p not in labs]
    if any(p.name != "README.md" for p in (repo / "data").iterdir()):
        left_out.append("data/ but its README.md: built on each machine by `perflab data`")
    left_out += ["README.md: the repository's (a student README is written instead)",
                 "pyproject.toml: " + ", ".join(f"[{t}]" for t in DROPPED_TABLES)
                 + " (instructor and developer extras, pytest's configuration)",
                 "perflab/cli/course.py: replaced by a stub that registers no command",
                 *left_package]
    return ReleaseReport(dest, tuple(files), tuple(left_out),
                         tuple(_resembling(repo, dest)))


def _resembling(repo: Path, dest: Path) -> list[str]:
    """Shipped perflab functions that cover most of a reference solution
    (:mod:`perflab.course.similarity`, the threshold of the review column)."""
    from perflab.course.similarity import (boilerplate_sources, library_sources,
                                           reference_sources, similarity_pairs)

    matches = similarity_pairs({"solutions": reference_sources(repo / "solutions")}, {},
                               library_sources(dest / "perflab"),
                               boilerplate=boilerplate_sources(dest / "labs"))
    return [f"{m.source} covers {m.score:.0%} of the reference solution {m.grade_id}"
            + (f" ({m.unit})" if m.unit else "") for m in matches if m.kind == "library"]


def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``perflab course release``'s arguments to an argparse parser."""
    parser.add_argument("dest", type=Path, help="a new (or empty) folder for the release")
    parser.add_argument("--repo", type=Path, default=Path("."),
                        help="the course repository (default: the current folder)")
    parser.add_argument("--no-labs-check", dest="check_labs", action="store_false",
                        help="do not rebuild labs/ from solutions/ to check it is up to "
                             "date (that needs nbgrader, the [course] extra)")


def release_command(args: argparse.Namespace) -> int:
    """Run ``perflab course release`` from parsed arguments; prints what was written and
    left out and returns 0 (errors raise, see :func:`release`)."""
    report = release(args.dest, repo=args.repo, check_labs=args.check_labs)
    print(report.summary())
    return 0
