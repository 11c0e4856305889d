"""FLOPs (FlopCounterMode), peak FLOP/s (datasheet table or measured) and MFU / HFU."""
from __future__ import annotations

import pytest
import torch

from perflab.core.config import RunConfig
from perflab.analysis.flops import FlopCount, count_flops, mfu_pct, utilization
from perflab.analysis.peak import (
    PEAK_TFLOPS, PeakFlops, _table_key, dtype_of, measure_peak_flops, peak_flops,
)
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.models import tiny_cnn
from perflab.core.result import RunResult
from tests.conftest import requires_cuda


def test_resnet18_forward_is_1_8_gmacs_at_224px():
    f = count_flops(RunConfig(image_size=224, batch_size=2), num_classes=1000)
    # Known: ResNet-18 forward is ~1.8 GMACs = ~3.6 GFLOPs per 224 px image.
    assert f.forward_flops_per_sample / 2 == pytest.approx(1.82e9, rel=0.01)
    ratio = f.backward_flops / f.forward_flops
    # Backward = input grads + weight grads (~2x); conv1 needs no input grad.
    assert 1.85 < ratio <= 2.0, ratio
    assert f.recompute_flops == 0 and f.hardware_flops == f.model_flops


def test_tiny_cnn_counts_match_the_conv_formula():
    # 2 * C_out * H_out * W_out * C_in * k * k per conv, 2 * in * out for the linear.
    conv1 = 2 * 8 * 16 * 16 * 3 * 9
    conv2 = 2 * 16 * 8 * 8 * 8 * 9
    fc = 2 * 16 * 10
    f = count_flops(tiny_cnn(10), batch_size=3, image_size=32)
    assert f.forward_flops == 3 * (conv1 + conv2 + fc)
    assert f.batch_size == 3 and f.forward_flops_per_sample == conv1 + conv2 + fc
    assert set(f.by_op) >= {"convolution", "addmm"}


def test_flops_scale_with_the_batch():
    one, four = (count_flops(RunConfig(image_size=32, batch_size=b)) for b in (2, 8))
    assert four.model_flops == 4 * one.model_flops


def test_checkpointing_adds_recompute_but_not_model_flops():
    plain = count_flops(RunConfig(image_size=64, batch_size=2))
    ckpt = count_flops(RunConfig(image_size=64, batch_size=2, checkpointing="per_stage"))
    assert ckpt.model_flops == plain.model_flops
    # per_stage reruns every stage's forward; only the final linear layer is not rerun.
    fc = 2 * 2 * 512 * 10
    assert ckpt.recompute_flops == plain.forward_flops - fc
    assert ckpt.hardware_flops == ckpt.model_flops + ckpt.recompute_flops
    # one segment of checkpoint_sequential(2) is left un-checkpointed: less recompute
    two = count_flops(RunConfig(image_size=64, batch_size=2, checkpointing=2))
    assert 0 < two.recompute_flops < ckpt.recompute_flops


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be an int >= 1"),
    (dict(image_size=8), "image_size must be an int >= 16"),
    (dict(checkpointing="per_stage"), "needs a model with set_checkpointing"),
])
def test_count_flops_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        count_flops(tiny_cnn(10), **kwargs)


def test_mfu_is_achieved_over_peak():
    assert mfu_pct(4e12, 2.0, 8e12) == pytest.approx(25.0)
    assert mfu_pct(1.0, 1.0, None) is None
    with pytest.raises(ValueError, match="step_time_s must be > 0"):
        mfu_pct(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="flops_per_step must be >= 0"):
        mfu_pct(-1.0, 1.0, 1.0)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"), ("Tesla V100-SXM2-16GB", "V100 SXM2"), ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", None), ("NVIDIA A10G", None),
])
def test_device_names_match_the_datasheet_table(name, key):
    assert _table_key(name) == key
    assert key is None or key in PEAK_TFLOPS


def test_datasheet_table_is_dense_and_ordered():
    for key, row in PEAK_TFLOPS.items():
        assert row["fp32"] > 0, key
        if "bf16" in row:
            assert row["fp16"] == row["bf16"] >= row.get("tf32", 0) >= row["fp32"], key


def test_cpu_peak_is_measured_and_labelled():
    p = measure_peak_flops("cpu", "fp32", n=128, repeats=3)
    assert p.flops_per_s > 0 and p.source.startswith("measured: 128x128 fp32 matmul")
    assert measure_peak_flops("cpu", "fp32", n=128, repeats=3) is p  # cached
    assert "measured" in repr(p) and "TFLOP/s" in repr(p)


def test_peak_unavailable_is_never_guessed():
    assert peak_flops("cpu", "tf32").flops_per_s is None
    off = peak_flops("cpu", "fp32", measure_unknown=False)
    assert off.flops_per_s is None and off.source.startswith("unavailable")
    assert "unavailable" in repr(off) and off.tflops is None


@pytest.mark.parametrize("call", [
    lambda: peak_flops("cpu", "fp8"), lambda: measure_peak_flops("cpu", "int8"),
    lambda: measure_peak_flops("cpu", n=8), lambda: measure_peak_flops("cpu", repeats=1)])
def test_peak_bad_input(call):
    with pytest.raises(ValueError, match="dtype must be one of|n must be|repeats must be"):
        call()


@requires_cuda
def test_gpu_peak_from_the_datasheet_or_measured():
    p = peak_flops("cuda", "bf16")
    assert p.flops_per_s > 0
    known = _table_key(torch.cuda.get_device_name()) is not None
    assert p.source.startswith("datasheet" if known else "measured")


def _result(step_s: float, batch_size: int = 4) -> RunResult:
    cfg = RunConfig(model="tiny", image_size=32, batch_size=batch_size, device="cpu")
    m = Measurement("step", (step_s,) * 3, samples_per_step=batch_size)
    return RunResult(config=cfg, phases={"step": m}, losses=(1.0,),
                     peak_memory=PeakMemory(1, "test"), env={}, num_classes=10, wall_s=1.0)


def test_utilization_from_a_run():
    peak = PeakFlops(1e9, "fp32", "test device", "datasheet: test")
    u = utilization(_result(0.01), peak=peak)
    per_sample = count_flops(tiny_cnn(10), image_size=32).model_flops
    assert u.model_flops_per_s == pytest.approx(4 * per_sample / 0.01)
    assert u.mfu_pct == pytest.approx(100 * 4 * per_sample / 0.01 / 1e9)
    assert u.hfu_pct == u.mfu_pct  # no checkpointing: nothing recomputed
    # FLOPs counted at another batch size are rescaled to the run's
    f8 = count_flops(tiny_cnn(10), batch_size=8, image_size=32)
    assert utilization(_result(0.01), flops=f8, peak=peak).mfu_pct == pytest.approx(u.mfu_pct)
    none = utilization(_result(0.01), peak=PeakFlops(None, "fp32", "x", "unavailable: x"))
    assert none.mfu_pct is None and "MFU unavailable" in repr(none)


def test_dtype_of_a_config():
    assert dtype_of(RunConfig(device="cpu", amp="bf16")) == "bf16"
    assert dtype_of(RunConfig(device="cpu")) == "fp32"


def test_flopcount_repr_gives_gflops_per_sample():
    f = FlopCount(batch_size=2, forward_flops=2_000_000_000, backward_flops=4_000_000_000,
                  recompute_flops=0, by_op={})
    assert repr(f).startswith("FlopCount(per sample: forward 1.000 GFLOPs, backward 2.000")


def test_gpt_flops_match_the_palm_formula_within_one_percent():
    """Training FLOPs per token ~ 6 N + 12 L d T (Chowdhery et al. 2022, PaLM, appendix B;
    N: the matmul parameters, i.e. all but the position embedding): FlopCounterMode agrees
    within 1 % (the rest: LayerNorm and biases, which are parameters but no matmul)."""
    from perflab.models import gpt_tiny
    m = gpt_tiny()
    n = sum(p.numel() for p in m.parameters()) - m.pos_emb.weight.numel()
    for batch, seq in ((2, 32), (4, 128)):
        f = count_flops(RunConfig(model="gpt-tiny", batch_size=batch, seq_len=seq))
        analytic = batch * seq * (6 * n + 12 * 4 * 128 * seq)
        assert abs(f.model_flops / analytic - 1) < 0.01, (batch, seq, f.model_flops, analytic)
        assert f.backward_flops == 2 * f.forward_flops
    ck = count_flops(RunConfig(model="gpt-tiny", batch_size=2, seq_len=32, checkpointing="per_stage"))
    assert 0 < ck.recompute_flops < ck.forward_flops           # the blocks, not the head
