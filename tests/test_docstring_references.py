"""Every dotted ``perflab.x.y`` a reader is pointed to exists.

The docstrings and comments of every module under ``perflab/`` (collected with ``ast`` and
``tokenize``, so code lines are not read) and the Markdown pages (``README.md``,
``docs/*.md``) name modules, classes and functions as ``perflab.analysis.trace.load_trace``,
``:func:`~perflab.experiment.run``` or ``perflab.run``. Each such reference must import as
a module, or resolve as an attribute (a chain of attributes) of the longest importable
module it starts with, whose first name lives there (a submodule, in its ``__all__``, or
defined in it: not merely imported), so a module or a name moved elsewhere cannot leave
its old address behind in the prose. ``NOT_NAMES`` lists the few matches that are not Python names.

The same prose cites files of the repository (``perflab/recordings/README.md``,
``tests/browser/trim.py``, ``benchmarks/grading.py``): each must exist, unless it is a
pattern (``solutions/NN_*.ipynb``, ``perflab/recordings/<name>``, ``solutions/01_...``).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import re
import tokenize
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perflab"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

#: A dotted reference: ``perflab`` then one or more ``.identifier``; not part of a longer
#: name (``my_perflab.x``), a path (``src/perflab.x``) or a file name (``x.perflab.y``).
REFERENCE = re.compile(r"(?<![\w./-])perflab(?:\.[A-Za-z_]\w*)+")

#: Matches that are not Python names (none needed so far: paths such as
#: ``perflab/recordings/`` do not match, and ``perflab.course.nbval_times``, a pytest
#: plugin, is a module). A file name would go here, e.g. ``"perflab.egg"``.
NOT_NAMES: frozenset[str] = frozenset()


#: A path in the repository: a top folder, ``/``, then a path (placeholders included).
PATH = re.compile(r"(?<![\w./-])(?:perflab|tests|benchmarks|docs|solutions|labs|data)/"
                  r"[\w./*<>-]*[\w/*>]")

#: Path-like matches that are prose, not paths.
NOT_PATHS = frozenset({"data/forward/backward/optimizer"})  # diagnosis.py: four phases


def _texts_of_module(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment in one source file."""
    source = path.read_text()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                found.append((body[0].lineno, body[0].value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
    return found


def references_in(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """(line, reference) of each dotted ``perflab.`` name in ``text``. A name broken over
    two lines inside a docstring (``perflab.\\n    core``) is not joined: it is not seen."""
    out = []
    for m in REFERENCE.finditer(text):
        out.append((first_line + text.count("\n", 0, m.start()), m.group()))
    return out


def resolves(reference: str) -> bool:
    """Whether ``reference`` imports as a module or is an attribute chain of one
    (dataclass fields count as attributes of their class). The first name after the
    module must live there: a submodule, in the module's ``__all__``, or a class or
    function defined in it (``perflab.experiment.RunConfig``, merely imported there, is
    not RunConfig's address). A module that exists but fails to import raises: that is
    a broken module, not a stale reference."""
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise  # the module exists but imports something missing
            continue
        for i, attr in enumerate(parts[cut:]):
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    and attr in {f.name for f in dataclasses.fields(obj)}):
                return True  # a field (its default may be a factory: no class attribute)
            try:
                found = getattr(obj, attr)
            except AttributeError:
                return False
            if i == 0 and not _lives_in(obj, attr, found):
                return False
            obj = found
        return True
    return False


def _lives_in(module: types.ModuleType, attr: str, found: object) -> bool:
    if attr in getattr(module, "__all__", ()):
        return True
    if isinstance(found, types.ModuleType):
        return found.__name__ == f"{module.__name__}.{attr}"
    if inspect.isclass(found) or inspect.isroutine(found):
        return getattr(found, "__module__", None) == module.__name__
    return True  # a constant: where it was assigned cannot be told from the value


def _all_references() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _texts_of_module(path):
            found += [(str(path.relative_to(ROOT)), n, ref)
                      for n, ref in references_in(text, line)]
    for page in PAGES:
        found += [(str(page.relative_to(ROOT)), n, ref)
                  for n, ref in references_in(page.read_text())]
    return found


def stale(references) -> list[str]:
    """``file:line reference`` for each reference that does not resolve."""
    return [f"{where}:{line} {ref}" for where, line, ref in references
            if ref not in NOT_NAMES and not resolves(ref)]


def paths_in(text: str) -> list[str]:
    """The repository paths ``text`` cites, patterns (``NN``, ``*``, ``<name>``, a
    trailing ``...``) and :data:`NOT_PATHS` left out."""
    return [m.group() for m in PATH.finditer(text)
            if not re.search(r"NN|\*|<", m.group()) and m.group() not in NOT_PATHS
            and not text.startswith("...", m.end())]


def _all_texts() -> list[tuple[str, str]]:
    texts = [(f"{path.relative_to(ROOT)}:{line}", text)
             for path in sorted(PACKAGE.rglob("*.py")) for line, text in _texts_of_module(path)]
    return texts + [(str(page.relative_to(ROOT)), page.read_text()) for page in PAGES]


def test_the_prose_cites_only_files_that_exist():
    cited = [(where, path) for where, text in _all_texts() for path in paths_in(text)]
    assert len(cited) > 20
    assert [f"{where} {path}" for where, path in cited if not (ROOT / path).exists()] == []


def test_a_made_up_path_is_caught_and_patterns_are_not():
    text = ("see tests/test_cli.py and perflab/cli.py, solutions/NN_*.ipynb, "
            "perflab/recordings/<name>, solutions/01_..., a data/forward/backward/optimizer "
            "split, docs/API.md.")
    assert paths_in(text) == ["tests/test_cli.py", "perflab/cli.py", "docs/API.md"]
    assert [p for p in paths_in(text) if not (ROOT / p).exists()] == [
        "tests/test_cli.py", "perflab/cli.py"]


def test_the_prose_names_only_what_exists():
    refs = _all_references()
    assert len(refs) > 100, "the collector found almost nothing: is the regex broken?"
    assert stale(refs) == [], "references to names that do not exist (moved or renamed?)"


def test_docstrings_and_comments_are_read_but_code_is_not(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""See :func:`~perflab.core.nope`."""\n'
                   "import perflab  # perflab.core.gone\n"
                   "def f():\n"
                   "    '''Uses perflab.run.'''\n"
                   "    return perflab.code_is_not_prose\n")
    refs = [(n, r) for line, text in _texts_of_module(src) for n, r in references_in(text, line)]
    assert sorted(refs) == [(1, "perflab.core.nope"), (2, "perflab.core.gone"),
                            (4, "perflab.run")]


@pytest.mark.parametrize("reference", [
    "perflab.core.nope",                       # a module that does not exist
    "perflab.analysis.trace.no_such_function",  # a name missing from a module
    "perflab.data.loader.dataset",              # the old address of a moved module
    "perflab.plot_results",                     # not on the face
    "perflab.core.config.RunConfig.no_field",   # an attribute chain that breaks
    "perflab.experiment.RunConfig",             # imported there, defined in core.config
    "perflab.core.config.torch",                # a module imported there
])
def test_a_made_up_reference_is_caught(reference):
    assert not resolves(reference)
    assert stale([("x.md", 1, reference)]) == [f"x.md:1 {reference}"]


@pytest.mark.parametrize("reference", [
    "perflab", "perflab.run", "perflab.analysis.trace.load_trace",
    "perflab.core.simulated.SimulatedLink", "perflab.course.nbval_times",
    "perflab.core.config.RunConfig.batch_size", "perflab.distributed.launch_fn",
])
def test_a_real_reference_resolves(reference):
    assert resolves(reference)


def test_the_pattern_skips_paths_and_longer_names():
    text = ("perflab/recordings/x.json, src/perflab.x, my_perflab.y, "
            ":func:`perflab.run`, (perflab.core.timing).")
    assert [r for _, r in references_in(text)] == ["perflab.run", "perflab.core.timing"]
