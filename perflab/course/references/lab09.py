"""Lab 09's reference, grader-only: one process, plain AdamW on the global batch, what
every data-parallel, ZeRO and FSDP variant of the lab must equal."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from perflab.models import mlp, mlp_batches

__all__ = ["unsharded_adamw"]


def unsharded_adamw(sizes: Sequence[int], world_size: int, batch: int, steps: int, *,
                    lr: float = 1e-2, weight_decay: float = 0.01, seed: int = 0,
                    with_state: bool = False, with_losses: bool = False,
                    param_dtype: torch.dtype | None = None) -> Any:
    """The reference: one process, plain ``torch.optim.AdamW``, the global batch
    (``world_size`` ranks' batches of :func:`perflab.models.mlp_batches`, concatenated).

    With ``param_dtype`` (mixed precision as FSDP2's ``MixedPrecisionPolicy(param_dtype=...,
    reduce_dtype=torch.float32)`` computes it): each rank's batch runs forward and
    backward on the parameters and inputs cast to ``param_dtype`` (the loss on the logits
    in fp32), each rank's gradients are cast to fp32 and averaged over the ranks, and
    AdamW steps the fp32 parameters.

    Returns:
        The fp32 parameters after ``steps`` steps, flattened in ``model.parameters()``
        order (a list of floats); with ``with_state``, ``(params, exp_avg, exp_avg_sq)``,
        AdamW's two buffers flattened in the same order (Loshchilov & Hutter 2019;
        ``torch/optim/adamw.py``); with ``with_losses``, ``(params, losses)``: each
        step's loss on the global batch (the mean of the equal ranks' batch means).
    """
    model = mlp(sizes, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    per_rank = [mlp_batches(sizes, batch, steps, r, seed) for r in range(world_size)]
    losses = []
    for s in range(steps):
        if param_dtype is not None:
            losses.append(_mixed_precision_grads(model, [b[s] for b in per_rank], param_dtype))
        else:
            x = torch.cat([per_rank[r][s][0] for r in range(world_size)])
            y = torch.cat([per_rank[r][s][1] for r in range(world_size)])
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
    params = list(model.parameters())
    flat = torch.cat([p.detach().flatten() for p in params]).tolist()
    if with_losses:
        return flat, losses
    if not with_state:
        return flat
    return (flat, *(torch.cat([opt.state[p][k].flatten() for p in params]).tolist()
                    for k in ("exp_avg", "exp_avg_sq")))


def _mixed_precision_grads(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                           dtype: torch.dtype) -> float:
    """Set ``model``'s fp32 ``.grad`` to the mean over ``batches`` (one per rank) of the
    gradients computed on the parameters and inputs cast to ``dtype``; return the mean
    of the ranks' losses."""
    from torch.func import functional_call

    names = [n for n, _ in model.named_parameters()]
    total = [torch.zeros_like(p) for p in model.parameters()]
    losses = []
    for x, y in batches:
        low = {n: p.detach().to(dtype).requires_grad_() for n, p in model.named_parameters()}
        loss = torch.nn.functional.cross_entropy(functional_call(model, low, (x.to(dtype),)).float(), y)
        grads = torch.autograd.grad(loss, [low[n] for n in names])
        for t, g in zip(total, grads):
            t += g.float()
        losses.append(float(loss.detach()))
    for p, t in zip(model.parameters(), total):
        p.grad = t / len(batches)
    return sum(losses) / len(losses)
