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

The kernel's output is bounded here too. nbval has no hook per output message: it reads
every message of the kernel through one method, ``RunningKernel.get_message(stream,
timeout)`` (nbval 0.11), keeps a cell's output in the pytest process's memory, and waits
for the cell's reply on the shell channel for the whole cell timeout before it reads any
output, so a kernel that prints without end fills both processes' queues. This plugin
wraps that one method on the notebook's kernel (:class:`OutputGuard`): while nbval waits
for a reply it reads the output as it comes, counting it, and stops the kernel (the cell
fails with :class:`CellStopped`, the session stops) when

* the notebook's output passes ``--perflab-output-mib`` (stream text, rich data and
  tracebacks, in characters; a cell's share counts towards it), or
* a cell runs :data:`AFTER_TIMEOUT_S` past nbval's cell timeout: nbval interrupts the
  kernel at the timeout and then reads until the kernel is idle, which a cell that
  catches ``KeyboardInterrupt`` and keeps printing never is.

A kernel started by another nbval (no such method) is left alone: the sandbox's memory
and output caps and its wall-clock limit (:mod:`perflab.course.sandbox`) still hold.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import time
from queue import Empty

import pytest

from perflab.course.checks import FACTS_MARKER

__all__ = ["ENV_FD", "OUTPUT_OPTION", "AFTER_TIMEOUT_S", "CellStopped", "OutputGuard"]

ENV_FD = "PERFLAB_VERDICT_FD"
#: The pytest option capping the kernel's output for the whole notebook, MiB.
OUTPUT_OPTION = "--perflab-output-mib"
#: Seconds a cell may go on after nbval's cell timeout before its kernel is stopped
#: (nbval waits up to 5 s for each message of an interrupted cell).
AFTER_TIMEOUT_S = 10.0
#: While nbval waits for a cell's reply, the output is read every this many seconds.
_SLICE_S = 0.1
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


class CellStopped(Exception):
    """The plugin stopped the kernel: the notebook's output passed its cap, or a cell
    ran :data:`AFTER_TIMEOUT_S` past its timeout."""


def _size(msg: dict) -> int:
    """Characters of output in one iopub message (0 for status and echo messages)."""
    kind, content = msg.get("msg_type", ""), msg.get("content") or {}
    if kind in ("status", "execute_input", "clear_output"):
        return 0
    if kind == "stream":
        text = content.get("text")
        return len(text) if isinstance(text, str) else len(json.dumps(text, default=str))
    return len(json.dumps(content, default=str))


class OutputGuard:
    """Counts the output a notebook's kernel sends and stops the kernel above the cap or
    long after a cell's timeout (see the module docstring).

    Args:
        cap_chars: the notebook's output cap, characters; None: no cap.
        cell_timeout_s: nbval's cell timeout, seconds; None: no time guard.
        after_timeout_s: how long a cell may go on after ``cell_timeout_s``.
    """

    def __init__(self, cap_chars: int | None, cell_timeout_s: float | None,
                 after_timeout_s: float = AFTER_TIMEOUT_S) -> None:
        self.cap_chars, self.cell_timeout_s = cap_chars, cell_timeout_s
        self.after_timeout_s = after_timeout_s
        self.used = 0
        self.cell_started: float | None = None
        self.pending: collections.deque = collections.deque()
        self.kernel = None

    def watch(self, kernel) -> bool:
        """Wrap ``kernel.get_message`` (once); False when the kernel has no such method."""
        if kernel is self.kernel:
            return True
        get = getattr(kernel, "get_message", None)
        if get is None:
            return False
        self.kernel = kernel
        guard = self

        def get_message(stream, timeout=None):
            guard.check_time()
            if stream == "iopub":
                if guard.pending:
                    return guard.pending.popleft()
                msg = get(stream, timeout=timeout)
                guard.count(msg)
                return msg
            # the shell channel: wait for the reply in slices, reading the output between
            end = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise Empty
                try:
                    return get(stream, timeout=_SLICE_S if left is None else min(_SLICE_S, left))
                except Empty:
                    if guard.cap_chars is not None:  # uncapped: leave it queued, as nbval
                        guard.drain(get)
                    guard.check_time()

        kernel.get_message = get_message
        return True

    def drain(self, get) -> None:
        """Read the output waiting now into ``pending``, counting it (the cap bounds it)."""
        for _ in range(10_000):
            try:
                msg = get("iopub", timeout=0)
            except Empty:
                return
            self.count(msg)
            self.pending.append(msg)

    def count(self, msg: dict) -> None:
        self.used += _size(msg)
        if self.cap_chars is not None and self.used > self.cap_chars:
            self.stop(f"Output cap: the notebook's cells printed more than "
                      f"{self.cap_chars / 2**20:g} MiB (--perflab-output-mib); the kernel was "
                      "stopped")

    def check_time(self) -> None:
        if self.cell_started is None or self.cell_timeout_s is None:
            return
        if time.monotonic() - self.cell_started > self.cell_timeout_s + self.after_timeout_s:
            self.stop(f"Timeout of {self.cell_timeout_s:g} seconds exceeded executing cell, "
                      f"and the kernel was still sending output {self.after_timeout_s:g} s "
                      "after it was interrupted; the kernel was stopped")

    def stop(self, why: str) -> None:
        self.pending.clear()
        kernel, self.kernel = self.kernel, None
        try:
            kernel.stop()  # SIGKILL, then nbval sees a dead kernel
        except Exception:  # noqa: BLE001 - already gone; the cell fails either way
            pass
        raise CellStopped(why)


_guard: OutputGuard | None = None


def pytest_addoption(parser) -> None:
    parser.addoption(OUTPUT_OPTION, type=float, default=None, metavar="MIB",
                     help="perflab grading: stop the kernel when the notebook's output "
                          "passes this many MiB (characters)")
    parser.addoption("--perflab-after-timeout-s", type=float, default=AFTER_TIMEOUT_S,
                     help=argparse.SUPPRESS)  # the tests shorten it


def pytest_configure(config) -> None:
    global _channel, _guard
    cap = config.getoption(OUTPUT_OPTION, None)
    timeout = getattr(config.option, "nbval_cell_timeout", None)
    _guard = OutputGuard(None if cap is None else int(cap * 2**20),
                         None if timeout is None else float(timeout),
                         config.getoption("--perflab-after-timeout-s", AFTER_TIMEOUT_S))
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    kernel = getattr(getattr(item, "parent", None), "kernel", None)
    if _guard is not None and kernel is not None and getattr(item, "cell_num", None) is not None:
        _guard.watch(kernel)
        _guard.cell_started = time.monotonic()
    yield
    if _guard is not None:
        _guard.cell_started = None


def _message(excinfo) -> tuple[str, bool]:
    """(a short message, whether the cell hung, the kernel died or was stopped)."""
    exc = excinfo.value
    what = str(exc)
    if isinstance(exc, CellStopped):
        return what[:_MAX_MESSAGE], True
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
    if call.when == "call":
        item.test_outputs = None  # read above; nbval keeps every item to the session's end
    if stopped:
        item.session.shouldstop = f"cell {cell_num}: {message}"
