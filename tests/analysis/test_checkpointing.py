"""Lab 04's pieces: segment plans, the sqrt(n) rule, the trade-off curve, the largest
batch that fits, and gradient accumulation (with the BatchNorm caveat)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import requires_cuda
from perflab import RunConfig
from perflab.analysis.accumulation import (
    accumulated_gradients, accumulation_gap, full_batch_gradients,
)
from perflab.analysis.checkpointing import (
    SETTINGS, STAGE_NAMES, checkpointed_stages, chen_cost, segment_plan, sqrt_n_segments,
    stage_table, tradeoff_curve,
)
from perflab.analysis.max_batch import (
    _cuda_fits, cpu_step_bytes, find_max_batch, search_max_batch, smallest_batch,
)
from perflab.core.memory import MIB, saved_activation_bytes
from perflab.models import resnet18, tiny_cnn

SMALL = RunConfig(device="cpu", image_size=32, batch_size=4, seed=0)


@pytest.mark.parametrize("mode, expected", [
    ("none", [((0, 1, 2, 3, 4), False)]),
    (1, [((0, 1, 2, 3, 4), False)]),
    (2, [((0, 1), True), ((2, 3, 4), False)]),
    (3, [((0,), True), ((1,), True), ((2, 3, 4), False)]),
    (4, [((0,), True), ((1,), True), ((2,), True), ((3, 4), False)]),
    (5, [((0,), True), ((1,), True), ((2,), True), ((3,), True), ((4,), False)]),
    ("per_stage", [((i,), True) for i in range(5)]),
])
def test_segment_plan_mirrors_checkpoint_sequential(mode, expected):
    plan = segment_plan(mode)
    assert [(s.stages, s.checkpointed) for s in plan] == expected
    assert checkpointed_stages(mode) == tuple(i for st, c in expected if c for i in st)


def test_settings_cover_every_mode():
    assert SETTINGS == ("none", 1, 2, 3, 4, 5, "per_stage")
    for s in SETTINGS:
        RunConfig(checkpointing=s)  # each is a valid RunConfig value


def test_segment_names_and_errors():
    assert [s.names for s in segment_plan(2)] == ["stem-layer1", "layer2-layer4"]
    for bad in (0, 6, "all", True):
        with pytest.raises(ValueError, match="checkpointing must be"):
            segment_plan(bad)


def test_segment_plan_matches_what_autograd_saves():
    # checkpoint_sequential keeps each checkpointed segment's input; the rest as usual.
    torch.manual_seed(0)
    m = resnet18(10)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    table = stage_table(m, x, y)
    assert list(table.index) == [*STAGE_NAMES, "head"]
    m.set_checkpointing("per_stage")
    per_stage = saved_activation_bytes(m, x, y).nbytes
    assert per_stage == round((table.input_mib.iloc[:5].sum() + table.saved_mib["head"]) * MIB)
    m.set_checkpointing("none")
    assert saved_activation_bytes(m, x, y).nbytes < table.saved_mib.sum() * MIB  # overlaps


@pytest.mark.parametrize("n, k", [(1, 1), (2, 1), (4, 2), (5, 2), (9, 3), (10, 3), (16, 4),
                                  (100, 10)])
def test_sqrt_n_rule(n, k):
    assert sqrt_n_segments(n) == k
    assert chen_cost(n, k) == min(chen_cost(n, j) for j in range(1, n + 1))


def test_chen_cost_values_and_errors():
    assert chen_cost(16, 4) == 8.0 == 2 * math.sqrt(16)
    assert chen_cost(16, 1) == 17.0 and chen_cost(16, 16) == 17.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        chen_cost(4, 5)
    with pytest.raises(ValueError, match="n >= 1"):
        sqrt_n_segments(0)


def test_tradeoff_curve_small():
    curve = tradeoff_curve(SMALL, settings=("none", 3, "per_stage"), warmup=1, repeats=2)
    t = curve.table
    assert list(t.index) == ["none", "3", "per_stage"]
    assert t.loc["none", "saved_reduction_pct"] == 0 and t.loc["none", "overhead_pct"] == 0
    assert t.loc["per_stage", "saved_mib"] < t.loc["3", "saved_mib"] < t.loc["none", "saved_mib"]
    assert t.loc["per_stage", "saved_reduction_pct"] >= 45
    assert t.loc["none", "recompute_mib"] == 0 < t.loc["per_stage", "recompute_mib"]
    assert t.loc["3", "checkpointed"] == "stem,layer1" and t.loc["3", "stored"] == "layer2-layer4"
    assert set(curve.steps) == {"none", "3", "per_stage"}
    assert len(curve.plot().axes) == 2


def test_tradeoff_curve_errors():
    with pytest.raises(ValueError, match="needs model='resnet18'"):
        tradeoff_curve(RunConfig(model="tiny", device="cpu"))
    with pytest.raises(ValueError, match="checkpointing must be"):
        tradeoff_curve(SMALL, settings=("none", 7))


# -- the largest batch -----------------------------------------------------------------
def _threshold(n_max):
    calls = []

    def fits(n):
        calls.append(n)
        return n <= n_max, n * 100, "fake"
    return fits, calls


@pytest.mark.parametrize("n_max, start", [(74, 74), (74, 8), (74, 300), (1, 8), (5, 1)])
def test_search_max_batch_finds_the_boundary(n_max, start):
    fits, calls = _threshold(n_max)
    best, trials, hit = search_max_batch(fits, start=start, limit=4096)
    assert best == n_max and not hit
    assert n_max in calls and n_max + 1 in calls  # the boundary was measured on both sides
    assert list(trials.columns) == ["batch_size", "fits", "bytes", "note"]
    assert len(calls) <= 2 * math.ceil(math.log2(abs(start - n_max) + 2)) + 2


def test_search_max_batch_edges():
    fits, calls = _threshold(0)
    assert search_max_batch(fits, start=8)[0] == 0 and calls == [8, 7, 5, 1]
    fits, calls = _threshold(1)
    assert search_max_batch(fits, start=8, minimum=2)[0] == 0 and calls == [8, 7, 5, 2]
    fits, calls = _threshold(2)
    assert search_max_batch(fits, start=8, minimum=2)[0] == 2 and calls == [8, 7, 5, 2, 3]
    fits, _ = _threshold(10 ** 6)
    best, _, hit = search_max_batch(fits, start=8, limit=100)
    assert (best, hit) == (100, True)
    with pytest.raises(ValueError, match="1 <= minimum <= start <= limit"):
        search_max_batch(fits, start=0)
    with pytest.raises(ValueError, match="1 <= minimum <= start <= limit"):
        search_max_batch(fits, start=4, minimum=5)


@pytest.mark.slow
def test_find_max_batch_cpu_budget_and_checkpointing():
    with pytest.raises(ValueError, match="needs budget_gib"):
        find_max_batch(SMALL)
    with pytest.raises(ValueError, match="budget_gib must be > 0"):
        find_max_batch(SMALL, budget_gib=0)
    budget = 0.15  # GiB; ResNet-18's model state (10 classes) is 128 MiB of it
    plain = find_max_batch(SMALL, budget_gib=budget)
    ckpt = find_max_batch(SMALL.replace(checkpointing="per_stage"), budget_gib=budget)
    assert 0 < plain.batch_size < ckpt.batch_size
    for r in (plain, ckpt):  # the boundary was measured: n fits, n + 1 does not
        measured = r.trials.set_index("batch_size").bytes
        assert measured[r.batch_size] <= r.budget_bytes < measured[r.batch_size + 1]
    assert "recompute 0.0 MiB" in plain.trials.note[0]
    assert "recompute 0.0 MiB" not in ckpt.trials.note[0]
    assert "CPU budget" in repr(plain) and "0.150 GiB" in repr(plain)
    # bytes at batch n = model state + saved activations (+ the recomputed segment)
    b = cpu_step_bytes(SMALL)(plain.batch_size)
    assert sum(b.values()) == plain.trials.set_index("batch_size").bytes[plain.batch_size]


def test_find_max_batch_nothing_fits():
    r = find_max_batch(SMALL, budget_gib=0.01)  # below the model state alone
    assert r.batch_size == 0 and not r.trials.fits.any()


def test_smallest_batch_is_where_batchnorm_can_train():
    """ResNet-18 at 32 px ends in a 1x1 map: one sample gives BatchNorm one value per
    channel and training refuses it; at 64 px (2x2) and in the tiny CNN it trains."""
    from perflab.train.workloads import training_parts

    at_64 = SMALL.replace(image_size=64)
    assert smallest_batch(SMALL) == 2
    assert smallest_batch(at_64) == 1 and smallest_batch(SMALL.replace(model="tiny")) == 1
    one = training_parts(SMALL, batch_size=1)      # the rule is torch's: check it holds
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        one.model(one.x)
    one = training_parts(at_64, batch_size=1)
    one.model(one.x)
    with pytest.raises(ValueError, match=r"batch 1 cannot train.*smallest_batch\(config\) = 2"):
        cpu_step_bytes(SMALL)(1)


@pytest.mark.parametrize("image_size, want", [(32, 0), (64, 1)])
def test_find_max_batch_starts_at_the_smallest_trainable_batch(image_size, want):
    """A budget one byte short of batch 2: at 32 px batch 1 cannot train, so nothing fits
    (a search that proposes or returns 1 fails here); at 64 px batch 1 fits."""
    cfg = SMALL.replace(image_size=image_size)
    two = sum(cpu_step_bytes(cfg)(2).values())
    r = find_max_batch(cfg, budget_gib=(two - 1) / 2**30, limit=64)
    assert r.batch_size == want, r.trials
    assert (1 in r.trials.batch_size.tolist()) == (want == 1)


def test_cuda_search_survives_out_of_memory(monkeypatch):
    """The GPU path with a fake OOM (after accelerate's tests): sizes above 12 raise
    torch.cuda.OutOfMemoryError inside the step; the search frees memory and goes on."""
    import perflab.analysis.max_batch as mb

    real_parts = mb.training_parts
    freed = []

    def parts(config, batch_size=None):
        if batch_size > 12:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return real_parts(config, batch_size)
    monkeypatch.setattr(mb, "training_parts", parts)
    for name in ("reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 123)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(True))
    cfg = RunConfig(model="tiny", device="cpu", image_size=16)
    best, trials, _ = search_max_batch(_cuda_fits(cfg), start=4, limit=32)
    assert best == 12
    assert trials.fits.tolist() == [n <= 12 for n in trials.batch_size]
    assert trials.note[~trials.fits].str.startswith("OutOfMemoryError: CUDA out of memory").all()
    assert len(freed) == len(trials)


@requires_cuda
def test_find_max_batch_on_cuda():
    cfg = RunConfig(device="cuda", model="tiny", image_size=32)
    r = find_max_batch(cfg, budget_gib=0.5, limit=256)
    assert r.batch_size >= 2 and "OutOfMemoryError" in r.method


# -- gradient accumulation -------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3])
def test_accumulation_matches_full_batch_without_batch_statistics(k):
    torch.manual_seed(0)
    m = resnet18(10).eval()  # BatchNorm uses running statistics: samples independent
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    gap = accumulation_gap(m, x, y, k)
    assert gap.matches(rtol=1e-4), gap
    assert not gap.training and gap.micro_batches == k


def test_accumulation_differs_with_batchnorm_in_training():
    torch.manual_seed(0)
    m = tiny_cnn(10).train()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    gap = accumulation_gap(m, x, y, 4)
    assert gap.training and gap.max_rel_diff > 1e-2  # per-micro-batch mean and variance
    for k, v in m.state_dict().items():  # running statistics restored
        torch.testing.assert_close(v, before[k])
    assert all(p.grad is None for p in m.parameters())


def test_accumulated_gradients_api():
    m = torch.nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    full = full_batch_gradients(m, x, y)
    acc = accumulated_gradients(m, x, y, 2)  # uneven chunks: 3 + 2 samples
    for n in full:
        torch.testing.assert_close(acc[n], full[n])
    with pytest.raises(ValueError, match="micro_batches must be in 1..batch size 5"):
        accumulated_gradients(m, x, y, 6)
