"""The browser tests' JupyterLab server leaves no process behind when stopped."""
from __future__ import annotations

import os
import signal

import psutil

from .labserver import LabServer


def _gone(procs) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)


def _server(tmp_path) -> LabServer:
    (tmp_path / "root").mkdir()
    return LabServer(tmp_path / "root", tmp_path / "state")


def test_stop_shuts_down_server_and_kernels(tmp_path):
    with _server(tmp_path) as lab:
        assert lab.api("POST", "kernels")["execution_state"] in ("starting", "idle")
        procs = lab.processes()
        assert len(procs) >= 2, procs  # the server and the kernel (in its own session)
    assert lab.proc.returncode is not None and _gone(procs) and not lab.processes()
    lab.stop()  # idempotent


def test_stop_kills_kernels_orphaned_by_a_dead_server(tmp_path):
    lab = _server(tmp_path).start()
    try:
        lab.api("POST", "kernels")
        procs = lab.processes()
        kernels = [p for p in procs if p.pid != lab.proc.pid]
        assert kernels
        os.kill(lab.proc.pid, signal.SIGKILL)  # no API left to shut the kernel down
        lab.proc.wait(timeout=10)
        assert not _gone(kernels)
    finally:
        lab.stop()
    assert _gone(procs)
