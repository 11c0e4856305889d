"""Lab 03's library: op dtypes under autocast, loss parity, GradScaler trace."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.conftest import requires_cuda
from perflab.analysis.amp import (
    loss_parity, op_dtypes, ops_kept_in_fp32, plot_parity, scaler_steps, scaler_trace,
)
from perflab.core.config import RunConfig
from perflab.models import tiny_cnn
from tests.synthetic import synthetic_result


@pytest.fixture
def model_and_batch():
    torch.manual_seed(0)
    return tiny_cnn(10).train(), torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))


def test_bf16_ops_and_the_loss_kept_in_fp32(model_and_batch):
    model, x, y = model_and_batch
    t = op_dtypes(model, x, y, amp="bf16")
    assert list(t.columns) == ["op", "calls", "inputs", "outputs", "precision"]
    conv = t[t["op"] == "aten.convolution"].iloc[0]
    assert conv["outputs"] == "bfloat16" and conv["precision"] == "low"
    kept = ops_kept_in_fp32(t)
    assert "aten._log_softmax" in kept and "aten.nll_loss_forward" in kept
    assert "aten.convolution" not in kept and "aten._to_copy" not in set(t["op"])
    casts = op_dtypes(model, x, y, amp="bf16", casts=True)
    assert "aten._to_copy" in set(casts["op"])  # autocast's own casts, when asked for


def test_fp32_has_no_low_precision_op(model_and_batch):
    model, x, y = model_and_batch
    t = op_dtypes(model, x, y, amp="off")
    assert set(t["precision"]) == {"fp32"}


def test_op_dtypes_rejects_unknown_mode(model_and_batch):
    with pytest.raises(ValueError, match="amp must be one of"):
        op_dtypes(*model_and_batch, amp="fp8")


def with_losses(config: RunConfig, losses: tuple[float, ...]):
    return dataclasses.replace(synthetic_result(config, {"forward": 1.0}), losses=losses)


def test_loss_parity_numbers_and_plot():
    base = RunConfig(model="tiny")
    ref = with_losses(base, (2.0, 1.5, 1.0))
    amp = with_losses(base.replace(amp="bf16", channels_last=True), (2.0, 1.6, 0.8))
    p = loss_parity(ref, amp, window=2)
    assert p.max_abs == pytest.approx(0.2) and p.mean_abs == pytest.approx(0.1)
    assert p.first_step_abs == 0.0 and p.mean_reference == pytest.approx(1.5)
    assert p.table["abs_diff"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert p.table["smooth_other"].tolist() == pytest.approx([2.0, 1.8, 1.2])
    assert p.smooth_max_abs == pytest.approx(0.05)  # |1.2 - 1.25|
    assert "max |diff| 0.2000" in repr(p) and "2-step averages within 0.0500" in repr(p)
    fig = plot_parity([p])
    assert len(fig.axes) == 2


@pytest.mark.parametrize("change, match", [
    (dict(seed=1), r"differ in \['seed'\]"),
    (dict(num_workers=1), r"differ in \['num_workers'\]"),
    (dict(batch_size=8, lr=0.1), r"differ in \['batch_size', 'lr'\]"),
])
def test_loss_parity_rejects_different_batches(change, match):
    base = RunConfig(model="tiny")
    with pytest.raises(ValueError, match=match):
        loss_parity(with_losses(base, (1.0,)), with_losses(base.replace(**change), (1.0,)))


def test_loss_parity_rejects_different_lengths():
    base = RunConfig(model="tiny")
    with pytest.raises(ValueError, match="1 vs 2 losses"):
        loss_parity(with_losses(base, (1.0,)), with_losses(base, (1.0, 2.0)))
    with pytest.raises(ValueError, match="at least one Parity"):
        plot_parity([])
    with pytest.raises(ValueError, match="window must be >= 1"):
        loss_parity(with_losses(base, (1.0,)), with_losses(base, (1.0,)), window=0)


def test_scaler_steps_records_scale_and_skips(model_and_batch):
    model, x, y = model_and_batch
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")  # -> inf gradients: the scaler must skip this step
    batches = iter([(x, y), (bad, y), (x, y)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    t = scaler_steps(model, batches, opt, scaler, steps=3, amp="off")
    assert t["skipped"].tolist() == [False, True, False]
    assert t["scale"].tolist() == [1024.0, 512.0, 512.0]
    assert not math.isfinite(t["loss"][1]) and math.isfinite(t["loss"][2])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_scaler_trace_needs_cuda(tiny_dataset, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4)
    with pytest.raises(ValueError, match="needs a CUDA device.*use amp='bf16'"):
        scaler_trace(cfg)


@requires_cuda
def test_scaler_trace_on_cuda(tiny_dataset):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4,
                    device="cuda")
    t = scaler_trace(cfg, steps=5)
    assert list(t.columns) == ["step", "loss", "scale", "skipped", "log2_scale"]
    assert len(t) == 5 and (t["scale"] > 0).all()
