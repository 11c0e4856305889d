"""The check-cell format: a *probe* that runs beside the student's code, a *judge* that
decides outside it.

A check cell (nbgrader ``grade: true``, ``locked: true``, a ``grade_id`` and ``points``,
tag ``nbval-check-output``) reads::

    # CHECK: double doubles (1 point)
    got = {"2": double(2)}                    # probe: the student's code on fixed inputs
    ### BEGIN HIDDEN TESTS
    got["-3"] = double(-3)
    ### END HIDDEN TESTS
    ### JUDGE
    assert got["2"] == 4, f"double(2) returned {got['2']!r}, expected 4"
    ### BEGIN HIDDEN TESTS
    assert got["-3"] == -6, "double(-3) should be -6"
    ### END HIDDEN TESTS
    print("PASS: double doubles")

In the student's notebook (and under nbval on ``solutions/``) the whole cell runs as
written: the student sees the assertion or ``PASS``. In grading the cell is cut at
``### JUDGE``:

* the **probe** (lines before ``### JUDGE``) runs in the sandboxed kernel, after the
  student's answers, and ends with one line that prints the values the judge reads as
  JSON (:func:`probe_source`). Bind plain values there: numbers, strings, bools, lists,
  dicts with string keys; tensors and arrays become lists (``.tolist()``), anything
  else its ``repr``.
* the **judge** (from ``### JUDGE`` on) runs in the grader process, outside the sandbox,
  with nothing but those JSON values in its namespace (:func:`run_judge`); it must
  import what it needs itself (``import math``). It never calls student code.
  Reference values live in the judge, so they never reach the sandbox.

A check without ``### JUDGE`` is all judge (fine when it only reads plain variables,
e.g. ``assert answer == 42``). The names the judge reads and does not bind itself are
the *facts* the probe reports (:func:`judge_names`).

What this guarantees, and what not: the verdict is computed where the student's code
never ran, from data; the kernel can only lie about the facts. Lying well means
knowing the right facts for the fixed (and hidden) inputs, i.e. solving the exercise;
an answer that reaches into the machinery to do it is flagged
(:mod:`perflab.course.answers`). So write judges on facts that take the work to
produce: the student's function on fixed inputs, byte and FLOP counts, recompile counts,
loss parity on a seeded run, or recorded timings shipped with the lab, never a live
timing (it moves with machine load).
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import threading
import traceback

from perflab.course.cases import FACTS_MARKER, GRADED_MARKER

__all__ = ["JUDGE_MARKER", "FACTS_MARKER", "CheckCell", "GradedPart", "JudgeResult",
           "split_check", "judge_names", "probe_source", "graded_probe", "graded_functions",
           "parse_facts", "run_judge", "parse_python"]

#: The line that starts the judge part of a check cell.
JUDGE_MARKER = "### JUDGE"

_BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
_END_HIDDEN = "### END HIDDEN TESTS"
_MAX_FACTS_CHARS = 1_000_000


_AST_LOCK = threading.Lock()
_AST_RACE = "AST constructor recursion depth mismatch"


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, safe to call from the grader's threads.

    CPython 3.11 keeps the AST constructor's recursion counter per interpreter, not per
    thread (python/cpython#106905): when two threads build ASTs at once (``perflab course
    grade --jobs 2`` grades two notebooks in two threads), one can fail with
    ``SystemError: AST constructor recursion depth mismatch`` on valid code; this
    happened in a CI run. perflab's own parses take one lock, and the rare clash with
    a parse elsewhere (torch's, in a judge) is retried.

    Raises:
        SyntaxError: ``source`` is not valid Python.
        SystemError: the clash repeated three times (any other SystemError at once).
    """
    for attempt in range(3):
        try:
            with _AST_LOCK:
                return ast.parse(source)
        except SystemError as e:
            if _AST_RACE not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class GradedPart:
    """The graded part of a check cell (:mod:`perflab.course.cases`)."""

    answer_source: str
    """What the sandbox runs: the block's imports and ``def student_answer``."""
    grader_source: str
    """What the grader runs to get ``hidden_cases`` and ``judge_answer``: the block
    without its top-level calls (the ``run_cases(...)`` line)."""
    forbid: tuple[str, ...] = ()
    """perflab functions the graded call may not reach (``run_cases(..., forbid=...)``)."""


@dataclasses.dataclass(frozen=True)
class CheckCell:
    """A check cell cut into its two parts."""

    probe: str
    """Runs in the sandboxed kernel (may be empty)."""
    judge: str
    """Runs in the grader, on the facts."""
    judge_hidden_lines: frozenset[int]
    """1-based line numbers of ``judge`` inside hidden-test regions."""
    names: tuple[str, ...]
    """The facts: names the judge reads and does not bind."""
    graded: GradedPart | None = None
    """The graded part (hidden cases), when the cell has one; then ``probe`` is the
    self-check (not run in grading) and ``judge`` is empty."""


@dataclasses.dataclass(frozen=True)
class JudgeResult:
    passed: bool
    message: str = ""
    """The assertion message (``AssertionError: ...``), empty when passed."""
    hidden: bool = False
    """The failing line is a hidden test: do not show its message to the student."""


def split_check(source: str) -> CheckCell:
    """Cut a check cell's source at ``### JUDGE``.

    Raises:
        ValueError: more than one ``### JUDGE`` line, an unbalanced hidden-test region,
            or a judge that is not valid Python (a bug in the reference notebook).
    """
    lines = source.split("\n")
    graded_at = [i for i, ln in enumerate(lines) if ln.strip() == GRADED_MARKER]
    if graded_at:
        return _split_graded(lines, graded_at)
    marks = [i for i, ln in enumerate(lines) if ln.strip().startswith(JUDGE_MARKER)]
    if len(marks) > 1:
        raise ValueError(f"a check cell has {len(marks)} '{JUDGE_MARKER}' lines; use one")
    cut = marks[0] if marks else 0
    hidden, inside = set(), False
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith(_BEGIN_HIDDEN):
            if inside:
                raise ValueError("nested '### BEGIN HIDDEN TESTS' in a check cell")
            inside = True
        elif s.startswith(_END_HIDDEN):
            if not inside:
                raise ValueError("'### END HIDDEN TESTS' without a BEGIN in a check cell")
            inside = False
        elif inside:
            hidden.add(i)
    if inside:
        raise ValueError("'### BEGIN HIDDEN TESTS' without an END in a check cell")
    probe = "\n".join(lines[:cut])
    judge_lines = lines[cut:]
    judge = "\n".join(judge_lines)
    hidden_rel = frozenset(i - cut + 1 for i in hidden if i >= cut)
    try:
        names = judge_names(judge)
    except SyntaxError as e:
        raise ValueError(f"the judge part of a check cell is not valid Python: {e}") from e
    return CheckCell(probe, judge, hidden_rel, names)


def _split_graded(lines: list[str], graded_at: list[int]) -> CheckCell:
    where = f"a check cell with {GRADED_MARKER!r}"
    if len(graded_at) > 1:
        raise ValueError(f"{where} has {len(graded_at)} such lines; use one")
    g = graded_at[0]
    if g == 0 or not lines[g - 1].strip().startswith(_BEGIN_HIDDEN):
        raise ValueError(f"{where}: the marker must be the first line of a "
                         f"'{_BEGIN_HIDDEN}' region")
    end = next((i for i in range(g + 1, len(lines))
                if lines[i].strip().startswith(_END_HIDDEN)), None)
    if end is None or any(ln.strip() for ln in lines[end + 1:]):
        raise ValueError(f"{where}: the graded region must end the cell with "
                         f"'{_END_HIDDEN}'")
    if any(ln.strip().startswith(JUDGE_MARKER) for ln in lines):
        raise ValueError(f"{where} cannot also have '{JUDGE_MARKER}'")
    block = "\n".join(lines[g + 1:end])
    try:
        tree = parse_python(block)
    except SyntaxError as e:
        raise ValueError(f"{where}: the graded part is not valid Python: {e}") from e
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name, nargs in (("hidden_cases", 1), ("student_answer", 1), ("judge_answer", 2)):
        if name not in defs or len(defs[name].args.args) != nargs:
            raise ValueError(f"{where}: the graded part must define {name}() with "
                             f"{nargs} argument(s)")
    imports = [ast.get_source_segment(block, n) for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    answer_def = defs["student_answer"]
    start = answer_def.decorator_list[0].lineno if answer_def.decorator_list else \
        answer_def.lineno
    answer_src = "\n".join(block.split("\n")[start - 1:answer_def.end_lineno])
    forbid: tuple[str, ...] = ()
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                if kw.arg == "forbid":
                    forbid = tuple(ast.literal_eval(kw.value))
    kept = ast.Module(body=[n for n in tree.body if not isinstance(n, ast.Expr)],
                      type_ignores=[])
    part = GradedPart("\n".join([*imports, answer_src]), ast.unparse(kept), forbid)
    return CheckCell("\n".join(lines[:g - 1]), "", frozenset(), (), part)


def graded_probe(part: GradedPart, cases: list) -> str:
    """The code the sandboxed kernel runs for a graded check: ``student_answer`` (defined
    inside a function, so the notebook's own names are not rebound) on ``cases``,
    printing the raw answers as one facts line
    (:func:`perflab.course.cases.answer_cases`)."""
    import textwrap

    body = textwrap.indent(part.answer_source, "    ")
    cases_json = json.dumps(cases)
    return (f"def __perflab_graded():\n{body}\n    return student_answer\n"
            "__import__('perflab.course.cases', fromlist=['answer_cases']).answer_cases("
            f"__perflab_graded(), {cases_json!r}, forbid={list(part.forbid)!r})\n"
            "del __perflab_graded\n")


def graded_functions(part: GradedPart, name: str = "check"):
    """``(hidden_cases, judge_answer)`` of a graded part, defined here in the grader
    (trusted reference code, never in the sandbox).

    Raises:
        ValueError: the block fails to run (a bug in the reference notebook).
    """
    namespace: dict = {"__name__": f"perflab_judge_{name}"}
    try:
        exec(compile(part.grader_source, f"<graded {name}>", "exec"), namespace)  # noqa: S102
    except Exception as e:  # noqa: BLE001 - reported as the reference's bug
        raise ValueError(f"the graded part of check {name!r} does not run: "
                         f"{type(e).__name__}: {e}") from e
    return namespace["hidden_cases"], namespace["judge_answer"]


def judge_names(judge: str) -> tuple[str, ...]:
    """The names a judge reads without binding them itself, minus builtins, in order of
    first use: the facts its probe must report.

    Raises:
        SyntaxError: the judge is not valid Python.
    """
    tree = parse_python(judge)
    bound: set[str] = set()
    loaded: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loaded.append(node.id)
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    skip = bound | set(dir(builtins))
    return tuple(dict.fromkeys(n for n in loaded if n not in skip))


def probe_source(check: CheckCell) -> str:
    """The code the sandboxed kernel runs for a check: the probe, then one line that
    prints :data:`FACTS_MARKER` and the facts as JSON."""
    emit = (f"print({FACTS_MARKER!r} + __import__('json').dumps("
            f"{{_n: globals()[_n] for _n in {list(check.names)!r} if _n in globals()}}, "
            "default=lambda o: o.tolist() if hasattr(o, 'tolist') else sorted(o) "
            "if isinstance(o, (set, frozenset)) else repr(o)[:500]))")
    return (check.probe.rstrip() + "\n" if check.probe.strip() else "") + emit


def parse_facts(stdout: str) -> tuple[dict | None, str]:
    """The facts a probe printed: (facts, "") or (None, why not).

    Exactly one facts line must be there: none means the probe did not get to its end
    (or its print was replaced), more than one means something else printed one.
    """
    lines = [ln for ln in stdout.splitlines() if ln.startswith(FACTS_MARKER)]
    if len(lines) != 1:
        return None, (f"the check's probe reported {len(lines)} fact lines instead of one"
                      + (" (something in the notebook printed fact lines: tampering)"
                         if len(lines) > 1 else ""))
    text = lines[0][len(FACTS_MARKER):]
    if len(text) > _MAX_FACTS_CHARS:
        return None, f"the check's facts are too large ({len(text)} characters)"
    try:
        facts = json.loads(text)
    except (ValueError, RecursionError) as e:  # a 3,000-deep line raises RecursionError
        return None, (f"the check's facts are not valid JSON ({type(e).__name__}: "
                      f"{str(e)[:200]}): tampered or crashed")
    if not isinstance(facts, dict):
        return None, "the check's facts are not a JSON object"
    return facts, ""


def run_judge(check: CheckCell, facts: dict, *, name: str = "check") -> JudgeResult:
    """Run a judge on facts (plain JSON values), in this process, outside any sandbox.

    The judge is the reference notebook's code and the facts are data, so nothing the
    student wrote runs here. A judge passes when it raises nothing; its own prints go
    nowhere.
    """
    import contextlib
    import io

    namespace = {k: v for k, v in facts.items() if k in check.names}
    filename = f"<judge {name}>"
    try:
        code = compile(check.judge, filename, "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, namespace)  # noqa: S102 - trusted reference code on JSON data
    except Exception as e:  # noqa: BLE001 - any failure of the judge is a failed check
        line = next((fs.lineno for fs in reversed(traceback.extract_tb(e.__traceback__))
                     if fs.filename == filename), None)
        if isinstance(e, NameError) and getattr(e, "name", None) in check.names:
            message = (f"NameError: {e.name!r} is not defined when the check runs; "
                       "the exercise above must define it")
        else:
            message = f"{type(e).__name__}: {e}".rstrip(": ")
        return JudgeResult(False, message, hidden=line in check.judge_hidden_lines)
    return JudgeResult(True)
