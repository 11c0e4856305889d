"""The grading process (perflab.course.grading_process): the graded calls of a submission
in a fresh interpreter that only the answers' definitions reach.

The plan is tested without a process (which cells a check needs, magics translated);
the process itself runs here as a plain subprocess (the sandbox is
test_grading_sandbox.py's and test_grading_attacks.py's), one per test, on the synthetic
lab of test_grading.py: each attack class of issue 43 that the kernel made possible
(the shell's hooks, a planted variable, forged records, a forbidden helper behind
torch.compile) earns nothing here, and the honest answers earn everything.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from perflab.course.answers import SKIP_TAG, assemble
from perflab.course.cases import judge_answers
from perflab.course.grading_process import (ENV_FD, SPEC_NAME, ForbiddenHelperError,
                                            MagicRunner, find_helpers, kernel_notebook,
                                            plan_process, read_records)
from tests.course.test_grading import GRADED_DOUBLE, _check, _code, _solution

#: A check whose answer may not use perflab's `measure` (the exercise: write it yourself).
GRADED_TIMER = ('### BEGIN HIDDEN TESTS\n### GRADED\n'
                'def hidden_cases(rng):\n    return [rng.randint(1, 9) for _ in range(3)]\n\n'
                'def student_answer(case):\n    return my_mean([case, case + 2])\n\n'
                'def judge_answer(case, got):\n    assert got == case + 1\n\n'
                'from perflab.course.cases import run_cases\n'
                'run_cases(hidden_cases, student_answer, judge_answer, forbid=["measure"])\n'
                '### END HIDDEN TESTS')


def _reference(double_src: str, mean_src: str, module_src: str = "") -> nbformat.NotebookNode:
    cells = [
        _code("import math\nfrom perflab import measure as perflab_measure\nbase = 10"),
        _code("panel = expensive_panel()", tags=[SKIP_TAG]),
        _code("shown = base * 2\nprint(shown)"),            # no check reads it
        _code("%matplotlib inline\nscale = 2"),              # a check reads scale
        _solution("my_module", module_src or "%%writefile helper_mod.py\nK = 2\n"),
        _solution("my_double", double_src),
        _check("check_double", 1, GRADED_DOUBLE, "PASS: double doubles\n"),
        _solution("my_mean", mean_src),
        _check("check_mean", 1, GRADED_TIMER, ""),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}
    return nb


HONEST_DOUBLE = "import helper_mod\ndef double(v):\n    return helper_mod.K * v * (scale * base) // 20"
HONEST_MEAN = "def my_mean(xs):\n    return sum(xs) / len(xs)"


def _answers(**kw):
    return {"my_module": "%%writefile helper_mod.py\nK = 2\n", "my_double": HONEST_DOUBLE,
            "my_mean": HONEST_MEAN, **kw}


def _grade(tmp_path: Path, answers: dict[str, str], *, seed="s") -> dict[str, object]:
    """Run the plan of the synthetic lab with these answers in a fresh process; judge."""
    assembled = assemble(_reference(HONEST_DOUBLE, HONEST_MEAN), answers, seed=seed)
    plan = plan_process(assembled, cell_timeout_s=60)
    work = tmp_path / "work"
    work.mkdir()
    (work / SPEC_NAME).write_text(json.dumps(plan))
    channel = tmp_path / "records.jsonl"
    fd = os.open(channel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_GRADING")}
    env[ENV_FD] = str(fd)
    try:
        proc = subprocess.run(
            [sys.executable, "-P", "-c",
             "import sys; from perflab.course.grading_process import main; sys.exit(main())",
             str(work / SPEC_NAME)], cwd=work, env=env, pass_fds=[fd], capture_output=True,
            text=True, timeout=120)
    finally:
        os.close(fd)
    by_check, cells, bad = read_records(channel)
    verdicts = {}
    for gid in ("check_double", "check_mean"):
        recs = by_check.get(gid, [])
        if len(recs) != 1 or "error" in recs[0]:
            verdicts[gid] = None if not recs else f"{len(recs)} records {recs[0].get('error')}"
            continue
        verdicts[gid] = judge_answers(assembled.judges[gid], assembled.cases[gid], recs[0])
    return {"verdicts": verdicts, "cells": cells, "bad": bad, "log": proc.stdout + proc.stderr,
            "rc": proc.returncode, "work": work, "plan": plan}


def _passed(result) -> dict[str, bool]:
    return {gid: getattr(v, "passed", False) for gid, v in result["verdicts"].items()}


def test_the_plan_runs_what_the_checks_need_with_magics_translated():
    assembled = assemble(_reference(HONEST_DOUBLE, HONEST_MEAN), _answers())
    plan = plan_process(assembled, cell_timeout_s=30)
    cells = [s for s in plan["steps"] if s["kind"] == "cell"]
    sources = [s["source"] for s in cells]
    # the imports/base cell and scale's cell are read by the answers; `shown` by nothing
    assert any("base = 10" in s for s in sources)
    assert any("scale = 2" in s and "run_line_magic('matplotlib'" in s for s in sources)
    assert not any("shown" in s for s in sources)
    assert not any("expensive_panel" in s for s in sources)       # grading-skip
    assert any("run_cell_magic('writefile', 'helper_mod.py'" in s for s in sources)
    checks = [s for s in plan["steps"] if s["kind"] == "check"]
    assert [c["grade_id"] for c in checks] == ["check_double", "check_mean"]
    assert plan["forbid"] == ["measure"] and len(checks[0]["cases"]) == 5
    # the judge never travels: only student_answer and the block's imports
    assert all("judge_answer" not in c["answer_source"] for c in checks)
    # the kernel's notebook has no graded call left
    kernel = kernel_notebook(assembled)
    assert not any("answer_cases" in c.source or "student_answer" in c.source
                   for c in kernel.cells if c.cell_type == "code")


def test_a_check_can_name_a_cell_whose_effect_is_no_name():
    nb = _reference(HONEST_DOUBLE, HONEST_MEAN)
    nb.cells[2].id = "seed-cell"
    nb.cells[6].metadata["perflab"] = {"needs": ["seed-cell"]}
    plan = plan_process(assemble(nb, _answers()), cell_timeout_s=30)
    assert any("shown = base * 2" in s.get("source", "") for s in plan["steps"])


def test_honest_answers_earn_every_point_in_a_fresh_process(tmp_path):
    result = _grade(tmp_path, _answers())
    assert result["rc"] == 0, result["log"][-2000:]
    assert _passed(result) == {"check_double": True, "check_mean": True}, result["verdicts"]
    assert (result["work"] / "helper_mod.py").read_text() == "K = 2\n"
    assert result["bad"] == 0 and not (result["work"] / SPEC_NAME).exists()


def test_wrong_answers_fail(tmp_path):
    result = _grade(tmp_path, _answers(my_double="def double(v):\n    return v + v + 1",
                                       my_mean="def my_mean(xs):\n    return max(xs)"))
    assert _passed(result) == {"check_double": False, "check_mean": False}


def test_the_shells_hooks_are_not_there(tmp_path):
    # class 1: in the kernel these rewrote later probes (a transformer through exit._ip,
    # a pre_run_cell hook planting a variable); here there is no shell to hook
    attack = ("exit._ip.input_transformers_post.append(lambda lines: lines)\n"
              "get_ipython().events.register('pre_run_cell', lambda: None)\n"
              "def double(v):\n    return 2 * v")
    result = _grade(tmp_path, _answers(my_double=attack))
    assert _passed(result) == {"check_double": False, "check_mean": True}
    assert "AttributeError" in result["log"]


def test_a_forged_record_makes_the_check_tampered(tmp_path):
    # class 3: the answers' process can write on its own records' descriptor; a record
    # that does not come from the graded call is a second record: 0 points
    forge = ("import os, json\n"
             "for fd in range(3, 64):\n"
             "    try:\n"
             "        os.write(fd, (json.dumps({'probe': 'check_double', 'got': "
             "[{'value': 0}] * 5, 'delegated': []}) + '\\n').encode())\n"
             "    except OSError:\n"
             "        pass\n"
             "def double(v):\n    return 2 * v")
    result = _grade(tmp_path, _answers(my_double=forge))
    assert result["verdicts"]["check_double"].startswith("2 records"), result["verdicts"]


@pytest.mark.parametrize("mean", [
    "from perflab import measure\ndef my_mean(xs):\n    return measure(lambda: None) or 0",
    # a given cell's import, used by the answer under another name
    "mine = perflab_measure\ndef my_mean(xs):\n    return mine(lambda: None) or 0",
    # class 2: behind torch.compile the spy saw no frame; the helper itself is gone
    "import torch\nfrom perflab.core.timing import measure\n"
    "m = torch.compile(measure, backend='eager', dynamic=True)\n"
    "def my_mean(xs):\n    return m(lambda: None) or 0",
])
def test_a_forbidden_helper_is_absent(tmp_path, mean):
    result = _grade(tmp_path, _answers(my_mean=mean))
    assert _passed(result) == {"check_double": True, "check_mean": False}
    # the stub raised, or (a copy the stub cannot reach: captured by torch.compile before
    # the call, run eagerly during it) the spy saw it run
    message = result["verdicts"]["check_mean"].message
    assert "ForbiddenHelperError" in message or "ran perflab's measure" in message, message


def test_absent_swaps_stubs_into_modules_and_names_then_puts_them_back():
    code = ("import perflab, perflab.core.timing as t\n"
            "from perflab.course.grading_process import absent, find_helpers, ForbiddenHelperError\n"
            "from perflab import measure as my_alias\n"
            "helpers = find_helpers(['measure', 'torch.utils.flop_counter.FlopCounterMode'])\n"
            "import torch.utils.flop_counter as fc\n"
            "ns = {'m': my_alias}\n"
            "with absent(helpers, ['measure', 'torch.utils.flop_counter.FlopCounterMode'], ns):\n"
            "    from perflab import measure\n"
            "    for f in (measure, t.measure, perflab.measure, fc.FlopCounterMode, ns['m']):\n"
            "        try:\n            f()\n            print('RAN')\n"
            "        except ForbiddenHelperError as e:\n"
            "            print('STUB', 'write it yourself' in str(e))\n"
            "print(ns['m'] is t.measure is helpers['measure'].real, fc.FlopCounterMode.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["STUB", "True"] * 5 + ["True", "FlopCounterMode"], out.stderr
    with pytest.raises(ValueError, match="not a public perflab name"):
        find_helpers(["no_such_helper_anywhere"])


def test_magic_runner_writes_files_and_refuses_unknown_magics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    ip = MagicRunner(ns)
    ip.run_cell_magic("writefile", "m.py", "A = 1\n")
    ip.run_cell_magic("writefile", "-a m.py", "B = 2\n")
    assert (tmp_path / "m.py").read_text() == "A = 1\nB = 2\n"
    assert ip.run_line_magic("time", "1 + 2") == 3
    ip.run_cell_magic("time", "", "x = 5")
    assert ns["x"] == 5 and ip.run_line_magic("matplotlib", "inline") is None
    with pytest.raises(NotImplementedError, match="%%bash"):
        ip.run_cell_magic("bash", "", "ls")
    with pytest.raises(ValueError, match="one file name"):
        ip.run_cell_magic("writefile", "", "x")
    assert issubclass(ForbiddenHelperError, RuntimeError)


@pytest.mark.parametrize("kw, says", [
    ({"stopped": "its processes together used 6.2 GiB, more than the memory cap of 6 GiB"},
     "the grader stopped the grading process (its processes together used 6.2 GiB"),
    ({"returncode": -9}, "exit status -9, killed by signal 9"),
    ({"returncode": 1}, "exit status 1)"),
    ({}, "the grading process stopped before this check (the last cell it finished"),
])
def test_a_check_that_never_ran_says_why(kw, says):
    """A check with no record gets 0 and a reason naming what stopped the process
    (the grader's cap, the exit status, or only where it got to)."""
    from perflab.course.submission import LabGrade, Limits, _score

    grade = LabGrade("ada", "09", None, [])
    nothing_assembled = None  # read only for checks that sent a record; this one sent none
    _score(grade, nothing_assembled, {"check_answer": 2.0}, {}, [{"cell": 1, "seconds": 0.1}],
           False, Limits(), **kw)
    (row,) = grade.checks
    assert row.points == 0 and row.status == "not run"
    assert says in row.message, row.message
