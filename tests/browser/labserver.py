"""A throw-away JupyterLab server for the browser tests.

It listens on 127.0.0.1 on a free port with a random token, keeps its runtime, config,
settings and workspace folders in a temporary directory, serves a copy of the notebooks
(JupyterLab autosaves: the sources are never opened), and :meth:`LabServer.stop` leaves
no process behind: kernels are shut down through the API, then the server's process
group is killed, then any process that descended from it (kernels run in sessions of
their own).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output" / "browser"  # screenshots and the server log

# User settings: every cell stays in the DOM (JupyterLab 4 virtualises long notebooks
# otherwise), no autosave, no news or update prompts over the page.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


def solution_notebooks() -> list[Path]:
    return sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """``with LabServer(notebooks_dir, tmp) as lab: lab.url_for("01_x.ipynb")``."""

    def __init__(self, root: Path, tmp: Path, *, env: dict[str, str] | None = None,
                 log: Path | None = None, startup_timeout_s: float = 120.0):
        self.root, self.tmp = Path(root).resolve(), Path(tmp).resolve()
        self.port, self.token = free_port(), secrets.token_hex(24)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log or self.tmp / "jupyterlab.log"
        self.extra_env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self._seen: dict[int, psutil.Process] = {}

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "LabServer":
        settings = self.tmp / "user-settings"
        for rel, values in SETTINGS.items():
            (settings / rel).parent.mkdir(parents=True, exist_ok=True)
            (settings / rel).write_text(json.dumps(values))
        for d in ("runtime", "config", "workspaces", "ipython"):
            (self.tmp / d).mkdir(parents=True, exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        env = {**os.environ, **self.extra_env,
               "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
               "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
               "JUPYTER_CONFIG_DIR": str(self.tmp / "config"),
               "IPYTHONDIR": str(self.tmp / "ipython")}
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ServerApp.open_browser=False", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}",
               f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={self.tmp / 'workspaces'}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}; see "
                                   f"{self.log_path}:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.api("GET", "status")
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"JupyterLab did not answer within "
                                       f"{self.startup_timeout_s:g} s; see {self.log_path}")
                time.sleep(0.5)

    def __enter__(self) -> "LabServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def processes(self) -> list[psutil.Process]:
        """The server and everything it started that is alive now (also remembered, so
        that :meth:`stop` finds kernels even after the server has gone)."""
        if self.proc is None:
            return []
        try:
            server = psutil.Process(self.proc.pid)
            for p in [server, *server.children(recursive=True)]:
                self._seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass
        return [p for p in self._seen.values() if _alive(p)]

    def stop(self) -> None:
        """Shut down kernels and the server; kill whatever is left. Idempotent."""
        if self.proc is None:
            return
        self.processes()
        if self.proc.poll() is None:
            try:
                self.shutdown_kernels()
            except OSError:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        for p in self._seen.values():
            if _alive(p):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        psutil.wait_procs(list(self._seen.values()), timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)
        self._log.close()

    # -- REST API --------------------------------------------------------------------
    def api(self, method: str, path: str, timeout_s: float = 10.0):
        req = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                     data=b"{}" if method == "POST" else None,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for k in self.api("GET", "kernels"):
            self.api("DELETE", f"kernels/{k['id']}", timeout_s=30)
        self.processes()

    def url_for(self, notebook: str) -> str:
        """The notebook alone in a fresh workspace of its own (no tabs restored from an
        earlier page)."""
        workspace = Path(notebook).stem.replace("_", "-")
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
