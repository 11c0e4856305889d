"""Run a command with a wall-clock and a memory limit, and kill everything it started.

Used by :mod:`perflab.course.grading` to run a student's notebook: the memory limit is an
address-space limit (``RLIMIT_AS``) set in the child before it starts, so every process
it launches (the Jupyter kernel) inherits it; at the wall-clock limit the whole process
tree is killed, including descendants in sessions of their own (Jupyter kernels).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

__all__ = ["run_limited", "kill_tree"]


def _limit_memory(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child, between fork and exec
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def kill_tree(pid: int) -> None:
    """Kill a process and all its descendants, then reap them."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def run_limited(cmd: list[str], *, cwd: Path, env: dict[str, str], wall_timeout_s: float,
                memory_gib: float | None) -> tuple[str, bool]:
    """Run ``cmd``; returns (its stdout and stderr, whether the wall-clock limit hit)."""
    pre = _limit_memory(int(memory_gib * 2**30)) if memory_gib is not None else None
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True, preexec_fn=pre)
    try:
        log, _ = proc.communicate(timeout=wall_timeout_s)
        return log, False
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        log, _ = proc.communicate()
        return log, True
