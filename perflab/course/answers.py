"""A submission's answers: taken by ``grade_id``, scanned, put into the reference notebook.

A submission is hostile, so grading keeps only its *answers*: the source of each cell
that the reference marks as a solution cell (nbgrader ``solution: true``), matched by
``grade_id``. :func:`assemble` puts them into the reference notebook's own cells (cells
the student added, or edited outside solution cells, never run), replaces every check
cell by its probe (:mod:`perflab.course.checks`), leaves out the cells tagged
:data:`SKIP_TAG` (panels, sweeps, long measurements), and strips everything secret: the
reference's solutions, written answers, judges, hidden assertions and stored outputs.

:func:`scan_answer` finds what in an answer (``%%writefile`` bodies included) reaches
into the machinery (the interpreter, the kernel, the grader): a *review* finding for the
instructor (the ``review`` column), never a deduction; points come only from answers on
hidden cases (:mod:`perflab.course.cases`). Honest idioms (``import os`` for
``os.cpu_count()``, ``self.__class__.__name__``, ``%time``, ``sys.getsizeof``,
``inspect.signature``, ``types.SimpleNamespace``, ``cProfile.Profile()``) are not
findings; the documented torch settings (:data:`COURSE_ALLOW`:
``torch.backends.cudnn.benchmark = True``, ...) are allowed in every answer, and an
exercise can allow more (solution-cell metadata ``perflab: {allow: [...]}``): both through
:func:`allowances`. The *exec family* (``exec``/``eval``/``compile``, ``runpy``,
``cProfile``/``profile`` ``run``/``runctx``, ``importlib`` loading a file,
``types.FunctionType``, ``code.replace``, ``__code__`` assignment) is always a finding: it
is how a second copy of a forbidden helper's code is made at run time.
The "predict, then explain" cells (nbgrader manually graded cells) are collected for
the instructor by :mod:`perflab.course.written`.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import re

import nbformat

from perflab.course.cases import draw_cases
from perflab.course.checks import (CheckCell, graded_functions, graded_probe, parse_python,
                                   probe_source, split_check)

__all__ = ["SKIP_TAG", "COURSE_ALLOW", "Flag", "Assembled", "solution_ids", "answers_of",
           "scan_answer", "assemble", "allowances"]

#: Cells with this tag do not run in grading (experiment panels, sweeps, long
#: measurements): no graded answer may need what they compute.
SKIP_TAG = "grading-skip"

#: Modules whose import reaches into the interpreter, the kernel or the grading machinery.
#: ``os``, ``sys``, ``pathlib``, ``io`` and ``time`` are not here: honest answers use
#: ``os.cpu_count()``, ``os.path``, ``sys.getsizeof``, ``Path``; what of them reaches into
#: the machinery is in :data:`BLOCKED_MODULE_ATTRS`. A private module (``_pickle``,
#: ``_json``: a name starting with ``_``) is always a finding.
BLOCKED_MODULES = frozenset({
    "builtins", "ctypes", "gc", "IPython", "ipykernel",
    "importlib", "subprocess", "signal", "socket", "shutil", "pty", "atexit",
    "code", "codeop", "marshal", "pickle", "dill", "tracemalloc", "faulthandler",
    "jupyter_client", "zmq", "nbformat", "nbval", "pytest", "perflab.course", "resource",
    "perflab.labs.checking", "multiprocessing", "threading", "asyncio", "runpy", "unittest",
    "sysconfig", "site", "linecache", "traceback", "trace", "pdb", "bdb", "doctest",
    "pkgutil", "zipimport", "imp", "py_compile", "compileall"})
#: Modules of which honest answers use a few names (``inspect.signature``,
#: ``types.SimpleNamespace``, ``cProfile.Profile``): importing them is not a finding, any
#: other name of them is (``inspect.currentframe``, ``types.FunctionType``,
#: ``cProfile.run``), and so is the module object itself passed around
#: (``getattr(inspect, name)``).
PARTLY_OPEN_MODULES: dict[str, frozenset[str]] = {
    "inspect": frozenset({
        "signature", "Signature", "Parameter", "BoundArguments", "isclass", "isfunction",
        "ismethod", "isroutine", "isbuiltin", "ismodule", "isabstract", "isgenerator",
        "isgeneratorfunction", "iscoroutinefunction", "isdatadescriptor", "getdoc",
        "cleandoc", "getfullargspec"}),
    "types": frozenset({"SimpleNamespace", "MappingProxyType", "NoneType", "GeneratorType"}),
    "cProfile": frozenset({"Profile"}),
    "profile": frozenset({"Profile"}),
}
#: Names (attributes of anything, or bare names) that run code built at run time or make
#: a second copy of a function's code: the exec family. ``runcall(fn, ...)`` calls a
#: function and is honest; ``run``/``runctx`` run a string of source.
EXEC_FAMILY = frozenset({
    "runctx", "run_path", "run_module", "spec_from_file_location", "spec_from_loader",
    "module_from_spec", "exec_module", "load_module", "SourceFileLoader",
    "SourcelessFileLoader", "ExtensionFileLoader", "source_to_code", "FunctionType",
    "CodeType", "LambdaType"})
#: Constructors of profilers, tracers and debuggers whose ``.run(source)`` executes a
#: string (``cProfile.Profile().run("...")``): the last part of the called name.
_RUNNERS = ("Profile", "Profiler", "Trace", "Pdb", "Bdb")
#: Modules reached as an attribute of another module that imported them
#: (``helpers.importlib``): the import check would not see them.
_MODULE_ATTRS = frozenset({"builtins", "importlib", "runpy", "subprocess", "marshal",
                           "codeop"})
#: Documented torch settings an honest answer assigns (``torch.backends.cudnn.benchmark =
#: True``, Lab 08's reference): allowed in every answer (:func:`allowances`). They are
#: exact scan keys; the two ``config`` entries allow any key of that config module.
COURSE_ALLOW = (
    "module attribute torch.backends.cudnn.benchmark",
    "module attribute torch.backends.cudnn.deterministic",
    "module attribute torch.backends.cudnn.enabled",
    "module attribute torch.backends.cudnn.allow_tf32",
    "module attribute torch.backends.cuda.matmul.allow_tf32",
    "module attribute torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "module attribute torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "module attribute torch.backends.mkldnn.enabled",
    "module attribute torch._dynamo.config",
    "module attribute torch._inductor.config",
)
#: Attributes of ``os`` and ``sys`` that run programs, write files, or reach frames,
#: modules and hooks.
BLOCKED_MODULE_ATTRS = frozenset({
    "os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.setsid",
    "os.open", "os.write", "os.dup", "os.dup2", "os.remove", "os.unlink", "os.rename",
    "os.replace", "os.chmod", "os.symlink", "os.link", "os.truncate", "os.execv",
    "os.execve", "os.execl", "os.execvp", "os.spawnv", "os.spawnl", "os.posix_spawn",
    "os.fdopen", "os.pipe", "os.putenv",
    "sys.modules", "sys._getframe", "sys.settrace", "sys.setprofile", "sys.gettrace",
    "sys.getprofile", "sys._current_frames", "sys.meta_path",
    "sys.path_hooks", "sys.addaudithook", "sys.displayhook", "sys.excepthook",
    "sys.__stdout__", "sys.__stderr__", "sys.stdout", "sys.stderr", "sys.stdin"})
#: Names that hand out the interpreter's machinery.
BLOCKED_NAMES = frozenset({
    "get_ipython", "__import__", "__builtins__", "exec", "eval", "compile", "globals",
    "locals", "vars", "breakpoint", "setattr", "delattr", "__loader__", "__spec__"})
#: Attributes that lead from any object to frames, code, globals or other classes.
#: ``x.__class__.__name__`` (and ``__qualname__``) is not a finding: a ``__repr__`` uses it.
BLOCKED_ATTRS = frozenset({
    "__class__", "__subclasses__", "__globals__", "__code__", "__dict__", "__builtins__",
    "__mro__", "__bases__", "__base__", "__closure__", "__func__", "__self__",
    "__getattribute__", "__setattr__", "__delattr__", "__reduce__", "__reduce_ex__",
    "__import__", "__loader__", "__spec__", "f_globals", "f_locals", "f_back", "f_builtins",
    "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "co_code", "write_text",
    "write_bytes", "unlink", "rmdir", "chmod", "symlink_to"})
#: Names that usually hold modules in the labs: assigning their attributes patches code.
MODULE_NAMES = frozenset({"torch", "perflab", "np", "numpy", "nn", "F", "json", "math",
                          "time", "random", "functools", "itertools", "collections",
                          "statistics", "pd", "pandas", "plt", "matplotlib", "builtins",
                          "sys", "os", "IPython", "types", "widgets", "ipywidgets"})
#: Cell magics whose body is Python the scan reads as Python (``%%writefile`` bodies are
#: modules the notebook imports: they are scanned like any answer).
_BODY_MAGICS = ("%%writefile", "%%file", "%%time", "%%timeit", "%%capture")
#: Line magics that only time or show a statement: the statement is scanned, the magic
#: is not a finding.
_LINE_MAGIC = re.compile(r"^(\s*)%(?:time|timeit)((?:\s+-[a-zA-Z](?:\s*\d+)?)*)\s+(\S.*)$")


@dataclasses.dataclass(frozen=True)
class Flag:
    """An answer line that reaches into the machinery."""

    grade_id: str
    line: int
    """1-based line of the answer cell."""
    key: str
    """What it does: ``import os``, ``name get_ipython``, ``module attribute torch.x``..."""
    text: str = ""
    """The line itself, shortened."""

    def __str__(self) -> str:
        return f"{self.grade_id} line {self.line}: {self.key}"


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def solution_ids(reference: nbformat.NotebookNode) -> list[str]:
    """``grade_id`` of every code solution cell of the reference, in order."""
    return [_nbg(c)["grade_id"] for c in reference.cells
            if c.cell_type == "code" and _nbg(c).get("solution") and _nbg(c).get("grade_id")]


def answers_of(submission: nbformat.NotebookNode, reference: nbformat.NotebookNode
               ) -> tuple[dict[str, str], list[str]]:
    """(``grade_id -> source`` of the student's answer cells, notes for the instructor).

    Only cells whose ``grade_id`` names a code solution cell of the reference count; the
    first one wins when a student duplicated it. Missing answers are simply absent.
    """
    wanted, answers, notes = set(solution_ids(reference)), {}, []
    for cell in submission.cells:
        gid = _nbg(cell).get("grade_id")
        if gid not in wanted or cell.get("cell_type") != "code":
            continue
        if gid in answers:
            notes.append(f"answer cell {gid!r} appears more than once; the first is graded")
            continue
        src = cell.get("source", "")
        answers[gid] = "".join(src) if isinstance(src, list) else str(src)
    for gid in sorted(wanted - set(answers)):
        notes.append(f"answer cell {gid!r} is missing from the submission")
    return answers, notes


def _python_of(source: str) -> str:
    """The Python IPython runs for a cell (magics and ``!`` become ``get_ipython()``),
    except that the body of a ``%%writefile`` (and timing) cell magic, and the statement
    of a ``%time``/``%timeit`` line, are kept as the Python they are, on their own lines
    (so line numbers still match the cell)."""
    lines = source.split("\n")
    if lines and lines[0].strip().startswith(_BODY_MAGICS):
        return "\n".join(["", *lines[1:]])
    source = "\n".join(_LINE_MAGIC.sub(lambda m: m.group(1) + m.group(3), ln) for ln in lines)
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - an untransformable cell fails at run time anyway
        return source


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _blocked_module(name: str) -> bool:
    return name.startswith("_") or any(name == m or name.startswith(m + ".")
                                       for m in BLOCKED_MODULES)


_MODE = re.compile(r"[rwxabt+U]{1,4}")   # a constant that reads as an open() mode


def _writes(call: ast.Call) -> bool:
    """``open(path, mode)`` (or ``io.open``, ``gzip.open``, ``Path(p).open(mode)``)
    with a mode that writes: a constant mode with ``w``, ``a``, ``x`` or ``+``, or a
    computed ``mode=``."""
    name_call = isinstance(call.func, ast.Name)
    mode = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        if name_call:
            mode = call.args[1] if len(call.args) > 1 else None
        else:  # Path(p).open("w") or io.open(p, "w"): the first constant that is a mode
            mode = next((a for a in call.args[:2] if isinstance(a, ast.Constant)
                         and isinstance(a.value, str) and _MODE.fullmatch(a.value)), None)
    if mode is None:
        return False
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return True  # a computed mode: assume the worst
    return any(ch in mode.value for ch in "wax+")


def _runner_call(node: ast.AST, runners: set[str]) -> bool:
    """``node`` is a profiler/tracer/debugger: ``cProfile.Profile()`` or a name bound
    to one in the cell."""
    if isinstance(node, ast.Name):
        return node.id in runners
    return isinstance(node, ast.Call) and _dotted(node.func).rpartition(".")[2].endswith(_RUNNERS)


def scan_answer(grade_id: str, source: str, allow: tuple[str, ...] | list[str] = ()
                ) -> list[Flag]:
    """Flag the lines of one answer that reach into the machinery.

    Flagged: importing :data:`BLOCKED_MODULES` or a private module (``_pickle``); a name
    of :data:`PARTLY_OPEN_MODULES` that is not one of its honest ones
    (``inspect.currentframe``, ``from types import FunctionType``) or the module object
    itself passed around; using :data:`BLOCKED_NAMES` (which covers IPython magics other
    than ``%time``/``%timeit`` and ``!`` shell lines, which run through
    ``get_ipython()``); reading :data:`BLOCKED_ATTRS` (frames, globals, subclasses, file
    writes) or :data:`BLOCKED_MODULE_ATTRS` (also reached through another module:
    ``helpers.sys.settrace``), or a module through another one (``helpers.importlib``);
    ``getattr``/``hasattr`` with a dunder or exec-family string; assigning an attribute
    of a module (``torch.x = ...``, ``perflab.run = ...``); ``open`` for writing (also
    ``Path.open``, ``io.open``). The *exec family* (key ``exec family ...``): a name of
    :data:`EXEC_FAMILY` (``runctx``, ``run_path``, ``spec_from_file_location``,
    ``exec_module``, ``SourceFileLoader``, ``FunctionType``, ``CodeType``) as an attribute
    of anything or a bare name, ``.run(...)`` on a profiler, tracer or debugger
    (``cProfile.Profile().run(src)``), ``.replace(co_...=...)`` on a code object,
    assigning ``__code__``; ``exec``, ``eval`` and ``compile`` are ``name`` keys. A
    ``%%writefile`` cell's body is scanned as the module it is. ``allow`` entries exempt
    flags whose key equals them or starts with them (``"import os"``, ``"module
    attribute torch.backends"``); grading passes :func:`allowances` (the cell's metadata
    and :data:`COURSE_ALLOW`).

    A static scan cannot see everything a determined student can build at run time
    (a string of source handed to ``timeit`` or ``torch.utils.benchmark.Timer`` through a
    variable, names built from strings); it is the instructor's signal, and the verdict
    does not depend on it (see :mod:`perflab.course.checks`; the run-time spy,
    :func:`perflab.labs.checking.watch_calls`, sees a forbidden helper's code however it
    was copied). An answer that is not valid Python is not flagged: it fails when it runs.
    """
    code = _python_of(source)
    try:
        tree = parse_python(code)
    except SyntaxError:
        return []
    lines = code.splitlines()
    imported, partly, runners = set(), {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            partly.update({a.asname or a.name: a.name for a in node.names
                           if a.name in PARTLY_OPEN_MODULES})
        elif isinstance(node, ast.ImportFrom):
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and _runner_call(node.value, set()):
            runners.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                and _runner_call(node.context_expr, set()):
            runners.add(node.optional_vars.id)
    modules = MODULE_NAMES | imported
    found: list[tuple[int, str]] = []
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        ln = getattr(node, "lineno", 0)
        up = parents.get(id(node))
        if isinstance(node, ast.Import):
            found += [(ln, f"import {a.name}") for a in node.names if _blocked_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 0 and _blocked_module(mod):
                found.append((ln, f"import {mod}"))
            elif node.level == 0 and mod in PARTLY_OPEN_MODULES:
                found += [(ln, f"import {mod}.{a.name}") for a in node.names
                          if a.name not in PARTLY_OPEN_MODULES[mod]]
            found += [(ln, f"exec family {a.name}") for a in node.names if a.name in EXEC_FAMILY]
        elif isinstance(node, ast.Name):
            if node.id in BLOCKED_NAMES:
                found.append((ln, f"name {node.id}"))
            if node.id in EXEC_FAMILY:
                found.append((ln, f"exec family {node.id}"))
            if node.id in partly and isinstance(node.ctx, ast.Load):
                mod = partly[node.id]
                if isinstance(up, ast.Attribute) and up.value is node:
                    if up.attr not in PARTLY_OPEN_MODULES[mod]:
                        found.append((ln, f"attribute {mod}.{up.attr}"))
                else:
                    found.append((ln, f"module {mod}"))
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr in BLOCKED_ATTRS and not (
                    node.attr == "__class__" and isinstance(up, ast.Attribute)
                    and up.attr in ("__name__", "__qualname__")):
                found.append((ln, f"attribute {node.attr}"))
            tail = ".".join(dotted.split(".")[-2:])
            if tail in BLOCKED_MODULE_ATTRS and (_root(node) in ("os", "sys")
                                                 or dotted.count(".") > 1):
                found.append((ln, f"attribute {tail}"))
            if node.attr in _MODULE_ATTRS and dotted.count(".") >= 1 and dotted != node.attr:
                found.append((ln, f"attribute {node.attr}"))
            if isinstance(node.ctx, (ast.Store, ast.Del)) and _root(node) in modules:
                found.append((ln, f"module attribute {dotted}"))
            if node.attr in ("run_line_magic", "run_cell_magic", "system", "getoutput"):
                found.append((ln, f"IPython {node.attr}"))
            if node.attr in EXEC_FAMILY:
                found.append((ln, f"exec family {node.attr}"))
            if node.attr == "__code__" and isinstance(node.ctx, (ast.Store, ast.Del)):
                found.append((ln, "exec family __code__ assignment"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name == "open" and _writes(node):
                found.append((ln, "open for writing"))
            elif (isinstance(func, ast.Name) and name in ("getattr", "hasattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and (str(node.args[1].value).startswith("__")
                       or node.args[1].value in EXEC_FAMILY)):
                found.append((ln, f"{name} {node.args[1].value}"))
            elif isinstance(func, ast.Attribute) and name == "run" and (
                    _runner_call(func.value, runners)
                    or partly.get(_root(func) or "") in ("cProfile", "profile")):
                found.append((ln, "exec family run"))
            elif name == "replace" and any((k.arg or "").startswith("co_") for k in node.keywords):
                found.append((ln, "exec family code.replace"))
    flags = []
    for ln, key in sorted(set(found)):
        if any(key == a or key.startswith(a + ".") or key.startswith(a + " ") for a in allow):
            continue
        text = lines[ln - 1].strip()[:120] if 0 < ln <= len(lines) else ""
        flags.append(Flag(grade_id, ln, key, text))
    return flags


@dataclasses.dataclass
class Assembled:
    """The notebook that runs in the sandbox, and what the grader keeps outside."""

    notebook: nbformat.NotebookNode
    checks: dict[str, CheckCell]
    """``grade_id -> CheckCell`` of every autograded check (judges stay here)."""
    points: dict[str, float]
    """``grade_id -> points`` of every autograded check, in notebook order."""
    after: dict[str, list[str]]
    """``answer grade_id -> check grade_ids`` that come after it in the lab."""
    skipped: int = 0
    """Cells left out (tag :data:`SKIP_TAG`)."""
    cases: dict[str, list] = dataclasses.field(default_factory=dict)
    """``grade_id -> hidden cases`` drawn for each graded check (the grader keeps them)."""
    judges: dict[str, object] = dataclasses.field(default_factory=dict)
    """``grade_id -> judge(case, got)`` of each graded check, defined in the grader."""


def _is_check(cell) -> bool:
    m = _nbg(cell)
    return cell.cell_type == "code" and bool(m.get("grade")) and not m.get("solution")


def autograded(reference: nbformat.NotebookNode) -> dict[str, float]:
    """``grade_id -> points`` of the reference's autograded check cells."""
    return {_nbg(c)["grade_id"]: float(_nbg(c).get("points", 0))
            for c in reference.cells if _is_check(c) and _nbg(c).get("grade_id")}


def assemble(reference: nbformat.NotebookNode, answers: dict[str, str], *,
             skip_tag: str = SKIP_TAG, seed: str = "0") -> Assembled:
    """The reference notebook with the student's answers in its solution cells, each
    check cell replaced by its probe, skip-tagged cells and every secret left out.

    A graded check's probe is its ``answer`` on cases drawn here from
    ``random.Random(f"{seed}:{grade_id}")`` (:mod:`perflab.course.cases`); its ``cases``
    and ``judge`` stay in :class:`Assembled`, outside the notebook.

    Raises:
        ValueError: a check cell of the reference is malformed (see ``split_check``), or
            its graded part does not run or draws no case.
    """
    cells, checks, points, after = [], {}, {}, {}
    drawn, judges = {}, {}
    answers_so_far: list[str] = []
    skipped = 0
    for ref in reference.cells:
        m = _nbg(ref)
        gid = m.get("grade_id")
        tags = ref.get("metadata", {}).get("tags", [])
        if ref.cell_type != "code":
            if m.get("solution") or m.get("grade"):
                continue  # a written answer of the reference: never into the sandbox
            cells.append(nbformat.v4.new_markdown_cell(ref.source))
            continue
        if skip_tag in tags and not m.get("solution") and not m.get("grade"):
            skipped += 1
            cells.append(nbformat.v4.new_markdown_cell(
                f"*(skipped in grading: tagged `{skip_tag}`)*"))
            continue
        cell = nbformat.v4.new_code_cell()
        if m.get("solution") and gid:
            cell.source = answers.get(gid, f"raise NotImplementedError("
                                           f"{'no answer for ' + repr(gid) + ' in the submission'!r})")
            cell.metadata["perflab"] = {"answer": gid}
            answers_so_far.append(gid)
        elif _is_check(ref) and gid:
            check = split_check(ref.source)
            checks[gid], points[gid] = check, float(m.get("points", 0))
            for a in answers_so_far:
                after.setdefault(a, []).append(gid)
            if check.graded is not None:
                cases_fn, judges[gid] = graded_functions(check.graded, gid)
                try:
                    drawn[gid] = draw_cases(cases_fn, f"{seed}:{gid}")
                except Exception as e:  # noqa: BLE001 - the reference's bug, named
                    raise ValueError(f"check {gid!r}: cases() fails: {type(e).__name__}: "
                                     f"{e}") from e
                cell.source = graded_probe(check.graded, drawn[gid])
            else:
                cell.source = probe_source(check)
            cell.metadata["perflab"] = {"probe": gid}
        else:
            cell.source = ref.source
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = copy.deepcopy(reference.metadata.get(
        "kernelspec", {"name": "python3", "language": "python", "display_name": "Python 3"}))
    return Assembled(nb, checks, points, after, skipped, drawn, judges)


def allowances(reference: nbformat.NotebookNode) -> dict[str, tuple[str, ...]]:
    """``answer grade_id -> allow`` entries for :func:`scan_answer`: the course-wide
    :data:`COURSE_ALLOW` (documented torch settings) and the solution cell's metadata
    ``["perflab"]["allow"]`` (what one exercise's honest answers need)."""
    return {_nbg(c)["grade_id"]:
            COURSE_ALLOW + tuple(c.metadata.get("perflab", {}).get("allow", []))
            for c in reference.cells if _nbg(c).get("solution") and _nbg(c).get("grade_id")}
