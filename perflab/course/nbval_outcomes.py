"""pytest plugin used by :mod:`perflab.course.grading`: stream each nbval cell's outcome.

Loaded with ``-p perflab.course.nbval_outcomes`` in the grading subprocess. Every cell's
result is appended as one JSON line to ``$PERFLAB_OUTCOMES`` as soon as pytest reports
it, so the cells that finished are known even when the subprocess is killed at its
wall-clock limit (a JUnit XML report is only written at the end of a session). After a
cell times out or the kernel dies, the session stops: later cells would run in a broken
kernel, and grading gives no points after a hang anyway.
"""
from __future__ import annotations

import json
import os
import re

import pytest

ENV_VAR = "PERFLAB_OUTCOMES"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: The line of an IPython traceback that names the exception: ``AssertionError: ...``.
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")


def _message(excinfo) -> tuple[str, bool]:
    """(a short human message, whether the cell hung or the kernel died)."""
    exc = excinfo.value
    what = str(exc)
    stopped = what.startswith("Timeout") or "Kernel dead" in what
    inner = _ANSI.sub("", str(getattr(exc, "inner_traceback", "") or "")).strip()
    if stopped or not inner:
        return what, stopped
    lines = [ln.rstrip() for ln in inner.splitlines() if ln.strip()]
    if what == "Cell outputs differ":
        return f"{what}: " + " | ".join(lines[:8]), stopped
    start = max((i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)), default=len(lines) - 1)
    return "\n".join(lines[start:]), stopped


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get(ENV_VAR)
    cell_num = getattr(item, "cell_num", None)
    if not path or cell_num is None or (call.when != "call" and not report.failed):
        return
    message, stopped = _message(call.excinfo) if call.excinfo else ("", False)
    nbgrader = item.cell.get("metadata", {}).get("nbgrader", {})
    record = {"cell_num": cell_num, "grade_id": nbgrader.get("grade_id"),
              "when": call.when, "outcome": report.outcome, "message": message,
              "stopped": stopped, "first_line": item.cell.source.strip().split("\n")[0][:60]}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    if stopped:
        item.session.shouldstop = f"cell {cell_num}: {message}"
