"""Lab 06's check cells: each judge passes the right facts and fails wrong ones (the
``FACTS_06`` table), and wrong *student code* fails its check through the lab's own probe:
wrong least-squares fits run in this process; wrong data-parallel files (a sum instead of
an average, blocking or late allreduces, buckets in the wrong order or with the wrong
cap, a wrapper around DDP, an fp32 or borrowed hook) run on 2 gloo ranks, all in one
launch. The lab's reference file matches DistributedDataParallel's gradients."""
from __future__ import annotations


import numpy as np
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, assert_judge_decides, grade_reference_and_wrong
from perflab.labs.lab06.checks import GRAD_ATOL, GRAD_RTOL, compare_rank
from perflab.analysis.overlap import ideal_step_s
from perflab.analysis.collectives import recorded_allreduce_sweep
from perflab.distributed import launch_fn

LAB = Lab("06")
CHECK_SIZES, CHECK_CAP_MB, CHECK_STEPS = [16, 32, 32, 8], 1184 / 2**20, 3


# -- the judges on plain facts ------------------------------------------------------------
def _ref_fit(n, t, p):
    n, t = np.asarray(n, float), np.asarray(t, float)
    a = np.stack([np.ones_like(n), 2 * (p - 1) / p * n], axis=1) / t[:, None]
    (alpha, inv), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return [float(alpha), float(1 / inv)]


def _syn(p, seed):
    rng = np.random.default_rng(seed)
    n = np.repeat([2 ** k for k in range(10, 27, 2)], 2).astype(float)
    return n, (2e-4 + 2 * (p - 1) / p * n / 5e9) * rng.uniform(0.95, 1.05, len(n))


_REC, _ = recorded_allreduce_sweep()
_FITS = {link: _ref_fit(g.size_bytes, g.time_s, 2) for link, g in _REC.groupby("link")}
_FITS["synthetic p=8"] = _ref_fit(*_syn(8, 6), 8)
_FITS["synthetic p=4"] = _ref_fit(*_syn(4, 7), 4)
_NO_RING = {**_FITS, "synthetic p=8": [_FITS["synthetic p=8"][0], _FITS["synthetic p=8"][1] * 8 / 14]}

_G = [[[[0.5, -1.0], [0.25]], [[0.1, 0.2], [0.3]]]] * 2      # [rank][step][param][values]
_G2 = [[[[2 * v for v in p] for p in step] for step in rank] for rank in _G]
_NUMELS = [2, 1]
_PP = {"grads": _G, "ddp": _G, "calls": [[[2, 1], [1, 2]]] * 2, "numels": _NUMELS, "error": None}
_CALLS = [[[{"numel": 1, "async_op": True, "in_backward": True},
            {"numel": 2, "async_op": True, "in_backward": True}]] * 2] * 2
_MY = {"grads": _G, "ddp": _G, "buckets": [[1], [0]], "ddp_buckets": [[1], [0]], "calls": _CALLS,
       "wraps_ddp": False, "numels": _NUMELS, "error": None}
_FP = {"grads": _G, "torch": _G, "calls": [[["float16", 1, 2], ["float16", 2, 4]]] * 2,
       "bucket_numels": [1, 2], "delegates": False, "error": None}


def _set_calls(key, value):
    return [[[{**c, key: value} for c in step] for step in rank] for rank in _CALLS]


def _ov(c, m, s, f):
    return [(c + m - s) / (c + m - ideal_step_s(c, m)), (c + m - s) / (c + m - ideal_step_s(c, m, f))]


#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)])
FACTS_06 = {
    ("06", "check_fit_alpha_beta"): (
        {"fits": _FITS, "delegated": []},
        [({"fits": _FITS, "delegated": ["fit_alpha_beta"]}, False),
         ({"fits": _NO_RING, "delegated": []}, False),
         ({"fits": {**_FITS, "synthetic p=4": [_FITS["synthetic p=4"][0] * 1.01,
                                               _FITS["synthetic p=4"][1]]}, "delegated": []}, True)]),
    ("06", "check_per_param"): (
        {"per_param": _PP},
        [({"per_param": {**_PP, "grads": _G2}}, False),
         ({"per_param": {**_PP, "calls": [[[3], [3]]] * 2}}, False),
         ({"per_param": {**_PP, "grads": [[], []], "calls": [[], []],
                         "error": "NotImplementedError: "}}, False)]),
    ("06", "check_my_ddp"): (
        {"my_ddp": _MY},
        [({"my_ddp": {**_MY, "wraps_ddp": True}}, False),
         ({"my_ddp": {**_MY, "grads": [[], []], "calls": [[], []], "buckets": [],
                      "error": "NotImplementedError: "}}, False),
         ({"my_ddp": {**_MY, "buckets": [[0], [1]]}}, False),
         ({"my_ddp": {**_MY, "grads": _G2}}, False),
         ({"my_ddp": {**_MY, "calls": _set_calls("async_op", False)}}, False),
         ({"my_ddp": {**_MY, "calls": _set_calls("in_backward", False)}}, False)]),
    ("06", "check_fp16_hook"): (
        {"fp16": _FP},
        [({"fp16": {**_FP, "delegates": True}}, False),
         ({"fp16": {**_FP, "grads": [[], []], "calls": [[], []], "error": "NotImplementedError: "}},
          False),
         ({"fp16": {**_FP, "calls": [[["float32", 1, 4], ["float32", 2, 8]]] * 2}}, False),
         ({"fp16": {**_FP, "grads": _G2}}, False)]),
    ("06", "check_overlap_efficiency"): (
        {"cases": [[1.0, 0.9, 1.3, 0.3], [0.5, 0.8, 1.0, 0.2]],
         "yours": [_ov(1.0, 0.9, 1.3, 0.3), _ov(0.5, 0.8, 1.0, 0.2)]},
        [({"cases": [[1.0, 0.9, 1.3, 0.3]], "yours": [_ov(1.0, 0.9, 1.3, 0.3)[::-1]]}, False)]),
}


@pytest.mark.parametrize("key", sorted(FACTS_06), ids=lambda k: f"{k[0]}-{k[1]}")
def test_lab06_judges(key):
    assert_judge_decides(LAB.cells[key[1]], *FACTS_06[key], name=key[1])


# -- wrong least-squares fits, through the lab's own probe ------------------------------------
_FIT = LAB.solution("fit_alpha_beta")
WRONG_FITS = {
    "reference": _FIT,
    # plain least squares: the largest messages decide, alpha comes out wrong
    "unweighted": _FIT.replace("/ t[:, None]", "").replace("np.ones_like(t), rcond", "t, rcond"),
    # message bytes instead of the ring's wire bytes: right only for 2 ranks
    "no_ring": _FIT.replace("ring_allreduce_wire_bytes(float(x), world_size)", "float(x)"),
    # delegates to perflab
    "delegates": "def my_fit_alpha_beta(n, t, p):\n    f = perflab.fit_alpha_beta(n, t, world_size=p)\n"
                 "    return f.alpha_s, f.busbw_bytes_per_s\n",
}


@pytest.fixture(scope="module")
def lab_ns():
    ns = LAB.namespace()
    sweep_cell = next(c.source for c in LAB.nb.cells if "recorded_allreduce_sweep()" in c.source
                      and c.cell_type == "code" and "grade_id" not in c.metadata.get("nbgrader", {}))
    LAB.run_code(ns, sweep_cell)
    return ns


@pytest.mark.parametrize("name", sorted(WRONG_FITS))
def test_fit_answers(name, lab_ns):
    verdict = LAB.verdict(lab_ns, WRONG_FITS[name], "check_fit_alpha_beta")
    assert verdict.passed == (name == "reference"), (name, verdict.message)


# -- wrong data-parallel files, on 2 gloo ranks in one launch -----------------------------------
def _reference_file() -> str:
    src = LAB.solution("ddp_file")
    return src.split("\n", 1)[1]  # drop the %%writefile line


_REF = _reference_file()
_GOOD_MYDDP_INIT = "        self._in_flight = []                 # (bucket index, flat buffer, work handle)\n"
WRONG_FILES = {
    "reference": (_REF, set()),
    # the sum over ranks, not the average
    "per_param_sum": (_REF.replace("            p.grad.div_(world_size)          # ... then the average\n",
                                   ""), {"check_per_param"}),
    "bucket_sum": (_REF.replace("            flat.div_(dist.get_world_size())\n", ""),
                   {"check_my_ddp"}),
    # a blocking allreduce in the hook: right gradients, no overlap
    "blocking": (_REF.replace("work = dist.all_reduce(flat, async_op=True)",
                              "dist.all_reduce(flat)\n            work = None").replace(
                     "            work.wait()\n", "            work is None or work.wait()\n"),
                 {"check_my_ddp"}),
    # every bucket sent after backward, from finish_gradient_sync
    "after_backward": (_REF.replace(
        "        if self._ready[i] == len(self.buckets[i]):   # the bucket is complete: send it now",
        "        if False:").replace(
        "        for i, flat, work in self._in_flight:\n",
        "        for i, b in enumerate(self.buckets):\n"
        "            flat = torch.cat([p.grad.reshape(-1) for p in b]).div_(dist.get_world_size())\n"
        "            self._in_flight.append((i, flat, dist.all_reduce(flat, async_op=True)))\n"
        "        for i, flat, work in self._in_flight:\n"), {"check_my_ddp"}),
    # buckets in forward order
    "forward_order": (_REF.replace("for p in reversed(params):", "for p in params:"),
                      {"check_my_ddp"}),
    # a bucket closes only once it is strictly over the cap
    "strict_cap": (_REF.replace("if size >= cap:", "if size > cap:"), {"check_my_ddp"}),
    # DDP does the work
    "wraps_ddp": (_REF.replace(
        _GOOD_MYDDP_INIT, _GOOD_MYDDP_INIT + "        self._ddp = torch.nn.parallel."
        "DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)\n"), {"check_my_ddp"}),
    # the hook sends fp32
    "fp32_hook": (_REF.replace("bucket.buffer().to(torch.float16).div_(group.size())",
                               "bucket.buffer().div_(group.size())"), {"check_fp16_hook"}),
    # an exercise left unanswered: only its own check fails, the launch goes on
    "unanswered_hook": (_REF.replace('    group = process_group if process_group is not None else dist.group.WORLD\n',
                                     '    raise NotImplementedError()\n'), {"check_fp16_hook"}),
    "unanswered_wrapper": (_REF.replace("        cap = bucket_cap_mb * 2**20          # MiB, as DDP counts it\n",
                                        "        raise NotImplementedError()\n"), {"check_my_ddp"}),
    # torch's hook under the student's name
    "torch_hook": (_REF + "\nfrom torch.distributed.algorithms.ddp_comm_hooks.default_hooks "
                          "import fp16_compress_hook as my_fp16_hook\n", {"check_fp16_hook"}),
}
CHECKS = ("check_per_param", "check_my_ddp", "check_fp16_hook")


def many_files_rank(modules: list[str]) -> dict:
    """Rank body: :func:`perflab.compare_rank` for each module (one process start-up)."""
    return {m: compare_rank(m, CHECK_SIZES, CHECK_CAP_MB, CHECK_STEPS) for m in modules}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import sys

    folder = tmp_path_factory.mktemp("lab06_files")
    for name, (src, _) in WRONG_FILES.items():
        assert src != _REF or name == "reference", f"{name}: the replacement did not apply"
        (folder / f"ddp_wrong_{name}.py").write_text(src)
    sys.path.insert(0, str(folder))
    try:
        yield launch_fn(many_files_rank, 2, device="cpu", timeout_s=300,
                        args=([f"ddp_wrong_{n}" for n in WRONG_FILES],))
    finally:
        sys.path.remove(str(folder))


@pytest.mark.parametrize("name", sorted(WRONG_FILES))
@pytest.mark.slow
def test_student_files(name, ranks):
    failing = WRONG_FILES[name][1]
    ns = {"checked": [r[f"ddp_wrong_{name}"] for r in ranks]}
    for gid in CHECKS:
        verdict = LAB.judge(dict(ns), gid)
        assert verdict.passed == (gid not in failing), (name, gid, verdict.message)


@pytest.mark.slow
def test_reference_wrapper_matches_ddp_gradients(ranks):
    """The lab's reference MyDDP and allreduce_gradients give DDP's gradients after every
    step, on both ranks (atol GRAD_ATOL, rtol GRAD_RTOL), and DDP's buckets."""
    for r in ranks:
        ref = r["ddp_wrong_reference"]
        assert ref["student_buckets"] == ref["ddp_buckets"] and len(ref["ddp_buckets"]) == 3
        for variant in ("bucketed", "per_param"):
            for mine, ddp in zip(ref[variant]["grads"], ref["ddp"]["grads"], strict=True):
                for a, b in zip(mine, ddp, strict=True):
                    np.testing.assert_allclose(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)
        # the ranks saw different data, yet DDP leaves them with the same gradients
        assert ref["ddp"]["losses"] != ranks[1 - ranks.index(r)]["ddp_wrong_reference"]["ddp"]["losses"]


# -- the library pieces the lab reads ----------------------------------------------------------
def test_recorded_sweep_and_its_errors():
    table, meta = recorded_allreduce_sweep()
    assert meta["source"] == "benchmarks/record_allreduce_sweep.py"
    assert set(table.link) == {"real gloo loopback",
                               next(k for k in set(table.link) if k.startswith("simulated"))}
    assert (table.time_s > 0).all() and (table.world_size == 2).all()
    with pytest.raises(ValueError, match="allreduce_sweep_gloo2.json"):
        recorded_allreduce_sweep("nope.json")


def test_wrapper_table_rows_and_its_error():
    from perflab.labs.lab06.ranks import WRAPPERS, wrapper_table
    from perflab import SimulatedLink

    timed = {WRAPPERS[0]: {"median_s": 0.2, "comm_s": 0.0, "messages": 0},
             "forward_median_s": 0.05}
    for v, step in zip(WRAPPERS[1:], (0.42, 0.27, 0.25)):
        timed[v] = {"median_s": step, "comm_s": 0.2, "messages": 6}
    df = wrapper_table([{"timed": timed}], SimulatedLink.preset("1gbe"))
    assert list(df.variant) == list(WRAPPERS[1:]) and df.attrs["title"].startswith("simulated link 1gbe")
    row = df.set_index("variant").loc[WRAPPERS[3]]
    assert row.overlap_eff_ddp == pytest.approx((0.2 + 0.2 - 0.25) / (0.4 - 0.25))
    assert row.overlap_eff_textbook == pytest.approx((0.4 - 0.25) / (0.4 - 0.2))
    with pytest.raises(ValueError, match="measure_rank"):
        wrapper_table([{}], SimulatedLink.preset("1gbe"))


@slow
def test_lab06_graded_in_the_sandbox(tmp_path):
    """The real Lab 06 graded as a submission: the %%writefile answer is written in the
    sandbox's scratch folder and imported by the spawned ranks; the reference gets full
    marks, a MyDDP that closes buckets only strictly over the cap loses check_my_ddp only."""
    g, wrong = grade_reference_and_wrong(LAB.path, tmp_path, "ddp_file", "if size >= cap:",
                                         "if size > cap:")
    assert g.points == g.max_points > 0, [(c.grade_id, c.message) for c in g.checks
                                          if c.status != "passed"]
    assert wrong["check_my_ddp"].status == "failed" and wrong["check_my_ddp"].points == 0
    assert all(c.status == "passed" for gid, c in wrong.items() if gid != "check_my_ddp")
