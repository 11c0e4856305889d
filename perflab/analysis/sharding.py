"""Sharding, measured: per-rank model-state bytes, peak memory and collective bytes (Lab 09).

Everything here reads the tensors and the calls themselves, never a formula:

* :func:`local_nbytes`: bytes a tensor holds on *this* rank. A ``DTensor`` (what FSDP2,
  ``torch.distributed.fsdp.fully_shard``, turns parameters, gradients and Adam's state
  into) counts its local shard only (``DTensor.to_local()``); its ``numel()`` is the
  global size and would count every rank's shard.
* :func:`state_bytes`: parameter, gradient and optimizer-state bytes on this rank, for a
  model and its optimizer (plain, ``ZeroRedundancyOptimizer``, or over DTensors).
* :class:`count_collectives`: a context manager that counts calls and bytes of
  ``torch.distributed`` collectives by kind while it is open.

Peak memory per rank comes from :func:`perflab.core.memory.reset_peak` / :func:`~perflab.core.memory.read_peak`
(the CUDA allocator's peak, or on CPU the process's RSS high-water mark, labelled).
The ZeRO formulas these measurements are checked against are in :mod:`perflab.analysis.zero`.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable, Iterable

import torch

__all__ = ["local_nbytes", "state_bytes", "count_collectives", "message_nbytes",
           "COLLECTIVE_KINDS", "COLLECTIVE_MESSAGES"]

#: torch.distributed function -> the kind it is counted under, and which argument (its
#: name in torch 2.13's signature) is the message (nccl-tests' "size": the full buffer,
#: not one rank's part of it). Lab 10's ``HandTPTrace`` reads the same arguments.
COLLECTIVE_MESSAGES: dict[str, tuple[str, str]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),  # FSDP2's all-gather (torch 2.13)
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),  # FSDP2's reduce-scatter
}
#: The kinds :class:`count_collectives` reports, in this order.
COLLECTIVE_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes ``t`` holds on this rank: ``numel * element_size`` of its local data.

    A ``torch.distributed.tensor.DTensor`` counts its local shard (``t.to_local()``);
    any other tensor itself. Non-tensors count 0.

    Args:
        t: any tensor (any dtype, device) or DTensor.

    Returns:
        Bytes (int).
    """
    if not isinstance(t, torch.Tensor):
        return 0
    to_local = getattr(t, "to_local", None)
    if callable(to_local):  # a DTensor: only this rank's shard lives here
        t = to_local()
    return t.numel() * t.element_size()


def _optimizer_state(optimizer: Any) -> Iterable[dict]:
    # ZeroRedundancyOptimizer keeps the real state in its local optimizer (``optim``)
    inner = getattr(optimizer, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    return optimizer.state.values()


def state_bytes(model: torch.nn.Module, optimizer: Any = None) -> dict[str, int]:
    """Model-state bytes held on this rank, read from the tensors themselves.

    Args:
        model: the model as this rank holds it (plain, DDP-wrapped or ``fully_shard``-ed;
            DTensor parameters count their local shard).
        optimizer: a ``torch.optim.Optimizer`` (its ``state``: Adam's ``exp_avg``,
            ``exp_avg_sq`` and ``step`` tensors), a
            ``torch.distributed.optim.ZeroRedundancyOptimizer`` (its local shard's state),
            or None.

    Returns:
        ``{"params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes"}`` (ints).
        Gradients count where ``p.grad`` is set (measure before ``zero_grad``); the
        optimizer state counts every tensor in it (Adam's scalar ``step`` tensors too:
        4 bytes per parameter tensor).

    Raises:
        ValueError: ``model`` is not an ``nn.Module``, or ``optimizer`` has no ``state``.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not hasattr(optimizer, "state"):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer (with .state), got "
                         f"{type(optimizer).__name__}")
    params = list(model.parameters())
    out = {"params_bytes": sum(local_nbytes(p) for p in params),
           "grads_bytes": sum(local_nbytes(p.grad) for p in params if p.grad is not None),
           "optimizer_bytes": 0}
    if optimizer is not None:
        out["optimizer_bytes"] = sum(local_nbytes(v) for s in _optimizer_state(optimizer)
                                     for v in s.values())
    out["total_bytes"] = out["params_bytes"] + out["grads_bytes"] + out["optimizer_bytes"]
    return out


def message_nbytes(value: Any) -> int:
    """Bytes of a collective's message on this rank: a tensor's :func:`local_nbytes`, a
    list or tuple's sum (the list forms of all-gather and reduce-scatter), 0 for anything
    else."""
    if isinstance(value, (list, tuple)):
        return sum(local_nbytes(t) for t in value)
    return local_nbytes(value)


class count_collectives:  # noqa: N801 - used as a context manager, named like one
    """Count ``torch.distributed`` collectives by kind, and their bytes, while open.

    Usage, on every rank::

        with count_collectives() as comm:
            loss = model(x).sum(); loss.backward(); optimizer.step()
        comm.bytes["all_reduce"], comm.calls["all_gather"], comm.total_bytes

    While open, the functions in ``torch.distributed`` (``all_reduce``, ``broadcast``,
    ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
    ``reduce_scatter_tensor`` and FSDP2's ``all_gather_single`` / ``reduce_scatter_single``)
    are wrapped; closing puts the originals back. Callers that look them up as
    ``dist.<name>`` at call time are seen: DDP *communication hooks*
    (``torch.distributed.algorithms.ddp_comm_hooks``, e.g. ``allreduce_hook``),
    ``ZeroRedundancyOptimizer``, FSDP2 and your own code. DDP's built-in allreduce runs
    in C++ and is NOT seen: register ``default_hooks.allreduce_hook`` to count it.
    (Written here because torch's ``CommDebugMode`` counts calls, not bytes.)

    Bytes are the message size as nccl-tests defines it: the tensor for all-reduce and
    broadcast, the full (gathered) output of an all-gather, the full input of a
    reduce-scatter; per rank, per call. A collective called inside another one (a
    wrapper delegating to another wrapped function) counts once.

    Set ``phase`` (a label such as ``"backward"`` or ``"step"``) while a part of the step
    runs to learn where each collective was issued: ``phase_calls[phase][kind]`` counts
    them (how Lab 09 checks that ZeRO-2's reduce-scatters run during ``backward()``).

    ``after_call`` (optional) is called with the ``torch.distributed`` function's name
    each time a counted collective returns (how Lab 09 samples the memory a rank holds
    right after each all-gather is issued).

    Attributes:
        calls: kind -> number of calls. bytes: kind -> message bytes.
        phase: the label calls are counted under in ``phase_calls`` ("" by default).
        phase_calls: phase -> kind -> number of calls.
    """

    def __init__(self, after_call: Callable[[str], None] | None = None) -> None:
        self.after_call = after_call
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.phase = ""
        self.phase_calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._saved: dict[str, Any] = {}
        self._depth = 0

    def _wrap(self, name: str, fn: Any) -> Any:
        import inspect

        kind, arg = COLLECTIVE_MESSAGES[name]
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                bound = sig.bind_partial(*args, **kwargs).arguments
                message = bound.get(arg, bound.get("output_tensor", bound.get("tensor")))
                self.calls[kind] += 1
                self.phase_calls[self.phase][kind] += 1
                self.bytes[kind] += message_nbytes(message)
            self._depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self._depth -= 1
            if self._depth == 0 and self.after_call is not None:
                self.after_call(name)
            return out

        return counted

    def __enter__(self) -> "count_collectives":
        import torch.distributed as dist

        if self._saved:
            raise RuntimeError("count_collectives is already open; use a new one")
        for name in COLLECTIVE_MESSAGES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved = {}

    @property
    def total_bytes(self) -> int:
        """Message bytes of every counted collective."""
        return sum(self.bytes.values())

    def summary(self, steps: int = 1) -> dict[str, float]:
        """Bytes per step by kind, for :data:`COLLECTIVE_KINDS` (0 when none), plus
        ``"total"``.

        Raises:
            ValueError: ``steps < 1``.
        """
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        out = {k: self.bytes.get(k, 0) / steps for k in COLLECTIVE_KINDS}
        out["total"] = sum(out.values())
        return out

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}: {self.calls[k]} calls {self.bytes[k]:,} B"
                          for k in COLLECTIVE_KINDS if self.calls.get(k))
        return f"count_collectives({parts or 'nothing counted'})"
