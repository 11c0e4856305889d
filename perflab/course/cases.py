"""Graded checks on hidden cases: drawn at grade time, answered in the sandbox, judged
outside it.

A check cell of a solution notebook has two parts (:mod:`perflab.course.checks`):

* a **self-check**, visible in ``labs/``: the student's code on the exercise's public
  examples, with ``PASS`` or what is wrong. Feedback, worth no points.
* the **graded part**, the last hidden-test region of the cell, starting with
  :data:`GRADED_MARKER`; nbgrader strips it, so it never reaches ``labs/``::

      ### BEGIN HIDDEN TESTS
      ### GRADED
      def hidden_cases(rng):      # the grader: draw hidden cases (rng: random.Random)
          return [(rng.randint(1, 512), rng.uniform(0.01, 3.0)) for _ in range(5)]

      def student_answer(case):   # the sandbox: the student's code on one case
          return my_samples_per_s(*case)

      def judge_answer(case, got):  # the grader: reference on the same case, decides
          b, s = case
          assert abs(got - b / s) <= 1e-9 * b / s, f"got {got!r}, expected {b / s!r}"

      from perflab.course.cases import run_cases
      run_cases(hidden_cases, student_answer, judge_answer, forbid=["measure"])
      ### END HIDDEN TESTS

In ``solutions/`` (under nbval, in the tests) :func:`run_cases` runs all three in the
kernel, exactly as grading does (the same JSON round trips), on seed 0. In grading the
grader draws the cases from a seed the notebook never sees, runs only
``student_answer`` (and the block's imports) in the sandbox through
:func:`answer_cases`, which prints the raw answers as one facts line, and runs
``hidden_cases`` and ``judge_answer`` outside (:func:`judge_answers`). The three names
are fixed (the grader finds them); they are long so that no notebook name is rebound.
``forbid`` names perflab functions (or dotted library paths) the exercise asks the
student to write themselves: a graded call that reaches one fails, however it is reached
(an alias, a default argument, a closure), in whatever thread or child process it runs
(``concurrent.futures``, DataLoader workers, ``multiprocessing`` fork or spawn) and in any
copy of its code (its module's source run again): see
:func:`perflab.labs.checking.watch_calls`, which also says what it cannot see.

Cases and answers are data: numbers, strings, bools, None, lists and dicts with string
keys (tuples become lists; tensors and arrays ``.tolist()``; sets sorted lists). This
module imports only the standard library: the kernel imports it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import random
import sys
import threading
from typing import Any, Callable, Iterable, Iterator

__all__ = ["GRADED_MARKER", "FACTS_MARKER", "MAX_DEPTH", "to_data", "draw_cases", "run_cases",
           "answer_cases", "judge_answers", "CaseOutcome"]

#: Dotted paths under this prefix are the grader's references (hidden in the sandbox).
GRADER_ONLY = "perflab.course.references."
#: The first line of a check cell's graded part (inside its last hidden-test region).
GRADED_MARKER = "### GRADED"
#: The prefix of the one stdout line a probe prints with its facts.
FACTS_MARKER = "PERFLAB-FACTS "
#: Deepest nesting of lists/dicts a case or an answer may have.
MAX_DEPTH = 12
#: Longest error text an answer record keeps.
_MAX_ERROR = 300


def to_data(value: Any, *, _depth: int = 0) -> Any:
    """``value`` as plain JSON data: tensors and arrays as (nested) lists, tuples as
    lists, sets as sorted lists, numpy scalars as numbers; dict keys must be strings.

    Raises:
        TypeError: a value that is not data (a function, a module, an object), naming
            its type.
        ValueError: nesting deeper than :data:`MAX_DEPTH`.
    """
    if _depth > MAX_DEPTH:
        raise ValueError(f"the value is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [to_data(v, _depth=_depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(to_data(v, _depth=_depth + 1) for v in value)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("dict keys must be strings")
        return {k: to_data(v, _depth=_depth + 1) for k, v in value.items()}
    if hasattr(value, "tolist") and callable(value.tolist):  # tensors, arrays, np scalars
        return to_data(value.tolist(), _depth=_depth)
    raise TypeError(f"a {type(value).__name__} is not data (return numbers, strings, "
                    "lists, dicts or tensors)")


#: The grader judges submissions in threads of one process (``--jobs``): drawing cases
#: and judging take this lock, so a judge that seeds torch's, NumPy's or Python's global
#: generator gets the numbers it seeded, and leaves the generators as it found them.
_GRADER_LOCK = threading.RLock()


@contextlib.contextmanager
def _grader_side() -> Iterator[None]:
    with _GRADER_LOCK:
        state = random.getstate()
        np = sys.modules.get("numpy")
        np_state = np.random.get_state() if np is not None else None
        torch = sys.modules.get("torch")
        try:
            if torch is not None:
                with torch.random.fork_rng(devices=[]):
                    yield
            else:
                yield
        finally:
            random.setstate(state)
            if np_state is not None:
                np.random.set_state(np_state)


def _round_trip(value: Any) -> Any:
    """``value`` exactly as the other side of the sandbox receives it."""
    return json.loads(json.dumps(to_data(value), allow_nan=True))


def draw_cases(cases: Callable[[random.Random], Iterable], seed: int | str) -> list:
    """The cases ``cases`` draws from ``random.Random(seed)``, as data.

    Raises:
        ValueError: it drew no case (a check must never pass on nothing).
        TypeError: a case is not data.
    """
    with _grader_side():
        drawn = _round_trip(list(cases(random.Random(seed))))
    if not drawn:
        raise ValueError("the check's cases() drew no case: a check must try at least one")
    return drawn


@contextlib.contextmanager
def _spy(names: Iterable[str]) -> Iterator[list[str]]:
    """The forbidden names that ran inside the block, however reached, in any thread,
    child process or copy of their code (:func:`perflab.labs.checking.watch_calls`; read
    the list after the block: children's hits arrive at its end); perflab is imported
    only when asked.

    A name under :data:`GRADER_ONLY` (``perflab.course.references``) that does not
    import is left out: in the grading sandbox that package is not there, so nothing
    can call it; elsewhere (the solutions under nbval, the tests) it is watched.

    Raises:
        ValueError: a name is not a public perflab name or importable dotted path, or
            names something the spy cannot see run (a class written in C).
    """
    names = list(names)
    if not names:
        yield []
        return
    from perflab.labs.checking import resolve, watch_calls

    targets = {}
    for name in names:
        if name.startswith(GRADER_ONLY):
            try:
                importlib.import_module(name.rpartition(".")[0])
            except ModuleNotFoundError:
                continue   # the grader-only package is not in this sandbox: unreachable
        targets[name] = resolve(name)
    with watch_calls(targets) as hits:
        yield hits


def _answer_one(answer: Callable[[Any], Any], case: Any) -> dict:
    try:
        return {"value": _round_trip(answer(case))}
    except Exception as e:  # noqa: BLE001 - any failure of the student's code is an answer
        return {"error": f"{type(e).__name__}: {e}"[:_MAX_ERROR]}


def answer_cases(answer: Callable[[Any], Any], cases_json: str, *,
                 forbid: Iterable[str] = ()) -> None:
    """Run in the sandbox: ``answer`` on each case of ``cases_json``, printing one facts
    line (:data:`FACTS_MARKER`) with ``{"got": [{"value": ...} or
    {"error": "Type: message"}, ...], "delegated": [names of forbidden functions that
    ran]}``. Nothing is decided here: the grader judges the values."""
    cases = json.loads(cases_json)
    with _spy(forbid) as delegated:
        got = [_answer_one(answer, case) for case in cases]
    print(FACTS_MARKER + json.dumps({"got": got, "delegated": delegated}), flush=True)


@dataclasses.dataclass(frozen=True)
class CaseOutcome:
    """The grader's verdict on one graded check's answers."""

    passed: bool
    message: str = ""
    """For the instructor: the case, the answer, the judge's message."""
    student: str = ""
    """What the student may see: which hidden case failed and how, never the case."""
    failed_case: int | None = None
    """1-based index of the first hidden case that failed (None: none did)."""
    tampered: bool = False
    """The answers record was malformed or had the wrong length: tampered or crashed."""


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + " [...]"


def judge_answers(judge: Callable[[Any, Any], None], cases: list, facts: Any) -> CaseOutcome:
    """Decide a graded check outside the sandbox: ``facts`` (what :func:`answer_cases`
    printed, parsed) against ``judge`` on each case.

    ``message`` is for the instructor (the case, the answer, the judge's message);
    ``student`` is what the student may see: which hidden case failed and the kind of
    failure, never the case or its expected value.
    """
    n = len(cases)
    if not isinstance(facts, dict) or not isinstance(facts.get("got"), list) \
            or not isinstance(facts.get("delegated", []), list):
        return CaseOutcome(False, "the answers record is malformed (tampered or crashed)",
                           "your answers could not be read (tampered or crashed)",
                           tampered=True)
    got = facts["got"]
    if len(got) != n:
        return CaseOutcome(False, f"{len(got)} answers for {n} cases (tampered or crashed)",
                           "your answers could not be read (tampered or crashed)",
                           tampered=True)
    delegated = [str(d)[:80] for d in facts.get("delegated", [])]
    ran = [d for d in delegated if not d.startswith("(")]
    if ran:
        named = ", ".join(d if "." in d else f"perflab's {d}" for d in ran)  # a.b: a library's
        why = f"the graded call ran {named}: the exercise asks you to write it yourself"
        return CaseOutcome(False, why, why)
    if delegated:  # the spy's own notes, e.g. that a profiler switched it off
        why = (f"the graded call could not be checked for delegation {delegated[0]}: "
               "turn profilers and tracers off before your function returns")
        return CaseOutcome(False, why, why)
    for k, (case, rec) in enumerate(zip(cases, got), start=1):
        if not isinstance(rec, dict) or ("value" in rec) == ("error" in rec):
            return CaseOutcome(False, f"hidden case {k}/{n}: malformed answer record "
                               f"{_short(rec)} (tampered)",
                               f"hidden case {k} of {n}: your answer could not be read",
                               k, tampered=True)
        if "error" in rec:
            kind = str(rec["error"]).split(":", 1)[0][:60]
            return CaseOutcome(False, f"hidden case {k}/{n} {_short(case)}: the student's "
                               f"code raised {str(rec['error'])[:_MAX_ERROR]}",
                               f"hidden case {k} of {n}: your code raised {kind}", k)
        try:
            with _grader_side():
                judge(case, rec["value"])
        except Exception as e:  # noqa: BLE001 - any failure of the judge is a wrong answer
            kind = "wrong result" if isinstance(e, AssertionError) else \
                f"unusable result ({type(e).__name__} when judged)"
            return CaseOutcome(False, f"hidden case {k}/{n} {_short(case)}: got "
                               f"{_short(rec['value'])}: {type(e).__name__}: {e}",
                               f"hidden case {k} of {n}: {kind}", k)
    return CaseOutcome(True)


def run_cases(cases: Callable[[random.Random], Iterable], answer: Callable[[Any], Any],
              judge: Callable[[Any, Any], None], *, forbid: Iterable[str] = (),
              seed: int | str = 0) -> None:
    """Run a graded check here, as grading runs it (same draws, same JSON round trips,
    same delegation spy), on ``seed``: how ``solutions/`` checks its own graded parts
    under nbval, and how the tests try wrong answers.

    Raises:
        AssertionError: a case failed, with the instructor's message.
    """
    drawn = draw_cases(cases, seed)
    with _spy(forbid) as delegated:
        got = [_answer_one(answer, case) for case in drawn]
    outcome = judge_answers(judge, drawn, _round_trip({"got": got, "delegated": delegated}))
    assert outcome.passed, outcome.message
    print(f"PASS (graded part): {len(drawn)} case{'' if len(drawn) == 1 else 's'} drawn at seed {seed}")
