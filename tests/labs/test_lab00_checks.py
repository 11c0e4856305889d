"""Lab 00's graded checks on real wrong answers: each runs as grading runs it (the
student's code on hidden cases in the "kernel", the judge apart, answers as JSON); the
reference solution passes at several seeds, wrong answers fail, and a function written
to pass the exercise's examples only fails on the hidden cases."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.labs.labcheck import Lab

LAB = Lab("00")
CHECKS_TESTED = ("check_samples_per_s", "check_throughput")

WRONG_SAMPLES = {
    "inverted": "def my_samples_per_s(batch_size, step_s):\n    return step_s / batch_size",
    "examples only": ("def my_samples_per_s(batch_size, step_s):\n"
                      "    return {(32, 0.1): 320.0, (8, 0.25): 32.0}[(batch_size, step_s)]"),
    "rounded": "def my_samples_per_s(batch_size, step_s):\n    return round(batch_size / step_s)",
    "a string": "def my_samples_per_s(batch_size, step_s):\n    return str(batch_size / step_s)",
}


@pytest.fixture(scope="module")
def ns():
    return {"__name__": "__main__"}


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
def test_reference_passes_at_any_seed(ns, seed):
    scope = dict(ns)
    LAB.run_code(scope, LAB.solution("samples_per_s"))
    verdict = LAB.judge(scope, "check_samples_per_s", seed=seed)
    assert verdict.passed, verdict.message


def test_honest_variant_passes(ns):
    scope = dict(ns)
    LAB.run_code(scope, "def my_samples_per_s(b, s):\n    return float(b) * (1.0 / s)")
    assert LAB.judge(scope, "check_samples_per_s", seed=7).passed


@pytest.mark.parametrize("name", sorted(WRONG_SAMPLES))
def test_wrong_samples_per_s_fails(ns, name):
    verdict = LAB.verdict(ns, WRONG_SAMPLES[name], "check_samples_per_s")
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict


def _run_ns(times=(0.10, 0.12, 0.11, 0.5, 0.09)):
    import statistics

    step = SimpleNamespace(times_s=tuple(times), median=statistics.median(times))
    return {"config": SimpleNamespace(batch_size=32), "result": SimpleNamespace(step=step),
            "my_samples_per_s": lambda b, s: b / s}


def test_throughput_right_and_wrong():
    scope = _run_ns()
    LAB.run_code(scope, LAB.solution("throughput"))
    assert LAB.judge(scope, "check_throughput").passed
    for wrong in ["my_throughput = 32 / 0.10",                       # the first step
                  "my_throughput = 32 / (sum(result.step.times_s) / 5)",  # the mean
                  "my_throughput = result.step.median / 32"]:
        scope = _run_ns()
        LAB.run_code(scope, wrong)
        verdict = LAB.judge(scope, "check_throughput")
        assert not verdict.passed, wrong
    short = _run_ns(times=(0.1, 0.1))
    LAB.run_code(short, LAB.solution("throughput"))
    assert not LAB.judge(short, "check_throughput").passed  # never passes on too few steps


def test_the_course_map_names_every_lab():
    """The map is read from perflab.labs.catalog (not typed), and the prose that walks
    through it (cell 4, before section 2) names every lab of the catalog, 09 included
    (issue 26: Lab 09 was missing)."""
    import json
    import re
    from pathlib import Path

    from perflab.labs.catalog import LABS

    nb = json.loads((Path(__file__).resolve().parents[2] / "solutions" / "00_start_here.ipynb")
                    .read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "lab_map(" in code, "the lab map must come from perflab.labs.catalog"
    (walk,) = ["".join(c["source"]) for c in nb["cells"]
               if c["cell_type"] == "markdown" and "build on each other" in "".join(c["source"])]
    walk = walk.split("## 2.")[0]
    named = set()
    for lo, hi in re.findall(r"\b(\d\d)-(\d\d)\b", walk):
        named |= {f"{n:02d}" for n in range(int(lo), int(hi) + 1)}
    named |= set(re.findall(r"\b(\d\d)\b", walk))
    missing = [lab.number for lab in LABS if lab.number not in named]
    assert not missing, f"the course map's prose does not name lab(s) {missing}"
