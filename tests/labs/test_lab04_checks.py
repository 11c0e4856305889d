"""Lab 04's check cells: each judge passes right facts and fails wrong ones, and real wrong
answers — typical mistakes and answers that only delegate to perflab — fail their check
when the lab's own cells run with them (see tests/labs/test_lab03_checks.py for how)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import slow
from tests.labs.labcheck import assert_judge_decides
from perflab.course.checks import run_judge, split_check
from tests.labs.test_lab03_checks import check_source, run_lab

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "04_activation_checkpointing.ipynb"

_CKPT = {"switched": [], "no_grad": [], "changed": []}
_ERRS = {"2": {"w": 1e-6}, "4": {"w": 1e-6}, "odd": {"w": 1e-6}, "delegated": False}
_OWN = {"exported": True, "points": 1500, "mine": [207_000_000, "unknown"],
        "ref": [207_000_000, "unknown"], "categorized": True}
_PEAKS = {"synthetic": [61, "gradient"], "hidden": [17, "unknown"]}


def _search(got, calls=12, max_calls=26):
    return {"got": got, "calls": calls, "max_calls": max_calls, "outside": []}


_SEARCH = {"affine": _search(108), "exact": _search(300), "none fits": _search(0),
           "limit fits": _search(1000, max_calls=22), "quadratic": _search(99)}

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)])
FACTS = {
    ("04", "check_checkpointed_forward"): (
        {"before": 100, "after": 40, "MIB": 2**20, "ckpt": _CKPT},
        [({"before": 100, "after": 80, "MIB": 2**20, "ckpt": _CKPT}, False),
         ({"before": 100, "after": 40, "MIB": 2**20, "ckpt": {**_CKPT, "changed": ["fc.weight"]}}, False),
         ({"before": 100, "after": 40, "MIB": 2**20, "ckpt": {**_CKPT, "no_grad": ["fc.bias"]}}, False),
         ({"before": 100, "after": 40, "MIB": 2**20, "ckpt": {**_CKPT, "switched": ["per_stage"]}},
          False)]),
    ("04", "check_predict_segments"): ({"predicted_mib": 10.0, "measured_mib": 10.5},
                                       [({"predicted_mib": 5.0, "measured_mib": 10.5}, False),
                                        ({"predicted_mib": 12.0, "measured_mib": 10.5}, False)]),
    ("04", "check_memory_peak"): (
        {"peak_got": _PEAKS, "own": _OWN},
        [({"peak_got": {**_PEAKS, "synthetic": [30, "activation"]}, "own": _OWN}, False),  # one category's peak
         ({"peak_got": {**_PEAKS, "synthetic": [61, "autograd_detail"]}, "own": _OWN}, False),  # off by one
         ({"peak_got": {**_PEAKS, "synthetic": None}, "own": _OWN}, False),
         ({"peak_got": {**_PEAKS, "hidden": [17, "parameter"]}, "own": _OWN}, True),
         ({"peak_got": _PEAKS, "own": {"exported": False}}, False),
         ({"peak_got": _PEAKS, "own": {**_OWN, "points": 3, "categorized": False}}, False),
         ({"peak_got": _PEAKS, "own": {**_OWN, "mine": [1, "unknown"]}}, False)]),
    ("04", "check_accumulate"): (
        {"acc_errors": _ERRS},
        [({"acc_errors": {**_ERRS, "2": {"w": .1}}}, False),
         ({"acc_errors": {**_ERRS, "2": None}}, False),
         ({"acc_errors": {**_ERRS, "delegated": True}}, False),
         ({"acc_errors": {**_ERRS, "odd": {"w": .1}}}, True)]),
    ("04", "check_largest_batch"): (
        {"search_got": _SEARCH, "search_delegated": []},
        [({"search_got": {**_SEARCH, "affine": _search(109)}, "search_delegated": []}, False),
         ({"search_got": {**_SEARCH, "exact": _search(299)}, "search_delegated": []}, False),
         ({"search_got": {**_SEARCH, "affine": _search(108, calls=109)}, "search_delegated": []}, False),
         ({"search_got": _SEARCH, "search_delegated": ["search_max_batch"]}, False),
         ({"search_got": {**_SEARCH, "none fits": _search(1)}, "search_delegated": []}, True)]),
}


@pytest.mark.parametrize("key", sorted(FACTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_judge_passes_right_facts_and_fails_wrong_ones(key):
    assert_judge_decides(check_source(LAB, key[1]), *FACTS[key], name=key[1])


def test_segment_prediction_message_does_not_give_the_answer():
    check = split_check(check_source(LAB, "check_predict_segments"))
    verdict = run_judge(check, {"predicted_mib": 5.0, "measured_mib": 10.4567})
    assert not verdict.passed
    for leak in ("10.4", "10.5", "52 %", "52%", "48 %", "48%"):
        assert leak not in verdict.message, verdict.message


_SWITCH_ON = '''
def checkpointed_forward(model, x):
    model.set_checkpointing("per_stage")
    return model(x)
'''
_ONE_STAGE = '''
def checkpointed_forward(model, x):
    h = x
    for i, stage in enumerate(model.stages()):
        h = checkpoint(stage, h, use_reentrant=False) if i == 4 else stage(h)
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_SUM_STAGES = "predicted_mib = float(table.saved_mib.sum())"
_NO_MEMORY = '''
def profile_step(model, x, y, optimizer, path):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    prof.export_memory_timeline(path, device=str(x.device))


def find_peak(timeline):
    times, sizes = timeline
    peak = max(range(len(sizes)), key=lambda i: sum(sizes[i]))
    row = sizes[peak][1:]
    return sum(sizes[peak]), CATEGORIES[max(range(len(row)), key=row.__getitem__)]
'''
_OFF_BY_ONE = '''
def profile_step(model, x, y, optimizer, path):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    prof.export_memory_timeline(path, device=str(x.device))


def find_peak(timeline):
    times, sizes = timeline
    peak = max(range(len(sizes)), key=lambda i: sum(sizes[i]))
    row = sizes[peak]
    return sum(row), CATEGORIES[max(range(len(CATEGORIES)), key=row.__getitem__)]
'''
_LARGEST_CATEGORY_OVER_TIME = _OFF_BY_ONE.replace(
    '''    peak = max(range(len(sizes)), key=lambda i: sum(sizes[i]))
    row = sizes[peak]
    return sum(row), CATEGORIES[max(range(len(CATEGORIES)), key=row.__getitem__)]''',
    '''    j = max(range(1, 9), key=lambda j: max(row[j] for row in sizes))
    return max(sum(row) for row in sizes), CATEGORIES[j - 1]''')
_UNSCALED_ACCUMULATION = '''
def my_accumulated_grads(model, x, y, k):
    model.zero_grad(set_to_none=True)
    for xc, yc in zip(x.tensor_split(k), y.tensor_split(k)):
        F.cross_entropy(model(xc), yc).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}
'''
_DELEGATE_ACCUMULATION = '''
def my_accumulated_grads(model, x, y, k):
    from perflab.analysis.accumulation import accumulated_gradients
    return accumulated_gradients(model, x, y, k)
'''
_LINEAR_SEARCH = '''
def largest_batch(bytes_at, budget, limit=4096):
    n = 0
    while n < limit and bytes_at(n + 1) <= budget:
        n += 1
    return n
'''
_OFF_BY_ONE_SEARCH = '''
def largest_batch(bytes_at, budget, limit=4096):
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes_at(mid) < budget:
            lo = mid + 1
        else:
            hi = mid
    return lo
'''
_DELEGATE_SEARCH = '''
def largest_batch(bytes_at, budget, limit=4096):
    import perflab
    best, _, _ = perflab.search_max_batch(lambda n: (bytes_at(n) <= budget, None, ""),
                                          start=1, limit=limit)
    return best
'''

#: (answer grade_id, wrong answer, the check it must fail)
WRONG = {
    "forward switches the model's own checkpointing": (
        "checkpointed_forward", _SWITCH_ON, "check_checkpointed_forward"),
    "only the last stage checkpointed": ("checkpointed_forward", _ONE_STAGE,
                                         "check_checkpointed_forward"),
    "prediction sums every stage": ("predict_segments", _SUM_STAGES, "check_predict_segments"),
    "profile without memory": ("memory_profile", _NO_MEMORY, "check_memory_peak"),
    "category index off by one": ("memory_profile", _OFF_BY_ONE, "check_memory_peak"),
    "largest category over the whole step": ("memory_profile", _LARGEST_CATEGORY_OVER_TIME,
                                             "check_memory_peak"),
    "losses not scaled per micro-batch": ("accumulate", _UNSCALED_ACCUMULATION,
                                          "check_accumulate"),
    "accumulation delegates to perflab": ("accumulate", _DELEGATE_ACCUMULATION,
                                          "check_accumulate"),
    "linear search": ("largest_batch", _LINEAR_SEARCH, "check_largest_batch"),
    "search off by one": ("largest_batch", _OFF_BY_ONE_SEARCH, "check_largest_batch"),
    "search delegates to perflab": ("largest_batch", _DELEGATE_SEARCH, "check_largest_batch"),
}


@slow
def test_reference_answers_pass_every_check(monkeypatch):
    verdicts = run_lab(LAB, {}, "check_largest_batch", monkeypatch, all_checks=True)
    assert set(verdicts) == {k[1] for k in FACTS}
    assert all(v.passed for v in verdicts.values()), {
        g: v.message for g, v in verdicts.items() if not v.passed}


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_its_check(name, monkeypatch):
    gid, source, check = WRONG[name]
    verdict = run_lab(LAB, {gid: source}, check, monkeypatch)[check]
    assert not verdict.passed, f"{name!r} passed {check}"
    assert verdict.message
