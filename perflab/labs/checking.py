"""``calls_to``: record calls to public perflab functions while a block runs.

A check cell uses it to fail an answer that only delegates to the perflab helper the
exercise asks the student to write themselves::

    with perflab.calls_to("train_step", namespace=globals()) as delegated:
        my_loss = my_amp_step(model, x, y, opt, scaler, dtype)
    assert not delegated, "write the autocast + GradScaler step yourself"

While the block runs, the function is replaced by a recording wrapper everywhere a
caller can reach it: in the module that defines it, on ``perflab`` itself, and in
``namespace`` (the notebook's globals: ``from perflab import train_step`` binds the
name there). Everything is restored afterwards, also when the block raises.

Why our own code: ``unittest.mock.patch`` patches one target at a time and would need
the private defining module spelled out in the notebook; this finds it from perflab's
public-name table.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Iterator, MutableMapping

__all__ = ["calls_to"]


@contextmanager
def calls_to(*names: str, namespace: MutableMapping[str, Any] | None = None
             ) -> Iterator[list[str]]:
    """Record calls to the public perflab functions ``names`` inside the block.

    Args:
        names: public perflab names (``from perflab import NAME`` works for each).
        namespace: a globals dict whose bindings of these functions are patched too.

    Yields:
        A list that gets the name of each function as it is called.

    Raises:
        ValueError: a name is not a public perflab function (before anything changes).
    """
    import perflab

    homes = perflab._HOME
    targets = []
    for name in names:
        if name not in homes:
            raise ValueError(f"{name!r} is not a public perflab name; see docs/API.md")
        module = importlib.import_module(f"perflab.{homes[name]}")
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
