"""ZeRO model-state memory against the paper's own worked example (Figure 1)."""
from __future__ import annotations

import pytest

from perflab.models import resnet18
from perflab.zero import GB, ZERO_STAGES, zero_memory, zero_table

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
