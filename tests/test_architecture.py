"""The package's shape: layer folders without cycles, and a small public face.

* Both contracts of ``.importlinter`` hold (``lint-imports``): the folders are layers, each
  importing only the ones below it, and each lab's glue (``perflab.labs.lab06`` ..
  ``lab09``) is independent of every other lab's. The same breaches planted in a copy of
  the package make ``lint-imports`` fail, and a checker written here (no import-linter)
  finds a lab importing another lab on grimp's graph of the package.
* No import cycle anywhere (Tarjan's strongly connected components), and every module
  imports in a fresh interpreter when its dependencies are imported first.
* ``perflab/`` holds only ``__init__``, ``__main__``, ``models``, ``experiment``, the layer
  folders and ``recordings/``, and every one of them sits in a layer of the contract.
* The face: ``perflab.__all__`` has at most 40 names, each resolving (lazily) to the
  module that defines it, listed in that module's ``__all__`` and documented; no public
  name is also a submodule's name; ``import perflab`` loads none of the heavy libraries.
* Every library module declares ``__all__``, each public name has one home, and every
  folder's ``__init__`` says what the folder is for.
* Every notebook (``solutions/`` and ``labs/``) imports only public names: from
  ``perflab.__all__`` or from the ``__all__`` of a module under a
  ``perflab.PUBLIC_SUBMODULES`` entry, nothing private, nothing from the faces.
* ``docs/API.md`` is what :mod:`perflab.course.apidoc` generates from the code.
"""
from __future__ import annotations

import ast
import configparser
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

import perflab
from perflab.course import apidoc

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perflab"
NOTEBOOKS = sorted([*ROOT.glob("solutions/*.ipynb"), *ROOT.glob("labs/*.ipynb")])

#: The only files at perflab's top level besides the layer folders (and the data folder).
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "models.py", "experiment.py"}
DATA_FOLDERS = {"recordings"}

#: Packages whose ``__init__`` re-exports names of modules under them (a second face):
#: notebooks launch ranks with ``from perflab.distributed import launch_fn``.
RE_EXPORTING_PACKAGES = {"perflab.distributed"}

MAX_PUBLIC_NAMES = 40


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("perflab", exclude_type_checking_imports=True)


def _contract_config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config


# --- the contracts, run by import-linter -------------------------------------------------


def _lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", str(ROOT / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_contracts_are_kept():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout, proc.stdout[-3000:]


def test_lint_imports_catches_a_layer_breach_and_a_lab_importing_a_lab(tmp_path):
    """Wrong answer: a copy of the package with the core importing the ladder and Lab 07
    importing Lab 06 breaks both contracts (run with this repository's .importlinter)."""
    shutil.copytree(PACKAGE, tmp_path / "perflab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.md"))
    with open(tmp_path / "perflab" / "core" / "dtypes.py", "a") as f:
        f.write("\nimport perflab.ladder.search  # a breach\n")
    with open(tmp_path / "perflab" / "labs" / "lab07.py", "a") as f:
        f.write("\nfrom perflab.labs.lab06 import ranks  # a breach\n")
    proc = _lint_imports(tmp_path, pythonpath=str(tmp_path))
    assert proc.returncode != 0
    assert "0 kept, 2 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "perflab.core.dtypes -> perflab.ladder.search" in proc.stdout
    assert "perflab.labs.lab07 -> perflab.labs.lab06" in proc.stdout


# --- a lab importing another lab: a checker of our own ------------------------------------


def _lab_modules_in_contract() -> list[str]:
    return _contract_config()["importlinter:contract:labs"]["modules"].split()


def _lab_to_lab_imports(graph, labs: list[str]) -> list[list[str]]:
    """Each chain of imports (direct or through other modules) from one lab's module (the
    lab or anything under it) to another lab's: the independence contract, checked
    without import-linter on a grimp graph."""
    def lab_of(module: str) -> str | None:
        return next((lab for lab in labs if module == lab or module.startswith(lab + ".")),
                    None)

    found = []
    for lab in labs:
        # breadth-first from the lab's own modules: shortest chain to each module reached
        start = sorted(m for m in graph.modules if lab_of(m) == lab)
        came_from: dict[str, str | None] = {m: None for m in start}
        queue = list(start)
        while queue:
            module = queue.pop(0)
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                if imported in came_from:
                    continue
                came_from[imported] = module
                other = lab_of(imported)
                if other is not None and other != lab:
                    chain = [imported]
                    while came_from[chain[0]] is not None:
                        chain.insert(0, came_from[chain[0]])
                    found.append(chain)
                    continue  # one chain per module reached; keep searching the rest
                queue.append(imported)
    return found


def test_no_lab_imports_another_lab(graph):
    labs = _lab_modules_in_contract()
    on_disk = sorted(f"perflab.labs.{p.stem}" for p in (PACKAGE / "labs").glob("lab[0-9]*")
                     if p.suffix == ".py" or (p / "__init__.py").exists())
    assert labs == on_disk, ".importlinter's labs contract must list every lab's glue"
    assert _lab_to_lab_imports(graph, labs) == []


def test_lab_checker_catches_a_lab_importing_a_lab():
    """Wrong answers on a synthetic graph: Lab 07 importing Lab 06's package (directly)
    and Lab 08 reaching Lab 09 through a library module are both found; a lab importing
    the library, and a lab's own submodules importing each other, are not."""
    g = grimp.ImportGraph()
    for m in ("perflab", "perflab.analysis", "perflab.analysis.x", "perflab.labs",
              "perflab.labs.lab06", "perflab.labs.lab06.ranks", "perflab.labs.lab06.checks",
              "perflab.labs.lab07", "perflab.labs.lab08", "perflab.labs.lab09"):
        g.add_module(m)
    labs = ["perflab.labs.lab06", "perflab.labs.lab07", "perflab.labs.lab08",
            "perflab.labs.lab09"]
    g.add_import(importer="perflab.labs.lab07", imported="perflab.analysis.x")
    g.add_import(importer="perflab.labs.lab06.ranks", imported="perflab.labs.lab06.checks")
    assert _lab_to_lab_imports(g, labs) == []
    g.add_import(importer="perflab.labs.lab07", imported="perflab.labs.lab06")
    assert _lab_to_lab_imports(g, labs) == [["perflab.labs.lab07", "perflab.labs.lab06"]]
    g.add_import(importer="perflab.labs.lab08", imported="perflab.analysis.x")
    g.add_import(importer="perflab.analysis.x", imported="perflab.labs.lab09")
    assert ["perflab.labs.lab08", "perflab.analysis.x", "perflab.labs.lab09"] in \
        _lab_to_lab_imports(g, labs)


# --- cycles and import order --------------------------------------------------------------


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm).
    Written here because grimp exposes shortest chains between two modules, not the
    components of the whole graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph.modules):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    """The checker itself: a graph with a -> b -> c -> a is reported, a -> b -> c is not."""
    g = grimp.ImportGraph()
    for m in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        g.add_module(m)
    g.add_import(importer="pkg.a", imported="pkg.b")
    g.add_import(importer="pkg.b", imported="pkg.c")
    assert _cycles(g) == []
    g.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(g) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_import_cycles(graph):
    assert _cycles(graph) == [], "import cycles (each list imports itself round)"


@pytest.mark.slow
def test_every_module_imports_in_dependency_order(graph):
    """A fresh interpreter imports every module, dependencies first: a module that needs
    an import it does not make (or a cycle hidden by import order) fails here."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(m: str) -> None:
        if m in seen:
            return
        seen.add(m)
        for d in sorted(graph.find_modules_directly_imported_by(m)):
            visit(d)
        order.append(m)

    for m in sorted(graph.modules):
        visit(m)
    mains = [m for m in order if m.endswith("__main__")]  # running them runs the CLI
    code = ("import importlib, sys\n"
            f"for m in {[m for m in order if m not in mains]!r}:\n"
            "    importlib.import_module(m)\n"
            "print('imported', len(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_import_perflab_is_light():
    code = ("import sys, perflab\n"
            "heavy = [m for m in ('torch', 'pandas', 'scipy', 'matplotlib', 'PIL', 'tqdm',"
            " 'ipywidgets', 'nbgrader', 'nbformat') if m in sys.modules]\n"
            "print(','.join(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import perflab loaded {proc.stdout.strip()}"


# --- the folders ----------------------------------------------------------------------------


def _subpackages(path: Path = PACKAGE) -> list[Path]:
    return sorted(p.parent for p in path.rglob("__init__.py") if "__pycache__" not in p.parts
                  and p.parent != path)


def test_top_level_holds_only_the_face_and_the_layer_folders():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {name for name in folders if (PACKAGE / name / "__init__.py").exists()}
    assert folders - packages == DATA_FOLDERS, "a folder at the top that is no package"
    assert entries - folders == TOP_LEVEL_FILES, (
        "perflab/ holds only __init__, __main__, models and experiment; put a new module "
        "in the layer folder it belongs to")


def test_every_top_level_module_sits_in_a_layer():
    layers = _contract_config()["importlinter:contract:layers"]["layers"]
    in_contract = set(re.findall(r"perflab(?:\.\w+)?", layers))
    on_disk = {f"perflab.{p.name}" for p in _subpackages() if p.parent == PACKAGE}
    on_disk |= {f"perflab.{name[:-3]}" for name in TOP_LEVEL_FILES - {"__init__.py"}}
    assert in_contract == on_disk


def _readme_tree() -> list[str]:
    """The entries of perflab/ in the README's Layout tree, in the order listed."""
    layout = (ROOT / "README.md").read_text().partition("\n## Layout\n")[2]
    block = layout.partition("```\n")[2].partition("```")[0]
    tree = block.partition("perflab/\n")[2]
    return re.findall(r"^  (\S+)", tree, re.M)


def _layer_index() -> dict[str, int]:
    """Top-level module (``perflab.x``) -> its layer's position, 0 at the top."""
    layers = _contract_config()["importlinter:contract:layers"]["layers"].strip().split("\n")
    return {m: i for i, line in enumerate(layers) for m in re.findall(r"perflab(?:\.\w+)?", line)}


def _tree_problems(entries: list[str], layer_of: dict[str, int]) -> list[str]:
    """What is wrong with the README's tree: entries missing from disk, top-level modules
    or folders left out, layers out of order."""
    on_disk = {p.name + "/" if p.is_dir() else p.name for p in PACKAGE.iterdir()
               if p.name != "__pycache__"}
    problems = [f"{e} is not in perflab/" for e in entries if e not in on_disk]
    problems += [f"{e} is missing from the tree" for e in sorted(on_disk - set(entries))
                 if e != "__main__.py"]
    ranks = [(e, layer_of[f"perflab.{e.removesuffix('/').removesuffix('.py')}"])
             for e in entries if f"perflab.{e.removesuffix('/').removesuffix('.py')}" in layer_of]
    problems += [f"{a} is listed above {b} but sits in a lower layer"
                 for (a, ra), (b, rb) in zip(ranks, ranks[1:]) if ra > rb]
    return problems


def test_the_readme_tree_is_the_package_in_layer_order():
    assert _tree_problems(_readme_tree(), _layer_index()) == []
    # wrong answers: an entry that is gone, one left out, two layers swapped
    layer_of = _layer_index()
    good = _readme_tree()
    assert _tree_problems([*good, "measure.py"], layer_of) == ["measure.py is not in perflab/"]
    assert _tree_problems([e for e in good if e != "ladder/"], layer_of) == [
        "ladder/ is missing from the tree"]
    swapped = [{"core/": "ladder/", "ladder/": "core/"}.get(e, e) for e in good]
    assert any("sits in a lower layer" in p for p in _tree_problems(swapped, layer_of))


def test_every_folder_says_what_it_is_for():
    """Each subpackage's ``__init__`` docstring: a summary line and at least one
    paragraph (what is in the folder, what it may import)."""
    for folder in _subpackages():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        name = ".".join(folder.relative_to(ROOT).parts)
        words = doc.split()
        assert len(words) >= 15 and doc.rstrip().endswith("."), (
            f"{name}/__init__.py needs a docstring of at least one paragraph")


# --- the face -------------------------------------------------------------------------------


def test_the_face_is_small():
    assert len(perflab.__all__) <= MAX_PUBLIC_NAMES, (
        f"perflab.__all__ has {len(perflab.__all__)} names (at most {MAX_PUBLIC_NAMES}): "
        "import the rest from their subpackages")
    assert perflab.__all__ == sorted(set(perflab.__all__))


def test_public_names_resolve_to_their_defining_module():
    for name in perflab.__all__:
        assert not name.startswith("_"), name
        obj = getattr(perflab, name)
        home = f"perflab.{perflab._HOME[name]}"
        module = sys.modules[home]
        assert name in module.__all__, f"{name} is not in {home}.__all__"
        assert getattr(obj, "__module__", None) == home, (
            f"perflab.{name} is defined in {getattr(obj, '__module__', '?')}, not in "
            f"{home}: point _PUBLIC at the module that defines it")
        doc = obj.__doc__ or ""
        assert doc.strip() and not doc.startswith(f"{name}("), (  # dataclass's made-up doc
            f"perflab.{name} has no docstring")


def test_unknown_attribute_says_where_to_look():
    with pytest.raises(AttributeError, match="docs/API.md"):
        perflab.no_such_name  # noqa: B018


def _names_shadowed_by_submodules(public: dict, modules: set) -> list[str]:
    return sorted(name for name in public if name in modules)


def test_no_public_name_is_also_a_submodule_name():
    """Importing ``perflab.X`` sets the package attribute X to the module, so a public
    function X would turn into a module for every later ``from perflab import X``
    ('module' object is not callable, depending on test order)."""
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(perflab.__path__)}
    assert _names_shadowed_by_submodules(perflab._HOME, modules) == []
    # wrong answer: the collision this test exists for is found
    assert _names_shadowed_by_submodules({"memory_breakdown": "x"},
                                         {"memory_breakdown"}) == ["memory_breakdown"]


# --- every module's __all__ -----------------------------------------------------------------


def _declares_nothing(module_name: str) -> bool:
    """A package whose ``__init__`` is its docstring alone: it exports nothing itself
    (its modules are its content), so it needs no ``__all__``."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "__path__"):
        return False
    body = ast.parse(Path(module.__file__).read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr)


def test_every_library_module_declares_all():
    modules = perflab._library_modules()
    assert len(modules) > 50 and "perflab.analysis.trace" in modules
    missing = [m for m in modules if "__all__" not in vars(importlib.import_module(m))
               and not _declares_nothing(m)]
    assert missing == [], "library modules without an explicit __all__"
    for m in modules:
        module = importlib.import_module(m)
        for name in getattr(module, "__all__", []):
            assert hasattr(module, name), f"{m}.__all__ lists {name}, which it lacks"


def _names_with_two_homes(all_of: dict[str, list[str]], re_exporting: set[str]) -> list[str]:
    """Names listed in more than one module's ``__all__`` (a re-exporting package's list
    does not count)."""
    homes = defaultdict(list)
    for module, names in all_of.items():
        if module not in re_exporting:
            for name in names:
                homes[name].append(module)
    return sorted(f"{name}: {', '.join(ms)}" for name, ms in homes.items() if len(ms) > 1)


def test_every_public_name_has_one_home():
    all_of = {m: list(getattr(importlib.import_module(m), "__all__", []))
              for m in perflab._library_modules()}
    assert _names_with_two_homes(all_of, RE_EXPORTING_PACKAGES) == []
    for package in RE_EXPORTING_PACKAGES:  # a re-export is the home's own object
        module = importlib.import_module(package)
        for name in module.__all__:
            home = getattr(module, name).__module__
            assert home.startswith(package + ".") and name in all_of[home], (
                f"{package}.{name} re-exports {home}.{name}, which is not in its __all__")
    # wrong answers: a name two modules list; perflab.distributed's re-exports, were it
    # not declared a re-exporting package
    assert _names_with_two_homes({"a": ["x", "y"], "b": ["x"]}, set()) == ["x: a, b"]
    assert ("launch_fn: perflab.distributed, perflab.distributed.launch"
            in _names_with_two_homes(all_of, set()))


# --- notebooks use the public API only ------------------------------------------------------


def _code_cells(path: Path):
    """Each code cell's source, magics as ``pass`` and a check's graded part (hidden
    cases: it runs in the grader and never reaches a student's notebook) left out."""
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            src = re.sub(r"### BEGIN HIDDEN TESTS\n### GRADED\n.*?### END HIDDEN TESTS", "",
                         src, flags=re.S)
            yield i, "\n".join("pass" if ln.lstrip().startswith(("%", "!")) else ln
                               for ln in src.split("\n"))


#: Every module under perflab, faces included (found on disk, nothing imported).
_MODULES = {"perflab", *(
    ".".join(("perflab", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__")
    for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)}


def _is_module(name: str) -> bool:
    return name in _MODULES


def _public_module(name: str) -> bool:
    """``perflab`` itself, a public submodule, or a module under one; nothing private."""
    return (not any(part.startswith("_") for part in name.split("."))
            and (name == "perflab" or any(name == p or name.startswith(p + ".")
                                          for p in perflab.PUBLIC_SUBMODULES)))


def _exports(module: str) -> set[str]:
    if module == "perflab":
        return set(perflab.__all__)
    return set(getattr(importlib.import_module(module), "__all__", ()))


def _attribute_problem(chain: list[str]) -> str | None:
    """What is wrong with ``a.b.c`` used from a perflab module ``chain[0]`` (a dotted
    module name), or None: each step is a public module or a name in the current
    module's ``__all__``; past the first non-module name only privacy is checked."""
    module = chain[0]
    for i, attr in enumerate(chain[1:], 1):
        if attr.startswith("_") and not (module == "perflab" and attr == "__version__"):
            return f"private name {'.'.join([module, *chain[i:]])}"
        if _is_module(f"{module}.{attr}"):
            module = f"{module}.{attr}"
            if not _public_module(module):
                return f"{module} is not a public module"
            continue
        if attr not in _exports(module) and not (module == "perflab"
                                                  and attr == "__version__"):
            return f"{module}.{attr} is not public (not in {module}.__all__)"
        rest = chain[i + 1:]
        private = [a for a in rest if a.startswith("_")]
        return f"private name {'.'.join([module, attr, *rest])}" if private else None
    return None


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *parts]
    return None


def _private_uses(path: Path) -> list[str]:
    """What a notebook imports or touches outside the public API: a perflab module that
    is private or not under a public submodule, a name not in its module's ``__all__``
    (``from perflab import X``: X in ``perflab.__all__``), any ``_name``, and attribute
    chains on a perflab module (``perflab.X``, an ``import ... as`` alias) that leave
    the public modules and names."""
    bad = []
    for i, src in _code_cells(path):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue  # a student's unfinished cell; nbval reports it
        for node in ast.walk(tree):  # chains are read from their outermost Attribute
            for child in ast.iter_child_nodes(node):
                child.parent = node
        aliases: dict[str, str] = {}  # a local name bound to a perflab module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != "perflab":
                        continue
                    if not _public_module(a.name):
                        bad.append(f"cell {i}: import {a.name}")
                    aliases[a.asname or "perflab"] = a.name if a.asname else "perflab"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
                    node.module or "").split(".")[0] == "perflab":
                if not _public_module(node.module):
                    bad.append(f"cell {i}: from {node.module} import ...")
                    continue
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if a.name.startswith("_"):
                        bad.append(f"cell {i}: private name {a.name} from {node.module}")
                    elif node.module != "perflab" and _is_module(sub):
                        aliases[a.asname or a.name] = sub  # a public module, checked above
                    elif a.name == "*" or a.name not in _exports(node.module):
                        bad.append(f"cell {i}: {sub} is not public (not in "
                                   f"{node.module}.__all__)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and not isinstance(
                    getattr(node, "parent", None), ast.Attribute):
                chain = _dotted(node)
                if chain and chain[0] in aliases:
                    problem = _attribute_problem([aliases[chain[0]], *chain[1:]])
                    if problem:
                        bad.append(f"cell {i}: {problem}")
    return sorted(set(bad), key=lambda b: (int(b.split(":")[0].split()[1]), b))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebooks_use_only_the_public_api(notebook: Path):
    assert _private_uses(notebook) == []


def _notebook(tmp_path: Path, cells: list[str]) -> Path:
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                     "execution_count": None, "source": src} for src in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_private_use_checker_passes_the_public_api(tmp_path):
    path = _notebook(tmp_path, [
        "%matplotlib inline\nfrom perflab import RunConfig, run\nperflab.run\n",
        "from perflab.analysis.amp import op_dtypes\nfrom perflab.viz.plots import plot_phases\n",
        "import perflab\nperflab.env_summary().cpu_cores\nperflab.__version__\n",
        "import perflab.distributed\nperflab.distributed.launch_fn(f, world_size=2)\n",
        "from perflab.distributed import launch_fn\nfrom perflab.labs.lab06.ranks import HOOKS\n",
        "import perflab.analysis.trace as tr\ntr.load_trace('x').events\n",
        "from perflab.analysis import trace\ntrace.load_ranks\n",
        "perflab.analysis.trace.load_trace\nperflab.core.memory.MIB\n",
        "x = (\n",  # an unfinished cell: nbval's business
    ])
    assert _private_uses(path) == []


@pytest.mark.parametrize("cell, problem", [
    ("from perflab import _HOME\n", "private name _HOME"),
    ("from perflab.core._hidden import x\n", "from perflab.core._hidden import"),
    ("from perflab.analysis.amp import _helper\n", "private name _helper"),
    ("from perflab.course.grading import grade\n", "from perflab.course.grading import"),
    ("from perflab.cli import main\n", "from perflab.cli import"),
    ("import perflab.cli\n", "import perflab.cli"),
    ("import perflab.course.grading as g\n", "import perflab.course.grading"),
    ("from perflab import not_a_name\n", "perflab.not_a_name is not public"),
    ("from perflab import distributed\n", "perflab.distributed is not public"),
    ("from perflab import *\n", "perflab.* is not public"),
    ("from perflab.analysis.amp import not_exported\n", "amp.not_exported is not public"),
    ("import perflab\nperflab.course.grading.grade\n", "perflab.course is not a public"),
    ("import perflab\nperflab._HOME\n", "private name perflab._HOME"),
    ("import perflab\nperflab.plot_results\n", "perflab.plot_results is not public"),
    ("import perflab\nperflab.core.memory._private\n", "private name"),
    ("import perflab\nperflab.run.__wrapped__\n", "private name perflab.run.__wrapped__"),
    ("import perflab.core as core\ncore._secret\n", "private name perflab.core._secret"),
    ("from perflab.analysis import trace\ntrace.not_exported\n", "is not public"),
])
def test_private_use_checker_catches_wrong_imports(tmp_path, cell, problem):
    path = _notebook(tmp_path, ["from perflab import RunConfig\n", cell])
    bad = _private_uses(path)
    assert len(bad) == 1 and bad[0].startswith("cell 1:") and problem in bad[0], bad


# --- the API reference ----------------------------------------------------------------------


def test_api_reference_is_up_to_date():
    doc = ROOT / "docs" / "API.md"
    assert doc.read_text() == apidoc.render(), (
        "docs/API.md is out of date: run `python -m perflab.course.apidoc > docs/API.md`")


def test_api_reference_lists_every_public_name():
    """The face's table holds ``perflab.__all__``; each library module has a heading of
    its own with every name of its ``__all__`` in the table under it."""
    text = apidoc.render()
    cut = text.index("\n## perflab.core\n")
    face, rest = text[:cut], text[cut:]
    for name in perflab.__all__:
        assert re.search(rf"^\| `{re.escape(name)}` \|", face, re.M), name
    for m in perflab._library_modules():
        heading = (re.search(rf"^### {re.escape(m)}$", rest, re.M)
                   or re.search(rf"^## {re.escape(m)}$", rest, re.M))
        assert heading, f"no section for {m}"
        table = re.split(r"^#", rest[heading.end():], maxsplit=1, flags=re.M)[0]
        for name in getattr(importlib.import_module(m), "__all__", []):
            assert re.search(rf"^\| `{re.escape(name)}` \|", table, re.M), f"{m}.{name}"
