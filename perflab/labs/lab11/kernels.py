"""Triton where it imports; a stand-in that says why not where it does not.

Triton ships wheels for Linux only (``pip install 'triton>=3.0'``; the repository's ``kernels`` extra). Its interpreter
runs ``@triton.jit`` kernels on CPU tensors, in NumPy, one program at a time
(``TRITON_INTERPRET=1``, read when a kernel is *defined*): it checks indices, masks and
numerics, never speed. :func:`load_triton` sets that variable before importing Triton, on
every machine: the lab's checks (and its grading) run the kernels on CPU tensors. On a
CUDA machine :func:`compiled_kernels` re-defines the same kernels without it, compiled for
the GPU, for the timings.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from typing import Any, Iterator, MutableMapping, Sequence

__all__ = ["load_triton", "compiled_kernels", "count_loads", "TritonMissing"]


class TritonMissing(RuntimeError):
    """Raised when a Triton kernel is launched where Triton is not installed."""


def _stub(reason: str) -> tuple[Any, Any]:
    def jit(fn=None, **kwargs):
        def wrap(f):
            class _Kernel:
                def __getitem__(self, grid):
                    raise TritonMissing(f"{f.__name__} is a Triton kernel: {reason}")

                def __call__(self, *a, **k):
                    raise TritonMissing(f"{f.__name__} is a Triton kernel: {reason}")
            return _Kernel()
        return wrap(fn) if fn is not None else wrap

    def cdiv(a, b):
        return -(-a // b)

    def next_power_of_2(n):
        return 1 << max(0, int(n) - 1).bit_length()

    triton = types.SimpleNamespace(jit=jit, cdiv=cdiv, next_power_of_2=next_power_of_2,
                                   missing=reason)
    tl = types.SimpleNamespace(constexpr=int, float32="float32", bfloat16="bfloat16")
    return triton, tl


def load_triton() -> tuple[Any, Any, str]:
    """``(triton, triton.language, how it runs)``, with ``TRITON_INTERPRET=1`` set first.
    The variable must be set before Triton is imported: a kernel reads it when it is
    defined, but ``triton.language``'s own jitted helpers (``tl.max``, ``tl.sum``) were
    defined at import. So where Triton was imported already without it (``torch.compile``'s
    Inductor imports it), the kernels cannot run in the interpreter: ``triton`` and ``tl``
    are then stand-ins and the reason says to restart the kernel and run this first. Where
    Triton does not import, the same stand-ins: ``@triton.jit`` still decorates, and
    launching the kernel raises :class:`TritonMissing` saying why and where to run it."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        reason = ("Triton was imported before TRITON_INTERPRET=1 was set (torch.compile "
                  "imports it): restart the kernel and run the first cell first")
        return (*_stub(reason), reason)
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        triton = importlib.import_module("triton")
        tl = importlib.import_module("triton.language")
    except ImportError as e:
        where = ("Triton has wheels for Linux only: run this lab on Linux (a lab machine, "
                 "WSL, Colab)" if sys.platform != "linux"
                 else "install it with pip install 'triton>=3.0' (the repository's make setup does)")
        reason = f"Triton does not import here ({type(e).__name__}: {e}); {where}"
        return (*_stub(reason), reason)
    return triton, tl, (f"Triton {triton.__version__} in its interpreter (TRITON_INTERPRET=1): "
                        "NumPy on the CPU, one program at a time; numerics, not speed")


@contextlib.contextmanager
def compiled_kernels(namespace: MutableMapping[str, Any], names: Sequence[str]) -> Iterator[None]:
    """While the block runs, each interpreted kernel ``namespace[name]`` is the same
    function jitted without ``TRITON_INTERPRET`` (compiled for the GPU on first launch),
    and ``TRITON_INTERPRET`` is unset, so the Triton kernels Inductor writes for
    ``torch.compile`` inside the block are compiled too (the variable is read when a
    kernel is defined); the interpreted kernels and the variable are put back after. For
    the GPU timings of kernels defined under the interpreter.

    Raises:
        KeyError: a name not in ``namespace``.
        TypeError: ``namespace[name]`` is not a Triton kernel (has no ``.fn``).
    """
    import triton

    saved = {n: namespace[n] for n in names}
    for n, k in saved.items():
        if not callable(getattr(k, "fn", None)):
            raise TypeError(f"{n} is not a @triton.jit kernel")
    was = os.environ.pop("TRITON_INTERPRET", None)
    try:
        namespace.update({n: triton.jit(k.fn) for n, k in saved.items()})
        yield
    finally:
        namespace.update(saved)
        if was is not None:
            os.environ["TRITON_INTERPRET"] = was


@contextlib.contextmanager
def count_loads() -> Iterator[list[int]]:
    """Under Triton's interpreter: the elements each ``tl.load`` in the block read (a
    masked load counts the lanes its mask lets through), one entry per load. How a check
    sees that a causal kernel skips the tiles above the diagonal: it loads fewer key and
    value elements than the same kernel without the mask.

    Raises:
        RuntimeError: Triton's interpreter does not import.
    """
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError as e:
        raise RuntimeError(f"count_loads needs Triton's interpreter: {e}") from e
    loads: list[int] = []
    plain, masked = InterpreterBuilder.create_load, InterpreterBuilder.create_masked_load

    def create_load(self, ptr, *args, **kwargs):
        loads.append(int(getattr(ptr.data, "size", 1)))
        return plain(self, ptr, *args, **kwargs)

    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        loads.append(int(mask.data.sum()) if mask is not None else int(ptrs.data.size))
        return masked(self, ptrs, mask, *args, **kwargs)

    InterpreterBuilder.create_load, InterpreterBuilder.create_masked_load = create_load, create_masked_load
    try:
        yield loads
    finally:
        InterpreterBuilder.create_load, InterpreterBuilder.create_masked_load = plain, masked
