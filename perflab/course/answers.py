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
is how a second copy of a forbidden helper's code is made at run time. So is the notebook's
shell (``get_ipython()``, ``exit._ip``, its input transformers and ``pre_run_cell``
callbacks, which rewrite later cells): an exercise's allowance of it covers a line magic's
own line, never Python.
The "predict, then explain" cells (nbgrader manually graded cells) are collected for
the instructor by :mod:`perflab.course.written`.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import io
import re
import sys
import tokenize

import nbformat

from perflab.course.cases import draw_cases
from perflab.course.checks import (CheckCell, graded_functions, graded_probe, parse_python,
                                   probe_source, split_check)

__all__ = ["SKIP_TAG", "COURSE_ALLOW", "Flag", "Assembled", "solution_ids", "answers_of",
           "scan_answer", "scan_forbidden", "assemble", "allowances", "forbidden_names"]

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
#: Attributes of the IPython shell that run, rewrite or hook later cells (input and AST
#: transformers, magics, callbacks on errors, the user namespace): key ``IPython <name>``.
#: Every name starting with ``input_transformer`` is one of them too.
SHELL_ATTRS = frozenset({
    "run_line_magic", "run_cell_magic", "system", "getoutput", "input_transformer_manager",
    "ast_transformers", "transform_cell", "transform_ast", "register_magic_function",
    "register_magics", "magics_manager", "prefilter_manager", "set_custom_exc", "set_hook",
    "user_ns", "user_global_ns", "user_ns_hidden", "run_cell", "run_cell_async",
    "run_ast_nodes", "safe_execfile", "safe_execfile_ipy", "safe_run_module"})
#: IPython's events (``ip.events.register('pre_run_cell', f)``): a callback on one of them
#: runs before or after every later cell.
SHELL_EVENTS = frozenset({"pre_execute", "pre_run_cell", "post_execute", "post_run_cell",
                          "shell_initialized"})
#: Names IPython binds to objects that hold the shell: ``exit._ip`` and ``quit._ip`` are
#: the shell. A plain call (``exit()``) is not a finding; any other use is.
_SHELL_HOLDERS = ("exit", "quit")
#: Keys that name the notebook's shell. An ``allow`` entry for one of them covers a line
#: magic's own line only (``%matplotlib inline``): never a Python line, a ``%%writefile``
#: body, or another cell magic's body (which IPython hands to the magic on the same line).
_SHELL_KEYS = ("name get_ipython", "IPython ", "name _ip", "attribute _ip", "getattr _ip",
               "name exit", "name quit")
#: Cell magics that write their body, verbatim, to a file (a module the notebook imports):
#: the body is scanned as the module it is.
_WRITE_MAGICS = ("writefile", "file")
#: Cell magics that run their body as a cell (IPython transforms it first): the body is
#: scanned as a cell; ``%%timeit``'s line is a setup statement, scanned too.
_RUN_MAGICS = ("time", "timeit", "capture")
#: Line magics that only time or show a statement: the statement is scanned, the magic
#: is not a finding.
_LINE_MAGIC = re.compile(r"^(\s*)%(?:time|timeit)((?:\s+-[a-zA-Z](?:\s*\d+)?)*)\s+(\S.*)$")
#: ``%%timeit``'s options before its setup statement.
_TIMEIT_OPTIONS = re.compile(r"^((?:\s*-[a-zA-Z](?:\s*\d+)?)*)\s*")
#: A ``%%writefile`` target that is an honest module: a plain ``name.py`` in the notebook's
#: folder (no path, no ``{var}``/``$var`` expansion) that shadows no module the notebook
#: or the grader imports (:data:`_SHADOWED`).
_PLAIN_TARGET = re.compile(r"[A-Za-z_]\w*\.py")
#: Module names a ``%%writefile`` target must not take: the standard library, what the
#: labs and the grader import, and what Python and pytest load by themselves.
_SHADOWED = frozenset(sys.stdlib_module_names) | MODULE_NAMES | frozenset(
    m.split(".")[0] for m in BLOCKED_MODULES) | frozenset({
        "perflab", "torch", "numpy", "pandas", "matplotlib", "IPython", "ipykernel",
        "nbformat", "nbclient", "nbval", "pytest", "_pytest", "conftest", "sitecustomize",
        "usercustomize", "typing_extensions", "torchvision", "triton", "scipy"})


@dataclasses.dataclass(frozen=True)
class _Cell:
    """A cell as the scan reads it: the Python IPython runs (or writes, for a
    ``%%writefile`` body), on the cell's own line numbers."""

    python: str
    magic_lines: frozenset[int] = frozenset()
    """Lines that are one line magic or ``!`` command each, as IPython turned them into
    ``get_ipython().run_line_magic(...)`` (an ``allow`` of a shell key covers these)."""
    found: tuple[tuple[int, str], ...] = ()
    """Findings on a cell magic's own line (a ``%%writefile`` target)."""


def _cleaned(source: str) -> tuple[list[str], int]:
    """The cell's lines as IPython reads them before any magic (its cleanup: leading blank
    lines dropped, common indentation and ``>>>``/``In [1]:`` prompts removed), and how
    many leading lines were dropped."""
    lines = (source if source.endswith("\n") else source + "\n").splitlines(keepends=True)
    n = len(lines)
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        for transform in TransformerManager().cleanup_transforms:
            lines = transform(lines)
    except Exception:  # noqa: BLE001 - no IPython: the blank lines are all we drop
        while lines and len(lines) > 1 and not lines[0].strip():
            lines = lines[1:]
    return lines, n - len(lines)


def _shift(cell: _Cell, by: int) -> _Cell:
    return _Cell("\n" * by + cell.python, frozenset(ln + by for ln in cell.magic_lines),
                 tuple((ln + by, key) for ln, key in cell.found))


def _magic_statement(line: str) -> bool:
    """``line`` is what IPython makes of one line magic or ``!`` command:
    ``[x = ]get_ipython().run_line_magic('name', 'args')`` (or ``.system``,
    ``.getoutput``) with constant arguments and nothing else."""
    try:
        body = ast.parse(line.strip()).body
    except SyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], (ast.Expr, ast.Assign)):
        return False
    call = body[0].value
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("run_line_magic", "system", "getoutput")
            and isinstance(call.func.value, ast.Call) and not call.func.value.args
            and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "get_ipython" and not call.keywords
            and all(isinstance(a, ast.Constant) for a in call.args))


def _target_findings(line: int, args: str) -> tuple[tuple[int, str], ...]:
    """A ``%%writefile`` target that is not a plain module of the notebook's folder."""
    target = re.sub(r"^(?:\s*(?:-a|--append)\b)*\s*", "", args).strip()
    if _PLAIN_TARGET.fullmatch(target) and target[:-3] not in _SHADOWED:
        return ()
    return ((line, f"writefile target {target[:60]}"),)


def _cell(source: str) -> _Cell:
    """The scan's view of a cell: see :func:`_python_of`."""
    lines, dropped = _cleaned(source)
    first = lines[0] if lines else ""
    if first.startswith("%%"):
        name, _, args = first[2:].rstrip().partition(" ")
        body = "".join(lines[1:])
        if name in _WRITE_MAGICS:
            return _shift(_Cell("\n" + body, found=_target_findings(1, args)), dropped)
        if name in _RUN_MAGICS:
            inner = _cell(body) if body.strip() else _Cell("")
            setup = _TIMEIT_OPTIONS.sub("", args, count=1) if name == "timeit" else ""
            try:  # the setup statement on the magic's line, if it is Python
                ast.parse(setup)
            except SyntaxError:
                setup = ""
            return _shift(_Cell(setup + "\n" + inner.python,
                                frozenset(ln + 1 for ln in inner.magic_lines),
                                tuple((ln + 1, key) for ln, key in inner.found)), dropped)
    text = "".join(lines)
    text = "\n".join(_LINE_MAGIC.sub(lambda m: m.group(1) + m.group(3), ln)
                     for ln in text.split("\n"))
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        python = TransformerManager().transform_cell(text)
    except Exception:  # noqa: BLE001 - an untransformable cell fails at run time anyway
        return _shift(_Cell(text), dropped)
    magic = frozenset(
        i for i, (orig, ran) in enumerate(zip(text.split("\n"), python.split("\n")), 1)
        if re.match(r"\s*(?:[A-Za-z_][\w.]*\s*=\s*)?[%!]", orig) and _magic_statement(ran))
    return _shift(_Cell(python, magic), dropped)


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
    except that the body of a ``%%writefile`` cell magic is kept as the module it is, the
    body of a timing cell magic (``%%time``, ``%%timeit``, ``%%capture``) as the cell it
    runs (and ``%%timeit``'s setup statement on the magic's line), and the statement of a
    ``%time``/``%timeit`` line as the Python it is; line numbers match the cell's. A cell
    magic is found where IPython finds it: after leading blank lines, indentation and
    prompts (IPython's cleanup)."""
    return _cell(source).python


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
    ``getattr``/``hasattr`` with a dunder, exec-family or shell string or a blocked
    ``os``/``sys`` name (``getattr(sys, "modules")``); ``sys``/``os`` names also through
    an alias or ``from sys import modules`` (so every ``sys.modules`` surgery: ``[...] =``,
    ``del``, ``pop``, ``update``, ``setdefault``); assigning an attribute
    of a module (``torch.x = ...``, ``perflab.run = ...``); ``open`` for writing (also
    ``Path.open``, ``io.open``). The notebook's shell (key ``IPython ...``, or the name):
    ``exit``/``quit`` used as anything but a plain call (``exit._ip``), any ``_ip`` name or
    attribute, the shell's attributes :data:`SHELL_ATTRS` and every ``input_transformer*``
    on anything, ``events.register``/``unregister`` on anything (``ip.events.register(
    'pre_run_cell', f)``; ``.register`` of a :data:`SHELL_EVENTS` name too; a trace's
    ``rt.events`` table is honest). The *exec family* (key ``exec family ...``): a name of
    :data:`EXEC_FAMILY` (``runctx``, ``run_path``, ``spec_from_file_location``,
    ``exec_module``, ``SourceFileLoader``, ``FunctionType``, ``CodeType``) as an attribute
    of anything or a bare name, ``.run(...)`` on a profiler, tracer or debugger
    (``cProfile.Profile().run(src)``), ``.replace(co_...=...)`` on a code object,
    assigning ``__code__``; ``exec``, ``eval`` and ``compile`` are ``name`` keys.

    A cell magic is found where IPython finds it (after leading blank lines, indentation
    and prompts). A ``%%writefile`` cell's body is scanned as the module it is, and its
    target is a finding (``writefile target ...``) unless it is a plain ``name.py`` that
    shadows no module (:data:`_SHADOWED`: ``torch.py``, ``sitecustomize.py``); the body of
    ``%%time``, ``%%timeit`` and ``%%capture`` as the cell it runs, and ``%%timeit``'s
    setup statement too. ``allow`` entries exempt flags whose key equals them or starts
    with them (``"import os"``, ``"module attribute torch.backends"``); grading passes
    :func:`allowances` (the cell's metadata and :data:`COURSE_ALLOW`). An entry for a
    shell key (``name get_ipython``, ``IPython ...``, ``_ip``, ``exit``) covers a line
    magic's own line only (``%matplotlib inline``): never a Python line, a ``%%writefile``
    body or another cell magic (whose body IPython passes on the magic's line).

    A static scan cannot see everything a determined student can build at run time
    (a string of source handed to ``timeit`` or ``torch.utils.benchmark.Timer`` through a
    variable, names built from strings); it is the instructor's signal, and the verdict
    does not depend on it (see :mod:`perflab.course.checks`; the run-time spy,
    :func:`perflab.labs.checking.watch_calls`, sees a forbidden helper's code however it
    was copied). An answer that is not valid Python is not flagged (it fails when it
    runs), except for a ``%%writefile`` target.
    """
    cell = _cell(source)
    code = cell.python
    found: list[tuple[int, str]] = list(cell.found)
    try:
        tree = parse_python(code)
    except SyntaxError:
        tree = None
    if tree is not None:
        found += _scan_tree(tree)
    lines = code.splitlines()
    flags = []
    for ln, key in sorted(set(found)):
        if any(key == a or key.startswith(a + ".") or key.startswith(a + " ") for a in allow) \
                and (ln in cell.magic_lines or not key.startswith(_SHELL_KEYS)):
            continue
        text = lines[ln - 1].strip()[:120] if 0 < ln <= len(lines) else ""
        if not text and 0 < ln <= len(source.split("\n")):  # a cell magic's own line
            text = source.split("\n")[ln - 1].strip()[:120]
        flags.append(Flag(grade_id, ln, key, text))
    return flags


def _shell_attr(name: str) -> bool:
    return name in SHELL_ATTRS or name.startswith("input_transformer")


@dataclasses.dataclass
class _Bindings:
    """What a cell binds, which the scan's rules read: names imported, names bound to a
    module of :data:`PARTLY_OPEN_MODULES` (``name -> module``), names bound to ``os``
    and ``sys`` (``import sys as s``), names bound to a profiler/tracer/debugger, every
    module name (perflab's and the imported), and each node's parent."""

    imported: set[str]
    partly: dict[str, str]
    real: dict[str, str]
    runners: set[str]
    modules: set[str]
    parents: dict[int, ast.AST]


def _bindings(tree: ast.Module) -> _Bindings:
    imported, partly, runners = set(), {}, set()
    real = {"os": "os", "sys": "sys"}  # names bound to the os and sys modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            partly.update({a.asname or a.name: a.name for a in node.names
                           if a.name in PARTLY_OPEN_MODULES})
            real.update({a.asname: a.name for a in node.names
                         if a.asname and a.name in ("os", "sys")})
        elif isinstance(node, ast.ImportFrom):
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and _runner_call(node.value, set()):
            runners.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                and _runner_call(node.context_expr, set()):
            runners.add(node.optional_vars.id)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return _Bindings(imported, partly, real, runners, MODULE_NAMES | imported, parents)


def _scan_tree(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, key)`` of every finding of :func:`scan_answer` in one parsed cell: the
    cell's bindings first, then each node by its kind."""
    b = _bindings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        ln = getattr(node, "lineno", 0)
        up = b.parents.get(id(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += _scan_import(node, ln)
        elif isinstance(node, ast.Name):
            found += _scan_name(node, ln, up, b)
        elif isinstance(node, ast.Attribute):
            found += _scan_attribute(node, ln, up, b)
        elif isinstance(node, ast.Call):
            found += _scan_call(node, ln, b)
    return found


def _scan_import(node: ast.Import | ast.ImportFrom, ln: int) -> list[tuple[int, str]]:
    """Blocked and private modules, partly open modules' other names, ``from sys
    import modules``, the exec family imported by name."""
    found: list[tuple[int, str]] = []
    if isinstance(node, ast.Import):
        found += [(ln, f"import {a.name}") for a in node.names if _blocked_module(a.name)]
    else:
        mod = node.module or ""
        if node.level == 0 and _blocked_module(mod):
            found.append((ln, f"import {mod}"))
        elif node.level == 0 and mod in PARTLY_OPEN_MODULES:
            found += [(ln, f"import {mod}.{a.name}") for a in node.names
                      if a.name not in PARTLY_OPEN_MODULES[mod]]
        elif node.level == 0 and mod in ("os", "sys"):  # from sys import modules
            found += [(ln, f"attribute {mod}.{a.name}") for a in node.names
                      if a.name == "*" or f"{mod}.{a.name}" in BLOCKED_MODULE_ATTRS]
        found += [(ln, f"exec family {a.name}") for a in node.names if a.name in EXEC_FAMILY]
    return found


def _scan_name(node: ast.Name, ln: int, up: ast.AST | None, b: _Bindings
               ) -> list[tuple[int, str]]:
    """Blocked names, the exec family, the shell's ``_ip`` and ``exit``/``quit`` used as
    anything but a plain call, a partly open module's other attributes or the module
    object itself."""
    found: list[tuple[int, str]] = []
    partly = b.partly
    if node.id in BLOCKED_NAMES:
        found.append((ln, f"name {node.id}"))
    if node.id in EXEC_FAMILY:
        found.append((ln, f"exec family {node.id}"))
    if node.id == "_ip":
        found.append((ln, "name _ip"))
    if node.id in _SHELL_HOLDERS and isinstance(node.ctx, ast.Load) and not (
            isinstance(up, ast.Call) and up.func is node):
        found.append((ln, f"name {node.id}"))  # exit._ip, f(quit): not a plain call
    if node.id in partly and isinstance(node.ctx, ast.Load):
        mod = partly[node.id]
        if isinstance(up, ast.Attribute) and up.value is node:
            if up.attr not in PARTLY_OPEN_MODULES[mod]:
                found.append((ln, f"attribute {mod}.{up.attr}"))
        else:
            found.append((ln, f"module {mod}"))
    return found


def _scan_attribute(node: ast.Attribute, ln: int, up: ast.AST | None, b: _Bindings
                    ) -> list[tuple[int, str]]:
    """Blocked attributes (also of ``os``/``sys`` through an alias or another module),
    a module's attribute assigned, the shell's attributes and events, the exec family,
    ``__code__`` assigned."""
    found: list[tuple[int, str]] = []
    real, modules = b.real, b.modules
    dotted = _dotted(node)
    root = _root(node)
    if root in real and dotted.startswith(root + "."):  # import sys as s: s.modules
        dotted = real[root] + dotted[len(root):]
    if node.attr in BLOCKED_ATTRS and not (
            node.attr == "__class__" and isinstance(up, ast.Attribute)
            and up.attr in ("__name__", "__qualname__")):
        found.append((ln, f"attribute {node.attr}"))
    tail = ".".join(dotted.split(".")[-2:])
    if tail in BLOCKED_MODULE_ATTRS and (root in real or dotted.count(".") > 1):
        found.append((ln, f"attribute {tail}"))
    if node.attr in _MODULE_ATTRS and dotted.count(".") >= 1 and dotted != node.attr:
        found.append((ln, f"attribute {node.attr}"))
    if isinstance(node.ctx, (ast.Store, ast.Del)) and root in modules:
        found.append((ln, f"module attribute {dotted}"))
    if _shell_attr(node.attr):
        found.append((ln, f"IPython {node.attr}"))
    if node.attr == "_ip":
        found.append((ln, "attribute _ip"))
    if node.attr in ("register", "unregister", "callbacks", "trigger") and (
            isinstance(node.value, ast.Attribute) and node.value.attr == "events"
            or isinstance(node.value, ast.Name) and node.value.id == "events"):
        found.append((ln, "IPython events"))  # ip.events.register('pre_run_cell', f)
    if node.attr in EXEC_FAMILY:
        found.append((ln, f"exec family {node.attr}"))
    if node.attr == "__code__" and isinstance(node.ctx, (ast.Store, ast.Del)):
        found.append((ln, "exec family __code__ assignment"))
    return found


def _scan_call(node: ast.Call, ln: int, b: _Bindings) -> list[tuple[int, str]]:
    """``open`` for writing, ``getattr``/``hasattr`` with a blocked string, ``.run`` on
    a profiler, ``.replace(co_...)``, ``.register`` of a shell event."""
    found: list[tuple[int, str]] = []
    real, partly, runners = b.real, b.partly, b.runners
    func = node.func
    name = func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None
    const = node.args[1].value if len(node.args) > 1 and isinstance(
        node.args[1], ast.Constant) and isinstance(node.args[1].value, str) else None
    if name == "open" and _writes(node):
        found.append((ln, "open for writing"))
    elif (isinstance(func, ast.Name) and name in ("getattr", "hasattr")
          and const is not None and (
              const.startswith("__") or const in EXEC_FAMILY or const == "_ip"
              or _shell_attr(const)
              or f"{real.get(_root(node.args[0]) or '', '')}.{const}"
              in BLOCKED_MODULE_ATTRS)):
        found.append((ln, f"{name} {const}"))
    elif isinstance(func, ast.Attribute) and name == "run" and (
            _runner_call(func.value, runners)
            or partly.get(_root(func) or "") in ("cProfile", "profile")):
        found.append((ln, "exec family run"))
    elif name == "replace" and any((k.arg or "").startswith("co_") for k in node.keywords):
        found.append((ln, "exec family code.replace"))
    elif name in ("register", "unregister") and node.args and isinstance(
            node.args[0], ast.Constant) and node.args[0].value in SHELL_EVENTS:
        found.append((ln, "IPython events"))  # ev = ip.events; ev.register(...)
    return found


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
        if ref.get("id"):  # a check's "needs" names given cells by id
            cell["id"] = ref["id"]
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
            # what the grading process needs to know of the check (its "needs" and
            # "compiles": perflab.course.grading_process)
            mine = ref.get("metadata", {}).get("perflab", {})
            cell.metadata["perflab"] = {"probe": gid, "needs": list(mine.get("needs", [])),
                                        "compiles": bool(mine.get("compiles"))}
        else:
            cell.source = ref.source
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = copy.deepcopy(reference.metadata.get(
        "kernelspec", {"name": "python3", "language": "python", "display_name": "Python 3"}))
    return Assembled(nb, checks, points, after, skipped, drawn, judges)


def forbidden_names(reference: nbformat.NotebookNode) -> dict[str, tuple[str, ...]]:
    """``answer grade_id -> names`` an exercise forbids its answer to use, from the solution
    cell's metadata ``["perflab"]["forbid"]`` (Lab 11: the attention kernels PyTorch ships,
    ``scaled_dot_product_attention``, ``_flash_attention_*``...), for :func:`scan_forbidden`."""
    return {_nbg(c)["grade_id"]: tuple(c.metadata.get("perflab", {}).get("forbid", []))
            for c in reference.cells if _nbg(c).get("solution") and _nbg(c).get("grade_id")
            and c.metadata.get("perflab", {}).get("forbid")}


def scan_forbidden(grade_id: str, source: str, forbid: tuple[str, ...] | list[str]) -> list[Flag]:
    """Flag each line of an answer (``%%writefile`` bodies included) that names what the
    exercise forbids: ``forbid`` holds names, a trailing ``*`` a prefix
    (``_scaled_dot_product_*``); a name counts as a whole word anywhere on the line (a
    call, an attribute, an import, a string such as ``torch.ops.aten`` lookups build).
    Key: ``forbidden <name>``. Like :func:`scan_answer`, a review finding for the
    instructor; the verdict comes from the run, where the grading process makes the
    forbidden functions absent."""
    if not forbid:
        return []
    patterns = [(name, re.compile(r"(?<![\w])" + re.escape(name.rstrip("*"))
                                  + (r"\w*" if name.endswith("*") else r"(?![\w])")))
                for name in forbid]
    code = _cell(source).python
    lines = code.splitlines()
    try:   # each line's code without its comment (an honest "# not F.scaled_dot_product_attention")
        by_line: dict[int, list[str]] = {}
        for t in tokenize.generate_tokens(io.StringIO(code).readline):
            if t.type in (tokenize.NAME, tokenize.STRING, tokenize.OP, tokenize.NUMBER):
                by_line.setdefault(t.start[0], []).append(t.string)
        words = [(ln, re.sub(r"\s*\.\s*", ".", " ".join(toks))) for ln, toks in by_line.items()]
    except (tokenize.TokenError, SyntaxError):
        words = list(enumerate(lines, start=1))
    found = sorted({(ln, name) for ln, text in words for name, pat in patterns if pat.search(text)})
    return [Flag(grade_id, ln, f"forbidden {name}",
                 lines[ln - 1].strip()[:120] if 0 < ln <= len(lines) else "")
            for ln, name in found]


def allowances(reference: nbformat.NotebookNode) -> dict[str, tuple[str, ...]]:
    """``answer grade_id -> allow`` entries for :func:`scan_answer`: the course-wide
    :data:`COURSE_ALLOW` (documented torch settings) and the solution cell's metadata
    ``["perflab"]["allow"]`` (what one exercise's honest answers need)."""
    return {_nbg(c)["grade_id"]:
            COURSE_ALLOW + tuple(c.metadata.get("perflab", {}).get("allow", []))
            for c in reference.cells if _nbg(c).get("solution") and _nbg(c).get("grade_id")}
