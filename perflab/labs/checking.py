"""Spies on public perflab functions while a block runs: :func:`calls_to` (by patching
the names a caller can reach) and :func:`watch_calls` (by code object, ``sys.setprofile``:
however the function is reached). :func:`resolve` turns a name into the object.

A check cell uses it to fail an answer that only delegates to the perflab helper the
exercise asks the student to write themselves::

    with calls_to("train_step", namespace=globals()) as delegated:
        my_loss = my_amp_step(model, x, y, opt, scaler, dtype)
    assert not delegated, "write the autocast + GradScaler step yourself"

While the block runs, the function is replaced by a recording wrapper everywhere a
caller can reach it: in the module that defines it, on ``perflab`` itself when the name
is on its face, and in ``namespace`` (the notebook's globals: ``from perflab import
train_step`` binds the name there). Everything is restored afterwards, also when the block raises.

Why our own code: ``unittest.mock.patch`` patches one target at a time and would need
the defining module spelled out in the notebook; this finds it from the modules' own
``__all__`` lists.
"""
from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, MutableMapping

__all__ = ["calls_to", "watch_calls", "resolve"]


@contextmanager
def calls_to(*names: str, namespace: MutableMapping[str, Any] | None = None
             ) -> Iterator[list[str]]:
    """Record calls to the public perflab functions ``names`` inside the block.

    Args:
        names: public perflab names: on ``perflab``'s face or in the ``__all__`` of the
            library module that defines them (e.g. ``"count_compiles"``).
        namespace: a globals dict whose bindings of these functions are patched too.

    Yields:
        A list that gets the name of each function as it is called.

    Raises:
        ValueError: a name is in no perflab module's ``__all__``, or is not a function
            (before anything changes).
    """
    import perflab

    targets = []
    for name in names:
        module = _home(name)
        real = getattr(module, name)
        if not callable(real):
            raise ValueError(f"perflab.{name} is not a function: nothing to spy on")
        targets.append((name, module, real))
    calls: list[str] = []
    undo: list[tuple[Any, str, Any, bool]] = []   # (owner, attribute, old, was_there)

    def patch(owner: Any, attr: str, new: Any) -> None:
        if isinstance(owner, MutableMapping):
            undo.append((owner, attr, owner.get(attr), attr in owner))
            owner[attr] = new
        else:
            undo.append((owner, attr, owner.__dict__.get(attr), attr in owner.__dict__))
            setattr(owner, attr, new)

    try:
        for name, module, real in targets:
            def recorder(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any):
                calls.append(_name)
                return _real(*args, **kwargs)

            patch(module, name, recorder)
            if name in perflab.__all__:
                patch(perflab, name, recorder)
            if namespace is not None:
                for key, value in list(namespace.items()):
                    if value is real:
                        patch(namespace, key, recorder)
        yield calls
    finally:
        for owner, attr, old, was_there in reversed(undo):
            if isinstance(owner, MutableMapping):
                if was_there:
                    owner[attr] = old
                else:
                    owner.pop(attr, None)
            elif was_there:
                setattr(owner, attr, old)
            else:
                delattr(owner, attr)


def _codes(obj: Any) -> list[Any]:
    """The Python code objects that run when ``obj`` is called: a function's (unwrapped),
    a class's own ``__init__``/``__call__``/``__new__``. C functions have none."""
    targets = [obj]
    if isinstance(obj, type):
        targets = [obj.__dict__[m] for m in ("__init__", "__call__", "__new__")
                   if m in obj.__dict__]
    out = []
    for fn in targets:
        fn = getattr(fn, "__func__", fn)
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        code = getattr(fn, "__code__", None)
        if code is not None:
            out.append(code)
    return out


@contextmanager
def watch_calls(targets: Mapping[str, Any]) -> Iterator[list[str]]:
    """Record which of ``targets`` (label -> function or class) run inside the block, in
    this thread, however they are reached: an alias, a default argument, a closure, an
    import (``sys.setprofile`` on their code objects, matched by identity: a code object
    whose constants hold a dict, as dynamo makes, cannot be hashed).

    Yields:
        A list that gets each label once, when its code first runs.
    """
    codes: dict[int, str] = {}
    keep = []  # the code objects stay alive while their ids are used
    for label, obj in targets.items():
        for code in _codes(obj):
            codes[id(code)] = label
            keep.append(code)
    hits: list[str] = []
    if not codes:
        yield hits
        return

    def profile(frame, event, arg) -> None:
        if event == "call":
            label = codes.get(id(frame.f_code))
            if label is not None and label not in hits:
                hits.append(label)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield hits
    finally:
        sys.setprofile(old)


def resolve(name: str) -> Any:
    """The object a public perflab name (``"measure"``) or a dotted path
    (``"torch.utils.flop_counter.FlopCounterMode"``) names.

    Raises:
        ValueError: no such public perflab name, or the dotted path does not resolve.
    """
    if "." not in name:
        return getattr(_home(name), name)
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{name!r} does not name an importable object ({e})") from e


def _home(name: str) -> Any:
    """The library module whose ``__all__`` holds ``name`` (modules already imported are
    looked at first).

    Raises:
        ValueError: no library module exports ``name``.
    """
    import sys

    import perflab

    if name in perflab._HOME:
        return importlib.import_module(f"perflab.{perflab._HOME[name]}")
    modules = perflab._library_modules()
    for loaded in (True, False):
        for dotted in modules:
            if (dotted in sys.modules) != loaded:
                continue
            module = importlib.import_module(dotted)
            if name in getattr(module, "__all__", ()):
                return module
    raise ValueError(f"{name!r} is not a public perflab name; see docs/API.md")
