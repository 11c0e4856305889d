"""Lab 08's check cells: each judge passes right facts and fails wrong ones (FACTS), and
real wrong answers — typical mistakes and answers that only delegate to perflab — fail
their check when the lab's own cells run with them: the set-up cell, the answer, the
check's probe in this process, its judge on the facts after a JSON round trip
(tests/labs/labcheck.py). The report check runs on a ladder climbed with seeded fake
measurements (tests/ladder/test_ladder.py's FakeRuns), so no test here times anything.
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from tests.labs.labcheck import Lab, assert_judge_decides
from perflab import count_flops, build_model
from perflab.ladder.search import climb
from perflab.ladder.rungs import RUNGS, naive_config
from perflab.labs.lab08 import (
    flatten_numbers, report_numbers, report_problems, rungs_called_kept,
    unmeasured_numbers,
)
from perflab.analysis.roofline import MatmulRoof, Roofline
from tests.ladder.test_ladder import FakeRuns

LAB = Lab("08")
_WHY = {r: None for r in RUNGS} | {"max_autotune": "GPU only", "cuda_graphs": "GPU only",
                                   "cudnn_benchmark": "GPU only"}
_RUNGS = {"rungs": ["data_loading", "channels_last"], "known": list(RUNGS), "limit": 3,
          "why_not": _WHY}
_FLOPS = {"fixed 4x8": 667392, "resnet18 2x32": 434565120, "fixed 2x16": 1329024,
          "resnet18 1x64": 869038080}
_MFU = [[2.0e9, 0.5, 1.0e10, 40.0], [3.2e12, 0.25, 989.5e12, 100 * 3.2e12 / 0.25 / 989.5e12],
        [7.0e9, 0.1, 2.17e10, 100 * 7.0e9 / 0.1 / 2.17e10]]
_STATE = {"sgd": {"params": 6312, "grads": 6312, "optimizer": 6312},
          "adam frozen": {"params": 6312, "grads": 5416, "optimizer": 10856}}
_TEXT = ("On this machine I climbed data_loading and channels_last. data_loading was kept: "
         "1.52x per sample (p = 0.003). channels_last was dropped: 0.97x (p = 0.41). "
         "Cumulative speedup per sample: 1.52x, MFU 2.31 % of the measured fp32 peak of "
         "ResNet-18 at 32 px.")
_VALUES = {"speedup dl": 1.5213, "p dl": 0.0031, "speedup cl": 0.968, "p cl": 0.4102,
           "cum": 1.5213, "mfu": 2.3111, "image_size": 32}
_REPORT = {"report": _TEXT, "speedup": "1.52x", "kept": ["data_loading"],
           "tried": ["data_loading", "channels_last"], "values": _VALUES}

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)])
FACTS = {
    ("08", "check_rungs"): (
        {"rungs_got": _RUNGS},
        [({"rungs_got": {**_RUNGS, "rungs": "'amp'"}}, False),                 # a string
         ({"rungs_got": {**_RUNGS, "rungs": []}}, False),
         ({"rungs_got": {**_RUNGS, "rungs": ["data_loader"]}}, False),         # misspelt
         ({"rungs_got": {**_RUNGS, "rungs": ["amp", "amp"]}}, False),
         ({"rungs_got": {**_RUNGS, "rungs": ["cuda_graphs"]}}, False),         # GPU only
         ({"rungs_got": {**_RUNGS, "rungs": ["data_loading", "amp", "channels_last",
                                             "compile"]}}, False)]),           # too many
    ("08", "check_step_flops"): (
        {"flops_got": _FLOPS, "flops_delegated": []},
        [({"flops_got": {**_FLOPS, "fixed 4x8": 259328}, "flops_delegated": []}, False),  # forward
         ({"flops_got": {**_FLOPS, "resnet18 2x32": 434565120 // 2},
           "flops_delegated": []}, False),                                     # MACs
         ({"flops_got": _FLOPS, "flops_delegated": ["count_flops"]}, False),
         ({"flops_got": {**_FLOPS, "fixed 4x8": "None"}, "flops_delegated": []}, False),
         ({"flops_got": {**_FLOPS, "resnet18 1x64": 3 * 296101888},
           "flops_delegated": []}, True)]),                                    # 3 x forward
    ("08", "check_mfu"): (
        {"mfu_got": _MFU, "mfu_delegated": []},
        [({"mfu_got": [[f, t, p, v / 100] for f, t, p, v in _MFU], "mfu_delegated": []}, False),
         ({"mfu_got": [[f, t, p, 100 * f / p] for f, t, p, _ in _MFU], "mfu_delegated": []},
          False),                                                              # no step time
         ({"mfu_got": _MFU, "mfu_delegated": ["mfu_pct"]}, False),
         ({"mfu_got": _MFU[:2] + [[7.0e9, 0.1, 2.17e10, 1.0]], "mfu_delegated": []}, True)]),
    ("08", "check_state_bytes"): (
        {"state_got": _STATE, "state_delegated": []},
        [({"state_got": {**_STATE, "sgd": {"params": 1578, "grads": 1578, "optimizer": 1578}},
           "state_delegated": []}, False),                                     # numel, not bytes
         ({"state_got": _STATE, "state_delegated": ["model_state_bytes"]}, False),
         ({"state_got": {**_STATE, "sgd": "None"}, "state_delegated": []}, False),
         ({"state_got": {**_STATE, "adam frozen": {**_STATE["adam frozen"], "grads": 6312}},
           "state_delegated": []}, True),                                      # frozen grads
         ({"state_got": {**_STATE, "adam frozen": {**_STATE["adam frozen"], "optimizer": 10824}},
           "state_delegated": []}, True)]),                                    # Adam's step
    ("08", "check_union_length"): (
        {"fixed": [0, 20.0, 20.0], "mine": 5.0, "busy": 5.0},
        [({"fixed": [0, 23.0, 20.0], "mine": 5.0, "busy": 5.0}, False),
         ({"fixed": [0, 20.0, 20.0], "mine": 6.0, "busy": 5.0}, False)]),
    ("08", "check_report"): (
        {"report_facts": _REPORT},
        [({"report_facts": {**_REPORT, "report": _TEXT + " It took 4 minutes."}}, False),
         ({"report_facts": {**_REPORT, "report": _TEXT.replace("1.52x per", "1.5x per")
                            .replace("0.97x", "0.95x")}}, False),              # not measured
         ({"report_facts": {**_REPORT, "report": _TEXT.replace("was dropped", "was kept")}},
          False),
         ({"report_facts": {**_REPORT, "speedup": "1.61x"}}, False),           # not quoted
         ({"report_facts": {**_REPORT, "report": _TEXT.replace("channels_last", "NHWC")}},
          False),                                                              # a move unnamed
         ({"report_facts": {**_REPORT, "report": "word " * 30 + "1.52x and 2.31 %"}}, False),
         ({"report_facts": {**_REPORT, "report": None}}, False)]),
}


@pytest.mark.parametrize("key", sorted(FACTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_judge_passes_right_facts_and_fails_wrong_ones(key):
    assert_judge_decides(LAB.cells[key[1]], *FACTS[key], name=key[1])


def test_every_lab08_check_has_facts():
    graded = {g for g in LAB.cells if g and g.startswith("check_")}
    assert graded == {g for _, g in FACTS}


# --- the lab's own cells with real answers ------------------------------------------

@pytest.fixture(scope="module")
def ns():
    return LAB.namespace()


FLOPS_WRONG = {
    "forward only": """
def count_step_flops(model, x, y):
    with FlopCounterMode(display=False) as c:
        F.cross_entropy(model(x), y)
    return c.get_total_flops()
""",
    "multiply-adds": """
def count_step_flops(model, x, y):
    with FlopCounterMode(display=False) as c:
        F.cross_entropy(model(x), y).backward()
    return c.get_total_flops() // 2
""",
    "3 x forward": """
def count_step_flops(model, x, y):
    with FlopCounterMode(display=False) as c:
        F.cross_entropy(model(x), y)
    return 3 * c.get_total_flops()
""",
    "delegates": """
import perflab
def count_step_flops(model, x, y):
    return perflab.count_flops(model, batch_size=x.shape[0],
                               image_size=max(16, x.shape[-1])).model_flops
""",
    "a float": """
def count_step_flops(model, x, y):
    with FlopCounterMode(display=False) as c:
        F.cross_entropy(model(x), y).backward()
    return float(c.get_total_flops())
""",
}
MFU_WRONG = {
    "a fraction": "def my_mfu_pct(f, t, p):\n    return f / t / p\n",
    "no step time": "def my_mfu_pct(f, t, p):\n    return 100 * f / p\n",
    "delegates": ("from perflab.analysis.flops import mfu_pct\n"
                  "def my_mfu_pct(f, t, p):\n    return mfu_pct(f, t, p)\n"),
}
STATE_WRONG = {
    "counts elements": """
def state_bytes(model, optimizer):
    ps = list(model.parameters())
    return {"params": sum(p.numel() for p in ps), "grads": sum(p.numel() for p in ps),
            "optimizer": sum(t.numel() for s in optimizer.state.values() for t in s.values())}
""",
    "grads of frozen params": """
def state_bytes(model, optimizer):
    ps = list(model.parameters())
    n = sum(p.numel() * p.element_size() for p in ps)
    return {"params": n, "grads": n, "optimizer": sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())}
""",
    "optimizer = params x multiplier": """
def state_bytes(model, optimizer):
    ps = list(model.parameters())
    n = sum(p.numel() * p.element_size() for p in ps)
    g = sum(p.grad.numel() * p.grad.element_size() for p in ps if p.grad is not None)
    k = 2 if isinstance(optimizer, torch.optim.Adam) else 1
    return {"params": n, "grads": g, "optimizer": k * g}
""",
    "delegates": """
from perflab.core.memory import model_state_bytes
def state_bytes(model, optimizer):
    s = model_state_bytes(model, optimizer)
    return {"params": s.params, "grads": s.grads, "optimizer": s.optimizer}
""",
}
RUNGS_WRONG = {
    "a string": 'my_rungs = "data_loading"',
    "twice": 'my_rungs = ["data_loading", "data_loading"]',
    "GPU only here": 'my_rungs = ["data_loading", "cuda_graphs"]',
    "too many": 'my_rungs = ["data_loading", "amp", "channels_last", "compile"]',
    "misspelt": 'my_rungs = ["dataloading"]',
}
CASES = ([("check_step_flops", n, c) for n, c in FLOPS_WRONG.items()]
         + [("check_mfu", n, c) for n, c in MFU_WRONG.items()]
         + [("check_state_bytes", n, c) for n, c in STATE_WRONG.items()]
         + [("check_rungs", n, c) for n, c in RUNGS_WRONG.items()])


@pytest.mark.parametrize("answer, check", [("count_step_flops", "check_step_flops"),
                                           ("my_mfu_pct", "check_mfu"),
                                           ("state_bytes", "check_state_bytes")])
def test_reference_answer_passes(ns, answer, check):
    v = LAB.verdict(ns, LAB.solution(answer), check)
    assert v.passed, v.message


def test_a_chosen_ladder_passes(ns):
    v = LAB.verdict(ns, 'my_rungs = ["data_loading", "amp", "channels_last"]', "check_rungs")
    assert v.passed, v.message


@pytest.mark.parametrize("check, name, code", CASES, ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_wrong_answer_fails(ns, check, name, code):
    v = LAB.verdict(ns, code, check)
    assert not v.passed, f"{name} passed {check}"
    assert v.message


def test_reference_flop_counts_are_perflabs():
    """The judge's counts for ResNet-18 are perflab.count_flops' (FlopCounterMode on meta)."""
    assert count_flops(build_model("resnet18", 10), batch_size=2, image_size=32).model_flops == 434565120
    assert count_flops(build_model("resnet18", 10), batch_size=1, image_size=64).model_flops == 869038080


# --- the report check on a ladder climbed with fake measurements --------------------

@pytest.fixture(scope="module")
def report_ns(ns):
    """The names the report cell and its check read, from a fake climb: data_loading and
    compile kept, channels_last dropped, also when re-tried (test_ladder.default_speed)."""
    scope = dict(ns)
    lad = climb(naive_config("tiny", model="tiny", device="cpu"),
                rungs=["data_loading", "channels_last", "compile"], rounds=1, save=False,
                progress=False, run_fn=FakeRuns())
    lad.baseline = dataclasses.replace(lad.baseline, env={"device": "cpu",
                                                          "device_name": "AMD EPYC"})
    roof = Roofline(device="cpu", device_name="AMD EPYC", threads=2,
                    matmul=(MatmulRoof("fp32", 18.53, 512), MatmulRoof("bf16", 0.504, 256),
                            MatmulRoof("fp16", 0.572, 256)), bandwidth_gb_s=3.7, copy_mib=64)
    mfu = {"baseline": dict(step_flops=1738260480, gflops_per_step=1.73826, step_time_ms=4055.5,
                            achieved_gflops=0.4286, peak_gflops=18.53, mfu_pct=2.3131,
                            dtype="fp32", source="measured: 512x512 fp32 matmul, 2 threads")}
    parts = pd.DataFrame({"measured_mib": [42.65, 42.65, 42.65, 3.51, 131.46]},
                         index=pd.Index(["params", "grads", "optimizer", "activations",
                                         "total"], name="part"))
    temporal = pd.DataFrame({"compute_pct": [97.65], "idle_pct": [2.35], "note": ["cpu"]})
    scope.update(ladder=lad, roof=roof, AMP_MODE="bf16", mfu_runs=mfu, breakdown=parts,
                 my_states={"params": 44_720_000, "grads": 44_720_000,
                            "optimizer": 44_720_000}, temporal=temporal,
                 my_rungs=["data_loading", "channels_last", "compile"])
    assert lad.kept[:2] == ["data_loading", "compile"] and "channels_last" in lad.dropped
    return scope


def test_reference_report_passes(report_ns):
    v = LAB.verdict(report_ns, LAB.solution("report"), "check_report")
    assert v.passed, v.message


REPORT_WRONG = {
    "a typed-in number": "\nreport += ' The step took 17 minutes.'",
    "a figure off by rounding": "\nreport += f' Speedup {ladder.cumulative_speedup * 1.07:.2f}x.'",
    "dropped rung called kept": "\nreport = report.replace('was dropped', 'was kept')",
    "rung listed as kept": "\nreport += ' Kept: data_loading, channels_last.'",
    "the old check's report": ("\nreport = ('word ' * 30 + f'{ladder.cumulative_speedup:.2f}x '"
                               " + '12.00 %')"),
}


@pytest.mark.parametrize("name", sorted(REPORT_WRONG))
def test_wrong_report_fails(report_ns, name):
    code = LAB.solution("report").replace("### END SOLUTION", REPORT_WRONG[name]
                                          + "\n### END SOLUTION")
    v = LAB.verdict(report_ns, code, "check_report")
    assert not v.passed, f"{name} passed check_report"
    assert ("not values this run measured" in v.message or "kept" in v.message
            or "quote" in v.message), v.message


# --- perflab.labs.lab08 ------------------------------------------------------------

def test_numbers_are_read_at_their_printed_precision():
    text = ("1. On ResNet-18 (fp32, bf16): 1.52x, 95 % CI 0.85-1.10x, p = 3.1e-05, "
            "-0.25, 1,234.5 samples/s, 12.3 % and 12.3%")
    got = [(n.text, n.decimals, n.scientific, n.percent) for n in report_numbers(text)]
    assert got == [("1.52", 2, False, False), ("95", 0, False, True), ("0.85", 2, False, False),
                   ("1.10", 2, False, False), ("3.1e-05", 1, True, False),
                   ("-0.25", 2, False, False), ("1,234.5", 1, False, False),
                   ("12.3", 1, False, True), ("12.3", 1, False, True)]
    values = {"a": 1.5213, "b": 0.849, "c": 1.1, "d": 3.14e-5, "e": -0.2512, "f": 1234.46,
              "frac": 0.1234, "ci": 95}
    assert unmeasured_numbers(text, values) == []
    assert unmeasured_numbers("1.53x and 1.5213x", values) == ["1.53"]  # rounding, not typing
    assert unmeasured_numbers("12.34 and 12.34 %", values) == ["12.34"]  # x100 only with %
    assert unmeasured_numbers("12 steps", [12.4]) == []


def test_rungs_called_kept_reads_the_nearest_status_word():
    text = ("Kept: data_loading (1.52x, p = 0.003); dropped: amp (0.06x).\n"
            "channels_last was not kept, compile was kept. threads did not help; "
            "amp+channels_last was kept. The -amp removal was kept.")
    assert rungs_called_kept(text) == ["data_loading", "compile", "amp", "channels_last",
                                       "-amp"]
    assert rungs_called_kept("torch.compile was kept") == []  # torch.compile is no rung name
    assert rungs_called_kept("amp was dropped and not kept") == []


def test_report_problems_names_what_is_wrong():
    assert report_problems(_TEXT, _VALUES, ["data_loading"]) == []
    bad = report_problems(_TEXT + " Also 7.7x.", _VALUES, ["data_loading"])
    assert len(bad) == 1 and "7.7" in bad[0]
    bad = report_problems(_TEXT.replace("was dropped", "was kept"), _VALUES, ["data_loading"])
    assert len(bad) == 1 and "channels_last" in bad[0]
    assert report_problems(_TEXT, _VALUES, ["data_loading+channels_last"]) == []
    assert "at least 30 words" in report_problems("1.52x", _VALUES, [])[0]
    assert "at least 30 words" in report_problems(None, _VALUES, [])[0]


def test_flatten_numbers_walks_frames_and_skips_non_numbers():
    df = pd.DataFrame({"x": [1.5, float("nan")], "s": ["a", "b"]})
    got = flatten_numbers({"df": df, "l": [1, True, None, "2"], "n": 3.25})
    assert got == {"df.x.0": 1.5, "l[0]": 1.0, "n": 3.25}


@pytest.mark.parametrize("call, field", [
    (lambda: report_numbers(3), "text must be a str"),
    (lambda: rungs_called_kept(b"amp"), "text must be a str"),
    (lambda: unmeasured_numbers("1", {"a": "1.0"}), "measured values must be numbers"),
])
def test_bad_input_is_a_value_error(call, field):
    with pytest.raises(ValueError, match=field):
        call()
