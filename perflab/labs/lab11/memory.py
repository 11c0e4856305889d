"""Peak bytes allocated inside a call, counted by tensor storage, and the aten ops it ran.

On a CPU there is no ``torch.cuda.max_memory_allocated``, and the process's resident
memory moves with the allocator, the OS and other threads. :class:`PeakBytes` is a
``TorchDispatchMode`` (torch/utils/_python_dispatch.py, the mechanism of torch's own
``CommDebugMode`` and ``FlopCounterMode``): every aten op the call runs passes through it,
and it keeps a weak reference to the storage of each output it has not seen before. The
live bytes are the storages created inside the call that are still alive; the peak is
their largest sum after any op. Deterministic: the same call on the same shapes gives the
same count on every machine and under any load. What it does not count: tensors made
before the call (the inputs), memory that never is a tensor (Python objects, the
allocator's slack), and work inside one fused C++ kernel (its temporaries are not aten
outputs): a T x T matrix made by ``torch.matmul`` is an output, so it is counted.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["PeakBytes", "peak_bytes", "FORBIDDEN_OP_MARKERS", "forbidden_ops"]

#: Substrings of aten op names that mean a library attention ran (SDPA's CPU/GPU kernels,
#: flash and efficient attention, flex attention's higher-order op).
FORBIDDEN_OP_MARKERS = ("scaled_dot_product", "flash_attention", "flex_attention",
                        "efficient_attention", "cudnn_attention")


def forbidden_ops(ops: Any) -> list[str]:
    """The names among ``ops`` (aten op names, e.g. ``PeakBytes.ops``) that are a
    library's attention (:data:`FORBIDDEN_OP_MARKERS`), sorted."""
    return sorted({str(o) for o in ops if any(m in str(o) for m in FORBIDDEN_OP_MARKERS)})


class PeakBytes(TorchDispatchMode):
    """``with PeakBytes() as pb: f(...)``: ``pb.peak_bytes`` (int, bytes) is the largest sum
    of the sizes of the tensor storages created inside the block and alive at once, after
    any aten op; ``pb.ops`` the set of aten op names that ran (``"aten.mm.default"``).

    Counted by storage: a view (slice, ``transpose``, ``reshape`` of a contiguous tensor)
    allocates nothing and is not counted; an in-place op writes into its input's storage;
    a storage an op reads before any op inside the block made it (an input, a global)
    is not counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self._outside: set[int] = set()
        self.peak_bytes = 0
        self.ops: set[str] = set()

    def _live_bytes(self) -> int:
        dead = [k for k, (ref, _) in self._live.items() if ref.expired()]
        for k in dead:
            del self._live[k]
        return sum(n for _, n in self._live.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs))[0]:   # storages made before the call: not counted
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                key = t.untyped_storage()._cdata
                if key not in self._live:
                    self._outside.add(key)
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                s = t.untyped_storage()
                key = s._cdata
                if key in self._outside:
                    continue
                if key not in self._live or self._live[key][0].expired():
                    self._live[key] = (StorageWeakRef(s), s.nbytes())
        self.peak_bytes = max(self.peak_bytes, self._live_bytes())
        return out


def peak_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any, set[str]]:
    """Run ``fn(*args, **kwargs)`` under :class:`PeakBytes`, without autograd.

    Returns:
        ``(peak bytes allocated inside the call, fn's result, the aten op names it ran)``.
    """
    with torch.no_grad(), PeakBytes() as pb:
        out = fn(*args, **kwargs)
    return pb.peak_bytes, out, pb.ops
