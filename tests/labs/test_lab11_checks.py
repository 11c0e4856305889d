"""Lab 11's check cells, graded on hidden cases (:mod:`perflab.course.cases`): each runs
here as grading runs it (the student's code in this process, the judge apart, answers as
JSON). The reference passes at the tests' seeds, honest variants written differently pass
(a key-tile-outer loop with ``torch.where`` masks, other block sizes, a Triton kernel with
other tiles, a ring of blocking sends ordered by rank parity), and wrong student code fails
on a hidden case: a tiled forward that forgets to rescale the running output, one that
materializes the T x T matrix (right numbers, caught by the memory check), a causal mask
off by one, one that calls SDPA (caught by the spy), a backward that uses each tile's own
``rowsum(P ∘ dP)`` instead of D, a Triton softmax without the guard for rows of −∞, a
Triton attention that drops the last partial tile, one that masks the tiles above the
diagonal instead of skipping them (right numbers: the interpreter counts its loads), and a
ring that merges by averaging.

The ring's check launches ranks: ONE module-scoped launch of 4 ranks runs every ring
variant on the hidden cases of the seeds tested, and the check's own launch is answered
from those records. ONE sandboxed grading (slow) grades the reference with the averaging
ring: every check but the ring's passes there, under Triton's interpreter, in bubblewrap.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.conftest import slow
from tests.labs.labcheck import Lab, notebook_points
from perflab.course.cases import draw_cases
from perflab.course.checks import graded_functions, split_check

NB = Lab("11")
SEEDS = [1, "grade:ada"]
GRADED = ("check_fusion_bytes", "check_triton_softmax", "check_tiled", "check_tiled_memory",
          "check_backward", "check_triton_attention", "check_ring")
GRADED_TESTED = GRADED   # each tried on wrong answers here (tests/labs/test_grading_checks.py)


def _fails_on_a_hidden_case(verdict, why: str = "") -> None:
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict
    if why:
        assert why in verdict.message, verdict.message


@pytest.fixture(scope="module")
def ns():
    """The setup cell and every reference answer run once (Triton loaded in its interpreter)."""
    scope = NB.namespace()
    for gid in ("fusion_bytes", "triton_softmax", "tiled_attention", "flash_backward",
                "triton_attention"):
        NB.run_code(scope, NB.solution(gid), gid)
    return scope


def _replace(gid: str, old: str, new: str) -> str:
    src = NB.solution(gid)
    assert old in src, f"{old!r} not in {gid}"
    return src.replace(old, new)


# -- the reference and honest variants --------------------------------------------------------------
@pytest.mark.parametrize("gid", [g for g in GRADED if g != "check_ring"])
def test_reference_passes(gid, ns):
    """At a grading seed (nbval runs every check's graded part at seed 0; the ring's
    reference is judged at both seeds below)."""
    verdict = NB.judge(dict(ns), gid, seed="grade:ada")
    assert verdict.passed, verdict.message


HONEST_TILED = '''
def tiled_attention(q, k, v, is_causal=False, block_q=16, block_k=16):
    B, H, T, d = q.shape
    qs = q.float() / d ** 0.5
    m = torch.full((B, H, T), -torch.inf)
    l = torch.zeros(B, H, T)
    acc = torch.zeros(B, H, T, d)
    for j0 in range(0, T, block_k):                 # keys outer, queries inner
        kt, vt = k[:, :, j0:j0 + block_k].float(), v[:, :, j0:j0 + block_k].float()
        for i0 in range(0, T, block_q):
            qi = qs[:, :, i0:i0 + block_q]
            s = torch.einsum("bhqd,bhkd->bhqk", qi, kt)
            if is_causal:
                qpos = torch.arange(i0, i0 + qi.shape[2]).view(-1, 1)
                kpos = torch.arange(j0, j0 + kt.shape[2]).view(1, -1)
                s = torch.where(kpos <= qpos, s, torch.tensor(float("-inf")))
            mi = m[:, :, i0:i0 + block_q]
            new = torch.maximum(mi, s.max(-1).values)
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            p = torch.exp(s - safe[..., None])
            corr = torch.exp(mi - safe)
            l[:, :, i0:i0 + block_q] = l[:, :, i0:i0 + block_q] * corr + p.sum(-1)
            acc[:, :, i0:i0 + block_q] = acc[:, :, i0:i0 + block_q] * corr[..., None] + p @ vt
            m[:, :, i0:i0 + block_q] = new
    return (acc / l[..., None]).to(q.dtype), m + l.log()
'''


def test_honest_tiled_variant_passes(ns):
    for gid in ("check_tiled", "check_tiled_memory"):
        verdict = NB.verdict(ns, HONEST_TILED, gid)
        assert verdict.passed, (gid, verdict.message)


def test_honest_triton_variant_passes(ns):
    """Other tiles (32 x 32 by default), the softmax guard written with tl.maximum."""
    attention = _replace("triton_attention", "block_m=16, block_n=16", "block_m=32, block_n=32")
    softmax = _replace("triton_softmax",
                       '    m = tl.where(m == -float("inf"), 0.0, m)     # a row of -inf: exp(-inf - 0) = 0, not NaN\n',
                       "    m = tl.maximum(m, -1e30)\n")
    assert NB.verdict(ns, attention, "check_triton_attention").passed
    verdict = NB.verdict(ns, softmax, "check_triton_softmax")
    assert verdict.passed, verdict.message


# -- wrong answers ------------------------------------------------------------------------------------
WRONG = {
    # elements, not bytes; and the subtract that forgets to read the row's max
    "fusion_elements": ("fusion_bytes", "n, r = rows * cols * elem_bytes, rows * elem_bytes",
                        "n, r = rows * cols, rows", "check_fusion_bytes", ""),
    "fusion_subtract_without_max": ("fusion_bytes", '"subtract": n + r + n', '"subtract": n + n',
                                    "check_fusion_bytes", ""),
    "no_rescale": ("tiled_attention", "            acc = alpha[..., None] * acc + p @ vj\n",
                   "            acc = acc + p @ vj\n", "check_tiled", "the output o"),
    "causal_off_by_one": ("tiled_attention", "s = s.masked_fill(cols > rows, float(\"-inf\"))",
                          "s = s.masked_fill(cols > rows + 1, float(\"-inf\"))", "check_tiled", ""),
    "backward_without_D": ("flash_backward", "                ds = p * (dp - D[:, :, i:i + n, None])\n",
                           "                ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))\n",
                           "check_backward", ""),
    "softmax_nan_rows": ("triton_softmax",
                         '    m = tl.where(m == -float("inf"), 0.0, m)     # a row of -inf: exp(-inf - 0) = 0, not NaN\n',
                         "", "check_triton_softmax", "NaN"),
    "drops_last_tile": ("triton_attention", "grid = (triton.cdiv(T, block_m), B * H)",
                        "grid = (T // block_m, B * H)", "check_triton_attention", ""),
    "loads_every_tile": ("triton_attention",
                         "hi = tl.minimum((pid_m + 1) * BLOCK_M, T) if CAUSAL else T",
                         "hi = T", "check_triton_attention", "not skipped"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails(name, ns):
    gid, old, new, check, why = WRONG[name]
    verdict = NB.verdict(ns, _replace(gid, old, new), check)
    _fails_on_a_hidden_case(verdict, why)


MATERIALIZED = '''
def tiled_attention(q, k, v, is_causal=False, block_q=16, block_k=16):
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])   # T x T
    if is_causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype), lse
'''

CALLS_SDPA = '''
def tiled_attention(q, k, v, is_causal=False, block_q=16, block_k=16):
    o = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return o.to(q.dtype), torch.logsumexp(s, dim=-1).float()
'''


def test_materialized_scores_pass_the_numbers_but_fail_the_memory_check(ns):
    assert NB.verdict(ns, MATERIALIZED, "check_tiled").passed
    _fails_on_a_hidden_case(NB.verdict(ns, MATERIALIZED, "check_tiled_memory"), "T x T")


def test_the_labs_naive_attention_is_forbidden(ns):
    verdict = NB.verdict(ns, "def tiled_attention(q, k, v, is_causal=False, block_q=16, block_k=16):\n"
                             "    return naive_attention(q, k, v, is_causal)\n", "check_tiled")
    assert not verdict.passed and "naive_attention" in verdict.message, verdict.message


def test_sdpa_is_forbidden_even_on_its_math_path(ns):
    """float64 inputs take SDPA's math path, whose aten ops are plain matmuls: the spy on
    the Python function catches it."""
    verdict = NB.verdict(ns, CALLS_SDPA, "check_tiled")
    assert not verdict.passed and "scaled_dot_product_attention" in verdict.message, verdict.message


def test_hidden_cases_cover_what_the_issue_asks(ns):
    for seed in SEEDS:
        cases_fn, _ = graded_functions(split_check(NB.cells["check_tiled"]).graded, "t")
        cases = draw_cases(cases_fn, seed)
        assert {(c["causal"], c["dtype"]) for c in cases} == {(a, b) for a in (False, True) for b in ("fp32", "bf16")}
        assert all(c["seq"] % c["block_q"] and c["seq"] % c["block_k"] for c in cases)
        cases_fn, _ = graded_functions(split_check(NB.cells["check_ring"]).graded, "r")
        (ring,) = draw_cases(cases_fn, seed)
        assert {(c["ranks"], c["causal"]) for c in ring["cases"]} == {(p, c) for p in (2, 4) for c in (False, True)}


# -- ring attention: one launch for every variant -----------------------------------------------------
def _ring_file() -> str:
    return NB.solution("ring_file").split("\n", 1)[1]


RING_AVERAGES = _ring_file().replace(
    "    lse = torch.logaddexp(lse_a, lse_b)\n", "    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)\n")
RING_HONEST = '''
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, is_causal, group=None):
    """Blocking send/recv, even ranks send first; the merge by a running max and sum."""
    r, p = dist.get_rank(group), dist.get_world_size(group)
    peer = lambda x: dist.get_global_rank(group, x % p)
    n, d = q.shape[2], q.shape[3]
    qs = q.float() / math.sqrt(d)
    m = torch.full(q.shape[:3], -math.inf)
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    kk, vv = k.clone(), v.clone()
    for step in range(p):
        owner = (r - step) % p
        if not (is_causal and owner > r):
            s = qs @ kk.float().transpose(-1, -2)
            if is_causal and owner == r:
                s = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), s, torch.tensor(-math.inf))
            new = torch.maximum(m, s.amax(-1))
            pr = torch.exp(s - new[..., None])
            c = torch.exp(m - new)
            l = l * c + pr.sum(-1)
            acc = acc * c[..., None] + pr @ vv.float()
            m = new
        if step < p - 1:
            k_in, v_in = torch.empty_like(kk), torch.empty_like(vv)
            if r % 2 == 0:
                dist.send(kk, peer(r + 1)); dist.send(vv, peer(r + 1))
                dist.recv(k_in, peer(r - 1)); dist.recv(v_in, peer(r - 1))
            else:
                dist.recv(k_in, peer(r - 1)); dist.recv(v_in, peer(r - 1))
                dist.send(kk, peer(r + 1)); dist.send(vv, peer(r + 1))
            kk, vv = k_in, v_in
    return (acc / l[..., None]).to(q.dtype), m + l.log()
'''
RING_FILES = {"ring_good": _ring_file(), "ring_honest": RING_HONEST, "ring_averages": RING_AVERAGES}
RING_SEEDS = {"ring_good": SEEDS, "ring_honest": [1], "ring_averages": [1]}


def _ring_cases(seed):
    cases_fn, _ = graded_functions(split_check(NB.cells["check_ring"]).graded, "check_ring")
    (case,) = draw_cases(cases_fn, seed)
    return case["cases"]


def _ring_jobs(jobs):
    """Rank body (module level: spawned ranks import this test module)."""
    from perflab.labs.lab11.ring import ring_rank

    return [ring_rank(cases, module) for module, cases in jobs]


@pytest.fixture(scope="module")
def ring_launched(tmp_path_factory):
    """(variant, seed) -> per-rank records of check_ring's hidden cases: ONE launch of 4 ranks."""
    from perflab.distributed import launch_fn

    folder = tmp_path_factory.mktemp("lab11_rings")
    for name, text in RING_FILES.items():
        (folder / f"{name}.py").write_text(text)
    keys = [(name, seed) for name, seeds in RING_SEEDS.items() for seed in seeds]
    jobs = [(name, _ring_cases(seed)) for name, seed in keys]
    here = os.getcwd()
    os.chdir(folder)
    try:
        ranks = launch_fn(_ring_jobs, 4, args=(jobs,), device="cpu", timeout_s=300)
    finally:
        os.chdir(here)
    return {key: [r[i] for r in ranks] for i, key in enumerate(keys)}


def _judge_ring(monkeypatch, ring_launched, variant, seed):
    import perflab.labs.lab11.ring

    def fake_launch(fn, world_size, *, args=(), **kwargs):
        assert world_size == 4 and args[0] == _ring_cases(seed)
        return json.loads(json.dumps(ring_launched[(variant, seed)]))

    monkeypatch.setattr(perflab.labs.lab11.ring, "launch_fn", fake_launch)
    return NB.judge({"__name__": "__main__"}, "check_ring", seed=seed)


@slow
@pytest.mark.parametrize("variant,seed", [(n, s) for n, ss in RING_SEEDS.items() for s in ss])
def test_ring_variants(variant, seed, ring_launched, monkeypatch):
    verdict = _judge_ring(monkeypatch, ring_launched, variant, seed)
    if variant == "ring_averages":
        _fails_on_a_hidden_case(verdict, "the output o")
    else:
        assert verdict.passed, verdict.message


@slow
def test_ring_counts_the_bytes_of_blocking_and_batched_sends(ring_launched):
    """The honest ring's blocking send of K then V and the reference's one batched isend of
    both count the same bytes: (p − 1)/p of K and V per rank."""
    for seed in [1]:
        for (case, good), honest in zip(zip(_ring_cases(seed), _records(ring_launched, "ring_good", seed)),
                                        _records(ring_launched, "ring_honest", seed)):
            p = case["ranks"]
            want = (p - 1) * 2 * case["batch"] * case["heads"] * case["seq"] * case["dim"] * 4 // p
            assert [r["sent_bytes"] for r in good] == [r["sent_bytes"] for r in honest] == [want] * p
            assert [r["sends"] for r in good] == [p - 1] * p and [r["sends"] for r in honest] == [2 * (p - 1)] * p


def _records(ring_launched, variant, seed):
    ranks = ring_launched[(variant, seed)]
    cases = _ring_cases(seed)
    return [[ranks[r][i] for r in range(c["ranks"])] for i, c in enumerate(cases)]


# -- the glue ------------------------------------------------------------------------------------------
def test_peak_bytes_counts_storages_not_views():
    import torch

    from perflab.labs.lab11.memory import peak_bytes

    x = torch.zeros(1000)

    def views(t):
        return t[:500].view(10, 50).transpose(0, 1)

    def two(t):
        a = t + 1            # 4,000 B
        b = a * 2            # 4,000 B, both alive
        return b

    assert peak_bytes(views, x)[0] == 0
    assert peak_bytes(two, x)[0] == 8000


def test_make_qkv_and_make_rows_reject_bad_input():
    from perflab.labs.lab11.attention import make_qkv, make_rows

    with pytest.raises(ValueError, match="seq must be an int >= 1"):
        make_qkv(1, 1, 0, 4)
    with pytest.raises(ValueError, match="dtype must be one of"):
        make_qkv(1, 1, 4, 4, "fp64")
    with pytest.raises(ValueError, match="inf_rows holds 5"):
        make_rows(3, 4, inf_rows=[5])


def test_naive_attention_and_shard_reject_bad_shapes():
    import torch

    from perflab.labs.lab11.attention import naive_attention
    from perflab.labs.lab11.ring import ring_on_ranks, shard

    with pytest.raises(ValueError, match="q, k, v must be"):
        naive_attention(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="must be a multiple of the ranks"):
        shard(torch.zeros(1, 1, 5, 2), 0, 2)
    with pytest.raises(ValueError, match="ranks must be one of"):
        ring_on_ranks([{"batch": 1, "heads": 1, "seq": 6, "dim": 2, "ranks": 3, "causal": False, "seed": 0}])


def test_attention_flops_follow_flashattentions_count():
    from perflab.labs.lab11.attention import attention_flops

    assert attention_flops(2, 3, 128, 64) == 4 * 2 * 3 * 128 * 128 * 64
    assert attention_flops(2, 3, 128, 64, is_causal=True) == 2 * 2 * 3 * 128 * 128 * 64
    assert attention_flops(1, 1, 8, 8, backward=True) == 3.5 * 4 * 8 * 8 * 8


def test_missing_triton_stub_says_why():
    from perflab.labs.lab11.kernels import TritonMissing, _stub

    triton, tl = _stub("Triton has wheels for Linux only")

    @triton.jit
    def kernel(x_ptr, BLOCK: tl.constexpr):
        pass

    with pytest.raises(TritonMissing, match="kernel is a Triton kernel: Triton has wheels for Linux only"):
        kernel[(1,)](None, BLOCK=4)
    assert triton.next_power_of_2(37) == 64 and triton.cdiv(37, 16) == 3


# -- one sandboxed grading --------------------------------------------------------------------------
def _grade_with(tmp_path, changes: dict):
    """ONE sandboxed grading of the reference with each answer cell of ``changes``
    (grade_id -> (old, new)) edited: several wrong answers, each breaking its own check,
    for the price of one grading (labcheck's ``grade_wrong`` edits one cell)."""
    import shutil

    import nbformat

    from perflab.course.grading import grade_submissions
    from perflab.course.submission import Limits

    ref, subs = tmp_path / "reference", tmp_path / "subs"
    ref.mkdir()
    shutil.copy(NB.path, ref / NB.path.name)
    nb = nbformat.read(str(NB.path), as_version=4)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in changes:
            old, new = changes[gid]
            assert old in cell.source, (gid, old)
            cell.source = cell.source.replace(old, new)
    (subs / "wrong").mkdir(parents=True)
    nbformat.write(nb, str(subs / "wrong" / NB.path.name))
    (grade,) = grade_submissions(subs, ref, limits=Limits(cell_timeout_s=600, wall_timeout_s=600),
                                 jobs=2, notebook_run="never")
    return grade, {c.grade_id: c for c in grade.checks}


@slow
def test_sandboxed_grading_under_the_interpreter(tmp_path):
    """In bubblewrap, Triton in its interpreter in the grading process: a ring that averages,
    a Triton attention that drops the last partial tile and a Triton softmax without the
    guard for rows of -inf each fail their own check, and every other check earns its
    points (the reference's answers)."""
    _, old_tile, new_tile, _, _ = WRONG["drops_last_tile"]
    _, old_nan, new_nan, _, _ = WRONG["softmax_nan_rows"]
    g, checks = _grade_with(tmp_path, {
        "ring_file": ("    lse = torch.logaddexp(lse_a, lse_b)\n",
                      "    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)\n"),
        "triton_attention": (old_tile, new_tile), "triton_softmax": (old_nan, new_nan)})
    assert g.max_points == notebook_points(NB.path) > 0
    failed = {"check_ring", "check_triton_attention", "check_triton_softmax"}
    for gid in failed:
        assert checks[gid].status == "failed" and checks[gid].points == 0, (gid, checks[gid])
    assert all(c.status == "passed" for gid, c in checks.items() if gid not in failed), {
        gid: c.message for gid, c in checks.items() if c.status != "passed"}


# -- the notebook's texts -------------------------------------------------------------------------
def test_written_answer_is_a_rubric_with_a_model_answer():
    cell = next(c for c in NB.nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_context_parallel")
    answer = cell.source.split("### BEGIN SOLUTION", 1)[1]
    assert answer.strip().startswith(f"**Rubric ({cell.metadata['nbgrader']['points']} points).**")
    assert "**A model answer, for the grader's reference** (true on any machine" in answer
    for phrase in ("(p − 1)/p", "all-gather", "grouped-query"):
        assert phrase in answer, phrase


def test_every_graded_check_is_tested_and_compiles_nothing():
    """Each check with a graded part is in GRADED; no code cell names torch's compiler
    (the grader would build Inductor's header for the lab: perflab.course.warm.uses_compile)."""
    from perflab.course.warm import uses_compile

    graded = {gid for gid, src in NB.cells.items() if "### GRADED" in src}
    assert graded == set(GRADED)
    assert not uses_compile(NB.nb)


def test_plots_draw_one_line_per_impl_and_refuse_a_bad_table():
    import pandas as pd

    from perflab.labs.lab11.plots import plot_peak_memory, plot_times

    t = pd.DataFrame({"impl": ["naive", "naive", "tiled", "tiled"], "T": [128, 64, 64, 128],
                      "peak_mib": [4.0, 1.0, 1.0, 2.0], "median_ms": [2.0, 1.0, 1.0, 3.0]})
    ax = plot_peak_memory(t, title="peak").axes[0]
    assert ax.get_legend_handles_labels()[1] == ["naive, measured", "∝ T²", "∝ T", "tiled, measured"]
    assert list(ax.lines[0].get_xdata()) == [64, 128] and ax.get_xscale() == ax.get_yscale() == "log"
    assert plot_times(t).axes[0].get_legend_handles_labels()[1] == ["naive", "tiled"]
    with pytest.raises(ValueError, match="median_ms"):
        plot_times(t.drop(columns="median_ms"))


def test_compiled_kernels_unsets_the_interpreter_for_the_whole_block():
    """On a GPU the timings compile the student's kernel and Inductor's own Triton kernels
    (torch.compile) inside the block: TRITON_INTERPRET must be unset there, and both the
    interpreted kernel and the variable come back after (also after an error)."""
    import os

    from perflab.labs.lab11.kernels import compiled_kernels, load_triton

    triton, tl, how = load_triton()
    if "interpreter" not in how:
        pytest.skip(how)

    @triton.jit
    def k(x_ptr):
        tl.store(x_ptr, 1.0)

    ns = {"k": k}
    with pytest.raises(ZeroDivisionError):
        with compiled_kernels(ns, ["k"]):
            assert "TRITON_INTERPRET" not in os.environ and ns["k"] is not k
            1 / 0
    assert os.environ["TRITON_INTERPRET"] == "1" and ns["k"] is k
    with pytest.raises(TypeError, match="not a @triton.jit kernel"):
        with compiled_kernels({"f": print}, ["f"]):
            pass


def test_triton_imported_before_the_interpreter_gives_stand_ins_that_say_why():
    """torch.compile imports Triton (Inductor); after that its language helpers (tl.max)
    cannot run in the interpreter, so load_triton returns stand-ins whose launch names the
    fix (the test suite sets TRITON_INTERPRET=1 before anything imports Triton:
    tests/conftest.py)."""
    import subprocess
    import sys

    code = ("import os\n"
            "os.environ.pop('TRITON_INTERPRET', None)\n"
            "import triton\n"
            "from perflab.labs.lab11.kernels import TritonMissing, load_triton\n"
            "triton, tl, how = load_triton()\n"
            "@triton.jit\n"
            "def k(x_ptr):\n"
            "    pass\n"
            "try:\n"
            "    k[(1,)](None)\n"
            "except TritonMissing as e:\n"
            "    print('missing:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if "No module named 'triton'" in out.stderr:
        pytest.skip("triton is not installed")
    assert "missing: k is a Triton kernel: Triton was imported before TRITON_INTERPRET=1" in out.stdout, (
        out.stdout, out.stderr[-800:])
    assert "restart the kernel" in out.stdout
