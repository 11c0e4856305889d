"""What tests/course/test_spy_everywhere.py runs in threads and child processes: importable
(a spawned child imports this module by name), light (the standard library and the one
forbidden perflab helper's module), and nothing at import time."""
from __future__ import annotations

import inspect
import math

from perflab.analysis import stragglers

#: The forbidden helper the tests watch (Lab 07's), and one it does not watch.
FORBIDDEN = "predicted_slowdown"


def delegate(step_s: float = 1.0, delay_s: float = 0.5) -> float:
    """Calls the forbidden helper."""
    return stragglers.predicted_slowdown(step_s, delay_s)


def honest(step_s: float = 1.0, delay_s: float = 0.5) -> float:
    """The same number, written here."""
    return (step_s + delay_s) / step_s


def copy_and_call(step_s: float = 1.0, delay_s: float = 0.5) -> float:
    """Runs the helper's module source again (a second copy of its code) and calls the copy."""
    scope = {"__name__": stragglers.__name__}
    exec(compile(inspect.getsource(stragglers), "<copy>", "exec"), scope)  # noqa: S102
    return scope["predicted_slowdown"](step_s, delay_s)


def square_root(x: float = 2.0) -> float:
    """Calls a C function (``math.sqrt``)."""
    return math.sqrt(x)


class Items:
    """A map-style dataset whose items call ``fn`` (a DataLoader worker runs it)."""

    def __init__(self, fn_name: str, n: int = 2) -> None:
        self.fn_name, self.n = fn_name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        return float(globals()[self.fn_name]())
