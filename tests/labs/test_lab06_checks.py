"""Lab 06's checks, all graded (perflab.course.cases), run on real answers as grading runs
them: the reference solution passes at several seeds, an honest variant written
differently passes, wrong answers fail on a hidden case.

* the least-squares fit and the overlap efficiency: pure functions on hidden cases, in
  this process;
* the data-parallel file (a sum instead of an average, blocking or late allreduces,
  buckets in the wrong order or with the wrong cap, an over-cap parameter given a bucket
  of its own, a first-bucket cap ignored, a wrapper around DDP, an fp32 or borrowed
  hook): check_per_param's graded call launches 2 ranks running the student's file on
  three tiny MLPs, caps and seeded data drawn at grade time (a sealed case the two later
  checks read back, as Lab 10's checks share a launch), and the grader recomputes the
  ranks' mean gradient and DDP's bucket assignment on its side; ``bucket_assignment`` is
  also judged on drawn size lists against torch's ``_compute_bucket_assignment_by_size``,
  which the answer may not call (the graded call forbids it: a C function, seen by the
  spy's C calls). What the notebook's own launch recorded (``checked``) feeds only the
  self-checks: records an answer cell fabricates earn nothing. Here one launch runs every
  file on the lab's runs and on the drawn ones, answered to the graded call's
  ``launch_fn``, and the grader's references are checked against
  DistributedDataParallel itself."""
from __future__ import annotations

import types

import numpy as np
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, notebook_points
from perflab.course.checks import split_check
from perflab.labs.lab06.checks import GRAD_ATOL, GRAD_RTOL, compare_rank, graded_rank
from perflab.analysis.collectives import recorded_allreduce_sweep
from perflab.distributed import launch_fn

LAB = Lab("06")
CHECK_SIZES, CHECK_CAP_MB, CHECK_STEPS = [16, 32, 32, 8], 1184 / 2**20, 3

GRADED_TESTED = ("check_fit_alpha_beta", "check_per_param", "check_my_ddp",
                 "check_fp16_hook", "check_overlap_efficiency", "check_bus_bandwidth",
                 "check_allreduce_benchmark", "check_comm_overlap")


def _fails_on_a_hidden_case(verdict) -> bool:
    return not verdict.passed and verdict.message.startswith("hidden case")


# -- the least-squares fit ----------------------------------------------------------------------
_FIT = LAB.solution("fit_alpha_beta")
WRONG_FITS = {
    # plain least squares: the largest messages decide, alpha comes out wrong
    "unweighted": _FIT.replace("/ t[:, None]", "").replace("np.ones_like(t), rcond", "t, rcond"),
    # message bytes instead of the ring's wire bytes: right only for 2 ranks
    "no_ring": _FIT.replace("ring_allreduce_wire_bytes(float(x), world_size)", "float(x)"),
    # the algorithm bandwidth n / T instead of the bus bandwidth
    "algbw": _FIT.replace("return float(alpha), float(1.0 / inv_busbw)",
                          "return float(alpha), float(1.0 / inv_busbw) * world_size / (2 * (world_size - 1))"),
    # the two examples typed in, plain least squares elsewhere
    "examples_only": ("def my_fit_alpha_beta(n, t, p):\n"
                      "    if p == 2 and len(n) == 3:\n"
                      "        return 119.86349e-6, 2.2220317e9\n"
                      "    w = 2 * (p - 1) / p * np.asarray(n, float)\n"
                      "    (a, inv), *_ = np.linalg.lstsq(np.stack([np.ones_like(w), w], 1), "
                      "np.asarray(t, float), rcond=None)\n"
                      "    return a, 1 / inv\n"),
}
DELEGATES = ("def my_fit_alpha_beta(n, t, p):\n    f = perflab.fit_alpha_beta(n, t, world_size=p)\n"
             "    return f.alpha_s, f.busbw_bytes_per_s\n")
HONEST_FIT = ("def my_fit_alpha_beta(size_bytes, time_s, world_size):\n"  # weighted polyfit
              "    t = np.asarray(time_s, dtype=float)\n"
              "    w = np.asarray(size_bytes, dtype=float) * 2 * (world_size - 1) / world_size\n"
              "    slope, intercept = np.polyfit(w, t, 1, w=1 / t)\n"
              "    return intercept, 1 / slope\n")


@pytest.fixture(scope="module")
def lab_ns():
    ns = LAB.namespace()
    sweep_cell = next(c.source for c in LAB.nb.cells if "recorded_allreduce_sweep()" in c.source
                      and c.cell_type == "code" and "grade_id" not in c.metadata.get("nbgrader", {}))
    LAB.run_code(ns, sweep_cell)
    return ns


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
def test_fit_reference_passes_at_any_seed(lab_ns, seed):
    scope = dict(lab_ns)
    LAB.run_code(scope, _FIT)
    verdict = LAB.judge(scope, "check_fit_alpha_beta", seed=seed)
    assert verdict.passed, verdict.message


def test_fit_honest_variant_passes(lab_ns):
    assert LAB.verdict(lab_ns, HONEST_FIT, "check_fit_alpha_beta").passed


@pytest.mark.parametrize("name", sorted(WRONG_FITS))
def test_wrong_fit_fails(lab_ns, name):
    assert WRONG_FITS[name] != _FIT
    verdict = LAB.verdict(lab_ns, WRONG_FITS[name], "check_fit_alpha_beta")
    assert _fails_on_a_hidden_case(verdict), (name, verdict)


def test_fit_delegating_to_perflab_fails(lab_ns):
    verdict = LAB.verdict(lab_ns, DELEGATES, "check_fit_alpha_beta")
    assert not verdict.passed and "fit_alpha_beta" in verdict.message, verdict


def test_fit_self_check_runs_the_examples(lab_ns):
    """The visible part passes the reference and stops the unweighted fit (its second
    example), and the examples-only fit passes it: only the hidden cases catch that."""
    probe = split_check(LAB.cells["check_fit_alpha_beta"]).probe
    for code, passes in ((_FIT, True), (WRONG_FITS["unweighted"], False),
                         (WRONG_FITS["examples_only"], True)):
        scope = dict(lab_ns)
        LAB.run_code(scope, code)
        if passes:
            LAB.run_code(scope, probe)
        else:
            with pytest.raises(AssertionError, match="example with p = 2"):
                LAB.run_code(scope, probe)


# -- overlap efficiency ----------------------------------------------------------------------------
_OVERLAP = LAB.solution("overlap_efficiency")
WRONG_OVERLAP = {
    "swapped": _OVERLAP.replace("return textbook, ddp", "return ddp, textbook"),
    "textbook_twice": _OVERLAP.replace("return textbook, ddp", "return textbook, textbook"),
    # the DDP bound without comm: max(compute, forward)
    "no_comm_in_bound": _OVERLAP.replace("max(compute_s, forward_s + comm_s)",
                                         "max(compute_s, forward_s)"),
    "examples_only": ("def my_overlap_efficiency(c, m, s, f):\n"
                      "    return {(1.0, 0.9, 1.3, 0.3): (2 / 3, 6 / 7), "
                      "(0.5, 0.8, 1.0, 0.2): (0.6, 1.0)}.get((c, m, s, f), (0.5, 0.5))\n"),
}
HONEST_OVERLAP = ("def my_overlap_efficiency(compute_s, comm_s, step_s, forward_s):\n"
                  "    hidden = compute_s + comm_s - step_s\n"
                  "    return (hidden / min(compute_s, comm_s),\n"
                  "            hidden / (compute_s + comm_s - max(compute_s, forward_s + comm_s)))\n")
DELEGATES_OVERLAP = (
    "from perflab.analysis.overlap import overlap_efficiency as oe\n"
    "def my_overlap_efficiency(c, m, s, f):\n"
    "    return oe(c, m, s, max(c, m)), oe(c, m, s, max(c, f + m))\n")


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
def test_overlap_reference_passes_at_any_seed(seed):
    scope = {"__name__": "__main__"}
    LAB.run_code(scope, _OVERLAP)
    verdict = LAB.judge(scope, "check_overlap_efficiency", seed=seed)
    assert verdict.passed, verdict.message


def test_overlap_honest_variant_passes():
    assert LAB.verdict({"__name__": "__main__"}, HONEST_OVERLAP, "check_overlap_efficiency").passed


@pytest.mark.parametrize("name", sorted(WRONG_OVERLAP))
def test_wrong_overlap_fails(name):
    assert WRONG_OVERLAP[name] != _OVERLAP
    verdict = LAB.verdict({"__name__": "__main__"}, WRONG_OVERLAP[name], "check_overlap_efficiency")
    assert _fails_on_a_hidden_case(verdict), (name, verdict)


def test_overlap_delegating_to_perflab_fails():
    verdict = LAB.verdict({"__name__": "__main__"}, DELEGATES_OVERLAP, "check_overlap_efficiency")
    assert not verdict.passed and "overlap_efficiency" in verdict.message, verdict


# -- bus bandwidth (Exercise 6) ---------------------------------------------------------------------
_BW = LAB.solution("my_bus_bandwidth")
WRONG_BW = {
    # nccl-tests' factor with n where n - 1 belongs: 2 for every rank count
    "2n/n": _BW.replace("2 * (world_size - 1) / world_size", "2 * world_size / world_size"),
    # (n - 1)/n: the reduce-scatter alone
    "(n-1)/n": _BW.replace("2 * (world_size - 1) / world_size", "(world_size - 1) / world_size"),
    # GiB/s for the bus bandwidth
    "GiB": _BW.replace("return algbw, algbw * 2", "return algbw, algbw / 1.073741824 * 2"),
    # the example's row typed in
    "examples_only": ("def my_bus_bandwidth(n, t, p):\n"
                      "    return np.array([247.94e9]), np.array([433.90e9])\n"),
}
HONEST_BW = ("def my_bus_bandwidth(size_bytes, time_s, world_size):\n"
             "    alg = [float(n) / float(t) for n, t in zip(np.ravel(size_bytes), np.ravel(time_s))]\n"
             "    factor = 2.0 * (world_size - 1) / world_size\n"
             "    return alg, [a * factor for a in alg]\n")


def test_bus_bandwidth_delegating_to_perflab_fails(lab_ns):
    code = ("from perflab.analysis.collectives import algbw_bytes_per_s, busbw_bytes_per_s\n"
            "def my_bus_bandwidth(n, t, p):\n"
            "    alg = [algbw_bytes_per_s(float(a), float(b)) for a, b in zip(n, t)]\n"
            "    return alg, [busbw_bytes_per_s(float(a), float(b), p) for a, b in zip(n, t)]\n")
    verdict = LAB.verdict(dict(lab_ns), code, "check_bus_bandwidth")
    assert not verdict.passed and "bytes_per_s" in verdict.message, verdict


def test_reference_bandwidths_equal_what_nccl_tests_printed():
    """The definitions the judge uses reproduce every shipped table's printed algbw and
    busbw (two decimals of GB/s, from a time printed to four or five digits)."""
    from perflab.analysis.recordings import nccl_table_names, read_nccl_tests
    scope = {"np": np}
    LAB.run_code(scope, _BW)
    for name in nccl_table_names():
        t = read_nccl_tests(name)
        alg, bus = scope["my_bus_bandwidth"](t.size_bytes.to_numpy(), t.time_us.to_numpy() * 1e-6,
                                             t.attrs["nranks"])
        tol = 0.005 + 1e-3 * t.algbw_GBps   # the printed rounding, and the time's own
        assert (abs(np.asarray(alg) / 1e9 - t.algbw_GBps) <= tol).all(), name
        assert (abs(np.asarray(bus) / 1e9 - t.busbw_GBps) <= 2 * tol).all(), name


def test_students_benchmark_file_runs_on_two_ranks(tmp_path, monkeypatch):
    """The reference allreduce_benchmark on 2 gloo ranks: one [size, seconds] row per size,
    every time positive, on both ranks (the lab launches it once; it is not graded)."""
    src = LAB.solution("allreduce_file").split("\n", 1)[1]
    (tmp_path / "bench_ref_student.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import importlib
    mod = importlib.import_module("bench_ref_student")
    out = launch_fn(mod.allreduce_benchmark, 2, args=([16, 4096, 2**18], 3, 1), device="cpu",
                    timeout_s=120)
    assert len(out) == 2
    for rows in out:
        assert [n for n, _ in rows] == [16, 4096, 2**18]
        assert all(t > 0 for _, t in rows)


# -- the benchmark's calls (Exercise 6) ----------------------------------------------------------------
_BENCH = LAB.solution("allreduce_file").split("\n", 1)[1]
WRONG_BENCH = {
    "no warm-up": _BENCH.replace("        for _ in range(warmup):\n            dist.all_reduce(x)\n", ""),
    "no barrier": _BENCH.replace("        dist.barrier()\n", ""),
    "barrier before the warm-up": _BENCH.replace(
        "        for _ in range(warmup):\n            dist.all_reduce(x)\n        if cuda:\n            torch.cuda.synchronize()\n        dist.barrier()\n",
        "        dist.barrier()\n        for _ in range(warmup):\n            dist.all_reduce(x)\n        if cuda:\n            torch.cuda.synchronize()\n"),
    "n elements, not n bytes": _BENCH.replace("max(1, int(n) // 4)", "max(1, int(n))"),
    "one timed call too few": _BENCH.replace("        for _ in range(iters):\n", "        for _ in range(iters - 1):\n"),
    "float64 tensor": _BENCH.replace("dtype=torch.float32", "dtype=torch.float64"),
}
HONEST_BENCH = """
import time
import torch
import torch.distributed as dist


def allreduce_benchmark(sizes_bytes, iters=10, warmup=3):
    results = []
    for size in sizes_bytes:
        buf = torch.empty(size // 4).fill_(1.0)
        [dist.all_reduce(buf) for _ in range(warmup)]
        dist.barrier()
        marks = [time.perf_counter()]
        for _ in range(iters):
            dist.all_reduce(buf)
            marks.append(time.perf_counter())
        dist.barrier()                       # a second barrier after timing: harmless
        results.append([size, (marks[-1] - marks[0]) / iters])
    return results
"""


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-rank gloo group in this process: the benchmark's calls are recorded as on a rank."""
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _bench_verdict(lab_ns, tmp_path, monkeypatch, code):
    import sys
    (tmp_path / "allreduce_student.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "allreduce_student", raising=False)
    scope = dict(lab_ns)
    # the ranks of a launch, run here one after the other on the 1-rank group
    scope["launch_fn"] = lambda fn, world_size, args=(), **kw: [fn(*args) for _ in range(world_size)]
    from perflab.labs.lab06.ranks import benchmark_rank
    scope.update(benchmark_rank=benchmark_rank, WORLD_SIZE=2)
    return LAB.judge(scope, "check_allreduce_benchmark", seed=3)


@pytest.mark.parametrize("name, passes", [("reference", True), ("honest", True)]
                         + [(n, False) for n in sorted(WRONG_BENCH)])
def test_benchmark_calls_judged(lab_ns, tmp_path, monkeypatch, one_rank_group, name, passes):
    code = {"reference": _BENCH, "honest": HONEST_BENCH}.get(name) or WRONG_BENCH[name]
    assert name in ("reference", "honest") or code != _BENCH, name
    v = _bench_verdict(lab_ns, tmp_path, monkeypatch, code)
    assert v.passed == passes, (name, v.message)
    if not passes:
        assert v.message.startswith("hidden case"), v.message


# -- overlap on the real trace (Exercise 7) ----------------------------------------------------------
_OV = LAB.solution("my_comm_overlap")
WRONG_COMM_OVERLAP = {
    # memory copies counted as computation
    "memcpy is compute": _OV.replace("k = merged(zip(dev.ts[~comm & ~memory], dev.end[~comm & ~memory]))",
                                     "k = merged(zip(dev.ts[~comm], dev.end[~comm]))"),
    # no communication: 0 % instead of undefined
    "0 % without communication": _OV.replace('100 * overlap / comm_us if comm_us > 0 else float("nan")',
                                             '100 * overlap / comm_us if comm_us > 0 else 0.0'),
    # the share of the step, not of the communication
    "share of the span": _OV.replace("\"overlap_pct\": 100 * overlap / comm_us",
                                     "\"overlap_pct\": 100 * overlap / float(dev.end.max() - dev.ts.min())"),
}
#: Wrong on the example already (the self-check stops them; the real trace's NCCL kernels
#: never overlap each other, nor its computation kernels during communication).
SELF_CHECK_WRONG_OVERLAP = {
    # durations summed: two NCCL kernels at once (two streams) counted twice
    "summed communication": _OV.replace("comm_us = float(sum(e - s for s, e in c))",
                                        "comm_us = float((dev.end - dev.ts)[comm].sum())"),
    # computation intervals of two streams not merged: their common time counted twice
    "pairwise, not merged": _OV.replace("k = merged(zip(dev.ts[~comm & ~memory], dev.end[~comm & ~memory]))",
                                        "k = sorted([list(x) for x in zip(dev.ts[~comm & ~memory], dev.end[~comm & ~memory])])"),
}
DELEGATES_COMM_OVERLAP = """
def my_comm_overlap(events):
    from perflab.analysis.trace import RankTrace
    from perflab.analysis.trace_analysis import comm_comp_overlap
    rt = RankTrace(rank=0, events=events.assign(step=False), on_gpu=True, trace={}, path=None)
    row = comm_comp_overlap({0: rt}).iloc[0]
    return {k: float(row[k]) for k in ("comm_us", "overlap_us", "overlap_pct")}
"""
HONEST_COMM_OVERLAP = """
def my_comm_overlap(events):
    # a sweep over boundaries: +1/-1 counters for communication and computation
    dev = events[events.stream >= 0]
    points = []
    for r in dev.itertuples():
        kind = ("comm" if r.name.startswith("nccl") or "ncclKernel" in r.name else
                None if r.name.startswith(("Memcpy", "Memset")) else "comp")
        if kind:
            points += [(r.ts, kind, 1), (r.end, kind, -1)]
    points.sort(key=lambda p: p[0])
    live = {"comm": 0, "comp": 0}
    comm = both = 0.0
    last = None
    for t, kind, d in points:
        if last is not None:
            comm += (t - last) * (live["comm"] > 0)
            both += (t - last) * (live["comm"] > 0 and live["comp"] > 0)
        live[kind] += d
        last = t
    return {"comm_us": comm, "overlap_us": both,
            "overlap_pct": 100 * both / comm if comm else float("nan")}
"""


#: Exercises 6 and 7's pure functions: (reference, honest variant, wrong answers) per check.
PURE_CHECKS = {"check_bus_bandwidth": (_BW, HONEST_BW, WRONG_BW),
               "check_comm_overlap": (_OV, HONEST_COMM_OVERLAP, WRONG_COMM_OVERLAP)}


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
@pytest.mark.parametrize("check", sorted(PURE_CHECKS))
def test_pure_reference_passes_at_any_seed(lab_ns, check, seed):
    scope = dict(lab_ns)
    LAB.run_code(scope, PURE_CHECKS[check][0])
    verdict = LAB.judge(scope, check, seed=seed)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("check", sorted(PURE_CHECKS))
def test_pure_honest_variant_passes(lab_ns, check):
    verdict = LAB.verdict(dict(lab_ns), PURE_CHECKS[check][1], check)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("check, name", [(c, n) for c, (_, _, wrong) in sorted(PURE_CHECKS.items())
                                         for n in sorted(wrong)])
def test_pure_wrong_answer_fails(lab_ns, check, name):
    reference, _, wrong = PURE_CHECKS[check]
    assert wrong[name] != reference
    verdict = LAB.verdict(dict(lab_ns), wrong[name], check)
    assert _fails_on_a_hidden_case(verdict), (name, verdict)


@pytest.mark.parametrize("name", sorted(SELF_CHECK_WRONG_OVERLAP))
def test_comm_overlap_self_check_stops(lab_ns, name):
    scope = dict(lab_ns)
    LAB.run_code(scope, SELF_CHECK_WRONG_OVERLAP[name])
    with pytest.raises(AssertionError, match="the example's is"):
        LAB.run_code(scope, split_check(LAB.cells["check_comm_overlap"]).probe)


def test_comm_overlap_hidden_cases_include_a_window_without_communication():
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions
    cases_fn, _ = graded_functions(split_check(LAB.cells["check_comm_overlap"]).graded,
                                   "check_comm_overlap")
    for seed in (0, "grade:ada"):
        drawn = draw_cases(cases_fn, seed)
        comm = [any(r[0].startswith("nccl") and r[4] >= 0 for r in c["events"]) for c in drawn]
        assert comm[:2] == [True, True] and comm[2:] == [False], comm


def test_comm_overlap_delegating_to_perflab_fails(lab_ns):
    verdict = LAB.verdict(dict(lab_ns), DELEGATES_COMM_OVERLAP, "check_comm_overlap")
    assert not verdict.passed and "comm_comp_overlap" in verdict.message, verdict


# -- the data-parallel file, on 2 gloo ranks ------------------------------------------------------
def _reference_file() -> str:
    src = LAB.solution("ddp_file")
    return src.split("\n", 1)[1]  # drop the %%writefile line


_REF = _reference_file()
_GOOD_MYDDP_INIT = "        self._in_flight = []                 # (bucket index, flat buffer, work handle)\n"
_HOOK_LINE = "    half = bucket.buffer().to(torch.float16).div_(group.size())\n"


#: bucket_assignment written differently: a running total, the cap looked up per bucket
_HONEST_ASSIGNMENT = (
    "    caps = [bucket_cap_bytes] if first_bucket_cap_bytes is None else [first_bucket_cap_bytes]\n"
    "    out, start, total = [], 0, 0\n"
    "    for i, n in enumerate(param_bytes):\n"
    "        total += n\n"
    "        if total >= (caps[0] if not out else bucket_cap_bytes):\n"
    "            out.append(list(range(start, i + 1)))\n"
    "            start, total = i + 1, 0\n"
    "    return out + ([list(range(start, len(param_bytes)))] if start < len(param_bytes) else [])\n")


#: bucket_assignment handed to torch's C++ rule (the grader's own reference)
_TORCH_RULE = (
    "    sizes = [torch.empty(n, dtype=torch.uint8) for n in param_bytes]\n"
    "    caps = [bucket_cap_bytes] if first_bucket_cap_bytes is None else [first_bucket_cap_bytes, bucket_cap_bytes]\n"
    "    buckets, _ = dist._compute_bucket_assignment_by_size(sizes, caps, [False] * len(sizes),\n"
    "                                                         list(range(len(sizes))))\n"
    "    return [list(b) for b in buckets]\n")


_ASSIGNMENT_BODY = _REF[_REF.index("    buckets, bucket, size = [], [], 0\n"):
                        _REF.index("    ### END SOLUTION\n\n\nclass MyDDP")]


def _honest_file() -> str:
    """The exercises written differently: divide before the per-parameter allreduce,
    ``bucket_assignment`` with a running total, MyDDP sizes its buckets with ``nbytes``
    and divides after the allreduce, the hook divides after the fp16 allreduce."""
    out = _REF
    for old, new in [
        ("            dist.all_reduce(p.grad)          # sum over the ranks, in place\n"
         "            p.grad.div_(world_size)          # ... then the average\n",
         "            p.grad /= world_size\n            dist.all_reduce(p.grad)\n"),
        ("[p.numel() * p.element_size() for p in ready]", "[p.nbytes for p in ready]"),
        (_REF[_REF.index("    buckets, bucket, size = [], [], 0\n"):_REF.index("    ### END SOLUTION\n\n\nclass MyDDP")],
         _HONEST_ASSIGNMENT),
        ("            flat.div_(dist.get_world_size())\n", ""),
        ("p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))",
         "p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / dist.get_world_size())"),
        (_HOOK_LINE, "    half = bucket.buffer().half()\n"),
        ("out.copy_(fut.value()[0])", "out.copy_(fut.value()[0].div(group.size()))"),
    ]:
        assert old in out, old
        out = out.replace(old, new)
    return out


#: name -> (the file, the checks it fails)
STUDENT_FILES = {
    "reference": (_REF, set()),
    "honest": (_honest_file(), set()),
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
    "forward_order": (_REF.replace("ready = list(reversed(params))", "ready = list(params)"),
                      {"check_my_ddp"}),
    # issue 26: a parameter over the cap closes the open bucket and gets one of its own
    "own_bucket": (_REF.replace(
        "        bucket.append(i)                     # a parameter over the cap joins the open bucket\n",
        "        if nbytes >= cap and bucket:\n"
        "            buckets.append(bucket)\n"
        "            bucket, size = [], 0\n"
        "            cap = bucket_cap_bytes\n"
        "        bucket.append(i)\n"), {"check_my_ddp"}),
    # the first-bucket cap ignored: right on every live run (no first cap there), wrong on
    # the hidden size lists that have one
    "no_first_cap": (_REF.replace("        cap = first_bucket_cap_bytes if (first_bucket_cap_bytes is not None\n"
                                  "                                         and not buckets) else bucket_cap_bytes\n",
                                  "        cap = bucket_cap_bytes\n"), {"check_my_ddp"}),
    # a bucket closes only once it is strictly over the cap
    "strict_cap": (_REF.replace("if size >= cap:", "if size > cap:"), {"check_my_ddp"}),
    # CS336's edge cases: a frozen parameter given a bucket (its hook cannot be registered,
    # and its gradient never comes), a tied weight listed twice
    "frozen_in_bucket": (_REF.replace("params = [p for p in module.parameters() if p.requires_grad]",
                                      "params = list(module.parameters())"), {"check_my_ddp"}),
    "tied_twice": (_REF.replace("params = [p for p in module.parameters() if p.requires_grad]",
                                "params = [p for _, p in module.named_parameters(remove_duplicate=False)"
                                " if p.requires_grad]"), {"check_my_ddp"}),
    # DDP does the work
    "wraps_ddp": (_REF.replace(
        _GOOD_MYDDP_INIT, _GOOD_MYDDP_INIT + "        self._ddp = torch.nn.parallel."
        "DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)\n"), {"check_my_ddp"}),
    # ... built only in the first forward
    "ddp_in_forward": (_REF.replace(
        "        return self.module(*args, **kwargs)\n",
        "        if not hasattr(self, '_ddp'):\n"
        "            self._ddp = torch.nn.parallel.DistributedDataParallel(self.module)\n"
        "        return self._ddp(*args, **kwargs)\n"), {"check_my_ddp"}),
    # the hook sends fp32
    "fp32_hook": (_REF.replace("bucket.buffer().to(torch.float16).div_(group.size())",
                               "bucket.buffer().div_(group.size())"), {"check_fp16_hook"}),
    # the fp16 hook sums instead of averaging, or never copies the result back
    "fp16_sum": (_REF.replace("bucket.buffer().to(torch.float16).div_(group.size())",
                              "bucket.buffer().to(torch.float16)"), {"check_fp16_hook"}),
    "fp16_no_copy_back": (_REF.replace("        out.copy_(fut.value()[0])            # back to fp32, into DDP's bucket\n",
                                       ""), {"check_fp16_hook"}),
    # an exercise left unanswered: only its own check fails, the launch goes on
    "unanswered_hook": (_REF.replace('    group = process_group if process_group is not None else dist.group.WORLD\n',
                                     '    raise NotImplementedError()\n'), {"check_fp16_hook"}),
    "unanswered_wrapper": (_REF.replace("        cap = bucket_cap_mb * 2**20          # MiB, as DDP counts it\n",
                                        "        raise NotImplementedError()\n"), {"check_my_ddp"}),
    # torch's hook under the student's name, or called from the student's
    "torch_hook": (_REF + "\nfrom torch.distributed.algorithms.ddp_comm_hooks.default_hooks "
                          "import fp16_compress_hook as my_fp16_hook\n", {"check_fp16_hook"}),
    "torch_hook_called": (_REF.replace(
        "    group = process_group if process_group is not None else dist.group.WORLD\n",
        "    return fp16_compress_hook(process_group, bucket)\n") + (
        "\nfrom torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook\n"),
        {"check_fp16_hook"}),
}
CHECKS = ("check_per_param", "check_my_ddp", "check_fp16_hook")


def _live_runs(ns: dict) -> list[list]:
    """The runs of the lab's own launch (its self-checks' runs): compare_rank's arguments
    after the module name, from the set-up cell's CHECK_* and CAP_ARGS."""
    runs = [[ns["CHECK_SIZES"], ns["CHECK_CAP_MB"], ns["CHECK_STEPS"], 4, 0.1, 0, False]]
    return runs + [list(c) + [False] * (7 - len(c)) for c in ns["CAP_ARGS"]]


def _hidden_runs(seed) -> list[dict]:
    """The runs check_per_param draws at ``seed`` (the graded launch's; the later checks
    judge the same ones, sealed)."""
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions

    cases_fn, _ = graded_functions(split_check(LAB.cells["check_per_param"]).graded,
                                   "check_per_param")
    (case,) = draw_cases(cases_fn, seed)
    return case["runs"]


#: Seeds the reference is graded at (each its own hidden runs); the wrong files at the first.
SEEDS = (0, 1, "grade:ada")


def many_files_rank(modules: list[str], live: list[list], hidden: list[list[dict]]) -> dict:
    """Rank body, one process start-up for every file: each module on the lab's runs
    (beside DDP: the self-checks' records), on the graded runs of ``hidden[0]`` as the
    graded launch runs them (:func:`graded_rank`); the reference (``modules[0]``) also on
    every ``hidden`` list beside DDP (a superset of graded_rank's records)."""
    out = {m: {"live": [compare_rank(m, *c) for c in live], "graded": graded_rank(m, hidden[0])}
           for m in modules[1:]}
    out[modules[0]] = {"live": [compare_rank(modules[0], *c) for c in live],
                       "beside_ddp": [[compare_rank(modules[0], r["sizes"], r["bucket_cap_mb"],
                                                    r["steps"], r["batch"], r["lr"], r["seed"],
                                                    r["edges"]) for r in runs] for runs in hidden]}
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, lab_ns):
    """Every student file on the lab's runs and on the graded runs, in one launch of 2
    gloo ranks: ``{name: {"live": [[rank 0, rank 1] per run], "graded": {seed: [rank]
    [run] (what the graded launch returns)}}}``; the reference at every seed of
    :data:`SEEDS` (run beside DDP), the others at the first."""
    import sys

    folder = tmp_path_factory.mktemp("lab06_files")
    for name, (src, _) in STUDENT_FILES.items():
        assert src != _REF or name == "reference", f"{name}: the replacement did not apply"
        (folder / f"ddp_wrong_{name}.py").write_text(src)
    live = _live_runs(lab_ns)
    names = ["reference"] + [n for n in STUDENT_FILES if n != "reference"]
    sys.path.insert(0, str(folder))
    try:
        out = launch_fn(many_files_rank, 2, device="cpu", timeout_s=600,
                        args=([f"ddp_wrong_{n}" for n in names], live,
                              [_hidden_runs(s) for s in SEEDS]))
    finally:
        sys.path.remove(str(folder))
    got: dict = {"live_runs": live}
    for name in names:
        per_rank = [r[f"ddp_wrong_{name}"] for r in out]
        got[name] = {"live": [[r["live"][k] for r in per_rank] for k in range(len(live))]}
        if name == "reference":
            got[name]["graded"] = {s: [r["beside_ddp"][i] for r in per_rank]
                                   for i, s in enumerate(SEEDS)}
        else:
            got[name]["graded"] = {SEEDS[0]: [r["graded"] for r in per_rank]}
    return got


def _student_module(name: str) -> types.ModuleType:
    """The file ``name`` imported as the notebook imports ``ddp_student``."""
    mod = types.ModuleType("ddp_student")
    exec(compile(STUDENT_FILES[name][0], f"ddp_wrong_{name}.py", "exec"), mod.__dict__)  # noqa: S102
    return mod


def _lab_globals(ranks: dict, name: str = "reference", records: str | None = None) -> dict:
    """What the lab's launch cell leaves in the notebook: ``checked`` (the check model)
    and ``checked_caps`` (the other runs), each ``[rank 0, rank 1]``, from file
    ``records``' run (default: ``name``'s), and ``name``'s file imported as
    ``ddp_student``."""
    runs = ranks[records or name]["live"]
    return {"__name__": "__main__", "checked": runs[0], "checked_caps": runs[1:], "np": np,
            "CHECK_STEPS": CHECK_STEPS, "CAP_ARGS": [tuple(c) for c in ranks["live_runs"][1:]],
            "ddp_student": _student_module(name)}


def _judge_chain(monkeypatch, answer: list, seed, ns: dict | None = None,
                 name: str = "reference") -> dict:
    """The three graded data-parallel checks at ``seed``, in notebook order, in one
    namespace (``ns``, else one with file ``name`` as ``ddp_student``): check_per_param's
    launch answered with ``answer`` (``[rank][run]`` records, as the graded launch returns
    them), the later checks reading what it kept (sealed). Returns ``{grade_id: verdict}``."""
    import json

    import perflab.labs.lab06.checks as lab06_checks

    runs = _hidden_runs(seed)

    def fake_launch(fn, world_size, *, args=(), **kwargs):
        assert fn is lab06_checks.graded_rank and world_size == 2, (fn, world_size)
        assert args[0] == "ddp_student" and args[1] == runs, args
        return json.loads(json.dumps(answer))   # fresh copies, as a launch unpickles them

    monkeypatch.setattr(lab06_checks, "_GRADED_LAUNCH", {})
    monkeypatch.setattr(lab06_checks, "launch_fn", fake_launch)
    ns = ns if ns is not None else {"__name__": "__main__", "ddp_student": _student_module(name)}
    return {gid: LAB.judge(ns, gid, seed=seed) for gid in CHECKS}


def test_drawn_runs_have_the_cases_that_matter():
    """At every seed: three runs on hidden seeded data; the first's cap is the bytes of
    its first bucket exactly and it has 2 or more buckets; the last is the MLP with a
    tied weight and a frozen bias, whose bucket assignment leaves the frozen bias out,
    lists the shared weight once and puts it (over the cap) in a bucket after a small
    bias; the runs differ from seed to seed."""
    from perflab.course.references.lab06 import ddp_buckets, run_model

    seen = set()
    for seed in (*SEEDS, 2, 3, "grade:bob"):
        runs = _hidden_runs(seed)
        seen.add(repr(runs))
        assert [r["edges"] for r in runs] == [False, False, True]
        assert all(2 <= r["steps"] <= 3 for r in runs)
        first = runs[0]
        params = list(run_model(first["sizes"], 0, False).parameters())
        buckets = ddp_buckets(first["sizes"], first["bucket_cap_mb"], False)
        assert len(buckets) >= 2
        assert sum(params[i].numel() * 4 for i in buckets[0]) == round(first["bucket_cap_mb"] * 2**20)
        edge = runs[2]
        model = run_model(edge["sizes"], 0, True)
        params = list(model.parameters())
        shared = next(i for i, p in enumerate(params) if p is model[4].weight)
        frozen = next(i for i, p in enumerate(params) if not p.requires_grad)
        got = ddp_buckets(edge["sizes"], edge["bucket_cap_mb"], True)
        assert sorted(i for b in got for i in b) == [i for i in range(len(params)) if i != frozen]
        (b,) = [b for b in got if shared in b]
        cap = edge["bucket_cap_mb"] * 2**20
        assert len(b) == 2 and params[shared].numel() * 4 > cap > params[b[0]].numel() * 4
    assert len(seen) == 6


def test_the_labs_runs_for_the_self_checks(lab_ns):
    """The lab's own launch (the self-checks' feedback): the check model, the second MLP
    with caps that make 1, 2 and 3 buckets, the MLP with a tied weight and a frozen bias;
    each cap the bytes of its first bucket exactly."""
    from perflab.course.references.lab06 import ddp_buckets, run_model

    live = _live_runs(lab_ns)
    assert [r[6] for r in live] == [False, False, False, False, True]
    assert [len(ddp_buckets(c[0], c[1], c[6])) for c in live] == [3, 1, 2, 3, 3]
    for sizes, cap_mb, *_, edges in live:
        params = list(run_model(sizes, 0, edges).parameters())
        first = ddp_buckets(sizes, cap_mb, edges)[0]
        assert sum(params[i].numel() * 4 for i in first) == round(cap_mb * 2**20)


@pytest.mark.parametrize("name", sorted(STUDENT_FILES))
@pytest.mark.slow
def test_student_files(name, ranks, monkeypatch):
    """Each file graded on the runs drawn at seed 0: the reference and the honest variant
    pass the three checks, each wrong file fails the checks it breaks on a hidden case
    and passes the others."""
    failing = STUDENT_FILES[name][1]
    verdicts = _judge_chain(monkeypatch, ranks[name]["graded"][SEEDS[0]], SEEDS[0], name=name)
    for gid, verdict in verdicts.items():
        if gid in failing:
            assert _fails_on_a_hidden_case(verdict), (name, gid, verdict)
        else:
            assert verdict.passed, (name, gid, verdict.message)


@pytest.mark.slow
def test_reference_passes_at_other_seeds(ranks, monkeypatch):
    for seed in SEEDS[1:]:   # other runs, other caps and data: the reference on each
        for gid, verdict in _judge_chain(monkeypatch, ranks["reference"]["graded"][seed],
                                         seed).items():
            assert verdict.passed, (seed, gid, verdict.message)


#: A wrong file per check, its mistake only in that check's exercise.
FABRICATED = {"check_per_param": "per_param_sum", "check_my_ddp": "bucket_sum",
              "check_fp16_hook": "fp16_sum"}


@pytest.mark.parametrize("gid", CHECKS)
@pytest.mark.slow
def test_records_of_the_notebooks_launch_earn_nothing(gid, ranks, monkeypatch):
    """Issue 43: an answer cell that makes the notebook's own launch run another (right)
    file, or assigns its records (``checked``, ``checked_caps``), while ``ddp_student.py``
    is wrong. The self-check reads those records, as the graded part did before it
    launched its own ranks, and passes; the graded part runs ddp_student.py on runs it
    drew and fails on that hidden case."""
    wrong = FABRICATED[gid]
    ns = _lab_globals(ranks, wrong, records="reference")   # the kernel's records: the right file's
    LAB.run_code(dict(ns), split_check(LAB.cells[gid]).probe)
    verdicts = _judge_chain(monkeypatch, ranks[wrong]["graded"][SEEDS[0]], SEEDS[0], ns=ns)
    assert _fails_on_a_hidden_case(verdicts[gid]), verdicts[gid]
    assert "hidden case 1/" in verdicts[gid].message   # the launch's case, not a size list
    assert "not the ranks' mean gradient" in verdicts[gid].message, verdicts[gid].message


@pytest.mark.slow
def test_short_or_missing_records_fail(ranks, monkeypatch):
    """A run with a step missing, a rank or a run missing never passes."""
    import copy

    good = ranks["reference"]["graded"][SEEDS[0]]
    short_step = copy.deepcopy(good)
    for variant in ("per_param", "bucketed", "fp16"):
        short_step[0][1][variant]["grads"].pop()
    one_rank = copy.deepcopy(good)[:1]
    one_run_less = [r[:-1] for r in copy.deepcopy(good)]
    for answer in (short_step, one_rank, one_run_less):
        for gid, verdict in _judge_chain(monkeypatch, answer, SEEDS[0]).items():
            assert _fails_on_a_hidden_case(verdict), (gid, verdict)


@pytest.mark.slow
def test_later_checks_judge_only_the_sealed_runs(ranks, monkeypatch):
    """check_my_ddp and check_fp16_hook judge the runs check_per_param drew: a record whose
    runs were changed in the process (a cap, to fit other buckets), or with no launch
    before it, fails."""
    import perflab.labs.lab06.checks as lab06_checks

    _judge_chain(monkeypatch, ranks["reference"]["graded"][SEEDS[0]], SEEDS[0])
    ns = {"__name__": "__main__", "ddp_student": _student_module("reference")}
    lab06_checks._GRADED_LAUNCH["runs"] = [dict(r) for r in lab06_checks._GRADED_LAUNCH["runs"]]
    lab06_checks._GRADED_LAUNCH["runs"][1]["bucket_cap_mb"] *= 2
    for gid in CHECKS[1:]:
        verdict = LAB.judge(ns, gid, seed=0)
        assert _fails_on_a_hidden_case(verdict) and "tampered" in verdict.message, verdict
    lab06_checks._GRADED_LAUNCH.clear()
    for gid in CHECKS[1:]:
        verdict = LAB.judge(ns, gid, seed=0)
        assert _fails_on_a_hidden_case(verdict), verdict
        assert "no graded data-parallel launch" in verdict.message, verdict.message


def test_graded_records_refuses_an_unknown_variant():
    from perflab.labs.lab06.checks import GRADED_VARIANTS, graded_records

    with pytest.raises(ValueError, match="one of"):
        graded_records(None, "ddp")
    assert GRADED_VARIANTS == ("per_param", "bucketed", "fp16")


@pytest.mark.slow
def test_graders_references_match_ddp(ranks):
    """What the grader computes on its side is what DistributedDataParallel does on every
    drawn run: DDP's buckets (after its first-step rebuild) are ``ddp_buckets``, its
    gradients the ranks' mean gradient (``mean_grads``), and torch's fp16_compress_hook's
    gradients the fp16 mean, which the fp32 mean is not."""
    from perflab.course.references.lab06 import ddp_buckets, mean_grads, same_grads

    for seed in SEEDS:
        for run, recs in zip(_hidden_runs(seed), zip(*ranks["reference"]["graded"][seed])):
            want32, _ = mean_grads(run)
            want16, _ = mean_grads(run, fp16=True)
            for rank, r in enumerate(recs):
                assert r["ddp_buckets"] == ddp_buckets(run["sizes"], run["bucket_cap_mb"],
                                                       run["edges"]), run
                same_grads(r["ddp"]["grads"], want32, rank, rtol=GRAD_RTOL)
                same_grads(r["torch_fp16"]["grads"], want16, rank, rtol=1e-3)
                with pytest.raises(AssertionError):
                    same_grads(r["ddp"]["grads"], want16, rank, rtol=1e-3)


@pytest.mark.slow
def test_fp16_judge_allows_the_ranks_own_rounding(ranks, lab_ns, monkeypatch):
    """The ranks' fp32 gradients may differ from the grader's in the last bit (threads,
    kernels); rounded to fp16 and summed, where the ranks' gradients nearly cancel, that
    is many fp16 ulps of the mean. The fp16 judge allows a few fp16 roundings of the
    ranks' gradients: the reference still passes when the grader's own gradients are
    jittered by 1e-6, while a plain rtol of the mean would fail it."""
    import torch

    from perflab.course.references.lab06 import mean_grads, same_grads

    real_grad = torch.autograd.grad
    gen = torch.Generator().manual_seed(0)

    def jittered(outputs, inputs, *a, **k):
        return tuple(g * (1 + 1e-6 * torch.randn(g.shape, generator=gen))
                     for g in real_grad(outputs, inputs, *a, **k))
    monkeypatch.setattr(torch.autograd, "grad", jittered)
    strict_failed = False
    runs = [dict(zip(("sizes", "bucket_cap_mb", "steps", "batch", "lr", "seed", "edges"), c))
            for c in _live_runs(lab_ns)]
    for seed in SEEDS:
        runs += _hidden_runs(seed)
    records = list(ranks["reference"]["live"])
    for seed in SEEDS:
        records += list(zip(*ranks["reference"]["graded"][seed]))
    for run, recs in zip(runs, records, strict=True):
        want16, scales = mean_grads(run, fp16=True)
        for rank, r in enumerate(recs):
            same_grads(r["fp16"]["grads"], want16, rank, rtol=3e-3, scales=scales)
            try:
                same_grads(r["fp16"]["grads"], want16, rank, rtol=1e-3)
            except AssertionError:
                strict_failed = True
    assert strict_failed


@pytest.mark.slow
def test_reference_wrapper_matches_ddp_gradients(ranks):
    """The lab's reference MyDDP and allreduce_gradients give DDP's gradients after every
    step, on both ranks (atol GRAD_ATOL, rtol GRAD_RTOL), and DDP's buckets, on every run
    (the lab's and the drawn ones)."""
    runs = list(ranks["reference"]["live"])
    for seed in SEEDS:
        runs += list(zip(*ranks["reference"]["graded"][seed]))
    for run in runs:
        for r in run:
            assert r["student_buckets"] == r["ddp_buckets"]
            for variant in ("bucketed", "per_param"):
                for mine, ddp in zip(r[variant]["grads"], r["ddp"]["grads"], strict=True):
                    for a, b in zip(mine, ddp, strict=True):
                        np.testing.assert_allclose(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)
        # the ranks saw different data, yet DDP leaves them with the same gradients
        assert run[0]["ddp"]["losses"] != run[1]["ddp"]["losses"]


@pytest.mark.parametrize("name", sorted(STUDENT_FILES))
@pytest.mark.slow
def test_self_checks_on_the_labs_runs(name, ranks):
    """The visible self-checks, on the lab's runs (DDP beside the student's code), pass
    the right files and stop the wrong ones at the check that names the mistake."""
    failing = STUDENT_FILES[name][1]
    for gid in CHECKS:
        ns = _lab_globals(ranks, name)
        probe = split_check(LAB.cells[gid]).probe
        if gid in failing:
            with pytest.raises(AssertionError):
                LAB.run_code(ns, probe)
        else:
            LAB.run_code(ns, probe)


# -- bucket_assignment on the grader's drawn size lists (no launch) ---------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, "grade:ada"])
def test_assignment_cases_and_torch_rule(seed):
    """Every drawn size list has a small parameter right before one over the cap, some a
    first-bucket cap; torch's rule (the grader's reference) puts the over-cap parameter in
    the small one's bucket; the reference and the honest variant match torch on all of
    them, and the 'own bucket' and 'no first cap' rules each miss some."""
    import random

    from perflab.course.references.lab06 import assignment_cases, torch_assignment

    cases = assignment_cases(random.Random(seed))
    assert len(cases) >= 6 and any(c["first_cap"] is not None for c in cases)
    own_shared = 0
    for c in cases:
        b, cap = c["param_bytes"], c["cap"]
        assert any(b[i] < cap < b[i + 1] for i in range(len(b) - 1)), c
        want = torch_assignment(c)
        where = {i: k for k, bucket in enumerate(want) for i in bucket}
        own_shared += any(b[i] < cap < b[i + 1] and where[i] == where[i + 1]
                          for i in range(len(b) - 1))
        for name in ("reference", "honest"):
            assert _student_module(name).bucket_assignment(b, cap, c["first_cap"]) == want, (name, c)
    assert own_shared >= 3
    for name in ("own_bucket", "no_first_cap", "strict_cap"):
        mod = _student_module(name)
        assert any(mod.bucket_assignment(c["param_bytes"], c["cap"], c["first_cap"])
                   != torch_assignment(c) for c in cases), (name, seed)


def _assignment_verdict(src: str, seed=0):
    """check_my_ddp's graded part on its drawn size lists only (no launch), for the
    student file ``src``: the probe (with its forbid spy) run here as the sandbox runs it,
    judged apart."""
    import contextlib
    import io
    import random

    from perflab.course.cases import judge_answers
    from perflab.course.checks import graded_functions, graded_probe, parse_facts
    from perflab.course.references.lab06 import assignment_cases

    check = split_check(LAB.cells["check_my_ddp"])
    _, judge = graded_functions(check.graded, "check_my_ddp")
    cases = assignment_cases(random.Random(seed))
    mod = types.ModuleType("ddp_student")
    exec(compile(src, "ddp_student.py", "exec"), mod.__dict__)  # noqa: S102
    ns, out = {"__name__": "__main__", "ddp_student": mod}, io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(graded_probe(check.graded, cases), "<probe>", "exec"), ns)  # noqa: S102
    facts, why = parse_facts(out.getvalue())
    assert facts is not None, why
    return judge_answers(judge, cases, facts)


@pytest.mark.parametrize("name", ["reference", "honest"])
def test_own_bucket_rule_passes_the_drawn_lists(name):
    outcome = _assignment_verdict(STUDENT_FILES[name][0], seed="grade:ada")
    assert outcome.passed, outcome.message


#: issue 33: bucket_assignment handed to torch's own rule (the judge's reference), reached
#: by its name, by an alias bound at import, or from torch._C
TORCH_RULE_FILES = {
    "by name": _REF.replace(_ASSIGNMENT_BODY, _TORCH_RULE),
    "an alias": _REF.replace(_ASSIGNMENT_BODY, _TORCH_RULE.replace("dist._compute_bucket_assignment_by_size", "_rule")) + (
        "\nfrom torch.distributed import _compute_bucket_assignment_by_size as _rule\n"),
    "torch._C": _REF.replace(_ASSIGNMENT_BODY, _TORCH_RULE.replace(
        "dist._compute", "torch._C._distributed_c10d._compute")),
}


@pytest.mark.parametrize("how", sorted(TORCH_RULE_FILES))
def test_bucket_rule_that_calls_torchs_fails_naming_it(how):
    """torch's C++ rule gives the right buckets (it is the judge's reference) and passes
    the examples; the graded call forbids it, and the spy sees the C call however it was
    reached."""
    src = TORCH_RULE_FILES[how]
    mod = types.ModuleType("ddp_student")
    exec(compile(src, "ddp_student.py", "exec"), mod.__dict__)  # noqa: S102
    assert mod.bucket_assignment([100, 500, 100, 100], 200) == [[0, 1], [2, 3]]
    assert mod.bucket_assignment([100] * 5, 300, 100) == [[0], [1, 2, 3], [4]]
    outcome = _assignment_verdict(src)
    assert not outcome.passed, how
    assert "_compute_bucket_assignment_by_size" in outcome.message, outcome.message


def test_bucket_check_states_what_it_forbids():
    name = "torch.distributed._compute_bucket_assignment_by_size"
    assert name in split_check(LAB.cells["check_my_ddp"]).graded.forbid
    text = next(c.source for c in LAB.nb.cells if c.cell_type == "markdown"
                and "**Exercise 3 — `bucket_assignment`" in c.source)
    assert f"`{name}`" in text


def test_assignment_examples_are_torchs():
    """The three examples of the exercise text are what torch's rule gives."""
    from perflab.course.references.lab06 import torch_assignment

    for b, cap, first, want in [([32, 1024, 128, 4096, 128, 2048], 1184, None, [[0, 1, 2], [3], [4, 5]]),
                                ([100, 500, 100, 100], 200, None, [[0, 1], [2, 3]]),
                                ([100] * 5, 300, 100, [[0], [1, 2, 3], [4]])]:
        case = {"param_bytes": b, "cap": cap, "first_cap": first}
        assert torch_assignment(case) == want


def test_own_bucket_file_fails_the_visible_example():
    """The text's old rule ('a parameter larger than the cap gets a bucket of its own')
    stops at the self-check's second example."""
    assert _student_module("own_bucket").bucket_assignment([100, 500, 100, 100], 200) == [[0], [1], [2, 3]]


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


def _grade_edited(tmp_path, edits: dict[str, tuple[str, str]]):
    """Grade Lab 06 once in the sandbox with answer cells edited (``{grade_id: (old,
    new)}``), every other answer the reference's. Returns ``(grade, {grade_id: check})``.
    (:func:`tests.labs.labcheck.grade_wrong` for more than one cell.)"""
    import shutil

    import nbformat

    from perflab.course.grading import grade_submissions
    from perflab.course.submission import Limits

    ref, subs = tmp_path / "reference", tmp_path / "subs"
    ref.mkdir()
    shutil.copy(LAB.path, ref / LAB.path.name)
    nb = nbformat.read(str(LAB.path), as_version=4)
    for gid, (old, new) in edits.items():
        (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid]
        assert old in cell.source, f"{old!r} is not in answer cell {gid}"
        cell.source = cell.source.replace(old, new)
    (subs / "wrong").mkdir(parents=True)
    nbformat.write(nb, str(subs / "wrong" / LAB.path.name))
    (grade,) = grade_submissions(subs, ref, limits=Limits(cell_timeout_s=600, wall_timeout_s=1200),
                                 jobs=2)   # one thread for the sandbox, as grade_wrong
    return grade, {c.grade_id: c for c in grade.checks}


#: An answer cell before the lab's launch that makes the notebook's launch run a right
#: copy of the file (``ddp_copied.py``) instead of the student's wrong ``ddp_student.py``:
#: the notebook's records (``checked``) are then a right file's.
_REDIRECT = (
    "import pathlib\n"
    f"pathlib.Path('ddp_copied.py').write_text({_REF!r})\n"
    "_real_launch = launch_fn\n"
    "def launch_fn(fn, world_size, *, args=(), **kwargs):\n"
    "    args = tuple('ddp_copied' if a == 'ddp_student' else a for a in args)\n"
    "    return _real_launch(fn, world_size, args=args, **kwargs)\n")


@slow
def test_lab06_graded_in_the_sandbox(tmp_path):
    """The real Lab 06 graded as a submission: the %%writefile answer is written in the
    sandbox's scratch folder and imported by the ranks the graded call spawns. Its
    per-parameter allreduce, MyDDP and fp16 hook each sum instead of averaging: they
    lose the three data-parallel checks on the drawn runs, though an answer cell made
    the notebook's own launch run a right copy (its records are what the checks judged
    before issue 43, and passed). Every other answer is the reference's and passes."""
    file_edits = (("            p.grad.div_(world_size)          # ... then the average\n", ""),
                  ("            flat.div_(dist.get_world_size())\n", ""),
                  ("bucket.buffer().to(torch.float16).div_(group.size())",
                   "bucket.buffer().to(torch.float16)"))
    wrong_file = LAB.solution("ddp_file")
    for old, new in file_edits:
        assert old in wrong_file
        wrong_file = wrong_file.replace(old, new)
    predict = LAB.solution("predict_overlap")
    g, got = _grade_edited(tmp_path, {"ddp_file": (LAB.solution("ddp_file"), wrong_file),
                                      "predict_overlap": (predict, predict + "\n" + _REDIRECT)})
    assert g.max_points == notebook_points(LAB.path) > 0
    for gid in CHECKS:
        assert got[gid].status == "failed" and got[gid].points == 0, (gid, got[gid].message)
        assert got[gid].message.startswith("hidden case 1/"), (gid, got[gid].message)
        assert "not the ranks' mean gradient" in got[gid].message, (gid, got[gid].message)
    assert all(c.status == "passed" for gid, c in got.items() if gid not in CHECKS), (
        {gid: c.message for gid, c in got.items() if c.status != "passed"})
