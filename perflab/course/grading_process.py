"""The grading process: a submission's graded calls in a fresh interpreter.

Points never come from the student's notebook kernel: its shell, its hooks (input
transformers, ``pre_run_cell`` callbacks) and its namespace are the student's to change,
and they ran before any probe. So each submission is graded in a *separate* process, in
the same sandbox (:mod:`perflab.course.sandbox`) but its own scratch folder: a plain
``python`` with no IPython and no kernel, which

1. reads its plan (:func:`plan_process`: the cells to run, the checks, their hidden
   cases) from a file in its scratch folder and deletes the file (where the sandbox
   bound it read-only it stays, unread again);
2. finds what the lab's exercises forbid (``forbid=[...]`` of each graded check) and makes
   a stub for each that raises :class:`ForbiddenHelperError` naming the rule
   (:func:`find_helpers`);
3. runs, in notebook order and in one ``__main__`` namespace as Jupyter does, the cells
   the checks need (:func:`_needed`: the answer and given cells that bind a name a
   check reads, their own inputs, every ``%%writefile`` cell; panels and measurements
   no check reads are left out) (``%%writefile`` cells write their module into
   the scratch folder, which the answers import from; ``%time`` runs its statement; a
   magic with no meaning outside a kernel is skipped and logged), a cell that raises is
   logged and the run goes on, as under nbval;
4. at each check's place calls the check's ``student_answer`` on the cases the grader
   drew (:func:`perflab.course.cases.answer_cases`' record, written on a file descriptor
   the grader passed, never on stdout); rank launches the answers start run from here.
   While it runs, what that check forbids is *absent* (:func:`absent`): its stub stands
   in every module that hands it out and under every name of the namespace bound to it
   (a given cell's import, an answer's alias); compiled functions run eagerly
   (:func:`_eager`), so a helper behind ``torch.compile`` meets its stub or the spy;
   and the delegation spy (:func:`perflab.labs.checking.watch_calls`) is the second line,
   for a copy held where no name reaches (a closure, a default argument, a child
   process). Given cells run with every helper in place: the lab's own code may use
   what the student may not.

The grader reads the records and judges them outside the sandbox
(:func:`perflab.course.cases.judge_answers`). Nothing the notebook kernel did reaches
this process: it never starts one.

Magics are translated in the grader, with IPython's own input transformer
(:class:`IPython.core.inputtransformer2.TransformerManager`), into calls on
:class:`MagicRunner`, a ``get_ipython()`` of this process that knows only the magics an
answer needs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable

__all__ = ["SPEC_NAME", "ENV_FD", "ForbiddenHelperError", "plan_process", "kernel_notebook",
           "Helper", "find_helpers", "absent", "MagicRunner", "read_records", "main"]

#: The plan's file name in the grading process's scratch folder (deleted once read).
SPEC_NAME = "grading-plan.json"
#: The environment variable naming the records' file descriptor (removed once read).
ENV_FD = "PERFLAB_GRADING_FD"
#: Line magics that change nothing a graded answer computes: skipped, not an error.
_NO_OP_MAGICS = frozenset({"matplotlib", "load_ext", "reload_ext", "config", "precision",
                           "pdb", "xmode", "autoreload", "aimport", "who", "whos",
                           "pylab", "alias_magic"})
#: Magics that run their statement or cell body once, as plain code.
_RUN_MAGICS = frozenset({"time", "timeit", "capture", "prun", "memit", "lprun"})


class ForbiddenHelperError(RuntimeError):
    """Raised by the stub that replaces a helper an exercise asks the student to write."""


# --------------------------------------------------------------------------- the grader
def plan_process(assembled, *, cell_timeout_s: float) -> dict:
    """The grading process's plan for an assembled submission
    (:func:`perflab.course.answers.assemble`): its code cells in order, as plain Python
    (magics translated), each graded check at its place with its hidden cases.

    Returns:
        ``{"steps": [{"kind": "cell", "n": int, "id": str, "first_line": str,
        "source": str} or {"kind": "check", "grade_id": str, "answer_source": str,
        "cases": list, "forbid": list[str], "compiles": bool, "needs": [cell id]}, ...],
        "forbid": [every forbidden name], "cell_timeout_s": float}``; JSON data. Only
        the cells the checks need are there (:func:`_needed`).

    Note:
        A check in the older ``### JUDGE`` format runs its probe here (a
        ``{"kind": "probe", "grade_id", "answer_source", "reads"}`` step whose printed
        facts line is its record); convert it: its facts are the student's code's word.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    steps: list[dict] = []
    forbid: list[str] = []
    for n, cell in enumerate(assembled.notebook.cells):
        if cell.cell_type != "code":
            continue
        gid = cell.metadata.get("perflab", {}).get("probe")
        if gid is not None:
            part = assembled.checks[gid].graded
            if part is None:   # the older format: its probe prints the facts its judge reads
                probe = cell.source
                steps.append({"kind": "probe", "grade_id": gid, "answer_source": probe,
                              "reads": list(assembled.checks[gid].names),
                              "needs": list(cell.metadata.get("perflab", {}).get("needs", []))})
                continue
            steps.append({"kind": "check", "grade_id": gid,
                          "answer_source": part.answer_source,
                          "cases": assembled.cases[gid], "forbid": list(part.forbid),
                          "compiles": bool(cell.metadata.get("perflab", {}).get("compiles")),
                          "needs": list(cell.metadata.get("perflab", {}).get("needs", []))})
            forbid += [f for f in part.forbid if f not in forbid]
            continue
        try:
            source = transform(cell.source)
        except Exception:  # noqa: BLE001 - the cell's own SyntaxError shows when it runs
            source = cell.source
        steps.append({"kind": "cell", "n": n, "source": source, "id": cell.get("id"),
                      "first_line": cell.source.strip().split("\n", 1)[0][:80]})
    steps = _needed(steps)
    return {"steps": steps, "forbid": forbid, "cell_timeout_s": float(cell_timeout_s)}


def kernel_notebook(assembled):
    """The assembled notebook as the kernel runs it (its log, what the student's cells
    print): every check cell replaced by a note, so no graded call runs in the kernel."""
    import copy

    import nbformat

    nb = copy.deepcopy(assembled.notebook)
    for i, cell in enumerate(nb.cells):
        gid = cell.get("metadata", {}).get("perflab", {}).get("probe")
        if cell.cell_type == "code" and gid is not None:
            nb.cells[i] = nbformat.v4.new_markdown_cell(
                f"*(check `{gid}`: graded in the grading process, not in this kernel)*")
    return nb


def read_records(path: Path) -> tuple[dict[str, list[dict]], list[dict], int]:
    """The grading process's records: ``(grade_id -> its check records, cell records
    (and a ``{"stopped": where, "message": ...}`` record when a step ran past the
    per-cell limit), lines that were not a JSON record)``. More than one record for a check is tampering
    (the caller decides)."""
    checks: dict[str, list[dict]] = {}
    cells: list[dict] = []
    bad = 0
    if not path.exists():
        return checks, cells, bad
    for ln in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            bad += 1 if ln.strip() else 0
            continue
        if not isinstance(rec, dict):
            bad += 1
        elif isinstance(rec.get("probe"), str):
            checks.setdefault(rec["probe"], []).append(rec)
        elif isinstance(rec.get("cell"), int) or isinstance(rec.get("stopped"), str):
            cells.append(rec)
        else:
            bad += 1
    return checks, cells, bad


def _names(source: str) -> tuple[set[str], set[str], bool]:
    """``(names a cell binds at its top level, names it reads from the module's
    namespace, whether it writes a module with %%writefile)``; a cell that does not parse
    binds nothing and reads nothing (it runs only if a check names it).

    Scopes are followed as Python does: a function's parameters and the names it assigns
    are its own (a read of them is no read of the namespace), a comprehension's targets
    are the comprehension's, and a function body's reads of other names are reads of the
    namespace (at call time). A class body's names are the class's. ``global x`` in a
    function counts as binding ``x`` (calling it may)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(), set(), False
    bound: set[str] = set()
    read: set[str] = set()
    writes = False
    comprehensions = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def stored(nodes) -> set[str]:
        out = set()
        for n in nodes:
            for sub in ast.walk(n):
                if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                    out.add(sub.id)
                elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.add(sub.name)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    out.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.Global):
                    bound.update(sub.names)
        return out

    def visit(node: ast.AST, local: frozenset[str] | None) -> None:
        nonlocal writes
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda) and local is None:
                bound.add(node.name)
            a = node.args
            for d in [*getattr(node, "decorator_list", []), *a.defaults,
                      *[k for k in a.kw_defaults if k is not None]]:
                visit(d, local)
            params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs,
                                      *filter(None, [a.vararg, a.kwarg])]}
            body = node.body if isinstance(node.body, list) else [node.body]
            inner = frozenset((local or frozenset()) | params | stored(body))
            for b in body:
                visit(b, inner)
            return
        if isinstance(node, ast.ClassDef):
            if local is None:
                bound.add(node.name)
            for d in [*node.decorator_list, *node.bases, *[k.value for k in node.keywords]]:
                visit(d, local)
            inner = frozenset((local or frozenset()) | stored(node.body))
            for b in node.body:
                visit(b, inner)
            return
        if isinstance(node, comprehensions):
            targets = stored([g.target for g in node.generators])
            inner = frozenset((local or frozenset()) | targets)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                if local is None or node.id not in local:
                    read.add(node.id)
            elif local is None:
                bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and local is None:
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "run_cell_magic" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "writefile":
            writes = True
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, None)
    return bound, read, writes


def _needed(steps: list[dict]) -> list[dict]:
    """The steps the checks need, in order: every check; every cell that binds a name a
    check's ``student_answer`` reads, or a name a needed cell reads (the closure, each
    name from the cells that bind it *before* the reader); every ``%%writefile`` cell (a
    module the answers import); the cells a check names in its reference metadata
    (``"perflab": {"needs": [cell id, ...]}``: a cell whose effect is not a name, such
    as seeding a generator). Panels, plots and measurements no check reads are left out,
    so the grading process runs only what its answers depend on."""
    info = {i: _names(s["source"] if s["kind"] == "cell" else s["answer_source"])
            for i, s in enumerate(steps)}
    for i, s in enumerate(steps):   # an older probe reports its judge's names by string
        info[i][1].update(s.get("reads", []))
    keep = {i for i, s in enumerate(steps) if s["kind"] != "cell" or info[i][2]}
    named = {n for s in steps if s["kind"] == "check" for n in s.get("needs", [])}
    keep |= {i for i, s in enumerate(steps) if s["kind"] == "cell" and s.get("id") in named}
    todo = sorted(keep)
    while todo:
        j = todo.pop()
        for name in info[j][1]:
            for i in range(j):
                if i not in keep and name in info[i][0] and steps[i]["kind"] == "cell":
                    keep.add(i)
                    todo.append(i)
    return [s for i, s in enumerate(steps) if i in keep]


# -------------------------------------------------------------- the sandbox: the process
def _stub(name: str, real: Any) -> Any:
    why = (f"{name} is not available in graded code: this exercise asks you to write it "
           "yourself (perflab grading replaces it before your answers load)")

    def refuse(*args, **kwargs):
        raise ForbiddenHelperError(why)

    if isinstance(real, type):
        return type(real.__name__, (), {"__new__": lambda cls, *a, **k: refuse(),
                                        "__doc__": why, "__module__": real.__module__})
    refuse.__name__ = getattr(real, "__name__", name.rpartition(".")[2])
    refuse.__qualname__ = refuse.__name__
    refuse.__doc__ = why
    return refuse


@dataclasses.dataclass
class Helper:
    """A forbidden helper: the real object, the stub that replaces it, and the modules
    that hand it out (``(module, attribute)``)."""

    real: Any
    stub: Any
    homes: list[tuple[Any, str]]


def find_helpers(names: Iterable[str]) -> dict[str, Helper]:
    """Each forbidden helper of ``names`` with its stub (which raises
    :class:`ForbiddenHelperError` naming the rule) and the places a student would import
    it from: the ``perflab`` package (a public name), the module that exports it, the
    module that defines it, and for a dotted path the module it names.

    ``names`` are public perflab names (``"mfu_pct"``) or dotted paths
    (``"torch.utils.flop_counter.FlopCounterMode"``), as a check's ``forbid``. A name
    under the grader-only ``perflab.course.references`` that does not import here (the
    sandbox hides it) is left out: nothing can call it.

    Raises:
        ValueError: a name names nothing (a bug in the reference notebook).
    """
    import importlib

    from perflab.course.cases import GRADER_ONLY
    from perflab.labs.checking import _home, resolve

    found: dict[str, Helper] = {}
    for name in names:
        if name.startswith(GRADER_ONLY):
            try:
                importlib.import_module(name.rpartition(".")[0])
            except ModuleNotFoundError:
                continue
        obj = resolve(name)
        attr = name.rpartition(".")[2]
        modules = {name.rpartition(".")[0]} if "." in name else {_home(name).__name__,
                                                                 "perflab"}
        if isinstance(getattr(obj, "__module__", None), str):
            modules.add(obj.__module__)
        homes = []
        for dotted in sorted(modules):
            try:
                module = sys.modules.get(dotted) or importlib.import_module(dotted)
            except ImportError:
                continue
            if dotted == "perflab" or getattr(module, attr, None) is obj:
                homes.append((module, attr))
        found[name] = Helper(obj, _stub(name, obj), homes)
    return found


_MISSING = object()


@contextlib.contextmanager
def absent(helpers: dict[str, Helper], names: Iterable[str], namespace: dict):
    """While the block runs, each helper of ``names`` is its stub in its modules and in
    ``namespace`` (every name there bound to the real object: an import in a given
    cell, an alias in an answer); everything is put back after the block."""
    swaps: list[tuple[dict, str, Any, Any]] = []
    for name in names:
        h = helpers.get(name)
        if h is None:
            continue
        places = [(m.__dict__, attr) for m, attr in h.homes]
        places += [(namespace, k) for k, v in list(namespace.items()) if v is h.real]
        for where, key in places:
            swaps.append((where, key, where.get(key, _MISSING), h.stub))
            where[key] = h.stub
    try:
        yield
    finally:
        for where, key, before, stub in reversed(swaps):
            if where.get(key, _MISSING) is stub:
                if before is _MISSING:
                    where.pop(key, None)
                else:
                    where[key] = before


class MagicRunner:
    """``get_ipython()`` in the grading process: runs the few magics an answer cell may
    hold (IPython's transformer turned them into calls on this object in the grader).

    ``%%writefile [-a] FILE`` writes its body to FILE (relative to the scratch folder);
    ``%time``/``%timeit``/``%%capture`` and the other timing magics run their code once;
    display and configuration magics (``%matplotlib``, ``%load_ext``) do nothing; any
    other magic raises :class:`NotImplementedError` naming it, which fails that cell only.
    Shell escapes (``!cmd``) do not run.
    """

    def __init__(self, namespace: dict) -> None:
        self._ns = namespace

    def _run(self, code: str) -> Any:
        try:
            compiled = compile(code, "<magic>", "eval")
        except SyntaxError:
            exec(compile(code, "<magic>", "exec"), self._ns)  # noqa: S102 - the student's cell
            return None
        return eval(compiled, self._ns)  # noqa: S307 - the student's own expression

    def run_line_magic(self, name: str, line: str) -> Any:
        if name in _RUN_MAGICS:
            return self._run(_strip_options(line))
        if name in _NO_OP_MAGICS:
            return None
        raise NotImplementedError(f"the magic %{name} does not run in the grading process")

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        if name == "writefile":
            args = shlex.split(line)
            append = "-a" in args or "--append" in args
            files = [a for a in args if not a.startswith("-")]
            if len(files) != 1:
                raise ValueError(f"%%writefile needs one file name, got {line!r}")
            with open(files[0], "a" if append else "w", encoding="utf-8") as f:
                f.write(cell)
            return None
        if name in _RUN_MAGICS:
            return self._run(cell)
        raise NotImplementedError(f"the cell magic %%{name} does not run in the grading "
                                  "process")

    def system(self, cmd: str) -> None:
        print(f"[grading process] shell command not run: !{cmd}", file=sys.stderr)

    getoutput = system


def _strip_options(line: str) -> str:
    """``%timeit -n 3 -r 1 f(x)`` -> ``f(x)``: leading ``-x`` options and their values."""
    words = line.split()
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in ("-n", "-r", "-o") and words[i] != "-o" else 1
    return " ".join(words[i:]) if i else line


class _CellTimeout(BaseException):
    """A cell or graded call ran past the per-cell limit (not an Exception: an answer's
    ``except Exception`` cannot swallow it)."""


def _on_alarm(signum, frame):
    raise _CellTimeout()


@contextlib.contextmanager
def _eager(step: dict):
    """A check that forbids a helper runs with compiled functions run eagerly
    (``torch.compiler.set_stance("force_eager")``): a helper hidden behind
    ``torch.compile`` then runs as Python, where its stub is and the spy sees it. A
    check whose graded call must compile (Lab 05's graph breaks and recompiles) says so
    in its reference metadata: ``"perflab": {"compiles": true}``."""
    torch = sys.modules.get("torch")
    if not step["forbid"] or step.get("compiles") or torch is None:
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield


def _display(*objs, **kwargs) -> None:
    for obj in objs:
        text = repr(obj)
        print(text if len(text) <= 2000 else text[:2000] + " [...]")


def main(argv: list[str] | None = None) -> int:
    """Run a grading plan (``argv[0]``: its path) in this process; see the module doc.
    Returns the exit status: 0 once every step was tried (a cell that raised included),
    2 when a step ran past the per-cell limit (the rest is not run)."""
    argv = sys.argv[1:] if argv is None else argv
    plan_path = Path(argv[0])
    plan = json.loads(plan_path.read_text())
    try:
        plan_path.unlink()
    except OSError:  # bound read-only into the sandbox's scratch: it stays, unread again
        pass
    fd = int(os.environ.pop(ENV_FD))
    os.set_inheritable(fd, False)
    channel = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def record(rec: dict) -> None:
        channel.write(json.dumps(rec) + "\n")
        channel.flush()

    from perflab.course.cases import FACTS_MARKER, _answer_one, _round_trip
    from perflab.labs.checking import watch_calls

    helpers = find_helpers(plan["forbid"])
    main_module = sys.modules["__main__"]
    ns = main_module.__dict__
    runner = MagicRunner(ns)
    ns["get_ipython"] = lambda: runner
    ns["display"] = _display
    # The answers import their %%writefile modules from here, as from a notebook's
    # folder; appended, so a file here cannot shadow an installed module.
    sys.path.append(os.getcwd())
    limit = max(1, int(plan["cell_timeout_s"]))
    signal.signal(signal.SIGALRM, _on_alarm)
    for step in plan["steps"]:
        t0 = time.perf_counter()
        signal.alarm(limit)
        try:
            if step["kind"] == "cell":
                code = compile(step["source"], f"<cell {step['n'] + 1}>", "exec")
                exec(code, ns)  # noqa: S102 - the notebook's cells, sandboxed
                record({"cell": step["n"], "first_line": step["first_line"],
                        "seconds": time.perf_counter() - t0})
            elif step["kind"] == "probe":
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    exec(compile(step["answer_source"], f"<check {step['grade_id']}>",
                                 "exec"), ns)  # noqa: S102 - an older check's probe
                record({"probe": step["grade_id"], "facts_lines": [
                    ln for ln in printed.getvalue().splitlines()
                    if ln.startswith(FACTS_MARKER)], "seconds": time.perf_counter() - t0})
            else:
                scope: dict = dict(ns)
                exec(compile(step["answer_source"], f"<check {step['grade_id']}>", "exec"),
                     scope)  # noqa: S102 - the check's student_answer, defined here
                answer = scope["student_answer"]
                targets = {n: helpers[n].real for n in step["forbid"] if n in helpers}
                with absent(helpers, step["forbid"], ns), absent(helpers, step["forbid"], scope), \
                        _eager(step), watch_calls(targets) as delegated:
                    got = [_answer_one(answer, case) for case in step["cases"]]
                record({"probe": step["grade_id"],
                        **_round_trip({"got": got, "delegated": list(delegated)}),
                        "seconds": time.perf_counter() - t0})
        except _CellTimeout:
            where = (f"code cell {step['n'] + 1} ({step['first_line']!r})"
                     if step["kind"] == "cell" else f"check {step['grade_id']!r}")
            record({"stopped": where,
                    "message": f"{where} ran past the per-cell limit ({limit} s)"})
            return 2
        except (Exception, SystemExit) as e:  # noqa: BLE001 - logged, the run goes on (a
            # cell's exit() or sys.exit() ends that cell, as in a kernel, not the process)
            traceback.print_exc()
            if step["kind"] == "cell":
                record({"cell": step["n"], "first_line": step["first_line"],
                        "seconds": time.perf_counter() - t0,
                        "error": f"{type(e).__name__}: {e}"[:300]})
            else:
                record({"probe": step["grade_id"], "error": f"{type(e).__name__}: {e}"[:300],
                        "seconds": time.perf_counter() - t0})
        finally:
            signal.alarm(0)
    return 0
