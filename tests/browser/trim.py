"""A lab cut down to what its experiment panels need, for the browser tests.

nbval runs every solution in full; the browser tests only have to show that the panels
work in a real JupyterLab. So each lab is served as a trimmed copy, built by this rule:

* a **panel cell** is a code cell that calls a function whose name ends in ``_panel``
  (``experiment_panel``, ``bucket_panel``, ``ladder_panel``, ...); panel cells, the
  first code cell (imports, preset, environment set-up) and every ``%%writefile`` cell
  before the last panel (the student's module, which a kept statement may import by a
  name in a string, ``importlib.import_module("...")``) are kept whole;
* from the code cells before the last panel cell, a **backward slice over names**: walking
  back from the last panel cell, a top-level statement is kept when it binds a name that
  a kept statement after it reads. Binding is assigning, importing, ``def``/``class``,
  and mutating in place: item or attribute assignment, augmented assignment, or a
  top-level method call on a name that is not an import (``knobs.update(...)``). The
  kept statement's own reads become needed in turn; the free names of a function it
  defines are read when the function is called, so they count as needed at the last
  panel cell (repeated until nothing new is needed). A name bound unconditionally at a
  statement's top level stops being needed above it (the latest binding wins); one
  bound only inside ``if``/``for``/``while``/``try`` stays needed, so earlier bindings
  are kept too;
* everything else is dropped: markdown, cells after the last panel, and statements no
  panel depends on (checks, prints, plots, experiments whose results the panels do not
  take);
* a notebook without a panel cell is kept whole.

What the rule cannot see: names made by ``exec``, ``globals()``, magics or ``%run``, and
in-place changes through a function call (``helper(knobs)``). A missing binding fails
loudly (a NameError traceback in the browser); the browser test also checks that exactly
one panel renders per panel cell found here, so a panel factory renamed out of the
``_panel`` convention fails instead of being skipped.
"""
from __future__ import annotations

import ast
import copy
import re
import symtable
from dataclasses import dataclass, field

import nbformat

PANEL_SUFFIX = "_panel"
COMPS = {"listcomp", "setcomp", "dictcomp", "genexpr"}
CONDITIONAL = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)


@dataclass(frozen=True)
class Trimmed:
    """The trimmed notebook and what was kept (indices into the source's cells)."""

    notebook: nbformat.NotebookNode
    panel_cells: list[int]
    kept: dict[int, list[int] | None] = field(default_factory=dict)  # None: whole cell
    whole: bool = False  # the notebook whole (:func:`whole_at_tiny`), not trimmed

    def describe(self) -> str:
        if self.whole:
            return f"whole at tiny, hidden tests cleared; panel cells {self.panel_cells}"
        parts = [f"{i}" if s is None else f"{i}[statements {', '.join(map(str, s))}]"
                 for i, s in self.kept.items()]
        return (f"panel cells {self.panel_cells}; kept code cells "
                + (", ".join(parts) or "none"))


def python_source(cell_source: str) -> str:
    """The cell as plain Python (IPython magics and ``!`` lines transformed)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(cell_source)


def is_panel_cell(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else ""
            if name.endswith(PANEL_SUFFIX):
                return True
    return False


def _reads(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """Module-level names the statement reads (now, later): a class body or comprehension
    reads when the statement runs; a function or lambda body only when called."""
    table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
    now = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    later: set[str] = set()
    stack = [(t, False) for t in table.get_children()]
    while stack:
        t, deferred = stack.pop()
        deferred = deferred or (t.get_type() == "function" and t.get_name() not in COMPS)
        names = {s.get_name() for s in t.get_symbols() if s.is_global() and s.is_referenced()}
        (later if deferred else now).update(names)
        stack.extend((c, deferred) for c in t.get_children())
    return now, later


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _target_names(target: ast.expr, out: set[str], mutated: set[str]) -> None:
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            _target_names(t, out, mutated)
    elif isinstance(target, ast.Starred):
        _target_names(target.value, out, mutated)
    elif (base := _base_name(target)) is not None:
        mutated.add(base)


def _bindings(stmt: ast.stmt, imported: set[str]) -> tuple[set[str], set[str]]:
    """(names bound for sure, names bound or mutated maybe) by a top-level statement."""
    sure: set[str] = set()
    maybe: set[str] = set()

    def visit(s: ast.stmt, conditional: bool) -> None:
        bound: set[str] = set()
        mutated: set[str] = set()
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(s.name)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in s.names}
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                _target_names(t, bound, mutated)
        elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
            _target_names(s.target, bound, mutated)
            if isinstance(s, ast.AugAssign):
                mutated |= bound
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                _target_names(t, mutated, mutated)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            f = s.value.func
            if isinstance(f, ast.Attribute) and (base := _base_name(f.value)) not in imported:
                if base is not None:
                    mutated.add(base)
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None:
                    _target_names(item.optional_vars, bound, mutated)
        for node in ast.walk(s):  # walrus anywhere in the statement's own scope
            if isinstance(node, ast.NamedExpr):
                maybe.add(node.target.id)
        (maybe if conditional else sure).update(bound)
        maybe.update(mutated)
        if isinstance(s, (ast.For, ast.AsyncFor)):
            _target_names(s.target, maybe, maybe)
        if isinstance(s, ast.Try):
            maybe.update(h.name for h in s.handlers if h.name)
        inner = conditional or isinstance(s, CONDITIONAL)
        for body in ("body", "orelse", "finalbody"):
            for child in getattr(s, body, []) if not isinstance(
                    s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []:
                visit(child, inner)
        for h in getattr(s, "handlers", []):
            for child in h.body:
                visit(child, True)
        for case in getattr(s, "cases", []):
            for child in case.body:
                visit(child, True)

    visit(stmt, False)
    return sure, maybe | sure


def trim_to_panels(nb: nbformat.NotebookNode, *, name: str = "notebook") -> Trimmed:
    """The trimmed copy of ``nb`` (see the module docstring for the rule).

    Raises:
        SyntaxError: a code cell is not Python after IPython's transforms.
    """
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    trees = {i: ast.parse(python_source(c.source), filename=f"{name} cell {i}")
             for i, c in code}
    panels = [i for i, _ in code if is_panel_cell(trees[i])]
    out = copy.deepcopy(nb)
    for c in out.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    if not panels:
        return Trimmed(out, [], {i: None for i, _ in code})

    imported = {n for t in trees.values() for s in t.body
                if isinstance(s, (ast.Import, ast.ImportFrom))
                for n in _bindings(s, set())[0]}
    writes = {i for i, c in code
              if i < panels[-1] and c.source.lstrip().startswith("%%writefile")}
    whole = {code[0][0], *panels, *writes}
    before_last = [i for i, _ in reversed(code) if i <= panels[-1]]
    later: set[str] = set()  # read by kept functions: needed when the panels run
    while True:
        needed, called = set(later), set()
        kept: dict[int, list[int] | None] = {}
        for i in before_last:
            body = trees[i].body
            chosen = []
            for k in reversed(range(len(body))):
                sure, maybe = _bindings(body[k], imported)
                if i in whole or maybe & needed:
                    chosen.append(k)
                    now, deferred = _reads(body[k])
                    needed = (needed - sure) | now
                    called |= deferred
            if chosen:
                kept[i] = None if i in whole or len(chosen) == len(body) else sorted(chosen)
        if called <= later:
            break
        later |= called
    kept = dict(sorted(kept.items()))

    cells = [nbformat.v4.new_markdown_cell(
        f"**Trimmed for the browser tests** (`tests/browser/trim.py`) from `{name}`: "
        f"{Trimmed(out, panels, kept).describe()}.")]
    for i, stmts in kept.items():
        cell = out.cells[i]
        if stmts is not None:
            src = python_source(nb.cells[i].source)
            cell.source = "\n".join(ast.get_source_segment(src, trees[i].body[k], padded=True)
                                    for k in stmts)
        cells.append(cell)
    out.cells = cells
    return Trimmed(out, panels, kept)


#: How a notebook may read PRESET and still run at ``tiny`` exactly as at ``quick``: its
#: definition, a comparison with "full", or a display inside an f-string.
_SAME_AS_QUICK = re.compile(r'PRESET\s*=\s*os\.environ\.get\(|PRESET\s*[!=]=\s*"full"|\{PRESET(!r)?\}')


def tiny_runs_as_quick(nb: nbformat.NotebookNode) -> bool:
    """True when every use of the preset in the notebook's code is one of
    :data:`_SAME_AS_QUICK`'s (or it never reads PERFLAB_PRESET at all): at ``tiny`` it
    runs the same cells with the same sizes as at ``quick``, which nbval already runs."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    if "PERFLAB_PRESET" not in code:
        return True
    uses = len(re.findall(r"\bPRESET\b", code))
    return uses == len(_SAME_AS_QUICK.findall(code))


def whole_at_tiny(nb: nbformat.NotebookNode, *, name: str = "notebook") -> Trimmed:
    """``nb`` whole (not trimmed), for a notebook whose sizes come from the preset
    (not :func:`tiny_runs_as_quick`): the browser test then runs every cell at ``tiny``,
    so that a preset cannot break a lab unseen (nbval runs the solutions at ``quick``; a
    cell after the panels whose sizes come from the preset, a batch of 1 that BatchNorm
    refuses or an empty sweep, once failed at ``tiny`` alone). Its hidden tests are
    cleared as ``perflab course build`` clears them for students: they draw their own
    cases, whatever the preset, and nbval runs them. The panel cells are found by
    :func:`trim_to_panels`' rule (:func:`is_panel_cell`), with no slice to compute."""
    from nbgrader.preprocessors import ClearHiddenTests

    panels = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and is_panel_cell(
        ast.parse(python_source(c.source), filename=f"{name} cell {i}"))]
    out, _ = ClearHiddenTests().preprocess(copy.deepcopy(nb), {})
    for c in out.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    code = [i for i, c in enumerate(out.cells) if c.cell_type == "code"]
    return Trimmed(out, panels, {i: None for i in code}, whole=True)
