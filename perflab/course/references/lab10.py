"""Lab 10's references, grader-only: the unsharded tensor-parallel block's output and
gradients, and the unsplit pipeline's loss (what the judges of the hand-written TP and
pipeline exercises compare with)."""
from __future__ import annotations

from typing import Any

import torch

from perflab.labs.lab10.models import mlp_block, pipeline_batch, pipeline_model, tp_tensors

__all__ = ["tp_reference", "pipeline_reference_loss"]


def tp_reference(case: dict[str, int]) -> dict[str, Any]:
    """The unsharded block on one case: ``{"out", "x_grad", "fc1_weight_grad",
    "fc1_bias_grad", "fc2_weight_grad", "fc2_bias_grad"}`` as float32 tensors (full
    shapes: ``fc1.weight`` is ``(4d, d)``, ``fc2.weight`` ``(d, 4d)``), from
    ``y = block(x)`` and ``y.backward(dL/dy)`` (:func:`~perflab.labs.lab10.models.tp_tensors`)."""
    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors(case)
    x.requires_grad_(True)
    out = block(x)
    out.backward(grad_out)
    fc1, fc2 = block[0], block[2]
    return {"out": out.detach(), "x_grad": x.grad, "fc1_weight_grad": fc1.weight.grad,
            "fc1_bias_grad": fc1.bias.grad, "fc2_weight_grad": fc2.weight.grad,
            "fc2_bias_grad": fc2.bias.grad}




def pipeline_reference_loss(width: int, blocks: int, batch: int, seed: int) -> float:
    """Cross-entropy (mean over the batch) of the unsplit :func:`~perflab.labs.lab10.models.pipeline_model` on
    :func:`~perflab.labs.lab10.models.pipeline_batch`: what a pipelined step's loss must equal, since equal
    micro-batches' mean losses average to the batch's mean loss."""
    x, y = pipeline_batch(width, batch, seed)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(pipeline_model(width, blocks, seed)(x), y))
