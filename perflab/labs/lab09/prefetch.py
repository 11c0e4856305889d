"""FSDP2 explicit prefetching (Lab 09, Exercise 2d): the order of collectives, recorded.

``FSDPModule.set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``
(torch/distributed/fsdp/_fully_shard/_fully_shard.py) tell a ``fully_shard``-ed block
which other blocks' all-gathers to issue from its own pre-forward / pre-backward hook
(``FSDPState._pre_forward`` / ``_pre_backward`` in _fsdp_state.py). What that changes,
and what does not move with the machine's load, is the ORDER of the collectives
relative to the blocks' forwards: with block i prefetching block i+1, block i+1's
all-gather is issued before block i's forward runs; without, after it.

* :class:`record_order`: while open, logs every all-gather and reduce-scatter call on
  this rank (``torch.distributed``'s functions, wrapped as
  :class:`perflab.analysis.sharding.count_collectives` wraps them: FSDP2 looks them up at
  call time) and every forward of the given blocks (forward pre-hooks registered after
  ``fully_shard``'s, so they fire once FSDP's pre-forward, prefetches included, is done),
  with the ``async_op`` each all-gather was issued with.
* :func:`prefetch_order_rank`: rank body: the student's ``my_fully_shard`` (and, per
  config, ``my_prefetch``) on :func:`perflab.models.mlp` models, one steady-state step
  recorded.
* :func:`prefetch_step_rank`: rank body for CUDA ranks (NCCL): step times with and
  without the student's prefetching, and of the same model unsharded on one GPU.

Why the time measurement is GPU-only: FSDP2's pre-forward unshard calls
``dist.all_gather_single(..., async_op=FSDPParamGroup.unshard_async_op)``, False by
default (_fsdp_param_group.py, _fsdp_collectives.py ``DefaultAllGather``); on CUDA the
call returns once the all-gather is queued on FSDP's all-gather *stream*, so it
overlaps the compute stream; on CPU the streams are stand-ins and gloo's synchronous
all-gather returns when it is done, so a prefetched all-gather cannot overlap compute.
:class:`record_order` records the ``async_op`` of every call, so the lab prints it.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from typing import Any, Sequence

import torch

from perflab.models import mlp, mlp_batches

__all__ = ["record_order", "prefetch_order_rank", "prefetch_step_rank"]

#: torch.distributed function -> (kind, the argument whose bytes are the message size:
#: the gathered output of an all-gather, the input of a reduce-scatter; nccl-tests' sizes)
_ORDERED = {"all_gather_single": ("all_gather", "output_tensor"),
            "all_gather_into_tensor": ("all_gather", "output_tensor"),
            "reduce_scatter_single": ("reduce_scatter", "input"),
            "reduce_scatter_tensor": ("reduce_scatter", "input")}


class record_order:  # noqa: N801 - a context manager, named like one
    """Log, in call order, this rank's all-gathers and reduce-scatters and the forwards
    of ``blocks`` while open.

    Usage (on every rank, after ``fully_shard``)::

        rec = record_order(blocks)
        with rec:
            loss = model(x).sum()
            rec.phase = "backward"
            loss.backward()
        rec.events["forward"], rec.events["backward"], rec.async_ops

    Attributes:
        events: phase -> list of ``[kind, value]``: ``["all_gather", bytes]``,
            ``["reduce_scatter", bytes]`` or ``["forward", block index]``.
        phase: where new events go ("forward" until changed).
        async_ops: the ``async_op`` of every all-gather call (bools).
    """

    def __init__(self, blocks: Sequence[torch.nn.Module]) -> None:
        self.blocks = list(blocks)
        self.events: dict[str, list[list]] = {"forward": [], "backward": []}
        self.phase = "forward"
        self.async_ops: list[bool] = []
        self._saved: dict[str, Any] = {}
        self._hooks: list[Any] = []
        self._depth = 0

    def _wrap(self, name: str, fn: Any) -> Any:
        kind, arg = _ORDERED[name]
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def logged(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:   # a wrapped function calling another logs once
                bound = sig.bind_partial(*args, **kwargs).arguments
                t = bound[arg]
                self.events[self.phase].append([kind, t.numel() * t.element_size()])
                if kind == "all_gather":
                    self.async_ops.append(bool(bound.get("async_op", False)))
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return logged

    def __enter__(self) -> "record_order":
        import torch.distributed as dist

        for name in _ORDERED:
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._saved[name]))
        for i, block in enumerate(self.blocks):
            def hook(module: Any, args: Any, i: int = i) -> None:
                self.events[self.phase].append(["forward", i])
            self._hooks.append(block.register_forward_pre_hook(hook))
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _student(module: str) -> Any:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the student's file sits in the working folder
    return importlib.import_module(module)


def _sharded(student: Any, cfg: dict[str, Any], device: torch.device) -> torch.nn.Module:
    """The student's FSDP2 model (fp32, reshard_after_forward=True), prefetching set by
    ``student.my_prefetch`` when ``cfg["prefetch"]``."""
    model = mlp(cfg["sizes"], cfg["seed"]).to(device)
    model = student.my_fully_shard(model, True, torch.float32, torch.float32) or model
    if cfg["prefetch"]:
        model = student.my_prefetch(model) or model
    return model


def prefetch_order_rank(configs: Sequence[dict[str, Any]], student_module: str
                        ) -> list[dict[str, Any]]:
    """Rank body (gloo or NCCL): per config, the student's FSDP2 model of
    :func:`perflab.models.mlp` ``(sizes, seed)`` (``my_fully_shard(model, True, float32,
    float32)``, then ``my_prefetch(model)`` if ``prefetch``), two AdamW steps on
    :func:`perflab.models.mlp_batches`; the second (steady-state) step is recorded by
    :class:`record_order`.

    Args:
        configs: dicts with ``sizes``, ``batch`` (per rank), ``seed``, ``prefetch`` (bool).
        student_module: the module name of the student's file in the working folder.

    Returns:
        Per config ``{"forward": [...], "backward": [...], "async_ops": [...]}`` (see
        :class:`record_order`), or ``{"error": "Type: message"}`` when the student's code
        raised.
    """
    import torch.distributed as dist

    student = _student(student_module)
    out = []
    for cfg in configs:
        try:
            model = _sharded(student, cfg, torch.device("cpu"))
            blocks = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            rec = record_order(blocks)
            for s, (x, y) in enumerate(mlp_batches(cfg["sizes"], cfg["batch"], 2, dist.get_rank(),
                                                   cfg["seed"])):
                if s == 1:
                    rec.__enter__()
                try:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    rec.phase = "backward"
                    loss.backward()
                finally:
                    if s == 1:
                        rec.__exit__()
                rec.phase = "forward"
                opt.step()
                opt.zero_grad(set_to_none=True)
            out.append({**rec.events, "async_ops": rec.async_ops})
        except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
            out.append({"error": f"{type(e).__name__}: {e}"[:400]})
        dist.barrier()
    return out


def prefetch_step_rank(cfg: dict[str, Any], student_module: str, steps: int = 20
                       ) -> dict[str, Any]:
    """Rank body for CUDA ranks (NCCL, one GPU per rank): median seconds per training
    step of the student's FSDP2 model without and with ``my_prefetch``, and of the same
    model unsharded on this rank's GPU alone (compute only: no collective). The step
    minus the unsharded step is the communication the compute did not hide.

    Timed with :func:`perflab.core.timing.measure` (CUDA synchronised, warm-up dropped).

    Raises:
        RuntimeError: CUDA is not available on this rank.
    """
    import torch.distributed as dist

    from perflab.core.timing import measure

    if not torch.cuda.is_available():
        raise RuntimeError("prefetch_step_rank needs CUDA ranks (torch.cuda.is_available() "
                           "is False)")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    student = _student(student_module)
    x, y = (t.to(device) for t in mlp_batches(cfg["sizes"], cfg["batch"], 1, rank, cfg["seed"])[0])
    out: dict[str, Any] = {}
    for name, prefetch in (("unsharded", None), ("no_prefetch", False), ("prefetch", True)):
        model = (mlp(cfg["sizes"], cfg["seed"]).to(device) if prefetch is None
                 else _sharded(student, {**cfg, "prefetch": prefetch}, device))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step() -> None:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out[name + "_s"] = measure(step, repeats=steps, warmup=3, device=device).median
        dist.barrier()
    return out
