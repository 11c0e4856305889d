"""The optimizers Lab 09's ``my_state_bytes`` (Exercise 1) is graded on: one step of a
seeded :func:`perflab.models.mlp`, its state on plain tensors, or as FSDP2 holds it, on
this rank's DTensor shards, built in this one process.

FSDP2 (``fully_shard``) makes each parameter a ``DTensor`` sharded on its first
dimension over the ranks (``Shard(0)``: rank r holds the r-th chunk of the rows as
``torch.chunk`` splits them, ceil(rows / world_size) rows each, the last ranks the rest
or none); an optimizer stepped on such parameters keeps its buffers (``exp_avg``, a
momentum, ...) as DTensors of the same sharding and its scalar ``step`` as a plain
tensor. :func:`stepped_optimizer`
with ``shard_rank`` builds exactly that state without launching ranks: a *fake* process
group of ``world_size`` ranks in this process (torch's ``FakeProcessGroup``, from
``torch.testing._internal.distributed.fake_pg``: it communicates nothing, which building
DTensors from local shards and an element-wise optimizer step never need), the
parameters made with ``DTensor.from_local`` from this rank's chunk of each tensor, one
step on seeded gradients, and the process group destroyed after the block.
``tests/labs/test_lab09_checks.py`` checks the state bytes against real FSDP2 on 2 gloo
ranks.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from perflab.models import mlp

__all__ = ["OPTIMIZERS", "stepped_optimizer"]

#: The optimizers :func:`stepped_optimizer` builds, by name.
OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p),
    "amsgrad": lambda p: torch.optim.Adam(p, amsgrad=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "rmsprop": lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p),
}


@contextlib.contextmanager
def stepped_optimizer(kind: str, sizes: Sequence[int], dtype: str, seed: int, *,
                      shard_rank: int | None = None,
                      world_size: int = 2) -> Iterator[torch.optim.Optimizer]:
    """An optimizer of :data:`OPTIMIZERS` after one step on ``mlp(sizes, seed)`` in
    ``dtype`` (a torch dtype name, e.g. ``"bfloat16"``).

    Args:
        shard_rank: None: plain parameters (one forward and backward of 3 seeded samples
            before the step). A rank: the parameters are FSDP2's DTensor shards of rank
            ``shard_rank`` of ``world_size`` (``Shard(0)``), on seeded gradients of the same
            sharding; a fake process group lives while the block runs (see the module
            doc), so ``DTensor.to_local()`` and ``numel()`` answer as on that rank.

    Raises:
        ValueError: an unknown ``kind`` or a ``shard_rank`` outside the world.
        RuntimeError: with ``shard_rank``, a default process group already exists in
            this process.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; choose from {sorted(OPTIMIZERS)}")
    net = mlp(list(sizes), seed=seed).to(getattr(torch, dtype))
    g = torch.Generator().manual_seed(seed)
    if shard_rank is None:
        opt = OPTIMIZERS[kind](net.parameters())
        inputs = torch.randn(3, sizes[0], generator=g).to(net[0].weight.dtype)
        labels = torch.randint(0, sizes[-1], (3,), generator=g)
        torch.nn.functional.cross_entropy(net(inputs), labels).backward()
        opt.step()
        yield opt
        return
    if not 0 <= shard_rank < world_size:
        raise ValueError(f"shard_rank must be in 0..{world_size - 1}, got {shard_rank}")
    import importlib

    from torch import distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    importlib.import_module("torch.testing._internal.distributed.fake_pg")  # the "fake" backend
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process: the "
                           "sharded optimizer state is built on a fake one of its own")
    dist.init_process_group("fake", store=dist.HashStore(), rank=shard_rank,
                            world_size=world_size)
    try:
        mesh = DeviceMesh("cpu", list(range(world_size)))

        def shard(full: torch.Tensor) -> torch.Tensor:   # this rank's rows, as FSDP2's
            chunks = full.detach().chunk(world_size, dim=0)   # fewer when rows are few
            local = (chunks[shard_rank] if shard_rank < len(chunks) else full[:0]).clone()
            return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=full.shape, stride=full.stride())

        params = [torch.nn.Parameter(shard(p)) for p in net.parameters()]
        opt = OPTIMIZERS[kind](params)
        for p, full in zip(params, net.parameters()):
            p.grad = shard(torch.randn(full.shape, generator=g).to(full.dtype))
        opt.step()
        yield opt
    finally:
        dist.destroy_process_group()
