"""Lab 07's check cells, graded on hidden cases (:mod:`perflab.course.cases`): each runs
here as grading runs it (the student's code in the "kernel", the judge apart, answers as
JSON). The reference solution passes at several seeds, an honest variant written
differently passes, and wrong *student code* fails its check on a hidden case: a
prediction that says "100 % slower", a detector that compares with the median of all
ranks, a z-score rule, one that forgets the window, a rebalance that favours the slow
rank, a gather that all-reduces instead of all-gathering (also run on 2 gloo ranks), an
in-loop detector whose own run's records were made up to pass (the check now launches the
student's gather and detector on hidden compute times), a
``rank_loss`` that does not weight by b_r / B (the rebalanced split's gradient is then
not the full-batch one), a debug-log parser that names the first rank it sees or rank 0;
code that delegates to perflab's ``detect_stragglers``, ``reference_gather``,
``reference_rank_loss`` or ``predicted_throughput_loss`` fails naming it."""
from __future__ import annotations

import importlib
import random

import numpy as np
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab
from perflab.analysis.stragglers import straggler_recording
from perflab.course.checks import split_check

LAB = Lab("07")
GRADED_TESTED = ("check_prediction", "check_gather", "check_detector_recorded",
                 "check_detector_live", "check_rebalance", "check_rank_loss",
                 "check_find_mismatch")
SEEDS = [0, 1, "grade:ada"]


def _fails_on_a_hidden_case(verdict) -> None:
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict


def _fails_naming(verdict, name: str) -> None:
    assert not verdict.passed and name in verdict.message, verdict


# -- check_prediction: predict_straggler(slowdown) on hidden slowdowns --------------------------
WRONG_PREDICTIONS = {
    # "twice as slow is 100 % slower": the loss as the extra time, not the lost share
    "100 % slower": "def predict_straggler(s):\n"
                    "    return {'loss_at_slow': s - 1, 'rebalanced_speedup': (1 + s) / 2}",
    # averaged over the ranks: only one of two is slow
    "averaged over ranks": "def predict_straggler(s):\n"
                           "    return {'loss_at_slow': (1 - 1 / s) / 2, 'rebalanced_speedup': (1 + s) / 2}",
    # rebalancing brings the job back to full speed
    "back to full speed": "def predict_straggler(s):\n"
                          "    return {'loss_at_slow': 1 - 1 / s, 'rebalanced_speedup': s}",
    # the lab's own answer for every slowdown
    "the lab's case only": "def predict_straggler(s):\n"
                           "    return {'loss_at_slow': 0.5, 'rebalanced_speedup': 1.5}",
    # written to pass the self-check's examples
    "examples only": "def predict_straggler(s):\n"
                     "    table = {1.0: (0.0, 1.0), 1.25: (0.2, 1.125), 2.0: (0.5, 1.5), 4.0: (0.75, 2.5)}\n"
                     "    loss, speedup = table.get(s, (0.5, 1.5))\n"
                     "    return {'loss_at_slow': loss, 'rebalanced_speedup': speedup}",
    "no numbers": "def predict_straggler(s):\n"
                  "    return {'loss_at_slow': None, 'rebalanced_speedup': None}",
}


@pytest.mark.parametrize("seed", SEEDS)
def test_prediction_reference_passes(seed, tmp_path):
    from perflab.labs.predictions import Predictions

    # the cell records its predictions (value and time) with the set-up cell's Predictions
    scope = {"__name__": "__main__", "predictions": Predictions("07", folder=tmp_path)}
    LAB.run_code(scope, LAB.solution("predict_straggler"))
    assert scope["predictions"].get("loss_at_slow").value == 0.5
    verdict = LAB.judge(scope, "check_prediction", seed=seed)
    assert verdict.passed, verdict.message


def test_prediction_honest_variant_passes():
    honest = ("def predict_straggler(slowdown):\n"
              "    even_step, fair_step = slowdown, 2 * slowdown / (slowdown + 1)\n"
              "    return dict(rebalanced_speedup=even_step / fair_step,\n"
              "                loss_at_slow=(slowdown - 1) / slowdown)")
    verdict = LAB.verdict({"__name__": "__main__"}, honest, "check_prediction")
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("name", sorted(WRONG_PREDICTIONS))
def test_wrong_prediction_fails(name):
    _fails_on_a_hidden_case(LAB.verdict({}, WRONG_PREDICTIONS[name], "check_prediction"))


def test_prediction_through_perflab_fails():
    code = ("from perflab.analysis.stragglers import predicted_throughput_loss\n"
            "def predict_straggler(s):\n"
            "    return {'loss_at_slow': predicted_throughput_loss(1.0, s - 1.0),\n"
            "            'rebalanced_speedup': (1 + s) / 2}")
    _fails_naming(LAB.verdict({}, code, "check_prediction"), "predicted_throughput_loss")


# -- the student's file, as modules --------------------------------------------------------------
_FILE = LAB.cells["straggler_file"].replace("%%writefile straggler_student.py\n", "")
_GATHER_BODY = _FILE[_FILE.index("    mine = torch.tensor([float(local_s)]"):
                     _FILE.index("    return [float(t) for t in everyone]\n")]
_DETECT_BODY = _FILE[_FILE.index("    window = t[:, -n:]"):_FILE.index("    return flagged\n")]
_REBALANCE_BODY = _FILE[_FILE.index("    speed = np.asarray(batch_sizes"):
                        _FILE.index("    return [int(b) for b in new]\n")]
_RANK_LOSS_BODY = _FILE[_FILE.index("    mine = torch.nn.functional.cross_entropy(logits, targets)\n"):]

WRONG_FILES = {
    # the median of ALL ranks, the rank itself included
    "median_with_self": ("check_detector_recorded", _FILE.replace(
        "np.median(np.delete(window, r, axis=0), axis=0)", "np.median(window, axis=0)")),
    # every step, not the last n
    "no_window": ("check_detector_recorded", _FILE.replace("window = t[:, -n:]", "window = t")),
    # any slow step flags the rank
    "any_step": ("check_detector_recorded", _FILE.replace(
        "if slow_steps >= min(k, window.shape[1]):", "if slow_steps >= 1:")),
    # k slow steps always, even when the window holds fewer than k
    "k_always": ("check_detector_recorded", _FILE.replace(
        "if slow_steps >= min(k, window.shape[1]):", "if slow_steps >= k:")),
    # a z > 2 rule: cannot fire with a few ranks
    "zscore": ("check_detector_recorded", _FILE.replace(_DETECT_BODY, (
        "    z = (t - t.mean(0)) / t.std(0, ddof=1)\n"
        "    flagged = [r for r in range(t.shape[0]) if (z[r] > 2).sum() >= k]\n"))),
    # gives the slow rank MORE samples
    "rebalance_by_time": ("check_rebalance", _FILE.replace(
        "np.asarray(batch_sizes, dtype=float) / np.asarray(compute_s, dtype=float)",
        "np.asarray(compute_s, dtype=float)")),
    # speed = 1 / time: forgets that the ranks' micro-batches differ
    "rebalance_ignores_batch": ("check_rebalance", _FILE.replace(
        "np.asarray(batch_sizes, dtype=float) / np.asarray(compute_s, dtype=float)",
        "1.0 / np.asarray(compute_s, dtype=float)")),
    # rounds each share, so the total drifts
    "rebalance_rounded": ("check_rebalance", _FILE.replace(_REBALANCE_BODY, (
        "    speed = np.asarray(batch_sizes, dtype=float) / np.asarray(compute_s, dtype=float)\n"
        "    new = np.round(sum(batch_sizes) * speed / speed.sum())\n"))),
    # the exact shares, not whole samples
    "rebalance_floats": ("check_rebalance", _FILE.replace(
        "    return [int(b) for b in new]\n",
        "    return [float(e) for e in exact]\n")),
}
#: Written to pass the exercise's examples (and nothing else).
_EXAMPLES_ONLY = {
    "check_detector_recorded": _FILE.replace(_DETECT_BODY, (
        "    w = t[:, -10:]\n"
        "    slow = np.median(w[1]) > 1.1 * np.median(w[0])\n"
        "    flagged = [1] if t.shape[0] == 2 and (slow or n == 12) else []\n"
        "    if t.shape[0] == 4:\n"
        "        flagged = [2]\n")),
    "check_rebalance": _FILE.replace(_REBALANCE_BODY, (
        "    new = {(32, 32): [43, 21], (40, 20): [40, 20], (3, 2, 2): [3, 2, 2]}.get(\n"
        "        tuple(batch_sizes), list(batch_sizes))\n")),
}
#: Honest variants, written differently from the reference.
_HONEST = {
    "check_detector_recorded": _FILE.replace(_DETECT_BODY, (
        "    x = torch.as_tensor(t)[:, max(0, t.shape[1] - n):]\n"
        "    flagged = []\n"
        "    for r in range(x.shape[0]):\n"
        "        rest = torch.cat([x[:r], x[r + 1:]])\n"
        "        med = torch.quantile(rest, 0.5, dim=0)\n"
        "        hits = int((x[r] / med > 1 + threshold).sum())\n"
        "        if hits >= k or hits == x.shape[1]:\n"
        "            flagged.append(r)\n")),
    "check_rebalance": _FILE.replace(_REBALANCE_BODY, (
        "    total = sum(batch_sizes)\n"
        "    rate = [b / s for b, s in zip(batch_sizes, compute_s)]\n"
        "    share = [total * v / sum(rate) for v in rate]\n"
        "    new = [int(x) for x in share]\n"
        "    order = sorted(range(len(share)), key=lambda i: new[i] - share[i])\n"
        "    for i in order[:total - sum(new)]:\n"
        "        new[i] += 1\n")),
}


_modules = iter(range(10**6))


def _student(tmp_path, monkeypatch, source: str):
    name = f"s07_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def lab_ns():
    return LAB.namespace()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_solution_file_passes_the_offline_checks(tmp_path, monkeypatch, lab_ns, seed):
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, _FILE))
    for gid in ("check_detector_recorded", "check_rebalance"):
        verdict = LAB.judge(dict(ns), gid, seed=seed)
        assert verdict.passed, (gid, verdict.message)


@pytest.mark.parametrize("gid", sorted(_HONEST))
def test_honest_variant_passes(gid, tmp_path, monkeypatch, lab_ns):
    source = _HONEST[gid]
    assert source != _FILE
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    for seed in (3, "grade:bo"):
        verdict = LAB.judge(dict(ns), gid, seed=seed)
        assert verdict.passed, (gid, seed, verdict.message)


@pytest.mark.parametrize("name", sorted(WRONG_FILES))
def test_wrong_student_code_fails_its_check(name, tmp_path, monkeypatch, lab_ns):
    gid, source = WRONG_FILES[name]
    assert source != _FILE, f"{name}: the replacement did not apply"
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    _fails_on_a_hidden_case(LAB.judge(dict(ns), gid))
    other = "check_rebalance" if gid == "check_detector_recorded" else "check_detector_recorded"
    assert LAB.judge(dict(ns), other).passed, f"{name} should fail {gid} only"


@pytest.mark.parametrize("gid", sorted(_EXAMPLES_ONLY))
def test_code_written_for_the_examples_fails(gid, tmp_path, monkeypatch, lab_ns):
    source = _EXAMPLES_ONLY[gid]
    assert source != _FILE
    student = _student(tmp_path, monkeypatch, source)
    ns = dict(lab_ns, straggler_student=student)
    LAB.run_code(dict(ns), split_check(LAB.cells[gid]).probe)   # passes the self-check
    _fails_on_a_hidden_case(LAB.judge(dict(ns), gid))


def test_a_detector_that_delegates_fails_naming_it(tmp_path, monkeypatch, lab_ns):
    source = _FILE.replace(_DETECT_BODY, (
        "    from perflab import detect_stragglers\n"
        "    flagged = [v.rank for v in detect_stragglers(t, threshold=threshold, k=k, n=n)]\n"))
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    _fails_naming(LAB.judge(ns, "check_detector_recorded"), "detect_stragglers")


# -- the live run's records, as the rank body writes them ----------------------------------------
def _own(world_size=2, phases=2, steps=10, slow_rank=1, seed=0) -> list:
    """Compute seconds [rank][phase][step]: phase 1 slows ``slow_rank`` 2x."""
    rng = random.Random(seed)
    return [[[0.02 * rng.uniform(0.95, 1.05) * (2.0 if p == 1 and r == slow_rank else 1.0)
              for _ in range(steps)] for p in range(phases)] for r in range(world_size)]


def _ranks(student, own, gather=lambda rank, row: list(row), fixed=None) -> list[dict]:
    """What straggler_rank returns on each rank, ``gather`` standing for the student's
    gather (rank, the ranks' own values) -> what that rank received, and ``student``'s
    my_detect run after each step on the history, as the rank body runs it."""
    ws, n_phases, steps = len(own), len(own[0]), len(own[0][0])
    out = []
    for r in range(ws):
        phases = []
        for p in range(n_phases):
            gathered = [gather(r, [own[q][p][s] for q in range(ws)]) for s in range(steps)]
            verdicts = []
            for s in range(steps):
                history = gathered[:s + 1]
                if ws > 1 and all(g is not None and len(g) == ws for g in history):
                    v = student.my_detect(np.asarray(history, dtype=float).T.tolist())
                    verdicts.append([int(x) for x in v])
                else:
                    verdicts.append(None)
            phases.append({"name": f"phase {p}", "compute_s": own[r][p], "gathered": gathered,
                           "verdicts": verdicts})
        out.append({"rank": r, "fixed_gather": gather(r, [0.1 * (q + 1) for q in range(ws)])
                    if fixed is None else fixed[r], "phases": phases})
    return out


def _live_ns(lab_ns, student, **kw) -> dict:
    own = kw.pop("own", None) or _own()
    return dict(lab_ns, straggler_student=student, ranks=_ranks(student, own, **kw))


def _in_loop(student, times, rank, gather) -> dict:
    """What perflab.labs.lab07.detector_rank records on ``rank`` for one schedule (ranks x
    steps seconds), ``gather`` standing for the student's gather (rank, the ranks' given
    values) -> what that rank received, and ``student``'s my_detect run after each step."""
    ws = len(times)
    gathered, verdicts = [], []
    for step in range(len(times[0])):
        gathered.append(gather(rank, [times[q][step] for q in range(ws)]))
        if all(g is not None and len(g) == ws for g in gathered):
            v = student.my_detect(np.asarray(gathered, dtype=float).T.tolist())
            verdicts.append([int(x) for x in v])
        else:
            verdicts.append(None)
    return {"gathered": gathered, "verdicts": verdicts}


@pytest.fixture
def launches(monkeypatch):
    """check_detector_live's hidden launch, answered here: ``launches(gather)`` makes
    ``perflab.distributed.launch_fn`` return what 2 ranks of ``detector_rank`` would, with
    the student's module's my_detect and ``gather`` standing for its gather (the real
    launch runs in test_wrong_gather_on_two_ranks_fails_gather_and_live_checks);
    ``launches.calls`` counts them."""
    import perflab.distributed
    from perflab.labs.lab07 import detector_rank

    def use(gather=lambda rank, row: list(row)):
        def launch_fn(fn, world_size, *, args=(), **kw):
            assert fn is detector_rank and world_size == 2, (fn, world_size)
            schedules, module = args
            student = importlib.import_module(module)
            use.calls += 1
            return [{"rank": r, "world_size": world_size, "errors": [],
                     "runs": [_in_loop(student, t, r, gather) for t in schedules]}
                    for r in range(world_size)]

        monkeypatch.setattr(perflab.distributed, "launch_fn", launch_fn)

    use.calls = 0
    use()
    return use


def test_gather_and_live_checks_pass_the_reference(tmp_path, monkeypatch, lab_ns, launches):
    student = _student(tmp_path, monkeypatch, _FILE)
    for gid in ("check_gather", "check_detector_live"):
        ns = _live_ns(lab_ns, student)
        LAB.run_code(dict(ns), split_check(LAB.cells[gid]).probe)   # the self-check passes
        for seed in SEEDS:
            verdict = LAB.judge(dict(ns), gid, seed=seed)
            assert verdict.passed, (gid, seed, verdict.message)


@pytest.mark.parametrize("name, gather", [
    ("only its own value", lambda r, row: [row[r]]),
    ("all_reduce(SUM)", lambda r, row: [sum(row)]),
    ("wrong order", lambda r, row: list(reversed(row))),
    ("a stale step", lambda r, row: [v * 1.01 for v in row]),
    ("raised", lambda r, row: None),
])
def test_wrong_gather_fails_gather_and_live_checks(name, gather, tmp_path, monkeypatch, lab_ns,
                                                   launches):
    ns = _live_ns(lab_ns, _student(tmp_path, monkeypatch, _FILE), gather=gather)
    for gid in ("check_gather", "check_detector_live"):
        _fails_on_a_hidden_case(LAB.judge(dict(ns), gid))
    # and in the check's own launch on hidden times, whatever this run's records say
    launches(gather)
    ns = _live_ns(lab_ns, ns["straggler_student"])
    assert not (v := LAB.judge(ns, "check_detector_live")).passed
    assert v.message.startswith("hidden case 2/2"), v.message


def test_gather_that_is_right_per_step_but_not_before_training_fails(tmp_path, monkeypatch,
                                                                     lab_ns):
    ns = _live_ns(lab_ns, _student(tmp_path, monkeypatch, _FILE), fixed=[[0.1], [0.2]])
    _fails_on_a_hidden_case(LAB.judge(ns, "check_gather"))


def test_gather_that_only_works_on_two_ranks_fails(tmp_path, monkeypatch, lab_ns):
    """Right in the launch, but hard-wired to 2 ranks: alone in a one-rank group (the
    graded call here) it returns two values."""
    source = _FILE.replace(_GATHER_BODY, (
        "    mine = torch.tensor([float(local_s)], dtype=torch.float64)\n"
        "    everyone = [torch.zeros_like(mine) for _ in range(2)]\n"
        "    dist.all_gather(everyone[:dist.get_world_size()], mine)\n"))
    ns = _live_ns(lab_ns, _student(tmp_path, monkeypatch, source))
    _fails_on_a_hidden_case(LAB.judge(ns, "check_gather"))


def test_gather_that_delegates_to_perflab_fails_naming_it(tmp_path, monkeypatch, lab_ns):
    for source in (_FILE.replace(_GATHER_BODY, (
            "    from perflab.course.references.lab07 import reference_gather\n"
            "    return reference_gather(local_s)\n")),
            _FILE + "\nfrom perflab.course.references.lab07 import reference_gather as all_gather_times\n"):
        ns = _live_ns(lab_ns, _student(tmp_path, monkeypatch, source))
        _fails_naming(LAB.judge(ns, "check_gather"), "reference_gather")


def test_gather_and_live_checks_never_pass_on_empty_or_short_records(tmp_path, monkeypatch,
                                                                     lab_ns, launches):
    student = _student(tmp_path, monkeypatch, _FILE)
    empty_phase = {"name": "p", "compute_s": [], "gathered": [], "verdicts": []}
    records = {
        "two steps": _ranks(student, _own(steps=2)),
        "one rank": _ranks(student, _own(world_size=1)),
        "no steps": [{"rank": r, "fixed_gather": [0.1, 0.2], "phases": [empty_phase] * 2}
                     for r in range(2)],
        "no phases": [{"rank": r, "fixed_gather": [0.1, 0.2], "phases": []} for r in range(2)],
        "no ranks": [],
    }
    for name, ranks in records.items():
        for gid in ("check_gather", "check_detector_live"):
            ns = dict(lab_ns, straggler_student=student, ranks=ranks)
            verdict = LAB.judge(ns, gid)
            assert not verdict.passed and verdict.message.startswith("hidden case"), (
                name, gid, verdict)


@pytest.mark.parametrize("name", ["k_always", "median_with_self", "any_step"])
def test_wrong_detector_fails_the_live_check(name, tmp_path, monkeypatch, lab_ns, launches):
    student = _student(tmp_path, monkeypatch, WRONG_FILES[name][1])
    own = _own(seed=5)
    if name == "median_with_self":   # a 20 % straggler: the median of all ranks hides it
        own = [[[t * (1.2 / 2.0 if p == 1 and r == 1 else 1.0) for t in steps]
                for p, steps in enumerate(phases)] for r, phases in enumerate(own)]
    if name == "any_step":           # no straggler, noise of +-15 %: a step or two look slow
        rng = random.Random(2)
        own = [[[0.02 * rng.uniform(0.85, 1.15) for _ in range(10)] for _ in range(2)]
               for _ in range(2)]
    _fails_on_a_hidden_case(LAB.judge(_live_ns(lab_ns, student, own=own), "check_detector_live"))


#: In-loop detectors that are wrong on times the grader draws.
_WRONG_IN_LOOP = {name: WRONG_FILES[name][1]
                  for name in ("k_always", "median_with_self", "any_step", "no_window")}
_WRONG_IN_LOOP["names the injected rank"] = _FILE.replace("    return flagged\n",
                                                          "    return [1]\n")
_WRONG_IN_LOOP["names nobody"] = _FILE.replace("    return flagged\n", "    return []\n")


@pytest.mark.parametrize("name", sorted(_WRONG_IN_LOOP))
def test_made_up_records_no_longer_pass_the_live_check(name, tmp_path, monkeypatch, lab_ns,
                                                      launches):
    """The old graded part judged only this run's records, which the kernel hands over: an
    answer cell that made them up (e.g. one that rebinds ``launch_fn`` before the launch
    cell, returning records the right rule would give) passed whatever the student's
    detector does. Those records still pass the live case, whose judge recomputes every
    verdict from them (so the old check passed), but the check's own launch runs the
    student's gather and detector on hidden times, and a wrong detector fails there."""
    from perflab.course.checks import graded_functions

    made_up = _ranks(_student(tmp_path, monkeypatch, _FILE), _own(seed=3))
    wrong = _student(tmp_path, monkeypatch, _WRONG_IN_LOOP[name])
    ns = dict(lab_ns, straggler_student=wrong, ranks=made_up)
    check = split_check(LAB.cells["check_detector_live"])
    LAB.run_code(dict(ns), check.probe)                 # the self-check passes on them
    _, judge = graded_functions(check.graded, "check_detector_live")
    judge(None, [{"own": rk["phases"][1]["compute_s"], "gathered": rk["phases"][1]["gathered"],
                  "verdicts": rk["phases"][1]["verdicts"]} for rk in made_up])  # the old case
    verdict = LAB.judge(ns, "check_detector_live")
    assert not verdict.passed and verdict.message.startswith("hidden case 2/2"), verdict
    assert launches.calls == 1


def test_honest_detector_passes_the_live_check(tmp_path, monkeypatch, lab_ns, launches):
    """The torch.quantile detector written differently from the reference, in the loop."""
    honest = _student(tmp_path, monkeypatch, _HONEST["check_detector_recorded"])
    ns = _live_ns(lab_ns, honest)
    for seed in (3, "grade:bo"):
        verdict = LAB.judge(dict(ns), "check_detector_live", seed=seed)
        assert verdict.passed, (seed, verdict.message)
    assert launches.calls == 2


def test_live_check_follows_this_run_s_times_not_the_injection(tmp_path, monkeypatch, lab_ns, launches):
    """On a loaded machine the injected rank may not look slow: the reference rule then
    answers [] on the gathered times, and a detector that says so passes; one hard-wired
    to name the injected rank fails."""
    even = [[[0.020, 0.021] * 5 for _ in range(2)], [[0.021, 0.020] * 5 for _ in range(2)]]
    right = _student(tmp_path, monkeypatch, _FILE)
    assert LAB.judge(_live_ns(lab_ns, right, own=even), "check_detector_live").passed
    hard_wired = _student(tmp_path, monkeypatch, _FILE.replace(
        "    return flagged\n", "    return [1]\n"))
    _fails_on_a_hidden_case(LAB.judge(_live_ns(lab_ns, hard_wired, own=even),
                                      "check_detector_live"))


@slow
def test_wrong_gather_on_two_ranks_fails_gather_and_live_checks(tmp_path, monkeypatch, lab_ns):
    """An all_reduce(SUM) where an all_gather belongs, run on 2 gloo ranks: every rank gets
    one number, so check_gather fails, and the detector (given no per-rank times) never
    names the slow rank; the reference file, run the same way, passes both."""
    from perflab.labs.lab07 import straggler_rank
    from perflab.distributed import launch_fn

    wrong = _FILE.replace(_GATHER_BODY, (
        "    everyone = torch.tensor([float(local_s)], dtype=torch.float64)\n"
        "    dist.all_reduce(everyone)\n"))
    phases = [{"name": p, "steps": 3, "slow": s, "batch": "even"}
              for p, s in (("no straggler", {}), ("straggler", {1: 1.0}))]
    for source, passes in ((wrong, False), (_FILE, True)):
        student = _student(tmp_path, monkeypatch, source)
        ranks = launch_fn(straggler_rank, 2, args=(phases, student.__name__), device="cpu",
                          timeout_s=300)
        ns = dict(lab_ns, ranks=ranks, SLOW_RANK=1, straggler_student=student)
        for gid in ("check_gather", "check_detector_live"):
            verdict = LAB.judge(dict(ns), gid)
            assert verdict.passed == passes, (source is wrong, gid, verdict.message)
    # the check's own launch (2 real ranks on hidden times): an honest file written
    # differently (all_gather_object, a torch detector) passes; the all_reduce gather,
    # with this run's records made up to pass, fails there
    honest = _HONEST["check_detector_recorded"].replace(_GATHER_BODY, (
        "    everyone = [None] * dist.get_world_size()\n"
        "    dist.all_gather_object(everyone, float(local_s))\n"
        "    return [float(v) for v in everyone]\n"))
    assert honest != _HONEST["check_detector_recorded"]
    made_up = _ranks(_student(tmp_path, monkeypatch, _FILE), _own())
    for source, passes in ((honest, True), (wrong, False)):
        ns = dict(lab_ns, ranks=made_up, straggler_student=_student(tmp_path, monkeypatch, source))
        verdict = LAB.judge(ns, "check_detector_live", seed="grade:bo")
        assert verdict.passed == passes, (source is wrong, verdict.message)
        assert passes or verdict.message.startswith("hidden case 2/2"), verdict.message


def test_detector_rank_rejects_a_schedule_without_a_row_per_rank():
    import torch.distributed as dist

    from perflab.labs.lab07 import detector_rank

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for bad in ([[[0.1], [0.2]]], [[[]]]):
            with pytest.raises(ValueError, match="one row of >= 1 step per rank"):
                detector_rank(bad, "straggler_student")
    finally:
        dist.destroy_process_group()


# -- check_rank_loss: the ranks' summed gradient is the full-batch gradient ---------------------
def _with_rank_loss(body: str) -> str:
    source = _FILE.replace(_RANK_LOSS_BODY, body)
    assert source != _FILE
    return source


WRONG_RANK_LOSSES = {
    # no re-weighting: every rank's mean, summed (W times the mean of means)
    "plain mean": "    return torch.nn.functional.cross_entropy(logits, targets)\n",
    # DDP's averaging: right only for an even split
    "mean / world_size": ("    return torch.nn.functional.cross_entropy(logits, targets) / world_size\n"),
    # the sum of the losses, never divided by B
    "sum, not divided": ("    return torch.nn.functional.cross_entropy(logits, targets, "
                         "reduction='sum')\n"),
    # weighted by the share, but of the world size
    "b_r / world_size": ("    return torch.nn.functional.cross_entropy(logits, targets) * "
                         "targets.shape[0] / world_size\n"),
}


@pytest.mark.parametrize("seed", SEEDS)
def test_rank_loss_reference_passes(seed, tmp_path, monkeypatch, lab_ns):
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, _FILE))
    LAB.run_code(dict(ns), split_check(LAB.cells["check_rank_loss"]).probe)   # the self-check
    verdict = LAB.judge(dict(ns), "check_rank_loss", seed=seed)
    assert verdict.passed, verdict.message


def test_rank_loss_sum_then_divide_by_b_passes(tmp_path, monkeypatch, lab_ns):
    """The other fix: back-propagate the SUM of the rank's losses divided by B."""
    source = _with_rank_loss("    total = torch.nn.functional.cross_entropy(logits, targets, "
                             "reduction='sum')\n    return total / global_batch\n")
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    LAB.run_code(dict(ns), split_check(LAB.cells["check_rank_loss"]).probe)
    for seed in (3, "grade:bo"):
        verdict = LAB.judge(dict(ns), "check_rank_loss", seed=seed)
        assert verdict.passed, (seed, verdict.message)


@pytest.mark.parametrize("name", sorted(WRONG_RANK_LOSSES))
def test_rebalance_without_loss_reweighting_fails(name, tmp_path, monkeypatch, lab_ns):
    ns = dict(lab_ns, straggler_student=_student(
        tmp_path, monkeypatch, _with_rank_loss(WRONG_RANK_LOSSES[name])))
    _fails_on_a_hidden_case(LAB.judge(dict(ns), "check_rank_loss"))
    assert LAB.judge(dict(ns), "check_rebalance").passed, f"{name} should fail check_rank_loss only"


def test_rank_loss_written_for_the_example_fails(tmp_path, monkeypatch, lab_ns):
    """Right on 2 ranks (the self-check's example), DDP's averaging on more."""
    source = _with_rank_loss(
        "    mine = torch.nn.functional.cross_entropy(logits, targets)\n"
        "    return mine * targets.shape[0] / global_batch if world_size == 2 else mine / world_size\n")
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    LAB.run_code(dict(ns), split_check(LAB.cells["check_rank_loss"]).probe)   # passes it
    _fails_on_a_hidden_case(LAB.judge(dict(ns), "check_rank_loss"))


def test_rank_loss_that_delegates_fails_naming_it(tmp_path, monkeypatch, lab_ns):
    source = _with_rank_loss("    from perflab.course.references.lab07 import reference_rank_loss\n"
                             "    return reference_rank_loss(logits, targets, global_batch, world_size)\n")
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, source))
    _fails_naming(LAB.judge(ns, "check_rank_loss"), "reference_rank_loss")


def test_reference_rank_loss_gives_the_full_batch_gradient_for_any_split():
    """The recording runs' weighting (no student module): b_r / B, not 1 / world_size."""
    import torch

    from perflab.course.references.lab07 import reference_rank_loss
    from perflab.models import mlp

    model = mlp((5, 7, 3), 1).double()
    x = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.arange(9) % 3
    torch.nn.functional.cross_entropy(model(x), y).backward()
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for lo, hi in ((0, 7), (7, 9)):
        reference_rank_loss(model(x[lo:hi]), y[lo:hi], 9, 2).backward()   # grads accumulate
    for p, want in zip(model.parameters(), full):
        assert torch.allclose(p.grad, want, rtol=1e-10, atol=1e-12)


# -- check_find_mismatch: the odd rank from the debug output ------------------------------------
_FIND = LAB.cells["find_mismatch"].split("\n\n\nprint(")[0]
_FIND_NS = {"__name__": "__main__", "re": __import__("re")}

WRONG_PARSERS = {
    "first rank mentioned": (
        "def find_mismatch(text):\n"
        "    m = re.search(r'\\[Rank (\\d+)\\] Running collective: .*?OpType=(\\w+)', text)\n"
        "    return int(m[1]), m[2]\n"),
    "rank 0 always": (
        "def find_mismatch(text):\n"
        "    ops = re.findall(r'OpType=(\\w+)', text)\n"
        "    return 0, ops[-1]\n"),
    # the first exception line's "but Rank q" (the odd rank's own line names a healthy rank)
    "first error's other rank": (
        "def find_mismatch(text):\n"
        "    m = re.search(r'but Rank (\\d+) is running collective: CollectiveFingerPrint\\('\n"
        "                  r'SequenceNumber=\\d+, OpType=(\\w+)', text)\n"
        "    if m is None:\n"
        "        m = re.search(r'\\[Rank (\\d+)\\] Running collective: .*?OpType=(\\w+)', text)\n"
        "    return int(m[1]), m[2]\n"),
    # the last collective logged: ranks interleave, so any rank can come last
    "last line's rank": (
        "def find_mismatch(text):\n"
        "    found = re.findall(r'\\[Rank (\\d+)\\] Running collective: .*?OpType=(\\w+)', text)\n"
        "    return int(found[-1][0]), found[-1][1]\n"),
    # compares op types only: a shape or dtype mismatch goes unseen
    "op type only": _FIND.replace("by_seq.setdefault(int(seq), {})[int(rank)] = (op, shape, dtype)",
                                  "by_seq.setdefault(int(seq), {})[int(rank)] = (op,)"),
}


@pytest.mark.parametrize("seed", SEEDS)
def test_find_mismatch_reference_passes(seed):
    scope = dict(_FIND_NS)
    LAB.run_code(scope, _FIND)
    verdict = LAB.judge(scope, "check_find_mismatch", seed=seed)
    assert verdict.passed, verdict.message


def test_find_mismatch_honest_variant_passes():
    """Majority by collections.Counter, read line by line with string methods."""
    honest = (
        "from collections import Counter\n"
        "def find_mismatch(text):\n"
        "    seen = {}\n"
        "    for line in text.splitlines():\n"
        "        if 'Running collective: CollectiveFingerPrint(' not in line:\n"
        "            continue\n"
        "        rank = int(line.split('[Rank ')[1].split(']')[0])\n"
        "        fp = line.split('CollectiveFingerPrint(')[1]\n"
        "        seq = int(fp.split('SequenceNumber=')[1].split(',')[0])\n"
        "        key = fp.split('TensorDeviceTypes=')[0]\n"
        "        key = key.split(', ', 1)[1]\n"
        "        seen.setdefault(seq, {})[rank] = key\n"
        "    for seq in sorted(seen):\n"
        "        counts = Counter(seen[seq].values())\n"
        "        if len(counts) > 1:\n"
        "            odd = next(r for r, k in seen[seq].items() if counts[k] == 1)\n"
        "            return odd, seen[seq][odd].split('OpType=')[1].split(',')[0]\n")
    for seed in (0, 4, "grade:bo"):
        scope = dict(_FIND_NS)
        LAB.run_code(scope, honest)
        verdict = LAB.judge(scope, "check_find_mismatch", seed=seed)
        assert verdict.passed, (seed, verdict.message)


@pytest.mark.parametrize("name", sorted(WRONG_PARSERS))
def test_wrong_find_mismatch_fails(name):
    assert WRONG_PARSERS[name] != _FIND
    _fails_on_a_hidden_case(LAB.verdict(dict(_FIND_NS), WRONG_PARSERS[name], "check_find_mismatch"))


@slow
def test_debug_rank_mismatch_is_caught_and_logged():
    """3 gloo ranks under TORCH_DISTRIBUTED_DEBUG=DETAIL: every rank raises on rank 2's
    broadcast, the captured logs show each rank's collectives, and the reference parser
    names rank 2."""
    import os
    import warnings

    from perflab.distributed import launch_fn
    from perflab.labs.lab07 import debug_rank

    keys = ("TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict(zip(keys, ("DETAIL", "INFO"))))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = launch_fn(debug_rank, 3, args=(2, "broadcast"), device="cpu", timeout_s=120)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert all("Detected mismatch between collectives" in (r["error"] or "") for r in out)
    text = "\n".join([r["log"] for r in out] + [f"[rank{r['rank']}]: {r['error']}" for r in out])
    assert text.count("Running collective: CollectiveFingerPrint(") == 9
    scope = dict(_FIND_NS)
    LAB.run_code(scope, _FIND)
    assert tuple(scope["find_mismatch"](text)) == (2, "BROADCAST")
