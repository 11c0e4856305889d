"""Lab 00's graded checks on real wrong answers: each runs as grading runs it (the
student's code on hidden cases in the "kernel", the judge apart, answers as JSON); the
reference solution passes at several seeds, wrong answers fail, and a function written
to pass the exercise's examples only fails on the hidden cases."""
from __future__ import annotations

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


def _with_samples_per_s() -> dict:
    scope = {"__name__": "__main__"}
    LAB.run_code(scope, LAB.solution("samples_per_s"))
    return scope


#: Exercise 2 written differently from the reference: it passes.
HONEST_THROUGHPUT = """
import statistics
def my_throughput(batch_size, step):
    return float(batch_size) / statistics.median(list(step.times_s))
"""

#: Exercise 2 answers that must fail on the hidden measurements.
WRONG_THROUGHPUT = {
    "the first step": "def my_throughput(batch_size, step):\n"
                      "    return my_samples_per_s(batch_size, step.times_s[0])",
    "the mean step": "def my_throughput(batch_size, step):\n"
                     "    return my_samples_per_s(batch_size, step.mean)",
    "inverted": "def my_throughput(batch_size, step):\n    return step.median / batch_size",
    "the middle of the unsorted times": (
        "def my_throughput(batch_size, step):\n"
        "    return my_samples_per_s(batch_size, step.times_s[len(step.times_s) // 2])"),
    # perflab's own figure needs the batch size inside the Measurement: None here
    "the measurement's own samples_per_s": ("def my_throughput(batch_size, step):\n"
                                            "    return step.samples_per_s"),
    "the example only": "def my_throughput(batch_size, step):\n    return 32 / 0.11",
}

#: The old exercise's cheat (issue 43): an answer cell that fabricates the run's record
#: and a throughput that agrees with it. The old check read `my_throughput`,
#: `config.batch_size` and `result.step.times_s` from the notebook and recomputed
#: 32 / median(0.032, 0.032, 0.032) = 1000 from them: it passed, whatever the run
#: measured. The check now calls the function on measurements it draws itself.
FABRICATED = """
from types import SimpleNamespace
result = SimpleNamespace(step=SimpleNamespace(times_s=(0.032, 0.032, 0.032), median=0.032))
config = SimpleNamespace(batch_size=32)
def my_throughput(batch_size, step):
    return 1000.0
"""


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
def test_throughput_reference_passes_at_any_seed(seed):
    scope = _with_samples_per_s()
    LAB.run_code(scope, LAB.solution("throughput"))
    verdict = LAB.judge(scope, "check_throughput", seed=seed)
    assert verdict.passed, verdict.message


def test_throughput_honest_variant_passes():
    verdict = LAB.verdict(_with_samples_per_s(), HONEST_THROUGHPUT, "check_throughput")
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("name", sorted(WRONG_THROUGHPUT) + ["fabricated record"])
def test_wrong_throughput_fails(name):
    code = WRONG_THROUGHPUT.get(name, FABRICATED)
    verdict = LAB.verdict(_with_samples_per_s(), code, "check_throughput")
    assert not verdict.passed and verdict.message.startswith("hidden case"), (name, verdict)


def test_throughput_is_graded_on_drawn_measurements_not_the_run():
    """The graded call reads no record of the notebook's run (issue 43): its cases are
    measurements the grader draws (one slow step each, odd and even counts), and its
    answer is the student's function on them."""
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions, split_check

    graded = split_check(LAB.cells["check_throughput"]).graded
    for name in ("result", "config", "my_throughput ="):
        assert name not in graded.answer_source.replace("my_throughput(", ""), name
    cases_fn, _ = graded_functions(graded, "check_throughput")
    cases = draw_cases(cases_fn, "grade:ada")
    assert len(cases) >= 5 and {len(c["times_s"]) % 2 for c in cases} == {0, 1}
    for c in cases:
        times = sorted(c["times_s"])
        assert times[-1] > 2 * times[len(times) // 2]   # a slow step the mean would follow


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
