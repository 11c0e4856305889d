"""Lab 07's check cells: each judge passes the right facts and fails wrong ones (the
``FACTS_07`` table), and wrong *student code* -- a detector that compares with the median
of all ranks, a z-score rule, one that forgets the window, one that delegates to perflab's
``detect_stragglers``, a rebalance that favours the slow rank, a gather that all-reduces
instead of all-gathering (run on 2 gloo ranks) -- fails its check through the lab's own
probe."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, assert_judge_decides
from perflab import detect_stragglers
from perflab.analysis.stragglers import straggler_recording
from perflab.course.checks import split_check

LAB = Lab("07")
T = {name: c["compute_s"] for name, c in straggler_recording()["cases"].items()}
_PARAMS = {"strict": ("4r_rank2_50pct", {"threshold": 0.8}),
           "k1": ("4r_rank3_hiccups", {"k": 1, "n": 10}),
           "all20": ("4r_rank0_recovered", {"k": 10, "n": 20}),
           "n5": ("4r_rank0_recovered", {"k": 3, "n": 5}),
           "t05": ("2r_rank1_20pct", {"threshold": 0.05, "k": 8, "n": 12}),
           **{name: (name, {}) for name in T}}


def _found(detect) -> dict:
    return {key: [int(r) for r in detect(T[name], **kw)] for key, (name, kw) in _PARAMS.items()}


def _reference(t, **kw):
    return [v.rank for v in detect_stragglers(t, **kw)]


def _with_self(t, threshold=0.1, k=6, n=10):
    w = np.asarray(t, dtype=float)[:, -n:]
    med = np.median(w, axis=0)        # the rank itself pulls the median toward it
    return [r for r in range(w.shape[0]) if (w[r] > (1 + threshold) * med).sum() >= min(k, w.shape[1])]


_RIGHT_FOUND = _found(_reference)
_WRONG_N5 = {**_RIGHT_FOUND, "n5": [9]}       # right on every visible case, wrong on a hidden one
_OWN = [[[0.010, 0.011], [0.010, 0.012]], [[0.020, 0.021], [0.022, 0.020]]]  # rank x phase x step
_GATHERED = [[[[0.010, 0.020], [0.011, 0.021]], [[0.010, 0.022], [0.012, 0.020]]]] * 2
_GATHER = {"fixed": [[0.1, 0.2], [0.1, 0.2]], "own": _OWN, "gathered": _GATHERED}


#: The straggler phase's gathered compute seconds (steps x ranks): rank 1 twice as slow,
#: or (a loaded machine where rank 0 was slowed as much) no rank slower in 6 of 10 steps.
_SLOW = [[0.010 + 0.001 * (s % 3), 0.021 + 0.001 * (s % 2)] for s in range(10)]
_EVEN = [[0.020, 0.021] if s % 2 else [0.021, 0.020] for s in range(10)]


def _live(v0, v1, gathered=_SLOW) -> dict:
    return {"live": [{"verdict": v0, "gathered": gathered}, {"verdict": v1, "gathered": gathered}]}


def _g(**changes) -> dict:
    return {"gather_facts": {**_GATHER, **changes}}
_SPLIT = [[[32, 32], [0.1, 0.2], [43, 21]], [[40, 20], [0.1, 0.1], [40, 20]],
          [[3, 2, 2], [1.0, 1.0, 1.0], [3, 2, 2]]]

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)]); ready to
#: merge into tests/labs/test_grading_checks.py's FACTS as Lab 09's FACTS_09 is
FACTS_07 = {
    ("07", "check_prediction"): (
        {"prediction": {"loss_at_slow": 0.5, "rebalanced_speedup": 1.5}},
        [({"prediction": {"loss_at_slow": 1.0, "rebalanced_speedup": 1.5}}, False),   # "100 % slower"
         ({"prediction": {"loss_at_slow": 0.25, "rebalanced_speedup": 1.5}}, False),  # averaged over ranks
         ({"prediction": {"loss_at_slow": 0.5, "rebalanced_speedup": 2.0}}, False),   # back to full speed
         ({"prediction": {"loss_at_slow": None, "rebalanced_speedup": None}}, False)]),
    ("07", "check_gather"): (
        _g(),
        [(_g(fixed=[[0.1], [0.2]]), False),                     # only its own value
         (_g(fixed=[[0.30000000000000004]] * 2), False),        # all_reduce(SUM)
         (_g(fixed=[[0.2, 0.1], [0.2, 0.1]]), False),           # wrong order
         (_g(gathered=[_GATHERED[0], [[None, None], _GATHERED[0][1]]]), False),
         (_g(gathered=[_GATHERED[0], [[[0.020, 0.010], [0.021, 0.011]], _GATHERED[0][1]]]),
          False)]),
    ("07", "check_detector_recorded"): (
        {"found": _RIGHT_FOUND, "delegated": []},
        [({"found": _RIGHT_FOUND, "delegated": ["detect_stragglers"]}, False),
         ({"found": _found(_with_self), "delegated": []}, False),
         ({"found": _WRONG_N5, "delegated": []}, True)]),
    ("07", "check_detector_live"): (
        _live([1], [1]),
        [(_live([], []), False),                                 # missed the slow rank
         (_live([0, 1], [0, 1]), False),                         # flags the fast one too
         (_live([1], None), False),                              # rank 1's detector raised
         (_live([1], [1], gathered=_EVEN), False),               # hard-coded [1]: no straggler
         (_live([1], [1], gathered=[[0.01, 0.02]] * 9 + [None]), False),  # a step not gathered
         (_live([1], [1], gathered=[[0.01]] * 10), False)]),     # one value per step
    ("07", "check_rebalance"): (
        {"split": _SPLIT},
        [({"split": [[[32, 32], [0.1, 0.2], [21, 43]]]}, False),          # favours the slow rank
         ({"split": [[[40, 20], [0.1, 0.1], [30, 30]]]}, False),          # speed = 1 / time
         ({"split": [[[3, 2, 2], [1.0, 1.0, 1.0], [2, 2, 2]]]}, False),   # rounded, total lost
         ({"split": [[[32, 32], [0.1, 0.2], [42.67, 21.33]]]}, False)]),  # not ints
}


def test_every_check_of_the_lab_is_tabled():
    checks = {g for g in LAB.cells if g and g.startswith("check_")}
    assert {("07", g) for g in checks} == set(FACTS_07)


@pytest.mark.parametrize("key", sorted(FACTS_07), ids=lambda k: k[1])
def test_lab07_judges(key):
    assert_judge_decides(LAB.cells[key[1]], *FACTS_07[key], name=key[1])


def test_no_judge_reads_a_clock_or_launches():
    for gid in (k[1] for k in FACTS_07):
        judge = split_check(LAB.cells[gid]).judge
        for word in ("perf_counter", "Stopwatch", "run_interleaved", "time.", "launch_"):
            assert word not in judge, (gid, word)


# -- wrong student code, through the lab's own probes -------------------------------------------
_FILE = LAB.cells["straggler_file"].replace("%%writefile straggler_student.py\n", "")
_DETECT_BODY = _FILE[_FILE.index("    window = t[:, -n:]"):_FILE.index("    return flagged\n")]
_REBALANCE_BODY = _FILE[_FILE.index("    speed = np.asarray(batch_sizes"):
                        _FILE.index("    return [int(b) for b in new]\n")]

WRONG_FILES = {
    # the median of ALL ranks, the rank itself included
    "median_with_self": ("check_detector_recorded", _FILE.replace(
        "np.median(np.delete(window, r, axis=0), axis=0)", "np.median(window, axis=0)")),
    # every step, not the last n
    "no_window": ("check_detector_recorded", _FILE.replace("window = t[:, -n:]", "window = t")),
    # any slow step flags the rank
    "any_step": ("check_detector_recorded", _FILE.replace(
        "if slow_steps >= min(k, window.shape[1]):", "if slow_steps >= 1:")),
    # a z > 2 rule: cannot fire with a few ranks
    "zscore": ("check_detector_recorded", _FILE.replace(_DETECT_BODY, (
        "    z = (t - t.mean(0)) / t.std(0, ddof=1)\n"
        "    flagged = [r for r in range(t.shape[0]) if (z[r] > 2).sum() >= k]\n"))),
    # delegates to perflab
    "delegates": ("check_detector_recorded", _FILE.replace(_DETECT_BODY, (
        "    from perflab import detect_stragglers\n"
        "    flagged = [v.rank for v in detect_stragglers(t, threshold=threshold, k=k, n=n)]\n"))),
    # gives the slow rank MORE samples
    "rebalance_by_time": ("check_rebalance", _FILE.replace(
        "np.asarray(batch_sizes, dtype=float) / np.asarray(compute_s, dtype=float)",
        "np.asarray(compute_s, dtype=float)")),
    # rounds each share, so the total drifts
    "rebalance_rounded": ("check_rebalance", _FILE.replace(_REBALANCE_BODY, (
        "    speed = np.asarray(batch_sizes, dtype=float) / np.asarray(compute_s, dtype=float)\n"
        "    new = np.round(sum(batch_sizes) * speed / speed.sum())\n"))),
}


def _student(tmp_path, monkeypatch, name: str, source: str):
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def lab_ns():
    return LAB.namespace()


def test_the_solution_file_passes_the_offline_checks(tmp_path, monkeypatch, lab_ns):
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, "s07_right", _FILE))
    for gid in ("check_detector_recorded", "check_rebalance"):
        verdict = LAB.judge(dict(ns), gid)
        assert verdict.passed, (gid, verdict.message)


@pytest.mark.parametrize("name", sorted(WRONG_FILES))
def test_wrong_student_code_fails_its_check(name, tmp_path, monkeypatch, lab_ns):
    gid, source = WRONG_FILES[name]
    assert source != _FILE, f"{name}: the replacement did not apply"
    ns = dict(lab_ns, straggler_student=_student(tmp_path, monkeypatch, f"s07_{name}", source))
    assert not LAB.judge(ns, gid).passed
    other = "check_rebalance" if gid == "check_detector_recorded" else "check_detector_recorded"
    assert LAB.judge(dict(ns), other).passed, f"{name} should fail {gid} only"


def test_live_check_follows_this_run_s_times_not_the_injection():
    """On a loaded machine the injected rank may not look slow: the reference rule then
    answers [] on the gathered times, and a detector that says so passes."""
    check = LAB.cells["check_detector_live"]
    assert_judge_decides(check, _live([], [], gathered=_EVEN),
                         [(_live([1], [1], gathered=_EVEN), False), (_live([], []), False)],
                         name="check_detector_live")


@slow
def test_wrong_gather_on_two_ranks_fails_gather_and_live_checks(tmp_path, monkeypatch, lab_ns):
    """An all_reduce(SUM) where an all_gather belongs, run on 2 gloo ranks: every rank gets
    one number, so check_gather fails, and the detector (given no per-rank times) never
    names the slow rank."""
    from perflab.labs.lab07 import straggler_rank
    from perflab.distributed import launch_fn

    wrong = _FILE.replace(_FILE[_FILE.index("    mine = torch.tensor([float(local_s)]"):
                                _FILE.index("    return [float(t) for t in everyone]\n")], (
        "    everyone = torch.tensor([float(local_s)], dtype=torch.float64)\n"
        "    dist.all_reduce(everyone)\n"))
    module = "s07_wrong_gather"
    _student(tmp_path, monkeypatch, module, wrong)
    phases = [{"name": p, "steps": 3, "slow": s, "batch": "even"}
              for p, s in (("no straggler", {}), ("straggler", {1: 1.0}))]
    ranks = launch_fn(straggler_rank, 2, args=(phases, module), device="cpu", timeout_s=300)
    ns = dict(lab_ns, ranks=ranks, SLOW_RANK=1)
    assert not LAB.judge(dict(ns), "check_gather").passed
    assert not LAB.judge(dict(ns), "check_detector_live").passed
