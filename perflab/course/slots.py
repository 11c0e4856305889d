"""The sandbox's processes: a slot uid per parallel run, claimed machine-wide, and
killing everything a run left behind (its process group, its uid's processes, or, when
unsandboxed, its descendants). Used by :mod:`perflab.course.sandbox`."""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SLOT_UID_BASE", "SLOT_UIDS", "claim_uid", "kill_group", "kill_uid",
           "kill_children", "processes_of"]

#: Unprivileged uid of parallel slot k (when the grader runs as root): SLOT_UID_BASE + k.
SLOT_UID_BASE = 61000
#: How many slot uids the graders on one machine share (see ``_claim_uid``).
SLOT_UIDS = 64


def processes_of(uid: int) -> int:
    import psutil

    n = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                n += p.info["num_threads"] or 1
        except psutil.Error:
            pass
    return n


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the sandbox: bwrap's process group; --die-with-parent takes the namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def kill_uid(uid: int) -> None:
    """Kill every process left with this slot's uid (belt and braces after bwrap)."""
    import psutil

    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                p.kill()
        except psutil.Error:
            pass


@contextlib.contextmanager
def claim_uid(slot: int):
    """Hold a slot uid for this run, machine-wide, and yield it.

    Two graders on one machine (two ``perflab course grade`` processes, or two pytest-xdist
    workers) both number their slots from 0; each run kills every process of its uid
    before and after it runs, so sharing a uid would kill the other grader's notebook.
    Each uid has a lock file (``flock``, released by the kernel when the holder dies):
    the run takes the first free uid from ``SLOT_UID_BASE + slot`` on, and waits for its
    own when all :data:`SLOT_UIDS` are taken. Where the lock folder cannot be made, the
    slot's own uid is used unlocked (the behaviour before locks)."""
    folder = Path(tempfile.gettempdir()) / "perflab-sandbox-slots"
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
    except OSError:
        yield SLOT_UID_BASE + slot
        return
    order = [SLOT_UID_BASE + (slot + k) % SLOT_UIDS for k in range(SLOT_UIDS)]
    for i, uid in enumerate(order):
        f = open(folder / f"{uid}.lock", "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if i < len(order) - 1 else 0))
        except BlockingIOError:
            f.close()
            continue
        break
    else:  # unreachable: the last try blocks until its uid is free
        raise AssertionError("no slot uid claimed")
    try:
        yield uid
    finally:
        f.close()  # releases the lock


def kill_children(pid: int) -> None:
    """Unsandboxed fallback only: kill a live process's descendants. A child that
    detached and whose parent exited escapes this (one reason bubblewrap is preferred)."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
