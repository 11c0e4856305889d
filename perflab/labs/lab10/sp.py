"""Sequence parallelism, measured on a rank (Lab 10): the activation bytes a block's
LayerNorm and dropout region keeps for the backward, and the parameters of a
tensor-parallel :class:`~perflab.labs.lab10.models.TransformerBlock` by name.

Korthikanti et al. 2022 (*Reducing Activation Recomputation in Large Transformer
Models*, arXiv:2205.05198, §4.2.2) run a block's LayerNorms and dropouts on a slice of
the sequence on each tensor-parallel rank: those ops act on each position alone, so
what they keep for the backward (the LayerNorm's input, mean and reciprocal standard
deviation, the dropout's mask) shrinks from ``(B, S, ·)`` to ``(B, S/tp, ·)`` per rank,
where plain tensor parallelism keeps it whole on every rank. :class:`SavedActivationBytes`
measures exactly that region on the module objects that run it.
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
    """Bytes the autograd graph keeps for the backward while the given modules run
    (``torch.autograd.graph.saved_tensors_hooks``, entered by a forward pre-hook and left
    by a forward hook of each module), parameters not counted (they are the model's, not
    activations): a LayerNorm's input, mean and rstd; a dropout's mask.

    Usage, around the forward of a block whose ``ln1``, ``drop1``, ``ln2``, ``drop2`` are
    the modules it runs::

        with SavedActivationBytes([block.ln1, block.drop1, block.ln2, block.drop2]) as saved:
            y = block(x)
        saved.nbytes, saved.shapes

    A module called through anything but its ``__call__`` (its functional form) is not
    seen: the region is the modules' own runs.

    Attributes:
        nbytes: bytes of the saved tensors (numel x element size each), int.
        shapes: ``[[shape...], ...]`` of the saved tensors, in the order they were saved.
    """

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        self.modules = list(modules)
        self.nbytes = 0
        self.shapes: list[list[int]] = []
        self._handles: list[Any] = []
        self._open: list[Any] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            self.nbytes += t.numel() * t.element_size()
            self.shapes.append(list(t.shape))
        return t

    def _enter(self, module: Any, args: Any) -> None:
        ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        ctx.__enter__()
        self._open.append(ctx)

    def _leave(self, module: Any, args: Any, out: Any) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)

    def __enter__(self) -> "SavedActivationBytes":
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._open:   # a module that raised inside its forward
            self._open.pop().__exit__(None, None, None)
