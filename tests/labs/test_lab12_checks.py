"""Lab 12's check cells ("Plan the cluster"), graded on hidden cases
(:mod:`perflab.course.cases`) as grading runs them: the student's functions in the
"kernel", the judge apart against perflab's planner, answers as JSON. Nothing here launches
a rank.

The reference solution passes at other seeds; honest variants written as a student who
never saw the reference would (their own arithmetic without the lab's helper functions
beyond the given ones, another loop order, a sort instead of a running minimum) pass; the
wrong answers the issue names fail on a hidden case: ZeRO-3 that divides activations by
dp, SP that does not divide the LayerNorm and dropout activations, a bubble without v, a
1F1B first stage holding one micro-batch instead of p, TP all-reduces counted once per
layer instead of twice forward and twice backward, MFU counting recomputation; and an
answer that calls the planner fails as delegation. One sandboxed grading batch (slow) grades
two wrong submissions at once.
"""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, notebook_points

NB = Lab("12")
SEEDS = [1, "grade:ada"]
CHECKS = {"memory_model": "check_memory", "time_model": "check_time", "search": "check_best"}
# each tried on wrong answers here (tests/labs/test_grading_checks.py)
GRADED_TESTED = ("check_memory", "check_time", "check_utilization", "check_best", "check_calibration")


@pytest.fixture(scope="module")
def base_ns():
    """The set-up cell and the reference answers, run once (copied per test)."""
    ns = NB.namespace()
    for gid in ("memory_model", "time_model", "search"):
        NB.run_code(ns, NB.solution(gid), gid)
    return ns


def _with(base: dict, **answers: str) -> dict:
    """A copy of the reference namespace with some answer cells replaced, the later
    reference cells run again on top (so best_layout sees the replaced memory/time)."""
    ns = dict(base)
    for gid in ("memory_model", "time_model", "search"):
        if gid in answers:
            NB.run_code(ns, answers[gid], gid)
        elif any(g in answers for g in ("memory_model", "time_model")) and gid == "search":
            NB.run_code(ns, NB.solution(gid), gid)
    return ns


def _replace(gid: str, old: str, new: str) -> str:
    src = NB.solution(gid)
    assert old in src, f"{old!r} is not in answer cell {gid}"
    return src.replace(old, new)


# -- the reference --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("check", ["check_memory", "check_time", "check_utilization", "check_best"])
def test_reference_passes(check, seed, base_ns):
    verdict = NB.judge(dict(base_ns), check, seed=seed)
    assert verdict.passed, verdict.message


# -- wrong answers that must fail ---------------------------------------------------------------
WRONG = {
    "ZeRO-3 divides activations by dp": ("memory_model", "check_memory",
        '"activations": acts,', '"activations": acts / (dp if layout.zero >= 3 else 1),'),
    "SP leaves the LayerNorm and dropout activations whole": ("memory_model", "check_memory",
        "replicated = 10 * split", "replicated = 10 * sbh"),
    "1F1B first stage holds one micro-batch": ("memory_model", "check_memory",
        "return min(p - stage, m)", "return min(1, m)"),
    "bubble without v": ("time_model", "check_time",
        "bubble = (p - 1) / (v * m) * m * per_mb", "bubble = (p - 1) / m * m * per_mb"),
    "TP all-reduces once per layer": ("time_model", "check_time",
        'n = 4 + (2 if layout.recompute == "full" else 0)',
        'n = 1 + (1 if layout.recompute == "full" else 0)'),
    "MFU counts recomputation": ("time_model", "check_utilization",
        'return {"mfu": model_flops / per_gpu_s', 'return {"mfu": hardware_flops / per_gpu_s'),
    "ZeRO-2 also divides the parameters": ("memory_model", "check_memory",
        '"params": 2 * psi / (dp if layout.zero >= 3 else 1)',
        '"params": 2 * psi / (dp if layout.zero >= 2 else 1)'),
    "DP reduction never hidden": ("time_model", "check_time",
        "hide = cluster.dp_overlap", "hide = False"),
    "best layout ignores memory": ("search", "check_best",
        "fits = mem <= cluster.hbm_bytes", "fits = True"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails(name, base_ns):
    gid, check, old, new = WRONG[name]
    ns = _with(base_ns, **{gid: _replace(gid, old, new)})
    verdict = NB.judge(ns, check, seed="grade:ada")
    assert not verdict.passed, name
    assert verdict.hidden and "hidden case" in verdict.message, verdict.message


def test_wrong_answers_fail_at_every_seed(base_ns):
    """The hidden cases force each rule into play (references.lab12._forced): the wrong
    answers fail whatever the seed."""
    for name in ("ZeRO-3 divides activations by dp", "bubble without v", "MFU counts recomputation",
                 "1F1B first stage holds one micro-batch"):
        gid, check, old, new = WRONG[name]
        ns = _with(base_ns, **{gid: _replace(gid, old, new)})
        for seed in (0, 2, 3, "grade:bob"):
            assert not NB.judge(ns, check, seed=seed).passed, (name, seed)


def test_calling_the_planner_fails_as_delegation(base_ns):
    cheat = '''
def memory_per_gpu(model, layout):
    from perflab.analysis import planner
    from perflab.labs.lab12 import _planner_layout, _shape
    mem = planner.memory_per_gpu(_shape(model), _planner_layout(layout), None, layout.global_batch,
                                 planner.Assumptions(flash_attention=False))
    return {"params": mem.params_bytes, "grads": mem.grads_bytes, "optimizer": mem.optimizer_bytes,
            "activations": mem.activations_bytes, "buffers": mem.comm_buffers_bytes, "total": mem.total_bytes}
'''
    verdict = NB.judge(_with(base_ns, memory_model=cheat), "check_memory", seed=1)
    assert not verdict.passed and "write it yourself" in verdict.message, verdict.message


# -- honest variants that must pass ---------------------------------------------------------------
HONEST_MEMORY = '''
def activation_bytes_per_layer(model, layout):
    """Korthikanti's Table 2, term by term."""
    s, b, h = model.seq_len, layout.micro_batch, model.hidden
    tp = layout.tp
    ln_dropout = 10 * s * b * h / (tp if layout.sp else 1)
    if layout.recompute == "full":
        return 2 * s * b * h / (tp if layout.sp else 1)
    q = 2 * s * b * h
    kv = 2 * 2 * s * b * model.kv_heads * (h // model.heads)
    proj_in = 2 * s * b * h
    mlp = 2 * s * b * model.ffn_hidden * (3 if model.gated else 2)
    scores = 0 if layout.recompute != "none" else 5 * model.heads * s * s * b
    return ln_dropout + (q + kv + proj_in + mlp + scores) / tp


def in_flight(layout, stage):
    p, v, m = layout.pp, layout.vpp, layout.num_microbatches
    warmup_chunks = 2 * (p - stage - 1) + (v - 1) * p + 1 if v > 1 else (p - stage) * v
    return min(warmup_chunks / v, m)


def memory_per_gpu(model, layout):
    s, b, h, V = model.seq_len, layout.micro_batch, model.hidden, model.vocab
    seq_split = layout.tp if layout.sp else 1
    psi = stage_parameters(model, layout)
    shard = {"params": 3, "grads": 2, "optimizer": 1}
    per_param = {"params": 2, "grads": 2, "optimizer": 12}
    out = []
    for stage in sorted({layout.pp - 1, 0}, reverse=True):       # last stage first
        which = "first" if stage == 0 else "last"
        d = {k: per_param[k] * psi[which] / (layout.dp if layout.zero >= shard[k] else 1)
             for k in per_param}
        k = in_flight(layout, stage)
        acts = k * (model.layers // layout.pp) * activation_bytes_per_layer(model, layout)
        if stage == 0:
            acts += k * s * b * h / seq_split
        if stage == layout.pp - 1:
            acts += 2 * 2 * s * b * h / seq_split + 4 * s * b * V / layout.tp
        d["activations"] = acts
        d["buffers"] = buffer_bytes(model, layout)
        d["total"] = sum(d.values())
        out.append(d)
    return max(out, key=lambda d: d["total"])
'''

HONEST_TIME = '''
def forward_flops_per_token(model):
    h, s = model.hidden, model.seq_len
    d = h // model.heads
    qkv = 2 * h * (h + 2 * model.kv_heads * d)
    attn = 2 * s * h + 2 * s * h
    out = 2 * h * h
    mlp = (6 if model.gated else 4) * h * model.ffn_hidden
    return qkv + attn + out + mlp, 2 * h * model.vocab


def step_time(model, cluster, layout):
    t, p, v, d = layout.tp, layout.pp, layout.vpp, layout.dp
    m, b = layout.num_microbatches, layout.micro_batch
    seqs = m * b                                            # sequences through one pipeline
    per_layer, logits = forward_flops_per_token(model)
    speed = cluster.peak_flops * cluster.efficiency
    fwd = seqs * model.seq_len * (model.layers // p * per_layer + logits) / t
    compute = 3 * fwd / speed
    rerun = {"none": 0.0, "selective": 4 * model.seq_len * model.hidden, "full": per_layer}
    recompute = seqs * model.seq_len * (model.layers // p) * rerun[layout.recompute] / t / speed
    msg = 2 * b * model.seq_len * model.hidden
    per_node = min(t, cluster.gpus_per_node)
    forward_collectives = 2 * (2 if layout.recompute == "full" else 1)
    count = forward_collectives + 2                          # + 2 in backward
    if t == 1:
        one_layer = 0.0
    elif layout.sp:
        one_layer = count * (collective_s("reduce_scatter", msg, t, per_node, cluster)
                             + collective_s("all_gather", msg, t, per_node, cluster))
    else:
        one_layer = count * collective_s("all_reduce", msg, t, per_node, cluster)
    tp_comm = m * (model.layers // p) * one_layer
    bubble = (p - 1) * (compute + recompute + tp_comm) / (v * m)
    if p == 1:
        p2p = 0.0
    elif t * d * p > cluster.gpus_per_node:
        p2p = 2 * v * m * (cluster.net_alpha_s + msg / t / cluster.net_busbw)
    else:
        p2p = 2 * v * m * (cluster.nvlink_alpha_s + msg / t / cluster.nvlink_busbw)
    stage = stage_parameters(model, layout)
    psi = stage["first"] if stage["first"] > stage["last"] else stage["last"]
    dp_comm = 0.0
    if d > 1:
        rpn = min(d, max(1, cluster.gpus_per_node // t))
        last_bwd = (2 * fwd / speed + recompute) / m
        last_all = (3 * fwd / speed + recompute) / m
        rs = collective_s("reduce_scatter", 2 * psi, d, rpn, cluster)
        ag = collective_s("all_gather", 2 * psi, d, rpn, cluster)
        ar = collective_s("all_reduce", 2 * psi, d, rpn, cluster)
        if layout.zero in (0, 1):
            dp_comm = max(ar - last_bwd, 0.0) if cluster.dp_overlap else ar
        elif layout.zero == 2:
            dp_comm = m * (max(rs - last_bwd, 0.0) if cluster.dp_overlap else rs) + ag
        else:
            dp_comm = m * (max(2 * ag + rs - last_all, 0.0) if cluster.dp_overlap else 2 * ag + rs)
    shard = psi / d if layout.zero else psi
    optimizer = 28 * shard / cluster.hbm_bytes_per_s
    parts = dict(compute=compute, recompute=recompute, tp_comm=tp_comm, bubble=bubble,
                 pp_p2p=p2p, dp_comm=dp_comm, optimizer=optimizer)
    parts["step"] = sum(parts.values())
    return parts


def utilization(model, cluster, layout):
    per_layer, logits = forward_flops_per_token(model)
    tokens = layout.dp * layout.micro_batch * layout.num_microbatches * model.seq_len
    model_flops = tokens * 3 * (model.layers * per_layer + logits)
    extra = {"none": 0, "selective": 4 * model.seq_len * model.hidden, "full": per_layer}[layout.recompute]
    budget = step_time(model, cluster, layout)["step"] * cluster.peak_flops * layout.gpus
    return {"hfu": (model_flops + tokens * model.layers * extra) / budget, "mfu": model_flops / budget}
'''

HONEST_SEARCH = '''
def best_layout(model, cluster, gpus, batch):
    options = []
    for recompute in ("full", "selective", "none"):
        for zero in (3, 2, 1, 0):
            for pp in range(1, gpus + 1):
                for tp in (1, 2, 4, 8, 16):
                    if tp > cluster.gpus_per_node or gpus % (tp * pp) or model.layers % pp:
                        continue
                    if model.heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
                        continue
                    dp = gpus // (tp * pp)
                    if batch % dp or (dp == 1) != (zero == 0):
                        continue
                    for mb in range(1, batch // dp + 1):
                        if (batch // dp) % mb:
                            continue
                        m = batch // dp // mb
                        for vpp in range(1, model.layers // pp + 1):
                            if (model.layers // pp) % vpp or (vpp > 1 and (pp == 1 or m % pp)):
                                continue
                            for sp in ((False, True) if tp > 1 else (False,)):
                                lay = ParallelLayout(tp=tp, pp=pp, dp=dp, vpp=vpp, micro_batch=mb,
                                             num_microbatches=m, zero=zero, sp=sp,
                                             recompute=recompute)
                                mem = memory_per_gpu(model, lay)["total"]
                                if mem <= cluster.hbm_bytes:
                                    options.append((0, step_time(model, cluster, lay)["step"], lay))
                                else:
                                    options.append((1, mem, lay))
    options.sort(key=lambda o: (o[0], o[1]))
    return options[0][2]
'''


@pytest.mark.parametrize("check", ["check_memory", "check_time", "check_utilization", "check_best"])
def test_honest_variants_pass(check, base_ns):
    ns = _with(base_ns, memory_model=HONEST_MEMORY, time_model=HONEST_TIME)
    NB.run_code(ns, HONEST_SEARCH, "honest search")
    verdict = NB.judge(ns, check, seed=1)
    assert verdict.passed, verdict.message


def test_honest_variants_differ_from_the_solution():
    for gid, honest in (("memory_model", HONEST_MEMORY), ("time_model", HONEST_TIME),
                        ("search", HONEST_SEARCH)):
        ref = NB.solution(gid)
        same = set(ref.splitlines()) & set(honest.splitlines()) - {""}
        assert len(same) <= 0.2 * len(honest.splitlines()), (gid, same)


# -- the calibration ----------------------------------------------------------------------------
def test_calibration_check_judges_the_fit():
    """The judge refuses an efficiency fitted on other rows than the two named and
    predictions made at another efficiency; it accepts the planner's own fit."""
    from perflab.course.references.lab12 import (CALIBRATION_IDS, _row_tflops,
                                                 judge_calibration, reference_efficiency)
    from perflab.labs.lab12 import narayanan_rows, preset_cluster

    e = reference_efficiency()
    other = reference_efficiency(("narayanan2021/1.7B", "narayanan2021/3.6B"))
    assert abs(other - e) > 0.002 and len(CALIBRATION_IDS) == 2
    rows = narayanan_rows()
    at = {r["id"]: _row_tflops(r, preset_cluster("a100-80gb", e, dp_overlap=r["dp_overlap"]))
          for r in rows}
    judge_calibration(e, at)
    with pytest.raises(AssertionError, match="minimises"):
        judge_calibration(other, at)
    with pytest.raises(AssertionError, match="TFLOP/s"):
        judge_calibration(e, {k: v * 1.05 for k, v in at.items()})


def test_calibration_check_on_the_notebooks_answer(base_ns):
    """The calibrate cell's answer passes the graded check; the same predictions at an
    efficiency fitted on every row (not the two named) fail it."""
    ns = dict(base_ns)
    rows_cell = next(c.source for c in NB.nb.cells
                     if c.cell_type == "code" and c.source.startswith("ROWS = narayanan_rows()"))
    NB.run_code(ns, rows_cell, "rows")
    NB.run_code(ns, NB.solution("calibrate"), "calibrate")
    verdict = NB.judge(ns, "check_calibration", seed=1)
    assert verdict.passed, verdict.message
    wrong = dict(ns)
    NB.run_code(wrong, """
ids = CALIBRATION_IDS
CALIBRATION_IDS = tuple(r["id"] for r in ROWS)        # fitted on every row
""" + NB.solution("calibrate").split("### BEGIN SOLUTION", 2)[2].split("### END SOLUTION")[0], "wrong")
    assert abs(wrong["my_efficiency"] - ns["my_efficiency"]) > 1e-3
    verdict = NB.judge(wrong, "check_calibration", seed=1)
    assert not verdict.passed and "minimises" in verdict.message, verdict.message


# -- the sandbox ----------------------------------------------------------------------------------
@slow
def test_lab12_graded_in_the_sandbox(tmp_path):
    """The real Lab 12 graded as two submissions in ONE batch: one whose MFU counts
    recomputation (loses check_utilization only), one whose memory_per_gpu calls the
    planner (loses check_memory by delegation, the stub standing in the sandbox, and
    check_best, which calls it)."""
    from perflab.course.grading import grade_submissions
    from perflab.course.submission import Limits

    ref, subs = tmp_path / "reference", tmp_path / "subs"
    ref.mkdir()
    shutil.copy(NB.path, ref / NB.path.name)
    gid, _, old, new = WRONG["MFU counts recomputation"]
    cheat_mem = ('def memory_per_gpu(model, layout):\n'
                 '    from perflab.analysis import planner\n'
                 '    planner.memory_per_gpu(None, None, None, 1)\n')
    edits = {"mfu": {gid: (old, new)},
             "delegates": {"memory_model": ("def memory_per_gpu(model, layout):\n", cheat_mem)}}
    for student, change in edits.items():
        nb = nbformat.read(str(NB.path), as_version=4)
        for cell in nb.cells:
            g = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if g in change:
                o, n = change[g]
                assert o in cell.source
                cell.source = cell.source.replace(o, n, 1)
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, str(subs / student / NB.path.name))
    grades = grade_submissions(subs, ref, limits=Limits(cell_timeout_s=300, wall_timeout_s=600),
                               jobs=2, notebook_run="never")
    by = {g.student: {c.grade_id: c for c in g.checks} for g in grades}
    assert grades[0].max_points == notebook_points(NB.path) > 0
    for student, lost in (("mfu", {"check_utilization"}),
                          ("delegates", {"check_memory", "check_best"})):  # best uses memory
        checks = by[student]
        for gid in lost:
            assert checks[gid].status == "failed" and checks[gid].points == 0, checks[gid]
        assert "write it yourself" in checks["check_memory"].message or student == "mfu"
        others = {g: c.status for g, c in checks.items() if g not in lost}
        assert set(others.values()) == {"passed"}, (student, others)


# -- the notebook's texts and glue --------------------------------------------------------------
def test_written_answer_is_a_rubric_with_a_model_answer():
    cell = next(c for c in NB.nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_residual")
    answer = cell.source.split("### BEGIN SOLUTION", 1)[1]
    assert answer.strip().startswith(f"**Rubric ({cell.metadata['nbgrader']['points']} points).**")
    assert "**A model answer, for the grader's reference** (true on any machine" in answer


def test_no_result_is_typed_in_the_closing_texts():
    """The closing sections state no number that is not an f-string: the markdown of
    "What a planner cannot know" holds no digit but lab and section numbers, and "What this run showed" prints only
    f-strings (and plain labels)."""
    cells = NB.nb.cells
    k = next(i for i, c in enumerate(cells) if c.source.startswith("### What a planner cannot know"))
    text = re.sub(r"Labs? \d+(, \d+)*( and \d+)?|Section \d+|[AH]100", "", cells[k].source.split("\n", 1)[1])
    assert not re.search(r"\d", text), text
    showed = next(c for c in cells if c.cell_type == "code"
                  and c.source.startswith('print("Everything below is a model'))
    tree = ast.parse(showed.source)
    specs = {id(c) for f in ast.walk(tree) if isinstance(f, ast.FormattedValue) and f.format_spec
             for c in ast.walk(f.format_spec)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in specs:
            text = re.sub(r"Llama-2-70B|et al\. \d{4}|Table \d", "", node.value)
            assert " " not in text or not re.search(r"\d", text), node.value   # prose, not keys


def test_the_checks_forbid_the_planner():
    for check in ("check_memory", "check_time", "check_utilization", "check_best",
                  "check_calibration"):
        src = NB.cells[check]
        for name in ("perflab.analysis.planner.memory_per_gpu", "perflab.analysis.planner.step_time",
                     "perflab.analysis.planner.plan", "perflab.labs.lab12.reference_plan"):
            assert f'"{name}"' in src, (check, name)


def test_glue_rejects_bad_input_and_matches_the_planner():
    from perflab.analysis.planner import layer_parameters, stage_params_per_gpu
    from perflab.labs.lab12 import (LLAMA2_70B, Cluster, ParallelLayout, Model, _planner_layout, _shape,
                                    stage_parameters)

    with pytest.raises(ValueError, match="sp=True needs tp > 1"):
        ParallelLayout(sp=True)
    with pytest.raises(ValueError, match="recompute"):
        ParallelLayout(recompute="some")
    with pytest.raises(ValueError, match="efficiency"):
        Cluster(name="x", peak_flops=1e15, hbm_bytes=1e9, hbm_bytes_per_s=1e12, gpus_per_node=8,
                nvlink_alpha_s=1e-6, nvlink_busbw=1e11, net_alpha_s=1e-5, net_busbw=1e10,
                efficiency=1.5)
    with pytest.raises(ValueError, match="divisible"):
        Model(layers=2, hidden=100, heads=3, seq_len=8, vocab=10)
    lay = ParallelLayout(tp=8, pp=4, dp=8, num_microbatches=128)
    assert lay.gpus == 256 and lay.global_batch == 1024
    first, last = stage_params_per_gpu(_shape(LLAMA2_70B), _planner_layout(lay))
    assert stage_parameters(LLAMA2_70B, lay) == {"first": first, "last": last}
    # Llama-2-70B's published size: 68.98 billion parameters (its config; untied output layer
    # not modelled here, the planner ties it): the layers alone are 80 x 0.856 billion
    assert abs(80 * layer_parameters(_shape(LLAMA2_70B)) / 1e9 - 68.5) < 0.2
    from perflab.analysis.planner import collective_time_s
    from perflab.labs.lab12 import _gpu, collective_s, narayanan_rows

    cl = Cluster(name="x", peak_flops=1e15, hbm_bytes=1e9, hbm_bytes_per_s=1e12, gpus_per_node=4,
                 nvlink_alpha_s=3e-6, nvlink_busbw=2e11, net_alpha_s=1e-5, net_busbw=2e10)
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        assert collective_s(kind, 1e8, 16, 4, cl) == collective_time_s(kind, 1e8, 16, 4, _gpu(cl)) > 0
    rows = narayanan_rows()
    assert len(rows) == 10 and all(r["layout"].gpus == r["gpus"] for r in rows)


def test_the_panel_answers_at_once_and_shows_bad_layouts():
    from perflab.ui.plan_panel import plan_panel

    calls = []

    def evaluate(fields):
        calls.append(fields)
        mem = {"params": 1e9 * fields["tp"], "grads": 1e9, "optimizer": 6e9, "activations": 2e9,
               "buffers": 0.0}
        return mem, {"compute": 1.0, "bubble": 0.1 * fields["pp"], "step": 1.0 + 0.1 * fields["pp"]}

    panel = plan_panel(evaluate, gpus=16, batch=32, hbm_bytes=80 * 2 ** 30, tp=(1, 2, 4),
                       pp=(1, 2, 3), micro_batch=(1, 2))
    assert calls and calls[-1]["dp"] == 16 and panel.image.value
    panel.pp.value = 2
    assert calls[-1] == {"tp": 1, "pp": 2, "dp": 8, "vpp": 1, "micro_batch": 1,
                         "num_microbatches": 4, "zero": 1, "sp": False, "recompute": "none"}
    assert "fits" in panel.status.value
    n = len(calls)
    panel.pp.value = 3                                   # 16 GPUs: not divisible by tp * pp
    assert len(calls) == n and "does not divide" in panel.error.value
    with pytest.raises(ValueError, match="tp choices"):
        plan_panel(evaluate, gpus=8, batch=8, hbm_bytes=1.0, tp=())
