"""Sequence parallelism, measured on a rank (Lab 10): the activation bytes a block's
LayerNorm and dropout region keeps for the backward and those the whole block keeps, and
the parameters of a tensor-parallel :class:`~perflab.labs.lab10.models.TransformerBlock`
by name.

Korthikanti et al. 2022 (*Reducing Activation Recomputation in Large Transformer
Models*, arXiv:2205.05198, §4.2.2) run a block's LayerNorms and dropouts on a slice of
the sequence on each tensor-parallel rank: those ops act on each position alone, so
what they keep for the backward (the LayerNorm's input, mean and reciprocal standard
deviation, the dropout's mask) shrinks from ``(B, S, ·)`` to ``(B, S/tp, ·)`` per rank,
where plain tensor parallelism keeps it whole on every rank. :class:`SavedActivationBytes`
measures exactly that region on the module objects that run it, and everything the block
keeps: all of it divided by tp needs the column-parallel matmuls to keep only their input's
sequence shard and all-gather it again in the backward (Megatron-LM's
``LinearWithGradAccumulationAndAsyncCommunication``, megatron/core/tensor_parallel/layers.py).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["SavedActivationBytes", "BLOCK_REGION", "BLOCK_PARAMS", "block_param"]

#: The modules of a (sharded or whole) transformer block that sequence parallelism puts
#: on sequence shards: its LayerNorms and dropouts.
BLOCK_REGION = ("ln1", "drop1", "ln2", "drop2")

#: A tensor-parallel block's parameters by name -> how Megatron splits them over tp ranks:
#: ``"rows"`` (a column-parallel Linear: output features, dim 0), ``"cols"`` (a row-parallel
#: Linear's weight: input features, dim 1) or ``"whole"`` (every rank holds all of it).
#: The names are the sharded block's attributes (``mlp.fc1``/``mlp.fc2``: ``ShardedMLP``'s);
#: :func:`block_param` reads the same name on a :class:`TransformerBlock` (``mlp.0``/``mlp.2``).
BLOCK_PARAMS = {"ln1.weight": "whole", "ln1.bias": "whole",
                "attn.wq.weight": "rows", "attn.wq.bias": "rows",
                "attn.wk.weight": "rows", "attn.wk.bias": "rows",
                "attn.wv.weight": "rows", "attn.wv.bias": "rows",
                "attn.wo.weight": "cols", "attn.wo.bias": "whole",
                "ln2.weight": "whole", "ln2.bias": "whole",
                "mlp.fc1.weight": "rows", "mlp.fc1.bias": "rows",
                "mlp.fc2.weight": "cols", "mlp.fc2.bias": "whole"}


def block_param(module: torch.nn.Module, name: str) -> Any:
    """The parameter ``name`` (a key of :data:`BLOCK_PARAMS`) of a sharded block
    (``module.mlp.fc1``) or of a whole :class:`~perflab.labs.lab10.models.TransformerBlock`
    (``module.mlp[0]``).

    Raises:
        AttributeError: the module has no such attribute (the message names it).
    """
    obj: Any = module
    for part in name.split("."):
        if isinstance(obj, torch.nn.Sequential) and part in ("fc1", "fc2"):
            part = {"fc1": "0", "fc2": "2"}[part]
        if not hasattr(obj, part):
            raise AttributeError(f"the block has no {name!r} (missing attribute {part!r})")
        obj = getattr(obj, part)
    return obj


class SavedActivationBytes:
    """Bytes the autograd graph keeps for the backward: while the given modules run
    (``nbytes``: a LayerNorm's input, mean and rstd; a dropout's mask) and in the whole
    ``with`` body (``total_nbytes``: every activation a block keeps, each storage once),
    parameters not counted (they are the model's, not activations).

    One ``torch.autograd.graph.saved_tensors_hooks`` is open for the ``with`` body; a
    forward pre-hook and a forward hook of each module mark when one of them runs. What
    a custom ``torch.autograd.Function`` keeps with ``ctx.save_for_backward`` is counted
    like any other saved tensor.

    Usage, around the forward of a block whose ``ln1``, ``drop1``, ``ln2``, ``drop2`` are
    the modules it runs::

        with SavedActivationBytes([block.ln1, block.drop1, block.ln2, block.drop2],
                                  params=block.parameters()) as saved:
            y = block(x)
        saved.nbytes, saved.shapes, saved.total_nbytes

    A module called through anything but its ``__call__`` (its functional form) is not
    seen by ``nbytes``: the region is the modules' own runs.

    Attributes:
        nbytes: bytes of the tensors saved while a module of ``modules`` runs (numel x
            element size each), int.
        shapes: ``[[shape...], ...]`` of those tensors, in the order they were saved.
        total_nbytes: bytes of the storages of every tensor saved in the ``with`` body,
            each storage once (three matmuls that keep views of one input count it
            once; a saved view keeps its whole storage alive, so the storage is what is
            counted), the storages of ``params`` (and of ``nn.Parameter`` s) left out:
            what sequence parallelism divides by tp (Korthikanti et al. 2022, §4.2.2).
    """

    def __init__(self, modules: Iterable[torch.nn.Module],
                 params: Iterable[torch.Tensor] = ()) -> None:
        self.modules = list(modules)
        self.nbytes = 0
        self.shapes: list[list[int]] = []
        self.total_nbytes = 0
        self._params = {_storage(p)[0] for p in params}
        self._storages: set[int] = set()
        self._depth = 0
        self._handles: list[Any] = []
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter):
            return t
        if self._depth:
            self.nbytes += t.numel() * t.element_size()
            self.shapes.append(list(t.shape))
        ptr, nbytes = _storage(t)
        if ptr not in self._params and ptr not in self._storages:
            self._storages.add(ptr)
            self.total_nbytes += nbytes
        return t

    def _enter(self, module: Any, args: Any) -> None:
        self._depth += 1

    def _leave(self, module: Any, args: Any, out: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def __enter__(self) -> "SavedActivationBytes":
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._depth = 0   # a module that raised inside its forward
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(the address, the bytes) of ``t``'s storage (a view shares its base's): what identifies
    a saved tensor's memory. A DTensor's is its local shard's; a wrapper tensor with no
    storage of its own (``AsyncCollectiveTensor``) counts as its own numel x element size."""
    local = t.to_local() if hasattr(t, "to_local") else t
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), t.numel() * t.element_size()
