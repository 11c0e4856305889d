"""Lab 08's graded checks on real answers: each runs as grading runs it (the set-up cell,
the answer, the student's code on hidden cases drawn in the grader, here in this process
standing in for the kernel, the answers as JSON, the judge apart; tests/labs/labcheck.py).
The reference solutions pass at several seeds, an honest answer written differently
passes, and typical mistakes, answers written for the examples only and answers that
only delegate to perflab or to the library call the judge uses fail (``FlopCounterMode`` for
the analytic FLOPs, ``torch.utils.benchmark.Timer`` for the timer; a timer returning equal
values, an average or a running total fails on hidden steps whose sleeps change from call
to call). The report check calls the student's ``write_report(run)`` on runs drawn in
the grader; here its self-check reads a fixed, made-up run (an ablation table, MFU rows, a
roofline, a placement and a memory peak), so no test here times anything. A report made
up together with the run it reports on (what the kernel's word let pass before the check
drew its runs) and one that reads the notebook's variables instead of ``run`` pass the
self-check and fail the graded runs. The glue (perflab.labs.lab08) is tested at the end.
"""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from tests.conftest import slow
from tests.labs.labcheck import REFERENCE_SEEDS, Lab, grade_wrong, notebook_points
from perflab.course.checks import split_check
from perflab.analysis.roofline import MatmulRoof, Roofline
from perflab.labs.lab08.report import (flatten_numbers, report_numbers, report_problems,
                                       rungs_called_kept, unmeasured_numbers)
from perflab.labs.lab08.traces import memory_events, op_rows
from perflab.labs.lab08.workloads import (CHANGES, NoiseImages, Training, fixed_batch,
                                          unavailable_change)

LAB = Lab("08")
_TEXT = ("On this machine I climbed data_loading and channels_last. data_loading was kept: "
         "1.52x per sample (p = 0.003). channels_last was dropped: 0.97x (p = 0.41). "
         "Cumulative speedup per sample: 1.52x, MFU 2.31 % of the measured fp32 peak of "
         "ResNet-18 at 32 px.")
_VALUES = {"speedup dl": 1.5213, "p dl": 0.0031, "speedup cl": 0.968, "p cl": 0.4102,
           "cum": 1.5213, "mfu": 2.3111, "image_size": 32}
#: The checks graded on hidden cases, each tried below on real wrong answers.
GRADED_TESTED = ("check_timer", "check_training", "check_keep_change", "check_analytic_flops",
                 "check_utilization", "check_op_intensity", "check_peak_of",
                 "check_temporal_breakdown", "check_report")


def test_every_lab08_check_is_tested():
    graded = {g for g in LAB.cells if g and g.startswith("check_")}
    assert graded == set(GRADED_TESTED)


@pytest.fixture(scope="module")
def ns():
    return LAB.namespace()


def _with(gid: str, old: str, new: str) -> str:
    """The reference answer of ``gid`` with ``old`` replaced (a wrong answer)."""
    src = LAB.solution(gid)
    assert old in src, f"{old!r} is not in {gid}"
    return src.replace(old, new)


#: check -> the answer cells its reference needs.
ANSWERS = {"check_timer": ["time_steps"], "check_training": ["make_training"],
           "check_keep_change": ["keep_change"], "check_analytic_flops": ["analytic_flops"],
           "check_utilization": ["utilization"], "check_op_intensity": ["op_intensity"],
           "check_peak_of": ["peak_of"], "check_temporal_breakdown": ["my_temporal_breakdown"]}


def _scope(ns, check, code=None):
    scope = dict(ns)
    for gid in ANSWERS[check]:
        LAB.run_code(scope, LAB.solution(gid))
    if code is not None:
        LAB.run_code(scope, code)
    return scope


@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
@pytest.mark.parametrize("check", sorted(set(ANSWERS) - {"check_training"}))
def test_reference_answer_passes_at_any_seed(ns, check, seed):
    v = LAB.judge(_scope(ns, check), check, seed=seed)
    assert v.passed, v.message


@pytest.mark.parametrize("seed", ["grade:ada"])  # seed 0: nbval (labcheck.REFERENCE_SEEDS)
def test_reference_training_passes(ns, seed):
    v = LAB.judge(_scope(ns, "check_training"), "check_training", seed=seed)
    assert v.passed, v.message


TIMER_WRONG = {
    "times the warm-up too": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    times = []
    for _ in range(warmup + iters):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    return times
""",
    "no warm-up": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    times = []
    for _ in range(iters):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    return times
""",
    "one clock around all steps, averaged": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup):
        step()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    return [(time.perf_counter() - t) / iters] * iters
""",
    # issue 33: right call counts and above every lower bound, but no timing at all
    "a constant list": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup + iters):
        step()
    return [1.0] * iters
""",
    # the clock read once before the timed steps: the time since then, not each step's
    "a running total": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup):
        step()
    start, times = time.perf_counter(), []
    for _ in range(iters):
        step()
        times.append(time.perf_counter() - start)
    return times
""",
    # each step timed, then sorted: the times are no longer the calls'
    "sorted times": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    return sorted(times)
""",
}
TRAINING_WRONG = {
    "channels_last on the model only": ("            if x.dim() == 4:\n                x = x.contiguous(memory_format=layout)\n",
                                        ""),
    "autocast missing": ('enabled="autocast" in changes', "enabled=False"),
    "loader changed when not asked": ('fast_loader = "loader" in changes', "fast_loader = True"),
    "precision not restored": ("            torch.set_float32_matmul_precision(precision)\n", ""),
    "threads not restored": ("            torch.set_num_threads(n_threads)\n", ""),
    "another learning rate": ("lr=NAIVE_LR, momentum", "lr=2 * NAIVE_LR, momentum"),
    "another loss": ("y.flatten())\n", "y.flatten(), label_smoothing=0.1)\n"),
    "the optimizer's default foreach": ('else {"foreach": True} if "foreach" in changes else {"foreach": False})',
                                        'else {"foreach": True} if "foreach" in changes else {})'),
}
KEEP_WRONG = {
    "two-sided test": ('alternative="greater"', 'alternative="two-sided"'),
    "ratio of means": ("np.median(b, axis=axis) / np.median(n, axis=axis)",
                       "np.mean(b, axis=axis) / np.mean(n, axis=axis)"),
    "keep on the speedup alone": ('"keep": p < alpha', '"keep": bool(ratio(base, new) > 1)'),
    "new over base": ("boot = stats.bootstrap((base, new)", "base, new = new, base\n    boot = stats.bootstrap((base, new)"),
}
FLOPS_WRONG = {
    "backward = forward (2x)": ("return batch * (2 * stem + 3 * forward)", "return batch * 2 * (stem + forward)"),
    "no first-conv rule": ("return batch * (2 * stem + 3 * forward)", "return batch * 3 * (stem + forward)"),
    "no attention term": ("return 6 * n_matmul * tokens + 12 * n_layer * d_model * seq_len * tokens",
                          "return 6 * n_matmul * tokens"),
    "6N with the embeddings": ("n_matmul = 12 * n_layer * d_model ** 2 + d_model * vocab_size",
                               "n_matmul = 12 * n_layer * d_model ** 2 + 2 * d_model * vocab_size + seq_len * d_model"),
    "no shortcut convolutions": ("forward += 2 * cin * width * out * out      # 1x1 shortcut", "pass"),
}
UTIL_WRONG = {
    "percent": ("    return mfu, hfu", "    return 100 * mfu, 100 * hfu"),
    "HFU without the recompute": ("hfu = (model_flops + recompute_flops)", "hfu = (model_flops)"),
    "HFU of the recompute only": ("hfu = (model_flops + recompute_flops)", "hfu = (recompute_flops)"),
    "swapped": ("    return mfu, hfu", "    return hfu, mfu"),
}
OPS_WRONG = {
    "output not written": ("        moved = sum(numel(t) for t in tensors) + numel(out)\n    elif op in (\"add\", \"mul\"):",
                           "        moved = sum(numel(t) for t in tensors)\n    elif op in (\"add\", \"mul\"):"),
    "a multiply-add as one FLOP": ("flops = 2 * numel(a) * b[-1]", "flops = numel(a) * b[-1]"),
    "no broadcasting": ("out = list(torch.broadcast_shapes(*[torch.Size(t) for t in tensors]))", "out = tensors[0]"),
    "layer_norm weights not read": ('read = tensors if op == "layer_norm" else tensors[:1]', "read = tensors[:1]"),
    "convolution without groups": ("w[1] * w[2] * w[3]", "x[1] * w[2] * w[3]"),
    "always fp32 bytes": ("int(moved * dtype_bytes)", "int(moved * 4)"),
    "memory-bound inverted": ("return flops / nbytes < ridge_flops_per_byte", "return flops / nbytes > ridge_flops_per_byte"),
}
PEAK_WRONG = {
    "the final total": ("if peak is None or total > peak:", "if True:"),
    "the last row at the peak": ("if peak is None or total > peak:", "if peak is None or total >= peak:"),
    "the category of the largest allocation": (
        "top_category = min(by_category, key=lambda c: (-by_category[c], c))",
        "top_category = category if delta > 0 else min(by_category, key=lambda c: (-by_category[c], c))"),
    "the allocation of the peak's row": ("top_alloc = min((a for a in by_alloc if by_alloc[a] > 0),\n                            key=lambda a: (-by_alloc[a], a), default=None)",
                                         "top_alloc = alloc"),
}
TEMPORAL_WRONG = {
    # durations summed: two streams at once, or back-to-back kernels, counted twice
    "sums instead of unions": ("    busy = union_length(zip(dev.ts, dev.end))\n    compute = union_length(zip(dev.ts[~not_compute], dev.end[~not_compute]))",
                               "    busy = float((dev.end - dev.ts).sum())\n    compute = float((dev.end - dev.ts)[~not_compute].sum())"),
    # the span over every event, host ones included
    "host events in the span": ("    span = float(dev.end.max() - dev.ts.min())",
                                "    span = float(events.end.max() - events.ts.min())"),
    # memory copies counted as compute
    "memcpy is compute": ("                   | name.str.startswith((\"Memcpy\", \"Memset\")))",
                          "                   )"),
    # NCCL counted as compute
    "nccl is compute": ("    not_compute = (name.str.startswith(\"nccl\") | name.str.contains(\"ncclKernel\", regex=False)\n",
                        "    not_compute = (name.str.startswith(\"nccl-never\")\n"),
}
CASES = ([("check_training", "make_training", n, o, w) for n, (o, w) in TRAINING_WRONG.items()]
         + [("check_temporal_breakdown", "my_temporal_breakdown", n, o, w) for n, (o, w) in TEMPORAL_WRONG.items()]
         + [("check_keep_change", "keep_change", n, o, w) for n, (o, w) in KEEP_WRONG.items()]
         + [("check_analytic_flops", "analytic_flops", n, o, w) for n, (o, w) in FLOPS_WRONG.items()]
         + [("check_utilization", "utilization", n, o, w) for n, (o, w) in UTIL_WRONG.items()]
         + [("check_op_intensity", "op_intensity", n, o, w) for n, (o, w) in OPS_WRONG.items()]
         + [("check_peak_of", "peak_of", n, o, w) for n, (o, w) in PEAK_WRONG.items()])


@pytest.mark.parametrize("check, gid, name, old, new", CASES,
                         ids=[f"{c}-{n}" for c, _, n, _, _ in CASES])
def test_wrong_answer_fails(ns, check, gid, name, old, new):
    threads = torch.get_num_threads()
    if "threads" in name:   # with one intra-op thread (the test runs' OMP_NUM_THREADS=1)
        torch.set_num_threads(max(2, threads))   # the change is unavailable: give it two
    try:
        v = LAB.verdict(dict(ns), _with(gid, old, new), check)
    finally:
        torch.set_num_threads(threads)
    assert not v.passed, f"{name} passed {check}"
    assert v.message.startswith("hidden case"), v.message


@pytest.mark.parametrize("name", sorted(TIMER_WRONG))
def test_wrong_timer_fails(ns, name):
    v = LAB.verdict(dict(ns), TIMER_WRONG[name], "check_timer")
    assert not v.passed, f"{name} passed check_timer"
    assert v.message.startswith("hidden case"), v.message


@pytest.mark.parametrize("name", ["a constant list", "a running total"])
def test_fake_timer_fails_the_self_check(ns, name):
    """The visible example already has a long first timed call and short ones after it."""
    scope = dict(ns)
    LAB.run_code(scope, TIMER_WRONG[name])
    with pytest.raises(AssertionError, match="time each call"):
        LAB.run_code(scope, LAB.cells["check_timer"].split("### BEGIN HIDDEN TESTS")[0])


def test_timer_hidden_steps_sleep_differently_per_call():
    """Every hidden case's timed calls start with a long sleep and have at least two
    short ones (so a running total and any constant fail), at several seeds."""
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions, split_check

    cases_fn, _ = graded_functions(split_check(LAB.cells["check_timer"]).graded, "check_timer")
    for seed in (0, 1, "grade:ada", "grade:bo"):
        for case in draw_cases(cases_fn, seed):
            timed = case["sleep_ms"][case["warmup"]:]
            assert len(case["sleep_ms"]) == case["warmup"] + case["iters"]
            assert timed[0] == max(timed) >= 15 and sum(t < max(timed) for t in timed) >= 2, case


EXAMPLES_ONLY = {
    "check_temporal_breakdown": """
def my_temporal_breakdown(events):
    return {"span_us": 40.0, "compute_us": 18.0, "non_compute_us": 17.0, "idle_us": 5.0}
""",
    "check_analytic_flops": """
def analytic_flops_resnet18(batch, image_size, num_classes):
    return 434565120
def analytic_flops_gpt(batch, seq_len, n_layer, d_model, vocab_size):
    return 70778880
""",
    "check_utilization": "def utilization(a, b, c, d):\n    return (0.4, 8e12 / 0.5 / 3e13)\n",
    "check_peak_of": """
def peak_of(events):
    return {"peak_bytes": 210, "time_us": 2, "category": "ACTIVATION", "alloc_id": 0, "alloc_bytes": 100}
""",
    "check_op_intensity": """
def op_intensity(op, shapes, dtype_bytes):
    return {"mm": (65536, 14336), "add": (512, 1408)}.get(op, (1, 1))
def memory_bound(flops, nbytes, ridge):
    return True
""",
}


@pytest.mark.parametrize("check", sorted(EXAMPLES_ONLY))
def test_examples_only_fails(ns, check):
    v = LAB.verdict(dict(ns), EXAMPLES_ONLY[check], check)
    assert not v.passed and v.message.startswith("hidden case"), v.message


DELEGATING = {
    ("check_analytic_flops", "count_flops"): """
import perflab
def analytic_flops_resnet18(batch, image_size, num_classes):
    return perflab.count_flops(build_model("resnet18", num_classes), batch_size=batch,
                               image_size=image_size).model_flops
def analytic_flops_gpt(batch, seq_len, n_layer, d_model, vocab_size):
    n = 12 * n_layer * d_model ** 2 + d_model * vocab_size
    return 6 * n * batch * seq_len + 12 * n_layer * d_model * seq_len * batch * seq_len
""",
    ("check_utilization", "mfu_pct"): """
from perflab.analysis.flops import mfu_pct
def utilization(f, r, t, p):
    return mfu_pct(f, t, p) / 100, mfu_pct(f + r, t, p) / 100
""",
    ("check_timer", "measure"): """
import perflab
def time_steps(step, warmup=WARMUP, iters=ITERS):
    return list(perflab.measure(step, warmup=warmup, repeats=iters).times_s)
""",
    ("check_keep_change", "compare"): """
import perflab
from scipy import stats
def keep_change(base_s, new_s, alpha=0.05):
    c = perflab.compare(perflab.Measurement("a", list(base_s)), perflab.Measurement("b", list(new_s)))
    p = float(stats.mannwhitneyu(base_s, new_s, alternative="greater").pvalue)
    return {"speedup": c.speedup, "ci95": c.ci95, "p_value": p, "keep": p < alpha}
""",
}


DELEGATING[("check_temporal_breakdown", "temporal_breakdown")] = """
def my_temporal_breakdown(events):
    from perflab.analysis.trace import RankTrace
    from perflab.analysis.trace_analysis import temporal_breakdown
    rt = RankTrace(rank=0, events=events.assign(step=False), on_gpu=True, trace={}, path=None)
    row = temporal_breakdown({0: rt}).iloc[0]
    return {k: float(row[k]) for k in ("span_us", "compute_us", "non_compute_us", "idle_us")}
"""


@pytest.mark.parametrize("check, helper", sorted(DELEGATING))
def test_delegating_answer_fails(ns, check, helper):
    v = LAB.verdict(dict(ns), DELEGATING[check, helper], check)
    assert not v.passed, f"delegating to {helper} passed {check}"
    assert "ran perflab" in v.message and helper in v.message, v.message


#: issue 33: answers that hand the exercise to the library call the judge itself uses
LIBRARY_SHORTCUTS = {
    # the judge's own reference: FlopCounterMode over a real step of the model, on meta tensors
    ("check_analytic_flops", "torch.utils.flop_counter.FlopCounterMode"): """
def _counted(net, xs, ys):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(xs).flatten(0, -2), ys).backward()
    return counter.get_total_flops()

def analytic_flops_resnet18(batch, image_size, num_classes):
    with torch.device("meta"):
        net = build_model("resnet18", num_classes)
        return _counted(net, torch.randn(batch, 3, image_size, image_size),
                        torch.zeros(batch, dtype=torch.long))

def analytic_flops_gpt(batch, seq_len, n_layer, d_model, vocab_size):
    from perflab.models import GPT
    with torch.device("meta"):
        net = GPT(vocab_size, n_layer, 2, d_model, seq_len)
        return _counted(net, torch.zeros(batch, seq_len, dtype=torch.long),
                        torch.zeros(batch * seq_len, dtype=torch.long))
""",
    # its formulas, fed the layer shapes by hand: the counting is torch's
    ("check_analytic_flops", "torch.utils.flop_counter.conv_flop_count"): LAB.solution("analytic_flops").replace(
        "            forward += 2 * cin * width * 9 * out * out + 2 * width * width * 9 * out * out\n",
        "            from torch.utils.flop_counter import conv_flop_count\n"
        "            forward += conv_flop_count([1, cin, h, h], [width, cin, 3, 3], [1, width, out, out])\n"
        "            forward += conv_flop_count([1, width, out, out], [width, width, 3, 3], [1, width, out, out])\n"),
    # torch's timer, one measurement per step (it adds calls of its own: the count is off too)
    ("check_timer", "torch.utils.benchmark.Timer"): """
import torch.utils.benchmark as benchmark
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup):
        step()
    timer = benchmark.Timer("step()", globals={"step": step})
    return [timer.timeit(1).mean for _ in range(iters)]
""",
}


@pytest.mark.parametrize("check, api", sorted(LIBRARY_SHORTCUTS))
def test_library_shortcut_fails_naming_it(ns, check, api):
    scope = dict(ns)
    LAB.run_code(scope, LIBRARY_SHORTCUTS[check, api])
    if check == "check_analytic_flops":   # right on the examples: only the spy tells
        LAB.run_code(dict(scope), LAB.cells[check].split("### BEGIN HIDDEN TESTS")[0])
    v = LAB.judge(scope, check)
    assert not v.passed, f"{api} passed {check}"
    assert api in v.message, v.message


HONEST = {
    "check_timer": """
def time_steps(step, warmup=WARMUP, iters=ITERS):
    for _ in range(warmup):
        step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    out = []
    while len(out) < iters:
        t0 = time.perf_counter_ns()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append((time.perf_counter_ns() - t0) / 1e9)
    return out
""",
    "check_keep_change": """
def keep_change(base_s, new_s, alpha=0.05):
    from scipy.stats import mannwhitneyu
    base, new = np.array(base_s), np.array(new_s)
    rng = np.random.default_rng(1234)
    ratios = [np.median(rng.choice(base, base.size)) / np.median(rng.choice(new, new.size))
              for _ in range(4000)]
    p = mannwhitneyu(base, new, alternative="greater").pvalue
    return dict(speedup=np.median(base) / np.median(new),
                ci95=tuple(np.percentile(ratios, [2.5, 97.5])), p_value=p, keep=bool(p < alpha))
""",
    "check_analytic_flops": """
def analytic_flops_resnet18(batch, image_size, num_classes):
    def conv(h, cin, cout, k, s, p):
        o = (h + 2 * p - k) // s + 1
        return o, 2 * cin * cout * k * k * o * o
    h, stem = conv(image_size, 3, 64, 7, 2, 3)
    h = (h + 2 - 3) // 2 + 1
    fwd, cin = 0, 64
    for width, first_stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for s in (first_stride, 1):
            h2, a = conv(h, cin, width, 3, s, 1)
            _, b = conv(h2, width, width, 3, 1, 1)
            fwd += a + b
            if s != 1 or cin != width:
                fwd += conv(h, cin, width, 1, s, 0)[1]
            h, cin = h2, width
    fwd += 2 * 512 * num_classes
    return batch * (3 * fwd + 2 * stem)

def analytic_flops_gpt(batch, seq_len, n_layer, d_model, vocab_size):
    per_block = 3 * d_model ** 2 + d_model ** 2 + 2 * 4 * d_model ** 2
    n = n_layer * per_block + vocab_size * d_model
    attention_fwd = n_layer * 4 * seq_len ** 2 * d_model * batch
    return 6 * n * batch * seq_len + 3 * attention_fwd
""",
    "check_utilization": """
def utilization(model_flops, recompute_flops, step_s, peak_flops_per_s):
    rate = 1.0 / (step_s * peak_flops_per_s)
    return model_flops * rate, (model_flops + recompute_flops) * rate
""",
    "check_op_intensity": """
import math
def op_intensity(op, shapes, dtype_bytes):
    ts = [s for s in shapes if s]
    n = lambda s: math.prod(s)
    if op in ("mm", "addmm", "bmm"):
        *rest, a, b = ts
        out = list(a[:-1]) + [b[-1]]
        return 2 * n(out) * a[-1], dtype_bytes * (sum(map(n, ts)) + n(out))
    if op == "convolution":
        x, w, y = ts
        return 2 * n(y) * n(w[1:]), dtype_bytes * (n(x) + n(w) + n(y))
    if op in ("add", "mul"):
        out = torch.broadcast_shapes(*ts)
        return n(out), dtype_bytes * (sum(map(n, ts)) + n(out))
    k = dict(relu=1, gelu=8, softmax=5, layer_norm=5)[op]
    reads = ts if op == "layer_norm" else ts[:1]
    return k * n(ts[0]), dtype_bytes * (sum(map(n, reads)) + n(ts[0]))

def memory_bound(flops, nbytes, ridge_flops_per_byte):
    return flops < ridge_flops_per_byte * nbytes
""",
    "check_peak_of": """
def peak_of(events):
    import collections
    totals, cats, allocs, best = 0, collections.Counter(), collections.Counter(), None
    for t, c, d, a in events:
        totals += d; cats[c] += d; allocs[a] += d
        if best is None or totals > best["peak_bytes"]:
            live = sorted((-b, i) for i, b in allocs.items() if b > 0)
            best = dict(peak_bytes=totals, time_us=t,
                        category=sorted(cats.items(), key=lambda kv: (-kv[1], kv[0]))[0][0],
                        alloc_id=live[0][1] if live else None, alloc_bytes=-live[0][0] if live else 0)
    return best
""",
}


HONEST["check_temporal_breakdown"] = """
def my_temporal_breakdown(events):
    import numpy as np
    dev = events[events["stream"] >= 0].sort_values("ts")
    def merged(rows):                         # running maximum of the ends: a sweep
        starts, ends = rows["ts"].to_numpy(), rows["end"].to_numpy()
        if not len(starts):
            return 0.0
        reach = np.maximum.accumulate(ends)
        new = np.r_[True, starts[1:] > reach[:-1]]
        group = np.cumsum(new)
        return float(sum(reach[group == g].max() - starts[group == g].min() for g in np.unique(group)))
    kind = dev["name"].map(lambda n: n.startswith("nccl") or "ncclKernel" in n or n.startswith(("Memcpy", "Memset")))
    span = dev["end"].max() - dev["ts"].min()
    idle = span - merged(dev)
    compute = merged(dev[~kind])
    return dict(span_us=span, compute_us=compute, idle_us=idle, non_compute_us=span - compute - idle)
"""


@pytest.mark.parametrize("check", sorted(HONEST))
def test_honest_variant_passes(ns, check):
    for seed in (0, 7):
        scope = dict(ns)
        LAB.run_code(scope, HONEST[check])
        v = LAB.judge(scope, check, seed=seed)
        assert v.passed, v.message


def test_honest_training_passes(ns):
    """make_training written another way: settings through an ExitStack, the layout
    applied per module, autocast as a context chosen up front."""
    code = _with("make_training", "            with torch.autocast(device.type, dtype=amp_dtype, enabled=\"autocast\" in changes):\n"
                 "                logits = model(x)\n"
                 "                loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())\n",
                 "            import contextlib\n"
                 "            ctx = (torch.autocast(device.type, dtype=amp_dtype) if \"autocast\" in changes\n"
                 "                   else contextlib.nullcontext())\n"
                 "            with ctx:\n"
                 "                out = model(x)\n"
                 "            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))\n")
    v = LAB.verdict(dict(ns), code, "check_training")
    assert v.passed, v.message


@slow
def test_lab08_graded_in_the_sandbox(tmp_path):
    """The real Lab 08 graded as a submission: every other answer
    is the reference's and passes; a
    make_training without autocast loses check_training only."""
    g, wrong = grade_wrong(LAB.path, tmp_path, "make_training",
                                         'enabled="autocast" in changes', "enabled=False")
    assert g.max_points == notebook_points(LAB.path) > 0
    assert wrong["check_training"].status == "failed" and wrong["check_training"].points == 0
    assert all(c.status == "passed" for gid, c in wrong.items() if gid != "check_training")


# --- the report check: write_report on a fixed, made-up run and on drawn runs --------

def _fixed_run() -> dict:
    """A run as the notebook's ``this_run``: an ablation table, the kept changes together,
    MFU rows, a roofline, a placement and a memory peak, made up."""
    rows = []
    for model, change, status, speedup, p in [
            ("resnet18", "loader", "dropped", 0.91, 0.84), ("resnet18", "autocast", "dropped", 0.2031, 0.996),
            ("resnet18", "channels_last", "kept", 1.2345, 0.0079), ("resnet18", "threads", "kept", 1.5, 0.004),
            ("gpt-tiny", "foreach", "kept", 1.1111, 0.0317), ("gpt-tiny", "autocast", "dropped", 0.97, 0.65)]:
        rows.append({"model": model, "change": change, "status": status, "naive_ms": 100.0,
                     "changed_ms": 100.0 / speedup, "speedup": speedup, "ci_low": speedup * 0.9,
                     "ci_high": speedup * 1.1, "p_value": p, "reason": ""})
    rows.append({"model": "gpt-tiny", "change": "cuda_graphs", "status": "skipped",
                 "reason": "needs a CUDA device"})
    best = {"resnet18": {"changes": ["channels_last", "threads"], "naive_ms": 100.0, "step_ms": 55.5,
                         "speedup": 1.8018, "ci_low": 1.6, "ci_high": 2.0, "p_value": 0.004},
            "gpt-tiny": {"changes": ["foreach"], "naive_ms": 20.0, "step_ms": 18.0, "speedup": 1.1111,
                         "ci_low": 1.01, "ci_high": 1.2, "p_value": 0.03}}
    peak = "measured: 1024x1024 fp32 matmul (torch.utils.benchmark), 2 threads"
    mfu_runs = {name: {"dtype": "fp32", "source": peak, "model_gflops": 1.5, "recompute_gflops": 0.4,
                       "step_ms": b["step_ms"], "ckpt_step_ms": 70.0, "peak_gflops": 190.0,
                       "mfu_pct": 14.2222, "hfu_pct": 15.11, "ckpt_mfu_pct": 11.3}
                for name, b in best.items()}
    placement = pd.DataFrame([
        {"op": "addmm", "kind": "matmul", "shapes": "[[384], [256, 128], [128, 384]]", "calls": 8, "time_us": 900.0,
         "flops": 25165824, "bytes": 457216, "intensity": 55.04, "achieved_gflops": 223.7,
         "memory_bound": False},
        {"op": "gelu", "kind": "elementwise", "shapes": "[[8, 32, 512], []]", "calls": 8, "time_us": 300.0, "flops": 1048576,
         "bytes": 1048576, "intensity": 1.0, "achieved_gflops": 27.96, "memory_bound": True}])
    return {"ablation": pd.DataFrame(rows), "best": best, "mfu_runs": mfu_runs, "ridge": 20.0,
            "placement": placement, "memory_bound_ops": ["gelu"],
            "memory_peak": {"peak_bytes": 150_000_000, "time_us": 12.5, "category": "PARAMETER",
                            "alloc_id": 3, "alloc_bytes": 9_437_184},
            "roof": Roofline(device="cpu", device_name="AMD EPYC", threads=2,
                             matmul=(MatmulRoof("fp32", 190.0, 1024), MatmulRoof("bf16", 12.0, 256),
                                     MatmulRoof("fp16", 10.0, 256)), bandwidth_gb_s=9.5, copy_mib=64)}


#: The given cell after the answer: it builds ``this_run`` from the notebook's values and
#: calls the student's write_report on it.
_LIVE = next(c.source for c in LAB.nb.cells if c.source.startswith("this_run = {"))


@pytest.fixture(scope="module")
def report_ns(ns):
    """The set-up cell's namespace with the sections' values of a made-up run (ablation,
    best, mfu_runs, roof, ridge, placement, memory_bound_ops, memory_peak)."""
    return dict(ns, **_fixed_run())


def _report(report_ns, answer: str) -> dict:
    """``answer`` (the report answer cell) run, then the given cell that builds
    ``this_run`` and calls write_report on it, as the notebook runs them."""
    scope = dict(report_ns)
    LAB.run_code(scope, answer)
    LAB.run_code(scope, _LIVE)
    return scope


def _answer_with(extra: str) -> str:
    """The reference write_report with ``extra`` (lines on ``report``) before it returns."""
    src = LAB.solution("report")
    last = '    return "\\n".join(lines)\n'
    assert last in src
    return src.replace(last, '    report = "\\n".join(lines)\n' + extra + "    return report\n")


@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
def test_reference_report_passes(report_ns, seed):
    scope = _report(report_ns, LAB.solution("report"))
    LAB.run_code(dict(scope), split_check(LAB.cells["check_report"]).probe)   # the self-check
    v = LAB.judge(scope, "check_report", seed=seed)
    assert v.passed, v.message


def test_honest_report_written_differently_passes(report_ns):
    """Sentences per model, other precisions, MIB from the set-up cell, p-values to 3
    significant digits."""
    honest = """
def write_report(run):
    table, out = run["ablation"], []
    for model in run["models"]:
        mine = table[(table.model == model) & (table.status != "skipped")]
        for r in mine.itertuples():
            verdict = "kept" if r.status == "kept" else "dropped"
            out.append(f"For {model}, {r.change} was {verdict}: {r.speedup:.3f}x per step "
                       f"(p-value {r.p_value:.3g}).")
        b, m = run["best"][model], run["mfu"][model]
        if b["speedup"] is not None:
            out.append(f"All of {model}'s kept changes at once: {b['speedup']:.3f}x.")
        out.append(f"{model} reaches an MFU of {m['mfu_pct']:.1f} %." if m["mfu_pct"] is not None
                   else f"The MFU of {model} is unavailable here.")
    ops = run["memory_bound_ops"]
    out.append(("Memory-bound on the roofline: " + ", ".join(ops) + ".") if ops
               else "No placed operator was memory-bound.")
    peak = run["memory_peak"]
    out.append(f"At the memory peak of {peak['peak_bytes'] / MIB:.1f} MiB, {peak['category']} "
               "held the most bytes.")
    return " ".join(out)
"""
    scope = _report(report_ns, honest)
    LAB.run_code(dict(scope), split_check(LAB.cells["check_report"]).probe)
    for seed in (0, 3, "grade:bo"):
        v = LAB.judge(dict(scope), "check_report", seed=seed)
        assert v.passed, (seed, v.message)


REPORT_WRONG = {
    "a typed-in number": "    report += ' The step took 17 minutes.'\n",
    "a figure off by rounding": (
        "    m = next(m for m in run['mfu'].values() if m['mfu_pct'] is not None)\n"
        "    report += f' MFU {m[\"mfu_pct\"] * 1.07:.2f} %.'\n"),
    "a dropped change called kept": "    report = report.replace('was dropped', 'was kept', 1)\n",
    "no MFU": "    report = report.replace('MFU', 'utilisation')\n",
    "no MFU value": ("    for m in run['mfu'].values():\n"
                     "        if m['mfu_pct'] is not None:\n"
                     "            report = report.replace(f\"MFU {m['mfu_pct']:.2f} %\", 'MFU')\n"),
    "no memory category": "    report = report.replace(run['memory_peak']['category'], 'weights')\n",
    "no memory-bound operator": ("    report = '\\n'.join(l for l in report.split('\\n')\n"
                                 "                       if not l.startswith('- Roofline'))\n"),
    "kept changes not called kept": "    report = report.replace('was kept', 'was timed')\n",
    "a change left out": ("    gone = report.split('\\n')[1].split()[2]\n"
                          "    report = '\\n'.join(l for l in report.split('\\n') if gone not in l)\n"),
}


@pytest.mark.parametrize("name", sorted(REPORT_WRONG))
def test_wrong_report_fails(report_ns, name):
    scope = _report(report_ns, _answer_with(REPORT_WRONG[name]))
    v = LAB.judge(scope, "check_report")
    assert not v.passed, f"{name} passed check_report"
    assert v.message.startswith("hidden case"), v.message


#: Reports that pass the self-check on this run and earned the points when the check read
#: the kernel's own values (the old graded part): made up together with the run they
#: report on, or written from the notebook's variables instead of ``run``.
REPORT_ON_THE_KERNEL_S_WORD = {
    # a report and the run it cites made up together: the notebook's this_run is
    # rebuilt from made-up values (here the fixed run's), whatever write_report is given
    "made up with its run": (
        LAB.solution("report").replace("def write_report(run):", "def _honest(run):", 1)
        + "\n\n\ndef write_report(run):\n"
          "    return _honest(MADE_UP)\n"),
    # the notebook's variables, not run: right on this run only
    "the notebook's variables": (
        LAB.solution("report").replace("def write_report(run):", "def _honest(run):", 1)
        + "\n\n\ndef write_report(run):\n"
          "    return _honest({'device': device.type, 'models': list(MODELS), 'ridge': ridge,\n"
          "                    'config': {'image_size': IMAGE_SIZE, 'seq_len': SEQ_LEN, 'iters': ITERS},\n"
          "                    'ablation': ablation, 'best': best, 'mfu': mfu_runs,\n"
          "                    'memory_bound_ops': memory_bound_ops, 'memory_peak': memory_peak})\n"),
}


@pytest.mark.parametrize("name", sorted(REPORT_ON_THE_KERNEL_S_WORD))
def test_report_on_the_kernel_s_word_fails_the_drawn_runs(report_ns, name):
    made_up = _report(report_ns, LAB.solution("report"))["this_run"]
    scope = _report(dict(report_ns, MADE_UP=made_up), REPORT_ON_THE_KERNEL_S_WORD[name])
    LAB.run_code(dict(scope), split_check(LAB.cells["check_report"]).probe)   # self-check passes
    v = LAB.judge(scope, "check_report")
    assert not v.passed and v.message.startswith("hidden case 1/3"), v.message


# --- the report checker (perflab.labs.lab08.report) ----------------------------------

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
    assert rungs_called_kept("- gpt-tiny autocast was kept: 1.2x", CHANGES) == ["autocast"]


def test_report_problems_names_what_is_wrong():
    assert report_problems(_TEXT, _VALUES, ["data_loading"]) == []
    bad = report_problems(_TEXT + " Also 7.7x.", _VALUES, ["data_loading"])
    assert len(bad) == 1 and "7.7" in bad[0]
    bad = report_problems(_TEXT.replace("was dropped", "was kept"), _VALUES, ["data_loading"])
    assert len(bad) == 1 and "channels_last" in bad[0]
    assert report_problems(_TEXT, _VALUES, ["data_loading+channels_last"]) == []
    assert "at least 30 words" in report_problems("1.52x", _VALUES, [])[0]
    assert "at least 30 words" in report_problems(None, _VALUES, [])[0]


def test_run_report_problems_reads_the_run():
    """The rule the report check applies to a run: its numbers (the memory peak also in
    MiB, the lab's settings), every timed change named, kept ones called kept, each MFU and
    combined speedup printed, a memory-bound operator as a word, the peak's category."""
    from perflab.labs.lab08.report import run_numbers, run_report_problems

    run = {"models": ["m"], "ablation": [
               {"model": "m", "change": "autocast", "status": "kept", "speedup": 1.52, "p_value": 0.004},
               {"model": "m", "change": "matmul_precision", "status": "dropped", "speedup": 0.9, "p_value": 0.6},
               {"model": "m", "change": "compile", "status": "skipped", "reason": "quick preset"}],
           "best": {"m": {"speedup": 1.4987}}, "mfu": {"m": {"mfu_pct": 12.345, "source": "measured"}},
           "memory_bound_ops": ["mul"], "memory_peak": {"peak_bytes": 3 * 2 ** 20, "category": "ACTIVATION"}}
    assert {"run.memory_peak.peak_bytes": 3 * 2 ** 20, "memory_mib.peak_bytes": 3.0,
            "settings.confidence_pct": 95} .items() <= run_numbers(run).items()
    text = ("On m, autocast was kept: 1.52x (p = 0.004, 95 % confidence); matmul_precision was "
            "dropped: 0.90x (p = 0.6). Together the kept changes give 1.50x. MFU 12.35 % of the "
            "peak. mul is memory-bound. The peak of 3.0 MiB is mostly ACTIVATION, as measured here.")
    assert run_report_problems(text, run, CHANGES) == []
    for wrong, why in [(text.replace("1.50x", "1.5x and 1.6x"), "not values this run measured"),
                       (text.replace("MFU 12.35 % of the peak", "MFU as printed above"), "give m's MFU"),
                       (text.replace("Together the kept changes give 1.50x.", "Together: more."),
                        "kept changes together"),
                       (text.replace("mul is", "matmul_precision is"), "memory-bound operator"),
                       (text.replace("ACTIVATION", "activations"), "the peak's category"),
                       (text.replace("autocast was kept", "autocast was timed"), "which changes were kept"),
                       (text.replace("; matmul_precision was dropped: 0.90x (p = 0.6)", ""),
                        "every change it timed")]:
        assert any(why in m for m in run_report_problems(wrong, run, CHANGES)), (why, wrong)
    assert "at least 30 words" in run_report_problems(None, run, CHANGES)[0]


def test_flatten_numbers_walks_frames_and_skips_non_numbers():
    df = pd.DataFrame({"x": [1.5, float("nan")], "s": ["a", "b"]})
    got = flatten_numbers({"df": df, "l": [1, True, None, "2"], "n": 3.25})
    assert got == {"df.x.0": 1.5, "l[0]": 1.0, "n": 3.25}


@pytest.mark.parametrize("call, field", [
    (lambda: report_numbers(3), "text must be a str"),
    (lambda: __import__("perflab.labs.lab08.report", fromlist=["run_numbers"]).run_numbers([]),
     "run must be a dict"),
    (lambda: rungs_called_kept(b"amp"), "text must be a str"),
    (lambda: unmeasured_numbers("1", {"a": "1.0"}), "measured values must be numbers"),
    (lambda: unavailable_change("warp", "resnet18", "cpu"), "unknown change"),
    (lambda: unavailable_change("loader", "vgg", "cpu"), "model_name must be one of"),
    (lambda: fixed_batch("resnet18", 0, 1), "batch_size must be >= 1"),
    (lambda: NoiseImages(4), "image_size must be >= 8"),
    (lambda: op_rows(None, per_kind=0), "per_kind must be >= 1"),
])
def test_bad_input_is_a_value_error(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_written_answer_is_a_rubric_with_a_model_answer():
    cell = next(c for c in LAB.nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_autocast")
    assert cell.metadata["nbgrader"]["solution"] and cell.metadata["nbgrader"]["grade"]
    text = cell.source
    assert text.strip().startswith(f"**Rubric ({cell.metadata['nbgrader']['points']} points).**")
    assert "**A model answer, for the grader's reference** (true on any machine" in text
    assert "on a gpu" in text.lower()


# --- the workload and trace glue (perflab.labs.lab08) --------------------------------

def test_unavailable_changes_say_why_from_the_machine():
    cpu_only = not torch.cuda.is_available()
    why = unavailable_change("cuda_graphs", "resnet18", "cpu")
    assert why and "torch.cuda.is_available() is" in why
    assert unavailable_change("channels_last", "gpt-tiny", "cpu")
    assert unavailable_change("channels_last", "resnet18", "cpu") is None
    assert unavailable_change("autocast", "gpt-tiny", "cpu") is None
    assert cpu_only or unavailable_change("cudnn_benchmark", "resnet18", "cuda") is None


def test_fixed_batch_is_seeded_and_shaped():
    x, y = fixed_batch("resnet18", 3, 5, image_size=16)
    assert x.shape == (3, 3, 16, 16) and y.shape == (3,) and y.dtype == torch.int64
    assert torch.equal(x, fixed_batch("resnet18", 3, 5, image_size=16)[0])
    xt, yt = fixed_batch("gpt-tiny", 2, 5, seq_len=8)
    assert xt.shape == yt.shape == (2, 8) and torch.equal(xt[:, 1:], yt[:, :-1])


def test_training_step_cycles_its_loader():
    seen = []
    loader = [(torch.zeros(1), torch.zeros(1)), (torch.ones(1), torch.ones(1))]
    t = Training(torch.nn.Linear(1, 1), None, loader,
                 lambda x, y: seen.append(float(x[0])) or torch.tensor(0.0))
    for _ in range(5):
        t.step()
    assert seen == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_memory_events_and_op_rows_read_a_profiled_step():
    from torch.profiler import ProfilerActivity, profile

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for _ in range(2):
            loss = net(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    events = memory_events(prof, "cpu")
    assert events == sorted(events, key=lambda r: r[0])
    cats = {r[1] for r in events}
    assert {"PARAMETER", "GRADIENT"} <= cats, cats
    assert all(isinstance(r[2], int) and isinstance(r[3], int) for r in events)
    rows = op_rows(prof, per_kind=1)
    assert rows and {r["op"] for r in rows} <= {"addmm", "mm", "gelu", "mul", "add"}
    assert all(r["calls"] >= 1 and r["time_us"] > 0 for r in rows)
    # one row of each kind the step ran, whatever their times: the matmuls cannot crowd
    # the elementwise operators off the roofline
    assert sorted(r["kind"] for r in rows) == ["elementwise", "matmul"], rows
    assert [r["time_us"] for r in rows] == sorted((r["time_us"] for r in rows), reverse=True)
    both = op_rows(prof, per_kind=8)
    assert any(r["op"] == "addmm" and [8, 16] in r["shapes"] for r in both)
    assert all(sum(r["kind"] == k for r in both) <= 8 for k in ("matmul", "elementwise"))
    assert all(sum(r["kind"] == k for r in op_rows(prof, per_kind=2)) == 2
               for k in ("matmul", "elementwise"))
