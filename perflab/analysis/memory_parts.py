"""Memory of a training step, part by part, measured next to its formula (Lab 04).

For P parameters of b bytes: parameters P*b, gradients P*b, optimizer state k*P*b
(:func:`optimizer_state_multiplier`), and activations from the layer shapes
(:func:`activation_formula_bytes`). :func:`memory_breakdown` puts each formula next to
the bytes measured by :mod:`perflab.core.memory`.
"""
from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from perflab.core.memory import (
    MIB, SavedTensorsCounter, model_state_tensors, model_state_bytes,
)

__all__ = ["optimizer_state_multiplier", "activation_formula_bytes", "memory_breakdown"]


#: Extra optimizer-state tensors per parameter, by optimizer (torch.optim docs, each
#: algorithm's box: SGD keeps one momentum buffer when momentum != 0; Adam/AdamW keep
#: exp_avg and exp_avg_sq; fp32 mixed-precision-free training as in ZeRO, Rajbhandari
#: et al. 2020, section 3.1, which counts Adam's state as 2 x 4 bytes per parameter).
def optimizer_state_multiplier(optimizer: torch.optim.Optimizer) -> int:
    """Parameter-sized state tensors ``optimizer`` keeps per parameter (formula).

    SGD: 1 with momentum, else 0; Adam / AdamW: 2 (3 with ``amsgrad``); RMSprop: 1
    (+1 momentum, +1 centered); Adagrad: 1.

    Raises:
        ValueError: an optimizer this formula does not know; name it to add it.
    """
    name = type(optimizer).__name__
    d = optimizer.defaults
    if name == "SGD":
        return int(d.get("momentum", 0) != 0)
    if name in ("Adam", "AdamW"):
        return 3 if d.get("amsgrad") else 2
    if name == "RMSprop":
        return 1 + int(d.get("momentum", 0) != 0) + int(bool(d.get("centered")))
    if name == "Adagrad":
        return 1
    raise ValueError(f"no state formula for optimizer {name}; known: SGD, Adam, AdamW, "
                     "RMSprop, Adagrad")


#: What autograd saves per layer type (PyTorch's derivatives.yaml): conv and linear save
#: their input; batch norm (training) its input plus a per-channel mean and inverse std;
#: ReLU its output; max-pool its input and int64 indices; adaptive average pooling its
#: input. Additions, views and flatten save nothing.
_SAVES = {nn.Conv2d: "input", nn.Linear: "input", nn.BatchNorm2d: "input+stats",
          nn.ReLU: "output", nn.MaxPool2d: "input+indices", nn.AdaptiveAvgPool2d: "input"}


def activation_formula_bytes(model: nn.Module, x: torch.Tensor,
                             num_classes: int | None = None) -> int:
    """Activation bytes for backward predicted from the layer shapes (the formula).

    Sums, over the distinct tensors each layer would save by the ``_SAVES`` rule
    (conv / linear / BN / pooling inputs, ReLU outputs, max-pool int64 indices; an
    in-place ReLU's output is its input, counted once), their bytes, plus BatchNorm's
    two fp32 per-channel statistics and, with ``num_classes``, cross-entropy's
    log-softmax output (B, num_classes) and int64 targets (B,). Shapes come from one
    forward under ``torch.no_grad`` in eval mode (no graph, running statistics kept).

    Args:
        model: a model of the layer types in ``_SAVES`` (others are ignored).
        x: the batch, e.g. (B, 3, H, W) float32.
        num_classes: add the cross-entropy loss's saved tensors for this many classes
            (log-softmax output, int64 targets and nll_loss's 0-d fp32 total weight).
    """
    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # alive, so no data pointer is reused during the pass
    extra = 0

    def add(t: torch.Tensor, nbytes: int | None = None) -> None:
        keep.append(t)
        seen.setdefault(t.untyped_storage().data_ptr(), nbytes or t.nbytes)

    def hook(mod: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal extra
        rule = _SAVES[type(mod)]
        add(output if rule == "output" else inputs[0])
        if rule == "input+stats":
            extra += 2 * mod.num_features * 4
        elif rule == "input+indices":
            extra += output.numel() * 8
    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m) in _SAVES]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()
            model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    if num_classes is not None:  # log-softmax output, int64 targets, 0-d total weight
        extra += x.shape[0] * (num_classes * 4 + 8) + 4
    return sum(seen.values()) + extra


def memory_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                     y: torch.Tensor, *, dtype_bytes: int = 4) -> pd.DataFrame:
    """Parameters, gradients, optimizer state and activations: measured vs the formula.

    Runs ONE training step on ``model`` and ``optimizer`` (it updates them, as training
    does): forward + cross-entropy under a :class:`SavedTensorsCounter`, backward, step.
    Formulas, for P parameters of ``dtype_bytes`` each: params P*b, grads P*b,
    optimizer k*P*b with k from :func:`optimizer_state_multiplier`; activations from
    :func:`activation_formula_bytes` (layer shapes).

    Returns:
        A DataFrame indexed by part (params, grads, optimizer, activations, total) with
        ``measured_mib``, ``formula_mib``, ``diff_pct`` (measured vs formula) and
        ``formula`` (the rule, as text).
    """
    formula_act = activation_formula_bytes(model, x, num_classes=_num_classes(model, x))
    with SavedTensorsCounter(model_state_tensors(model)) as c:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    state = model_state_bytes(model, optimizer)
    optimizer.zero_grad(set_to_none=True)
    k = optimizer_state_multiplier(optimizer)
    p = state.num_params
    rows = [("params", state.params, p * dtype_bytes, f"P x {dtype_bytes} B"),
            ("grads", state.grads, p * dtype_bytes, f"P x {dtype_bytes} B"),
            ("optimizer", state.optimizer, k * p * dtype_bytes,
             f"{k} x P x {dtype_bytes} B ({type(optimizer).__name__})"),
            ("activations", c.result().nbytes, formula_act, "saved tensors per layer type")]
    rows.append(("total", sum(r[1] for r in rows), sum(r[2] for r in rows), "sum"))
    df = pd.DataFrame(rows, columns=["part", "measured", "formula_b", "formula"])
    df["measured_mib"] = df.pop("measured") / MIB
    df["formula_mib"] = df.pop("formula_b") / MIB
    df["diff_pct"] = 100 * (df.measured_mib / df.formula_mib - 1)
    return df.set_index("part")[["measured_mib", "formula_mib", "diff_pct", "formula"]]


def _num_classes(model: nn.Module, x: torch.Tensor) -> int | None:
    last = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return last[-1].out_features if last else None
