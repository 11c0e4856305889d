"""Lab 08: the rows the roofline and memory exercises read from a ``torch.profiler``
recording of one training step.

* :func:`op_rows`: the step's slowest operators of each kind (matmul, convolution,
  elementwise, softmax, normalization) from ``prof.key_averages(group_by_input_shape=
  True)`` (needs ``record_shapes=True``) whose names are in the exercise's op list, with
  their input shapes, calls and time;
* :func:`memory_events`: the profiler's memory timeline (``profile_memory=True``,
  ``record_shapes=True``, ``with_stack=True``) as ``(time_us, category, delta_bytes,
  alloc_id)`` rows, the documented format of the memory exercise. The categories are
  ``torch.profiler._memory_profiler.Category`` (PARAMETER, OPTIMIZER_STATE, INPUT,
  TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL) and ``"UNKNOWN"`` for memory the
  profiler could not attribute; the conversion follows that module's
  ``MemoryProfileTimeline._coalesce_timeline`` (a version increment moves the bytes
  from the old version's category to the new one's).

Both read private profiler state (``_memory_profile``) that PyTorch marks experimental;
they are here, not in a notebook cell, so one place changes when it does.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["ROOFLINE_OPS", "OP_KINDS", "op_rows", "memory_events"]

#: The operators the roofline exercise places (aten names without ``aten::``).
ROOFLINE_OPS = ("mm", "addmm", "bmm", "convolution", "relu", "gelu", "add", "mul",
                "layer_norm", "softmax")
#: The kind of each operator of :data:`ROOFLINE_OPS`: :func:`op_rows` keeps the slowest
#: of each kind, so operators of low arithmetic intensity (elementwise, softmax,
#: normalization) are placed on any machine, not only the matmuls that dominate a CPU.
OP_KINDS = {"mm": "matmul", "addmm": "matmul", "bmm": "matmul", "convolution": "convolution",
            "relu": "elementwise", "gelu": "elementwise", "add": "elementwise",
            "mul": "elementwise", "softmax": "softmax", "layer_norm": "normalization"}


def op_rows(prof: Any, *, per_kind: int = 2, device_time: bool = False) -> list[dict]:
    """The slowest operator/shape groups of :data:`ROOFLINE_OPS` of each kind
    (:data:`OP_KINDS`: matmul, convolution, elementwise, softmax, normalization).

    Args:
        prof: a finished ``torch.profiler.profile`` run with ``record_shapes=True``.
        per_kind: how many rows of each kind present in the recording (>= 1).
        device_time: rank and time by ``device_time_total`` (a CUDA step) instead of
            ``cpu_time_total``.

    Returns:
        Dicts with ``op`` (e.g. "addmm"), ``kind`` (its :data:`OP_KINDS` entry),
        ``shapes`` (the recorded input shapes, a list of lists of ints; ``[]`` for a
        non-tensor argument), ``calls`` and ``time_us`` (microseconds, all calls
        together, the operator's children included: aten's ``layer_norm`` does its work
        in ``native_layer_norm``), slowest first.

    Raises:
        ValueError: ``per_kind`` < 1.
    """
    if per_kind < 1:
        raise ValueError(f"per_kind must be >= 1, got {per_kind}")
    rows = []
    for evt in prof.key_averages(group_by_input_shape=True):
        name = evt.key.removeprefix("aten::")
        if name not in ROOFLINE_OPS:
            continue
        t = evt.device_time_total if device_time else evt.cpu_time_total
        if t <= 0:
            continue
        shapes = [list(s) if isinstance(s, (list, tuple)) else [] for s in evt.input_shapes]
        rows.append({"op": name, "kind": OP_KINDS[name], "shapes": shapes,
                     "calls": int(evt.count), "time_us": float(t)})
    rows.sort(key=lambda r: -r["time_us"])
    taken: dict[str, int] = {}
    kept = []
    for r in rows:
        if taken.get(r["kind"], 0) < per_kind:
            taken[r["kind"]] = taken.get(r["kind"], 0) + 1
            kept.append(r)
    return kept


def memory_events(prof: Any, device: str | torch.device = "cpu") -> list[tuple]:
    """The memory timeline of ``device`` as rows ``(time_us, category, delta_bytes,
    alloc_id)``, in time order: a positive ``delta_bytes`` allocates ``alloc_id`` in
    ``category``, a negative one frees it; an allocation whose category changes (a
    new version of the tensor) is freed under the old category and allocated under the
    new one at the same time. Memory that existed before the recording starts at the
    first event's time.

    Args:
        prof: a finished ``torch.profiler.profile`` run with ``profile_memory=True``,
            ``record_shapes=True`` and ``with_stack=True``.
        device: the device whose memory to read.

    Raises:
        ValueError: the recording has no memory events for ``device``.
    """
    from torch.profiler._memory_profiler import Action, TensorKey

    profile = prof._memory_profile()
    categories = profile._categories
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    ids: dict = {}
    rows: list[tuple] = []

    def category(key, version) -> str:
        c = categories.get(key, version) if isinstance(key, TensorKey) else None
        return "UNKNOWN" if c is None else c.name

    for t, action, (key, version), numbytes in profile.timeline:
        if key.device != dev:
            continue
        alloc = ids.setdefault(key, len(ids))
        t_us = -1.0 if t == -1 else t / 1000.0
        if action in (Action.PREEXISTING, Action.CREATE):
            rows.append((t_us, category(key, version), int(numbytes), alloc))
        elif action == Action.INCREMENT_VERSION:
            old, new = category(key, version), category(key, version + 1)
            if old != new:
                rows.append((t_us, old, -int(numbytes), alloc))
                rows.append((t_us, new, int(numbytes), alloc))
        elif action == Action.DESTROY:
            rows.append((t_us, category(key, version), -int(numbytes), alloc))
    if not rows:
        raise ValueError(f"no memory events for {dev} in this recording: profile with "
                         "profile_memory=True, record_shapes=True, with_stack=True")
    first = min((r[0] for r in rows if r[0] >= 0), default=0.0)
    rows = [(first if r[0] < 0 else r[0],) + r[1:] for r in rows]
    rows.sort(key=lambda r: r[0])   # stable: same-time rows keep the profiler's order
    return rows
