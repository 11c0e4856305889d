"""What a pipeline stage's rank records while the student's schedule runs (Lab 10).

The student's hand-written schedules (``gpipe_step``, ``one_f_one_b_step``) and torch's
(``ScheduleGPipe``/``Schedule1F1B`` through their ``build_schedule``) run unchanged; the
rank watches them from outside:

* :class:`StageProbe`: hooks on the stage module. A forward hook records ``F k`` (the
  k-th forward of the step is micro-batch k: every schedule runs a stage's forwards in
  micro-batch order) and puts a gradient hook on that forward's output, which records
  ``B k`` when micro-batch k's gradient reaches the stage: the order the stage really ran
  its micro-batches in, and the seconds it was busy. A backward ends when the stage's
  first parameter has accumulated its gradient (the first layer's weight gets its
  gradient last). No ``register_full_backward_pre_hook``: on the first stage no input
  requires a gradient, so torch warns that such a module hook will not fire ("Full
  backward hook will not fire as no inputs require gradients"); a tensor hook on the
  output fires on every stage.
* :class:`Stash`: the ``dict`` the rank hands a hand-written schedule for its activation
  stash (micro-batch -> what its backward needs); it remembers the most entries it held:
  the activations a stage keeps in flight, p - stage with 1F1B and m with GPipe (Narayanan
  et al. 2021, arXiv:2104.04473, §2.2).
* :class:`P2PTrace`: every ``torch.distributed`` ``isend``/``irecv`` the step issues
  (``P2POp`` + ``batch_isend_irecv``, ``isend``/``irecv`` and the blocking ``send``, which
  calls ``isend``), with the peer's stage and the tensor's shape, and every collective
  (a schedule written over point-to-point messages issues none).
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from perflab.core.timing import PerfCounterClock

__all__ = ["Stash", "StageProbe", "CallTrace", "P2PTrace", "COLLECTIVES", "in_flight_peak",
           "code_of"]

#: ``torch.distributed`` functions that are not point-to-point: a schedule written over
#: send/recv calls none of them during its step (``barrier`` moves no data: allowed).
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "scatter", "gather", "reduce",
               "all_to_all", "all_to_all_single", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list", "send_object_list", "recv_object_list")


class Stash(dict):
    """The activation stash a hand-written schedule fills (``stash[i] = (input, output)``
    after micro-batch i's forward, ``stash.pop(i)`` at its backward): a ``dict`` that keeps
    ``peak``, the most entries it held at once (read after ``__setitem__``,
    ``setdefault`` and ``update``)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0

    def _seen(self) -> None:
        self.peak = max(self.peak, len(self))

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._seen()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        out = super().setdefault(key, default)
        self._seen()
        return out

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._seen()


def in_flight_peak(order: list[str]) -> int:
    """The most micro-batches whose forward ran and whose backward did not, over an op
    order ``["F0", "F1", "B0", ...]`` (0 for an empty order); an op may carry a stage
    label (``"S2:F0"``: an interleaved rank's ops of all its stages, each stage's
    forward of a micro-batch counted once)."""
    live = peak = 0
    for op in order:
        live += 1 if op.rpartition(":")[2].startswith("F") else -1
        peak = max(peak, live)
    return peak


class StageProbe:
    """Hooks on one stage module that record its ops while ``recording`` is True.

    Args:
        stage_module: the stage (hooks are put on it and on its first parameter).
        order: the list to append ops to (default: a new one); several probes given one
            list record an interleaved rank's stages in the order their ops ran.
        label: put before every op (``"S2:"`` gives ``"S2:F0"``).

    Attributes:
        order: ``["F0", "F1", "B0", ...]``: forwards numbered in the order they ran,
            backwards by the forward whose output received the gradient.
        busy_s: seconds inside the stage's forwards (pre-hook to hook) and backwards
            (the output's gradient hook to the first parameter's post-accumulate hook).
        stash: the :class:`Stash` of the step (None for torch's schedules), sampled at
            every op too.
    """

    def __init__(self, stage_module: torch.nn.Module, order: list[str] | None = None,
                 label: str = "") -> None:
        self._clock = PerfCounterClock()
        self.recording = False
        self.stash: Stash | None = None
        self.order: list[str] = [] if order is None else order
        self._label = label
        self.reset()
        stage_module.register_forward_pre_hook(self._forward_start)
        stage_module.register_forward_hook(self._forward_end)
        first = next(stage_module.parameters(), None)
        if first is not None:
            first.register_post_accumulate_grad_hook(self._backward_end)

    def reset(self, stash: Stash | None = None) -> None:
        """Forget the last step's ops (the order list is emptied in place, so a probe
        that shares it empties it for all); ``stash``: the next step's stash (or None)."""
        self.order.clear()
        self.busy_s = 0.0
        self._forwards = 0
        self._t0: float | None = None
        self.stash = stash

    def _sample(self) -> None:
        if self.stash is not None:
            self.stash._seen()

    def _forward_start(self, module: Any, args: Any) -> None:
        if self.recording:
            self._t0 = self._clock.now()

    def _forward_end(self, module: Any, args: Any, output: Any) -> None:
        if not self.recording or not torch.is_grad_enabled() or (
                torch.is_tensor(output) and output.is_meta):
            return   # no backward follows, or torch's schedule inferring shapes on "meta"
        if self._t0 is not None:
            self.busy_s += self._clock.now() - self._t0
            self._t0 = None
        k = self._forwards
        self._forwards += 1
        self.order.append(f"{self._label}F{k}")
        self._sample()
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda grad, k=k: self._backward_start(k))

    def _backward_start(self, k: int) -> None:
        if self.recording:
            self.order.append(f"{self._label}B{k}")
            self._t0 = self._clock.now()
            self._sample()

    def _backward_end(self, param: Any) -> None:
        if self.recording and self._t0 is not None:
            self.busy_s += self._clock.now() - self._t0
            self._t0 = None


def code_of(fn: Any) -> Any:
    """The code object of ``fn`` (decorators unwrapped, a bound method's function), or
    None for a function written in C: what a profile hook's ``frame.f_code`` is compared
    with."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    return getattr(fn, "__code__", None)


class CallTrace:
    """A context manager that shows every Python call on this thread to ``_on_call(frame)``
    while open (``sys.setprofile``); a profile function already set (a
    :func:`~perflab.labs.checking.watch_calls` spy) keeps getting every event, and is
    set again on exit. Subclasses define ``_on_call``."""

    _outer: Any = None

    def _on_call(self, frame: Any) -> None:
        raise NotImplementedError

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self._on_call(frame)
        if self._outer is not None:
            self._outer(frame, event, arg)

    def __enter__(self) -> "CallTrace":
        self._outer = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._outer)


class P2PTrace(CallTrace):
    """While open, on this thread (``sys.setprofile``; gloo's own threads run no Python):
    the ``isend``/``irecv`` calls of ``torch.distributed`` however they are reached, and
    its collectives (:data:`COLLECTIVES`). A profile function already set (a
    :func:`~perflab.labs.checking.watch_calls` spy) keeps getting every event.

    Args:
        group: the pipeline's process group (None: the default group); peers are
            recorded as ranks in it (the stage numbers).

    Attributes:
        sends, recvs: ``[[peer stage, [shape...]], ...]`` in call order (peer None: any
            source).
        collectives: names of the collectives called, in call order.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist, self._group = dist, group
        self._p2p = {code_of(dist.isend): ("send", "dst"), code_of(dist.irecv): ("recv", "src")}
        self._collective = {code_of(getattr(dist, n)): n for n in COLLECTIVES if hasattr(dist, n)}
        self.sends: list[list] = []
        self.recvs: list[list] = []
        self.collectives: list[str] = []

    def _peer(self, local: dict, key: str) -> int | None:
        peer = local.get(f"group_{key}")
        if peer is None and local.get(key) is not None:
            try:
                peer = self._dist.get_group_rank(self._group or self._dist.group.WORLD,
                                                 int(local[key]))
            except Exception:  # noqa: BLE001 - a rank outside the group: kept as given
                peer = int(local[key])
        return None if peer is None else int(peer)

    def _on_call(self, frame: Any) -> None:
        code = frame.f_code
        if code in self._p2p:
            kind, key = self._p2p[code]
            local = frame.f_locals
            tensor = local.get("tensor")
            shape = list(tensor.shape) if torch.is_tensor(tensor) else None
            (self.sends if kind == "send" else self.recvs).append([self._peer(local, key), shape])
        elif code in self._collective:
            self.collectives.append(self._collective[code])
