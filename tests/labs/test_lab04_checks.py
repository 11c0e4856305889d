"""Lab 04's graded checks on real answers: each runs as grading runs it (the student's code
on hidden cases drawn in the grader, here in this process standing in for the kernel, the
answers as JSON, the judge apart, tests/labs/labcheck.py). The reference solutions pass at
several seeds, an honest answer written differently passes, and typical mistakes, answers
written for the examples only and answers that only delegate to perflab fail. The lab's
own cells also run top to bottom with the reference answers at the tiny preset, each
check graded as in grading.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import REFERENCE_SEEDS, Lab, graded_verdict
from perflab.course.answers import SKIP_TAG
from perflab.course.checks import split_check

ROOT = Path(__file__).resolve().parents[2]
LAB = Lab("04")

#: The checks graded on hidden cases, each tried below on real wrong answers.
GRADED_TESTED = ("check_checkpointed_forward", "check_predict_segments", "check_memory_peak",
                 "check_accumulate", "check_largest_batch", "check_allocator_record")
#: check -> the answer cell(s) it grades
ANSWERS = {"check_checkpointed_forward": ("checkpointed_forward",),
           "check_predict_segments": ("predict_segments",),
           "check_memory_peak": ("memory_profile",),
           "check_accumulate": ("accumulate",),
           "check_largest_batch": ("largest_batch",),
           "check_allocator_record": ("allocator_record",)}


def _code_cell(marker: str) -> str:
    return next(c.source for c in LAB.nb.cells if c.cell_type == "code" and marker in c.source)


@pytest.fixture(scope="module")
def ns():
    """The lab's set-up cell at the tiny preset, and the cell defining CATEGORIES."""
    from perflab import RunConfig

    scope = LAB.namespace()
    scope["config"] = RunConfig.preset("tiny")
    LAB.run_code(scope, _code_cell("CATEGORIES = ["))
    return scope


def _reference(gid: str) -> str:
    """The reference answer cell; the prediction's function only (the cell's last lines
    use the lab's `table`)."""
    source = LAB.solution(gid)
    return source.split("\n\npredicted_mib")[0] if gid == "predict_segments" else source


def _verdict(ns, check: str, code: str | None = None, seed=0):
    scope = dict(ns)
    for gid in ANSWERS[check]:
        LAB.run_code(scope, _reference(gid))
    if code is not None:
        LAB.run_code(scope, code)
    return LAB.judge(scope, check, seed=seed)


@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
@pytest.mark.parametrize("check", GRADED_TESTED)
def test_reference_passes_at_any_seed(ns, check, seed):
    verdict = _verdict(ns, check, seed=seed)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("check", ["check_checkpointed_forward", "check_accumulate"])
def test_judge_needs_no_global_generator(ns, check, monkeypatch):
    """Grading judges submissions side by side in threads of one process, so torch's global
    generator may move between a judge's seeding and its model's initialisation: with
    torch.manual_seed a no-op (the generator runs on between the answer and the judge),
    the weights must still match."""
    import torch

    monkeypatch.setattr(torch, "manual_seed", lambda seed: None)
    verdict = _verdict(ns, check, seed=3)
    assert verdict.passed, verdict.message


_HEAD_BY_MEAN = '''
import contextlib
import torch

_recomputing = [False]


@contextlib.contextmanager
def _flag_recompute():
    _recomputing[0] = True
    try:
        yield
    finally:
        _recomputing[0] = False


def _stash(bn, args):        # forward pre-hook: keep the buffers during a recompute
    if _recomputing[0]:
        bn._kept = [bn.running_mean.clone(), bn.running_var.clone(),
                    bn.num_batches_tracked.clone()]


def _unstash(bn, args, out):  # forward hook: put them back
    if _recomputing[0]:
        with torch.no_grad():
            for b, v in zip((bn.running_mean, bn.running_var, bn.num_batches_tracked), bn._kept):
                b.copy_(v)


def checkpointed_forward(model, x):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d) and not getattr(m, "_hooked", False):
            m.register_forward_pre_hook(_stash)
            m.register_forward_hook(_unstash)
            m._hooked = True
    h = x
    for part in model.stages():
        h = checkpoint(part, h, use_reentrant=False,
                       context_fn=lambda: (contextlib.nullcontext(), _flag_recompute()))
    return model.fc(h.mean(dim=(2, 3)))
'''
_PREDICT_BY_SETS = '''
def predict_saved_mib(table, plan):
    firsts = {seg.stages[0] for seg in plan if seg.checkpointed}
    stored = {i for seg in plan if not seg.checkpointed for i in seg.stages}
    total = float(table.saved_mib["head"])
    total += sum(table.input_mib.iloc[i] for i in firsts)
    total += sum(table.saved_mib.iloc[i] - table.input_mib.iloc[i + 1] for i in stored)
    return total
'''
_PEAK_NUMPY = '''
import numpy as np
def find_peak(timeline):
    a = np.asarray(timeline[1])
    i = int(a.sum(axis=1).argmax())
    return int(a[i].sum()), CATEGORIES[int(a[i, 1:].argmax())]
'''
_ACCUMULATE_SUMS = '''
def my_accumulated_grads(model, x, y, k):
    model.zero_grad(set_to_none=True)
    for xc, yc in zip(torch.tensor_split(x, k), torch.tensor_split(y, k)):
        (F.cross_entropy(model(xc), yc, reduction="sum") / x.shape[0]).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}
'''
_SEARCH_UPPER = '''
def largest_batch(bytes_at, budget, limit=4096):
    lo, hi = 0, limit                 # bytes_at(lo) fits (or lo == 0); answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bytes_at(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
'''
_LARGEST_BY_SORT = '''
def largest_allocation(snapshot):
    allocs = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    if not allocs:
        return None
    top = sorted(allocs, key=lambda e: -e["size"])[0]      # sorted is stable: first on a tie
    mine = [f for f in top["frames"] if f["filename"].endswith(".py")
            and "/torch/" not in f["filename"]]
    return top["size"], (f"{mine[0]['filename']}:{mine[0]['line']}" if mine else None)


def fragmentation(stats):
    out = {k: stats[f"{k}_bytes.all.current"] for k in ("reserved", "allocated", "inactive_split")}
    out["cached_unused"] = out["reserved"] - out["allocated"]
    return out
'''
#: check -> an honest answer written differently from the reference
HONEST = {"check_checkpointed_forward": _HEAD_BY_MEAN,
          "check_allocator_record": _LARGEST_BY_SORT,
          "check_predict_segments": _PREDICT_BY_SETS,
          "check_memory_peak": _PEAK_NUMPY,
          "check_accumulate": _ACCUMULATE_SUMS,
          "check_largest_batch": _SEARCH_UPPER}


_STATS_UPDATED_IN_RECOMPUTE_ONLY = '''
import contextlib


def checkpointed_forward(model, x):
    # the forward's update undone, the recompute's kept: one update per step, made in backward
    h = x
    for stage in model.stages():
        h = checkpoint(stage, h, use_reentrant=False,
                       context_fn=lambda: (batchnorm_stats_kept(model), contextlib.nullcontext()))
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''


def test_batchnorm_updated_once_in_backward_passes(ns):
    """Undoing the forward's update and keeping the recompute's is one update per step of
    the same batch statistics: honest, and it passes."""
    verdict = _verdict(ns, "check_checkpointed_forward", _STATS_UPDATED_IN_RECOMPUTE_ONLY, seed=5)
    assert verdict.passed, verdict.message


def test_plain_checkpoint_fails_on_the_batchnorm_count(ns):
    """The double update is what fails an uncorrected checkpoint, named in the message."""
    verdict = _verdict(ns, "check_checkpointed_forward", _PLAIN_CHECKPOINT)
    assert not verdict.passed and "num_batches_tracked" in verdict.message, verdict.message


def test_self_check_fails_the_double_update(ns):
    """The visible self-check already stops an uncorrected checkpoint."""
    scope = dict(ns)
    for gid in ANSWERS["check_checkpointed_forward"]:
        LAB.run_code(scope, _reference(gid))
    LAB.run_code(scope, _PLAIN_CHECKPOINT)
    probe = split_check(LAB.cells["check_checkpointed_forward"]).probe
    with pytest.raises(AssertionError, match="recomputation updated BatchNorm"):
        LAB.run_code(scope, probe)


@pytest.mark.parametrize("check", GRADED_TESTED)
def test_honest_variant_passes(ns, check):
    verdict = _verdict(ns, check, HONEST[check], seed=7)
    assert verdict.passed, verdict.message


_SWITCH_ON = '''
def checkpointed_forward(model, x):
    model.set_checkpointing("per_stage")
    return model(x)
'''
_SET_ATTRIBUTE = '''
def checkpointed_forward(model, x):
    model.checkpointing = "per_stage"
    return model(x)
'''
_ONE_STAGE = '''
def checkpointed_forward(model, x):
    h = x
    for i, stage in enumerate(model.stages()):
        h = checkpoint(stage, h, use_reentrant=False) if i == 4 else stage(h)
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_DETACHED = '''
def checkpointed_forward(model, x):
    h = x
    for stage in model.stages():
        h = checkpoint(stage, h.detach(), use_reentrant=False)
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_PLAIN_CHECKPOINT = '''
def checkpointed_forward(model, x):
    h = x
    for stage in model.stages():
        h = checkpoint(stage, h, use_reentrant=False)
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_COUNT_NOT_RESTORED = '''
import contextlib
from torch import nn


@contextlib.contextmanager
def stats_kept_but_count(model):
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    kept = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (mean, var) in zip(norms, kept):
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)


def checkpointed_forward(model, x):
    h = x
    for stage in model.stages():
        h = checkpoint(stage, h, use_reentrant=False,
                       context_fn=lambda: (contextlib.nullcontext(), stats_kept_but_count(model)))
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_MOMENTUM_ZERO = '''
import contextlib
from torch import nn


@contextlib.contextmanager
def no_momentum(model):
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, mom in zip(norms, saved):
            m.momentum = mom


def checkpointed_forward(model, x):
    h = x
    for stage in model.stages():
        h = checkpoint(stage, h, use_reentrant=False,
                       context_fn=lambda: (contextlib.nullcontext(), no_momentum(model)))
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_STATS_FROZEN_ALL_STEP = '''
import contextlib


def checkpointed_forward(model, x):
    h = x
    with batchnorm_stats_kept(model):        # undoes the forward's update as well
        for stage in model.stages():
            h = checkpoint(stage, h, use_reentrant=False,
                           context_fn=lambda: (batchnorm_stats_kept(model),
                                               batchnorm_stats_kept(model)))
    return model.fc(torch.flatten(model.avgpool(h), 1))
'''
_SEGMENT_ALLOC_COUNTS = '''
def largest_allocation(snapshot):
    best = None
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] in ("alloc", "segment_alloc") and (best is None or e["size"] > best["size"]):
                best = e
    where = next((f"{f['filename']}:{f['line']}" for f in best["frames"]
                  if f["filename"].endswith(".py") and "/torch/" not in f["filename"]), None)
    return best["size"], where
'''
_OUTERMOST_FRAME = '''
def largest_allocation(snapshot):
    best = max((e for t in snapshot["device_traces"] for e in t if e["action"] == "alloc"),
               key=lambda e: e["size"])
    mine = [f for f in best["frames"] if f["filename"].endswith(".py")
            and "/torch/" not in f["filename"]]
    return best["size"], (f"{mine[-1]['filename']}:{mine[-1]['line']}" if mine else None)
'''
_INNERMOST_ANY_FRAME = '''
def largest_allocation(snapshot):
    best = max((e for t in snapshot["device_traces"] for e in t if e["action"] == "alloc"),
               key=lambda e: e["size"])
    f = best["frames"][0] if best["frames"] else None
    return best["size"], (f"{f['filename']}:{f['line']}" if f else None)
'''
_LAST_ON_TIE = '''
def largest_allocation(snapshot):
    best = None
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] == "alloc" and (best is None or e["size"] >= best["size"]):
                best = e
    where = next((f"{f['filename']}:{f['line']}" for f in best["frames"]
                  if f["filename"].endswith(".py") and "/torch/" not in f["filename"]), None)
    return best["size"], where
'''
_FIRST_DEVICE_ONLY = '''
def largest_allocation(snapshot):
    best = max((e for e in snapshot["device_traces"][0] if e["action"] == "alloc"),
               key=lambda e: e["size"], default=None)
    if best is None:
        return None
    where = next((f"{f['filename']}:{f['line']}" for f in best["frames"]
                  if f["filename"].endswith(".py") and "/torch/" not in f["filename"]), None)
    return best["size"], where
'''
_FRAGMENTATION_PEAK = '''
def fragmentation(stats):
    r, a = stats["reserved_bytes.all.peak"], stats["allocated_bytes.all.peak"]
    return {"reserved": r, "allocated": a, "cached_unused": r - a,
            "inactive_split": stats["inactive_split_bytes.all.current"]}
'''
_FRAGMENTATION_ACTIVE = '''
def fragmentation(stats):
    r, a = stats["reserved_bytes.all.current"], stats["active_bytes.all.current"]
    return {"reserved": r, "allocated": a, "cached_unused": r - a,
            "inactive_split": stats["inactive_split_bytes.all.current"]}
'''
_SUM_STAGES = "def predict_saved_mib(table, plan):\n    return float(table.saved_mib.sum())\n"
_ALWAYS_FOUR = '''
_reference_predict = predict_saved_mib
def predict_saved_mib(table, plan):
    return _reference_predict(table, segment_plan(4))
'''
_NO_BOUNDARY = '''
def predict_saved_mib(table, plan):
    total = table.saved_mib["head"]
    for seg in plan:
        if seg.checkpointed:
            total += table.input_mib.iloc[seg.stages[0]]
        else:
            total += sum(table.saved_mib.iloc[i] for i in seg.stages)
    return float(total)
'''
_PREDICT_BY_MEASURING = '''
def predict_saved_mib(table, plan):
    from perflab import RunConfig, saved_activation_bytes
    from perflab.train.workloads import training_parts
    stored = [seg for seg in plan if not seg.checkpointed]
    setting = ("per_stage" if not stored else "none" if len(plan) == 1 else len(plan))
    b, _, h, _ = table.output_shape["stem"]
    run = training_parts(RunConfig.preset("tiny", device="cpu", batch_size=b,
                                          image_size=4 * h, checkpointing=setting))
    return saved_activation_bytes(run.model, run.x, run.y).nbytes / 2 ** 20
'''
_NO_MEMORY = '''
def profile_step(model, x, y, optimizer, path):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    prof.export_memory_timeline(path, device=str(x.device))
'''
_NO_EXPORT = '''
def profile_step(model, x, y, optimizer, path):
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
'''
_OFF_BY_ONE = '''
def find_peak(timeline):
    times, sizes = timeline
    peak = max(range(len(sizes)), key=lambda i: sum(sizes[i]))
    row = sizes[peak]
    return sum(row), CATEGORIES[max(range(len(CATEGORIES)), key=row.__getitem__)]
'''
_LARGEST_CATEGORY_OVER_TIME = '''
def find_peak(timeline):
    times, sizes = timeline
    j = max(range(1, 9), key=lambda j: max(row[j] for row in sizes))
    return max(sum(row) for row in sizes), CATEGORIES[j - 1]
'''
_LARGEST_ENTRY = '''
def find_peak(timeline):
    times, sizes = timeline
    i = max(range(len(sizes)), key=lambda i: max(sizes[i]))
    row = sizes[i][1:]
    return max(row), CATEGORIES[row.index(max(row))]
'''
_PEAK_EXAMPLE_ONLY = '''
def find_peak(timeline):
    return (61, "gradient")
'''
_UNSCALED_ACCUMULATION = '''
def my_accumulated_grads(model, x, y, k):
    model.zero_grad(set_to_none=True)
    for xc, yc in zip(x.tensor_split(k), y.tensor_split(k)):
        F.cross_entropy(model(xc), yc).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}
'''
_DIVIDED_BY_K = '''
def my_accumulated_grads(model, x, y, k):
    model.zero_grad(set_to_none=True)
    for xc, yc in zip(x.tensor_split(k), y.tensor_split(k)):
        (F.cross_entropy(model(xc), yc) / k).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}
'''
_DELEGATE_ACCUMULATION = '''
def my_accumulated_grads(model, x, y, k):
    from perflab.analysis.accumulation import accumulated_gradients
    return accumulated_gradients(model, x, y, k)
'''
_FULL_BATCH_ONLY = '''
def my_accumulated_grads(model, x, y, k):
    from perflab.analysis.accumulation import full_batch_gradients
    return full_batch_gradients(model, x, y)
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
_NEVER_ZERO = '''
def largest_batch(bytes_at, budget, limit=4096):
    good, bad = 1, limit + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if bytes_at(mid) <= budget:
            good = mid
        else:
            bad = mid
    return good
'''
_SEARCH_EXAMPLES_ONLY = '''
def largest_batch(bytes_at, budget, limit=4096):
    return {5000: 108, 1000 + 37 * 300: 300}[budget]
'''
_DELEGATE_SEARCH = '''
def largest_batch(bytes_at, budget, limit=4096):
    from perflab.analysis.max_batch import search_max_batch
    best, _, _ = search_max_batch(lambda n: (bytes_at(n) <= budget, None, ""),
                                  start=1, limit=limit)
    return best
'''

#: name -> (the check it must fail, the wrong answer); each runs after the reference
#: answers of its check, replacing one of them
WRONG = {
    "forward switches the model's own checkpointing": ("check_checkpointed_forward", _SWITCH_ON),
    "forward sets the model's checkpointing attribute": ("check_checkpointed_forward",
                                                         _SET_ATTRIBUTE),
    "only the last stage checkpointed": ("check_checkpointed_forward", _ONE_STAGE),
    "stage inputs detached": ("check_checkpointed_forward", _DETACHED),
    "BatchNorm statistics updated again in the recompute": ("check_checkpointed_forward",
                                                            _PLAIN_CHECKPOINT),
    "recompute restores the statistics but not the count": ("check_checkpointed_forward",
                                                            _COUNT_NOT_RESTORED),
    "recompute with momentum 0 (still counts the batch)": ("check_checkpointed_forward",
                                                          _MOMENTUM_ZERO),
    "statistics frozen over the whole forward": ("check_checkpointed_forward",
                                                 _STATS_FROZEN_ALL_STEP),
    "segment_alloc taken for a tensor": ("check_allocator_record", _SEGMENT_ALLOC_COUNTS),
    "outermost user frame": ("check_allocator_record", _OUTERMOST_FRAME),
    "innermost frame even inside PyTorch": ("check_allocator_record", _INNERMOST_ANY_FRAME),
    "last allocation on a tie": ("check_allocator_record", _LAST_ON_TIE),
    "first device only": ("check_allocator_record", _FIRST_DEVICE_ONLY),
    "fragmentation from the peaks": ("check_allocator_record", _FRAGMENTATION_PEAK),
    "allocated read as active bytes": ("check_allocator_record", _FRAGMENTATION_ACTIVE),
    "prediction sums every stage": ("check_predict_segments", _SUM_STAGES),
    "prediction of the 4-segment run whatever the plan": ("check_predict_segments",
                                                          _ALWAYS_FOUR),
    "profile without memory": ("check_memory_peak", _NO_MEMORY),
    "profile exports nothing": ("check_memory_peak", _NO_EXPORT),
    "category index off by one": ("check_memory_peak", _OFF_BY_ONE),
    "largest category over the whole step": ("check_memory_peak", _LARGEST_CATEGORY_OVER_TIME),
    "peak of one category": ("check_memory_peak", _LARGEST_ENTRY),
    "find_peak for the example only": ("check_memory_peak", _PEAK_EXAMPLE_ONLY),
    "losses not scaled per micro-batch": ("check_accumulate", _UNSCALED_ACCUMULATION),
    "losses divided by k": ("check_accumulate", _DIVIDED_BY_K),
    "linear search": ("check_largest_batch", _LINEAR_SEARCH),
    "search off by one": ("check_largest_batch", _OFF_BY_ONE_SEARCH),
    "search never returns 0": ("check_largest_batch", _NEVER_ZERO),
    "search for the examples only": ("check_largest_batch", _SEARCH_EXAMPLES_ONLY),
}
#: wrong answers that delegate to the perflab function the exercise asks for
DELEGATING = {
    "prediction measures the run": ("check_predict_segments", _PREDICT_BY_MEASURING,
                                    "saved_activation_bytes"),
    "accumulation delegates to perflab": ("check_accumulate", _DELEGATE_ACCUMULATION,
                                          "accumulated_gradients"),
    "accumulation is one full batch": ("check_accumulate", _FULL_BATCH_ONLY,
                                       "full_batch_gradients"),
    "search delegates to perflab": ("check_largest_batch", _DELEGATE_SEARCH,
                                    "search_max_batch"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_a_hidden_case(ns, name):
    check, code = WRONG[name]
    verdict = _verdict(ns, check, code)
    assert not verdict.passed, f"{name!r} passed {check}"
    assert verdict.message.startswith("hidden case"), verdict.message


@pytest.mark.parametrize("name", sorted(DELEGATING))
def test_delegating_answer_fails(ns, name):
    check, code, helper = DELEGATING[name]
    verdict = _verdict(ns, check, code)
    assert not verdict.passed, f"{name!r} passed {check}"
    assert f"ran perflab's {helper}" in verdict.message, verdict.message


def test_the_predictions_hidden_settings_differ():
    """The hidden cases try several checkpointing settings, not only the example's 4."""
    import random

    check = split_check(LAB.cells["check_predict_segments"])
    from perflab.course.checks import graded_functions

    cases_fn, _ = graded_functions(check.graded, "check_predict_segments")
    for seed in range(5):
        settings = {str(c["setting"]) for c in cases_fn(random.Random(seed))}
        assert len(settings) == 4 and settings != {"4"}


def test_segment_prediction_message_does_not_give_the_answer(ns):
    """The self-check a student sees fails a wrong prediction without printing the
    measured value."""
    scope = dict(ns)
    scope["predicted_mib"] = 0.5
    probe = split_check(LAB.cells["check_predict_segments"]).probe
    with pytest.raises(AssertionError) as failed:
        LAB.run_code(scope, probe)
    measured = scope["measured_mib"]
    message = str(failed.value)
    for leak in (f"{measured:.1f}", f"{measured:.2f}", f"{measured:.3f}"):
        assert leak not in message, message


# --- the lab's own cells, top to bottom, graded as in grading -----------------------

def _run_graded_lab(monkeypatch) -> dict:
    """Every code cell grading runs (not tagged grading-skip), in order, at the tiny
    preset, with the reference answers; each check cell replaced by its graded part
    (hidden cases at seed "grade:test", answers in this namespace, judged apart).
    Returns ``check grade_id -> JudgeResult``."""
    monkeypatch.setenv("PERFLAB_PRESET", "tiny")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(LAB.path), as_version=4)
    scope: dict = {"__name__": "__lab__", "display": lambda *a, **k: None}
    verdicts = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or (SKIP_TAG in cell.metadata.get("tags", [])
                                        and not meta.get("solution") and not meta.get("grade")):
            continue
        if meta.get("grade"):
            check = split_check(cell.source)
            assert check.graded is not None, meta["grade_id"]
            verdicts[meta["grade_id"]] = graded_verdict(check, scope, meta["grade_id"],
                                                        "grade:test")
        else:
            exec(compile(cell.source, "<cell>", "exec"), scope)  # noqa: S102
    return verdicts


@slow
def test_reference_answers_pass_every_check(monkeypatch):
    verdicts = _run_graded_lab(monkeypatch)
    assert set(verdicts) == set(GRADED_TESTED)
    assert all(v.passed for v in verdicts.values()), {
        g: v.message for g, v in verdicts.items() if not v.passed}


def test_unanswered_prediction_breaks_no_later_cell(ns, tmp_path):
    """The prediction cell as students get it (labs/, value None) records nothing, and the
    measuring cell's line still prints (beside says no prediction was made)."""
    from perflab.labs.predictions import Predictions

    built = nbformat.read(str(ROOT / "labs" / LAB.path.name), as_version=4)
    (stub,) = [c.source for c in built.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "predict_overhead"]
    scope = dict(ns)
    scope["predictions"] = Predictions("04", folder=tmp_path)
    LAB.run_code(scope, stub)
    assert scope["my_predicted_overhead_pct"] is None
    line = scope["predictions"].beside("overhead_pct", 21.0, fmt="{:+.0f}")
    assert "no prediction was recorded for overhead_pct" in line and "+21" in line
