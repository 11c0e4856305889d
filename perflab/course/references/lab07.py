"""Lab 07's references, grader-only: the all-gather of one float per rank and the
b_r / B loss weighting (what the judges of ``all_gather_times`` and ``rank_loss``
compare with; ``benchmarks/record_stragglers.py`` passes this module to
:func:`perflab.labs.lab07.straggler_rank` as its student module)."""
from __future__ import annotations

import torch

__all__ = ["reference_gather", "reference_rank_loss", "all_gather_times", "rank_loss"]


def reference_gather(local_s: float) -> list[float]:
    """Every rank's ``local_s`` in rank order (``dist.all_gather`` of a float64 tensor).

    Call on every rank of an initialized process group; returns ``world_size`` floats
    (seconds, as given)."""
    import torch.distributed as dist

    mine = torch.tensor([float(local_s)], dtype=torch.float64)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [float(t) for t in out]


def reference_rank_loss(logits: torch.Tensor, targets: torch.Tensor, global_batch: int,
                        world_size: int) -> torch.Tensor:
    """This rank's share of the global-batch mean cross-entropy: sum over its b_r samples
    divided by ``global_batch`` (B), so the ranks' gradients SUMMED (``all_reduce``) equal
    the gradient of the mean over all B samples for any split (b_0 + ... = B).

    ``logits`` (b_r, classes) float, ``targets`` (b_r,) int64; returns a 0-d tensor.
    ``world_size`` is unused: the weight is b_r / B, not 1 / world_size (equal only for
    an even split; Goyal et al. 2017, "Accurate, Large Minibatch SGD", section 3,
    remark 3: normalize the per-worker loss by the total minibatch size).
    """
    del world_size
    return torch.nn.functional.cross_entropy(logits, targets, reduction="sum") / global_batch


#: The names :func:`perflab.labs.lab07.straggler_rank` looks for in a student module:
#: recording runs pass this module's name instead of a student's.
all_gather_times = reference_gather
rank_loss = reference_rank_loss
