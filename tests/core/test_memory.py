"""Memory accounting: saved-activation bytes are exact, model state and formulas agree."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import requires_cuda
from perflab.core.memory import (
    GIB, MIB, PeakMemory, SavedTensorsCounter, model_state_bytes, read_peak, reset_peak,
    saved_activation_bytes, tensor_peak_bytes,
)
from perflab.analysis.memory_parts import (
    activation_formula_bytes, memory_breakdown, optimizer_state_multiplier,
)
from perflab.models import resnet18, tiny_cnn


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_saved_bytes_of_a_known_model_are_exact():
    # Linear(4, 8) saves its input x (5, 4); ReLU saves its output (5, 8), which the
    # second Linear saves again (same storage, counted once). Weights are excluded.
    m, x = _mlp(), torch.randn(5, 4)
    with SavedTensorsCounter(exclude=m.parameters()) as c:
        m(x)
    r = c.result()
    assert (r.nbytes, r.storages) == (5 * 4 * 4 + 5 * 8 * 4, 2)
    assert r.saves >= 3  # the ReLU output is packed twice, plus weights
    with SavedTensorsCounter() as c:  # nothing excluded: a saved weight counts too
        m(x)
    # only the second weight is saved (for the gradient of its input); x needs no grad,
    # so the first Linear does not save its weight
    assert c.result().nbytes == r.nbytes + m[2].weight.nbytes


def test_counter_counts_storages_not_views():
    base = torch.randn(10, 10, requires_grad=True)
    x = base * 1.0                      # (10, 10): one storage of 400 bytes
    with SavedTensorsCounter() as c:
        y = x[:2] * x[:2]               # saves two views of x's storage
    assert (c.result().nbytes, c.result().storages, c.result().saves) == (400, 1, 2)
    y.sum().backward()                  # the hooks did not change autograd's result
    torch.testing.assert_close(base.grad[:2], 2 * x[:2].detach())
    assert repr(c.result()) == "SavedTensors(0.00 MiB in 1 storages, 2 saves)"


def test_saved_activation_bytes_match_the_layer_formula_and_keep_buffers():
    m = resnet18(10)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    saved = saved_activation_bytes(m, x, y)
    assert saved.nbytes == activation_formula_bytes(m, x, num_classes=10)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k], msg=f"{k} changed")
    # bytes are affine in the batch size: equal steps in B add equal bytes
    b = [saved_activation_bytes(m, torch.cat([x] * k), torch.cat([y] * k)).nbytes
         for k in (1, 2, 3)]
    assert b[2] - b[1] == b[1] - b[0] > 0


def test_activation_formula_of_tiny_cnn():
    m = tiny_cnn(10)
    x, y = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    assert saved_activation_bytes(m, x, y).nbytes == activation_formula_bytes(m, x, 10)
    assert m.training  # restored after the eval-mode shape pass


@pytest.mark.parametrize("make, k", [
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: torch.optim.Adam(p), 2),
    (lambda p: torch.optim.AdamW(p, amsgrad=True), 3),
    (lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True), 3),
    (lambda p: torch.optim.Adagrad(p), 1),
])
def test_optimizer_state_multiplier(make, k):
    assert optimizer_state_multiplier(make(_mlp().parameters())) == k


def test_optimizer_state_multiplier_unknown():
    with pytest.raises(ValueError, match="no state formula for optimizer LBFGS"):
        optimizer_state_multiplier(torch.optim.LBFGS(_mlp().parameters()))


def test_model_state_bytes_before_and_after_a_step():
    m = _mlp()
    opt = torch.optim.Adam(m.parameters())
    p_bytes = sum(p.nbytes for p in m.parameters())
    s = model_state_bytes(m, opt)
    assert (s.params, s.grads, s.optimizer, s.num_params) == (p_bytes, 0, 0, 4 * 8 + 8 + 8 * 3 + 3)
    F.cross_entropy(m(torch.randn(5, 4)), torch.tensor([0, 1, 2, 0, 1])).backward()
    opt.step()
    s = model_state_bytes(m, opt)
    # Adam: exp_avg and exp_avg_sq per parameter, plus a 0-d fp32 step count per tensor.
    assert (s.grads, s.optimizer) == (p_bytes, 2 * p_bytes + 4 * 4)
    assert s.total == 4 * p_bytes + 16


def test_memory_breakdown_matches_formulas_for_resnet18():
    m = resnet18(10)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    df = memory_breakdown(m, opt, x, y)
    assert list(df.index) == ["params", "grads", "optimizer", "activations", "total"]
    assert df.loc["params", "measured_mib"] == pytest.approx(11_181_642 * 4 / MIB)
    assert (df.diff_pct.abs() < 1e-9).all()
    assert df.loc["optimizer", "formula"] == "1 x P x 4 B (SGD)"
    assert all(p.grad is None for p in m.parameters())  # zero_grad(set_to_none) at the end


def test_tensor_peak_bytes_cpu():
    def work():
        a = torch.ones(1024)          # 4 KiB
        b = a * 2                     # +4 KiB while a is alive
        del a, b
        c = torch.ones(512)           # 2 KiB, after both were freed
        return c
    peak = tensor_peak_bytes(work)
    assert 8192 <= peak.peak_bytes < 8192 + 64  # + 0-d scalars the ops wrap
    assert "torch.profiler memory events" in peak.kind


def test_peak_memory_repr_and_cpu_read():
    assert repr(PeakMemory(GIB, "x")) == "PeakMemory(1.000 GiB, x)"
    was_reset = reset_peak("cpu")
    p = read_peak("cpu", was_reset=was_reset)
    assert p.peak_bytes > 0 and "RSS" in p.kind


@requires_cuda
def test_tensor_peak_bytes_cuda():
    peak = tensor_peak_bytes(lambda: torch.ones(1 << 20, device="cuda") * 2, "cuda")
    assert peak.peak_bytes >= 2 * 4 * (1 << 20)
    assert "CUDA allocator" in peak.kind
