"""The package's shape: layers without cycles, and a public API that is what the labs use.

* The layers contract (``.importlinter``: faces > analyses > training > core) holds, run
  through import-linter's own API.
* No import cycle anywhere in the package (strongly connected components of grimp's
  import graph, the graph import-linter builds), and every module imports in a fresh
  interpreter when its dependencies are imported first (dependency order).
* ``perflab.__all__`` is the public API: every name resolves lazily to the module that
  defines it (no re-exported twins), ``import perflab`` loads none of the heavy
  libraries, and every notebook (solutions/ and labs/) imports only public names from
  ``perflab`` or a documented public submodule.
* ``docs/API.md`` is what :mod:`perflab.course.apidoc` generates from the code.
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import perflab
from perflab.course import apidoc

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("solutions/*.ipynb"), *ROOT.glob("labs/*.ipynb")])


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("perflab", exclude_type_checking_imports=True)


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


def test_layers_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_cycle_finder_finds_a_cycle():
    """The checker itself: a graph with a -> b -> a is reported, a -> b alone is not."""
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


def test_public_names_resolve_to_their_defining_module():
    assert len(perflab.__all__) == len(set(perflab.__all__))
    for name in perflab.__all__:
        assert not name.startswith("_"), name
        obj = getattr(perflab, name)
        home = f"perflab.{perflab._HOME[name]}"
        module = sys.modules[home]
        assert name in module.__all__, f"{name} is not in {home}.__all__"
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == home, (f"perflab.{name} is defined in {obj.__module__}"
                                            f", re-exported by {home}: export it once")
            assert inspect.getdoc(obj), f"perflab.{name} has no docstring"


def test_every_module_all_is_exported():
    """Every name a library module declares public reaches perflab.__all__ (or is a
    spawned rank's body), so the two lists cannot drift apart."""
    rank_bodies = {"sweep_on_rank"}
    for mod in perflab._PUBLIC:
        module = __import__(f"perflab.{mod}", fromlist=["__all__"])
        missing = set(module.__all__) - set(perflab.__all__) - rank_bodies
        assert not missing, f"perflab.{mod}.__all__ names missing from perflab: {missing}"


def test_unknown_attribute_says_where_to_look():
    with pytest.raises(AttributeError, match="docs/API.md"):
        perflab.no_such_name  # noqa: B018


def _code_cells(path: Path):
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            yield i, "\n".join("pass" if ln.lstrip().startswith(("%", "!")) else ln
                               for ln in src.split("\n"))


def _private_uses(path: Path) -> list[str]:
    """What a notebook imports or touches outside the public API."""
    public_modules = {"perflab", *perflab.PUBLIC_SUBMODULES}
    bad = []
    for i, src in _code_cells(path):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue  # a student's unfinished cell; nbval reports it
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perflab"):
                if node.module not in public_modules:
                    bad.append(f"cell {i}: from {node.module} import ...")
                for a in node.names:
                    if a.name.startswith("_"):
                        bad.append(f"cell {i}: private name {a.name}")
                    elif node.module == "perflab" and a.name not in perflab.__all__:
                        bad.append(f"cell {i}: perflab.{a.name} is not public")
            elif isinstance(node, ast.Import):
                bad += [f"cell {i}: import {a.name}" for a in node.names
                        if a.name.startswith("perflab") and a.name not in public_modules]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "perflab"
                  and node.attr not in {*perflab.__all__, "distributed", "__version__"}):
                bad.append(f"cell {i}: perflab.{node.attr}")
    return bad


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebooks_use_only_the_public_api(notebook: Path):
    assert _private_uses(notebook) == []


def test_private_use_checker_catches_wrong_imports(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                     "execution_count": None, "source": src} for src in [
        "from perflab.viz.plots import plot_phases\n",
        "from perflab import _HOME\n",
        "import perflab.core.memory\n",
        "perflab.viz.figures.figure_to_png\n",
        "from perflab import not_a_name\n",
        "%matplotlib inline\nfrom perflab import RunConfig\nperflab.run\n",
    ]], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    bad = _private_uses(path)
    assert [b.split(":")[0] for b in bad] == ["cell 0", "cell 1", "cell 2", "cell 3", "cell 4"]


def test_api_reference_is_up_to_date():
    doc = ROOT / "docs" / "API.md"
    assert doc.read_text() == apidoc.render(), (
        "docs/API.md is out of date: run `python -m perflab.course.apidoc > docs/API.md`")


def test_api_reference_lists_every_public_name():
    text = apidoc.render()
    for name in perflab.__all__:
        assert re.search(rf"^\| `{re.escape(name)}` \|", text, re.M), name


def _names_shadowed_by_submodules(public: dict, modules: set) -> list[str]:
    return sorted(name for name in public if name in modules)


def test_no_public_name_is_also_a_submodule_name():
    """Importing ``perflab.X`` sets the package attribute X to the module, so a public
    function X would turn into a module for every later ``from perflab import X``
    ('module' object is not callable, depending on test order)."""
    import pkgutil

    import perflab

    modules = {m.name for m in pkgutil.iter_modules(perflab.__path__)}
    assert _names_shadowed_by_submodules(perflab._HOME, modules) == []
    # wrong answer: the collision this test exists for is found
    assert _names_shadowed_by_submodules({"memory_breakdown": "x"},
                                         {"memory_breakdown"}) == ["memory_breakdown"]
