"""pytest plugin run inside the grading sandbox: report each nbval cell on a private fd.

Loaded with ``-p perflab.course.nbval_channel`` by :mod:`perflab.course.grading`. The
grader opens the verdict channel (a file outside the sandbox, never mounted in it) and
passes only its file descriptor, named by ``$PERFLAB_VERDICT_FD``; this plugin takes the
descriptor, removes the variable, and makes the descriptor non-inheritable, so the
student's kernel (a child process) neither inherits it nor learns its number. The pytest
process also makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): in the sandbox
nothing has ``CAP_SYS_PTRACE``, so the kernel cannot open ``/proc/<pytest>/fd/N`` or
read pytest's memory.

After collection the assembled notebook is deleted: nbval holds every cell in memory,
and each probe (hidden inputs included) reaches the kernel only when it runs.

Each cell's record is one JSON line, written as soon as pytest reports the cell (the
grader learns which cells finished even when it kills the run). A probe cell's record
carries the fact lines it printed; the verdict is computed outside
(:mod:`perflab.course.checks`). After a cell times out or the kernel dies the session
stops: grading gives no points after a hang.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from perflab.course.checks import FACTS_MARKER

ENV_FD = "PERFLAB_VERDICT_FD"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: The line of an IPython traceback that names the exception: ``AssertionError: ...``.
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")
_MAX_MESSAGE = 4000
_channel = None


def _non_dumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def pytest_configure(config) -> None:
    global _channel
    fd = os.environ.pop(ENV_FD, None)
    if fd is None:
        return
    _non_dumpable()
    os.set_inheritable(int(fd), False)
    _channel = os.fdopen(int(fd), "a", encoding="utf-8", buffering=1)


def pytest_collection_finish(session) -> None:
    if _channel is None:
        return
    for path in {str(getattr(item, "fspath", "")) for item in session.items}:
        if path.endswith(".ipynb"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _message(excinfo) -> tuple[str, bool]:
    """(a short message, whether the cell hung or the kernel died)."""
    exc = excinfo.value
    what = str(exc)
    stopped = what.startswith("Timeout") or "Kernel dead" in what
    inner = _ANSI.sub("", str(getattr(exc, "inner_traceback", "") or "")).strip()
    if stopped or not inner:
        return what[:_MAX_MESSAGE], stopped
    lines = [ln.rstrip() for ln in inner.splitlines() if ln.strip()]
    start = max((i for i, ln in enumerate(lines) if _EXC_LINE.match(ln)),
                default=len(lines) - 1)
    return "\n".join(lines[start:])[:_MAX_MESSAGE], stopped


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cell_num = getattr(item, "cell_num", None)
    if _channel is None or cell_num is None or (call.when != "call" and not report.failed):
        return
    message, stopped = _message(call.excinfo) if call.excinfo else ("", False)
    probe = item.cell.get("metadata", {}).get("perflab", {}).get("probe")
    record = {"cell_num": cell_num, "probe": probe, "when": call.when,
              "outcome": report.outcome, "message": message, "stopped": stopped,
              "first_line": item.cell.source.strip().split("\n")[0][:60],
              "seconds": round(call.stop - call.start, 3)}
    if probe:
        text = "".join(o.get("text", "") for o in (getattr(item, "test_outputs", None) or [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        record["facts_lines"] = [ln[:1_100_000] for ln in text.splitlines()
                                 if ln.startswith(FACTS_MARKER)][:5]
    _channel.write(json.dumps(record) + "\n")
    if stopped:
        item.session.shouldstop = f"cell {cell_num}: {message}"
