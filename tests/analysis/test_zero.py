"""ZeRO model-state memory against the paper's own worked example (Figure 1)."""
from __future__ import annotations

import pytest

from perflab.models import resnet18
from perflab.analysis.zero import GB, ZERO_STAGES, zero_memory, zero_table

# Rajbhandari et al. 2020, Figure 1: Psi = 7.5 B, K = 12, N_d = 64.
PSI, N_D = 7_500_000_000, 64


@pytest.mark.parametrize("stage, paper_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_figure_1_worked_example(stage, paper_gb):
    m = zero_memory(PSI, N_D, stage)
    # The paper prints one decimal (three significant digits for stage 0).
    assert m.total_gb == pytest.approx(paper_gb, abs=0.05)


def test_stage_formulas_term_by_term():
    psi, n = 1000, 10
    s0, s1, s2, s3 = (zero_memory(psi, n, s) for s in range(4))
    assert (s0.params_bytes, s0.grads_bytes, s0.optimizer_bytes) == (2000, 2000, 12000)
    assert (s1.params_bytes, s1.grads_bytes, s1.optimizer_bytes) == (2000, 2000, 1200)
    assert (s2.params_bytes, s2.grads_bytes, s2.optimizer_bytes) == (2000, 200, 1200)
    assert (s3.params_bytes, s3.grads_bytes, s3.optimizer_bytes) == (200, 200, 1200)
    assert s3.total_bytes == s0.total_bytes / n


def test_one_device_partitions_nothing():
    totals = {zero_memory(123_456, 1, s).total_bytes for s in range(4)}
    assert totals == {16 * 123_456}


def test_fp32_adam_without_master_copy():
    m = zero_memory(10, 2, 0, param_bytes=4, grad_bytes=4, optimizer_bytes_per_param=8)
    assert m.total_bytes == 160


def test_table_for_a_model():
    model = resnet18(10)
    psi = sum(p.numel() for p in model.parameters())
    df = zero_table(model, 8)
    assert list(df.index) == [0, 1, 2, 3]
    assert list(df.partitioned) == list(ZERO_STAGES.values())
    assert df.total_gb[0] == pytest.approx(16 * psi / GB)
    assert df.total_gb[3] == pytest.approx(16 * psi / 8 / GB)
    assert df.saving_x[3] == pytest.approx(8.0)
    assert (df.total_gb.diff().dropna() < 0).all()  # every stage saves more
    assert df.equals(zero_table(psi, 8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_params=0, world_size=2, stage=1), "num_params must be an int >= 1"),
    (dict(num_params=10, world_size=0, stage=1), "world_size must be an int >= 1"),
    (dict(num_params=10, world_size=2, stage=4), "stage must be one of [0, 1, 2, 3]"),
    (dict(num_params=10, world_size=2, stage=True), "stage must be one of"),
    (dict(num_params=10, world_size=2, stage=1, param_bytes=-1),
     "param_bytes must be an int >= 0"),
])
def test_bad_input_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        zero_memory(**kwargs)


def test_repr_names_stage_and_total():
    assert repr(zero_memory(PSI, N_D, 3)) == (
        "ZeroMemory(stage 3 P_os+g+p, Psi=7,500,000,000, N_d=64: 1.88 GB per device)")


# -- Lab 09: the formulas beside bytes measured from the tensors ---------------------------
def test_figure_1_assumptions_term_by_term():
    """Figure 1's assumptions, stated: Psi = 7.5e9, N_d = 64, mixed-precision Adam with
    fp16 params (2 B) and grads (2 B), K = 12 B of fp32 master copy + momentum + variance,
    GB = 1e9 bytes; model states only (no activations, buffers or fragmentation)."""
    s0, s1, s2, s3 = (zero_memory(PSI, N_D, s) for s in range(4))
    assert (s0.params_bytes, s0.grads_bytes, s0.optimizer_bytes) == (15e9, 15e9, 90e9)
    assert s1.optimizer_bytes == 90e9 / 64 and s1.params_bytes + s1.grads_bytes == 30e9
    assert s2.grads_bytes == 15e9 / 64 and s3.params_bytes == 15e9 / 64
    assert [round(m.total_gb, 1) for m in (s0, s1, s2, s3)] == [120.0, 31.4, 16.6, 1.9]


def test_zero_vs_measured_on_the_model_trained():
    import torch

    from perflab.analysis.sharding import state_bytes
    from perflab.models import mlp
    from perflab.analysis.zero import zero_vs_measured

    model = mlp([32] * 9)
    opt = torch.optim.AdamW(model.parameters())
    torch.nn.functional.cross_entropy(model(torch.ones(4, 32)), torch.zeros(4, dtype=torch.long)
                                      ).backward()
    opt.step()
    psi = sum(p.numel() for p in model.parameters())
    got = state_bytes(model, opt)  # one process = DDP's replica on each rank (stage 0)
    table = zero_vs_measured({"ddp": got}, psi, 2).set_index("part")
    assert table.loc["params", "diff_bytes"] == 0 and table.loc["grads", "diff_bytes"] == 0
    # fp32 AdamW: K = 8 plus one 4-byte step scalar per parameter tensor (16 tensors)
    assert table.loc["optimizer", "diff_bytes"] == 4 * 16
    # what ZeRO-1 and FSDP2 would hold per rank, measured on 2 ranks (tests/analysis/test_sharding.py)
    shard = {"params_bytes": 4 * psi // 2, "grads_bytes": 4 * psi // 2,
             "optimizer_bytes": 8 * psi // 2 + 64}
    fsdp = zero_vs_measured({"fsdp2": shard}, psi, 2).set_index("part")
    assert list(fsdp.diff_bytes) == [0, 0, 64] and set(fsdp.stage) == {3}
    with pytest.raises(ValueError, match="unknown method 'zero9'"):
        zero_vs_measured({"zero9": shard}, psi, 2)
