"""perflab.course.cases: hidden cases drawn in the grader, answered as data, judged apart;
delegation found by behaviour, whatever name reaches the helper."""
from __future__ import annotations

import json
import textwrap

import pytest

from perflab.course.cases import (FACTS_MARKER, answer_cases, draw_cases, judge_answers,
                                  run_cases, to_data)


def _cases(rng):
    return [" " * rng.randint(1, 8) + "x\n" + " " * 8 + "y" for _ in range(4)]


def _judge(case, got):
    assert got == textwrap.dedent(case), "not dedented"


def _mine(case):
    lines = case.split("\n")
    cut = min(len(ln) - len(ln.lstrip()) for ln in lines if ln.strip())
    return "\n".join(ln[cut:] for ln in lines)


def test_honest_answer_passes_and_draws_depend_on_the_seed():
    run_cases(_cases, _mine, _judge, forbid=["textwrap.dedent"])
    assert draw_cases(_cases, "1:ada") != draw_cases(_cases, "1:bob")
    assert draw_cases(_cases, 7) == draw_cases(_cases, 7)


@pytest.mark.parametrize("answer", [
    lambda case: textwrap.dedent(case),                  # by name
    lambda case, f=textwrap.dedent: f(case),             # a default argument
    (lambda g: (lambda case: g(case)))(textwrap.dedent),  # a closure
])
def test_delegation_is_found_however_the_helper_is_reached(answer):
    with pytest.raises(AssertionError, match="textwrap.dedent"):
        run_cases(_cases, answer, _judge, forbid=["textwrap.dedent"])


def test_wrong_answers_fail_naming_the_hidden_case_not_its_answer():
    cases = draw_cases(_cases, 3)
    got = {"got": [{"value": c} for c in cases], "delegated": []}   # not dedented
    out = judge_answers(_judge, cases, got)
    assert not out.passed and out.failed_case == 1
    assert out.student == "hidden case 1 of 4: wrong result"
    assert repr(cases[0]) in out.message  # the instructor sees the case
    err = judge_answers(_judge, cases, {"got": [{"error": "ZeroDivisionError: x"}] * 4})
    assert err.student == "hidden case 1 of 4: your code raised ZeroDivisionError"


@pytest.mark.parametrize("facts", [
    None, [], {"got": {}}, {"got": []}, {"got": [{"value": "x"}] * 3},
    {"got": [{"value": "x", "error": "e"}] * 4}, {"got": [1, 2, 3, 4]},
])
def test_malformed_short_or_empty_records_never_pass(facts):
    cases = draw_cases(_cases, 3)
    out = judge_answers(_judge, cases, facts)
    assert not out.passed and out.tampered


def test_answer_cases_prints_one_record_of_raw_values(capsys):
    answer_cases(lambda c: [c, c * 2], json.dumps([1, 2]))
    answer_cases(lambda c: 1 / c, json.dumps([0]))
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(ln[len(FACTS_MARKER):]) for ln in lines] == [
        {"got": [{"value": [1, 2]}, {"value": [2, 4]}], "delegated": []},
        {"got": [{"error": "ZeroDivisionError: division by zero"}], "delegated": []}]


def test_to_data_and_its_errors():
    torch = pytest.importorskip("torch")
    assert to_data({"t": torch.tensor([[1, 2]]), "s": {3, 1}, "p": (1.5, None)}) == {
        "t": [[1, 2]], "s": [1, 3], "p": [1.5, None]}
    with pytest.raises(TypeError, match="function is not data"):
        to_data(lambda: 1)
    with pytest.raises(TypeError, match="keys must be strings"):
        to_data({1: 2})
    deep: list = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        to_data(deep)
    with pytest.raises(ValueError, match="drew no case"):
        draw_cases(lambda rng: [], 0)


def test_judges_in_threads_get_the_global_generator_they_seed():
    """The grader judges submissions in threads: a judge that seeds torch's global
    generator must draw what it seeded, whatever other threads do meanwhile."""
    import threading

    torch = pytest.importorskip("torch")

    def judge(case, got):
        torch.manual_seed(case)
        first = torch.rand(1000)
        for _ in range(50):
            torch.rand(10)  # another thread interleaving here would shift the stream
        torch.manual_seed(case)
        assert torch.equal(first, torch.rand(1000)) and got == case

    results = []

    def grade(k):
        results.append(judge_answers(judge, [k] * 20, {"got": [{"value": k}] * 20}).passed)

    before = torch.get_rng_state()
    threads = [threading.Thread(target=grade, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4
    assert torch.equal(before, torch.get_rng_state())  # left as it was found


def test_a_forbidden_class_is_watched_through_its_init():
    import fractions

    def cases(rng):
        return [[1, 3], [2, 5]]

    def judge(case, got):
        assert abs(got - case[0] / case[1]) < 1e-12

    run_cases(cases, lambda c: c[0] / c[1], judge, forbid=["fractions.Fraction"])
    with pytest.raises(AssertionError, match="fractions.Fraction"):
        run_cases(cases, lambda c: float(fractions.Fraction(*c)), judge,
                  forbid=["fractions.Fraction"])


def test_frames_with_unhashable_code_constants_do_not_break_the_spy():
    # dynamo's resume frames carry a dict among their code constants: hashing such a
    # code object raises TypeError; the spy matches code objects by identity instead
    import types

    def double_all(x):
        return [v * 2 for v in x]

    code = double_all.__code__.replace(co_consts=double_all.__code__.co_consts + ({},))
    with pytest.raises(TypeError):
        hash(code)
    odd = types.FunctionType(code, globals())

    def judge(case, got):
        assert got == [2 * v for v in case]

    run_cases(lambda rng: [[1, 2], [3]], odd, judge, forbid=["textwrap.dedent"])


def test_parse_python_retries_the_ast_thread_race(monkeypatch):
    """CPython 3.11's shared AST recursion counter (python/cpython#106905) made a grader
    thread's valid parse raise SystemError in CI: parse_python retries that one, and
    re-raises any other SystemError and every SyntaxError at once."""
    import ast

    from perflab.course import checks

    real, calls = ast.parse, []

    def flaky(source, *a, **k):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=25)")
        return real(source, *a, **k)

    monkeypatch.setattr(checks.ast, "parse", flaky)
    assert isinstance(checks.parse_python("x = 1"), ast.Module) and len(calls) == 2

    def broken(source, *a, **k):
        raise SystemError("something else")

    monkeypatch.setattr(checks.ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        checks.parse_python("x = 1")
    monkeypatch.setattr(checks.ast, "parse", real)
    with pytest.raises(SyntaxError):
        checks.parse_python("x = (")
