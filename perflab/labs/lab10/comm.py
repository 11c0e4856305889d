"""Count the collectives DTensor issues, with their bytes.

``parallelize_module``'s DTensors do not call ``torch.distributed.all_reduce``: they issue
*functional* collectives (``torch.ops._c10d_functional.all_reduce`` and friends,
torch/distributed/_functional_collectives.py), which
:class:`perflab.analysis.sharding.count_collectives` (a wrapper of the ``dist.*``
functions) cannot see. torch's own ``CommDebugMode``
(torch/distributed/tensor/debug/_comm_mode.py) sees them, as a ``TorchDispatchMode``, but
counts calls, not bytes. :class:`count_functional_collectives` is the same mechanism,
keeping each call's message bytes (nccl-tests' size: the tensor of an all-reduce, the
gathered output of an all-gather, the input of a reduce-scatter).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perflab.analysis.sharding import message_nbytes

__all__ = ["count_functional_collectives", "wire_bytes"]

#: functional op name -> (kind, how the message size follows from the first argument)
_KINDS = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce",
          "all_reduce_coalesced": "all_reduce", "all_gather_into_tensor": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
          "broadcast": "broadcast", "broadcast_": "broadcast"}


def wire_bytes(kind: str, message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends on the wire for one collective of message size ``n`` (bytes)
    over ``p = world_size`` ranks, run as a ring: nccl-tests' bus-bytes convention
    (nccl-tests/doc/PERFORMANCE.md): an all-reduce ``2(p−1)/p·n`` (a reduce-scatter
    then an all-gather), an all-gather and a reduce-scatter ``(p−1)/p·n`` each, where
    ``n`` is the full tensor (the gathered output, the scattered input; what
    :class:`count_functional_collectives` and
    :class:`perflab.analysis.sharding.count_collectives` count).

    Raises:
        ValueError: an unknown ``kind`` (use ``"all_reduce"``, ``"all_gather"``,
            ``"reduce_scatter"``), ``world_size < 1`` or negative bytes.
    """
    factors = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
    if kind not in factors:
        raise ValueError(f"kind must be one of {sorted(factors)}, got {kind!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes!r}")
    return factors[kind] * (world_size - 1) / world_size * message_bytes


class count_functional_collectives(TorchDispatchMode):  # noqa: N801 - a context manager
    """Count functional collectives (DTensor's) by kind, with message bytes, while open.

    Usage, on every rank::

        with count_functional_collectives() as comm:
            y = tp_block(x); y.backward(dy)
        comm.calls["all_reduce"], comm.bytes["all_reduce"], comm.log

    The backward runs in the same thread on CPU, so its collectives are counted too
    (as ``CommDebugMode`` counts them). ``all_gather_into_tensor``'s bytes are the gathered
    output: input bytes x ``group_size`` (its second argument).

    Attributes:
        calls: kind -> calls. bytes: kind -> message bytes. log: ``[(kind, bytes), ...]``
        in call order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.log: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        name = func._schema.name
        if name.startswith("_c10d_functional::") and name.split("::")[1] in _KINDS:
            op = name.split("::")[1]
            kind, nbytes = _KINDS[op], message_nbytes(args[0])
            if kind == "all_gather":
                nbytes *= int(args[1])   # all_gather_into_tensor(input, group_size, group)
            self.calls[kind] += 1
            self.bytes[kind] += nbytes
            self.log.append((kind, nbytes))
        return func(*args, **(kwargs or {}))
