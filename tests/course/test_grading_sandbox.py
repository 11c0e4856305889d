"""The grading sandbox (bubblewrap): what a submission can see, write, reach and leave."""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from perflab.course import sandbox
from perflab.course.sandbox import (SANDBOX_WORK, SandboxLimits, _bwrap_has_size, run_sandboxed,
                                    sandbox_status)

needs_bwrap = pytest.mark.skipif(not sandbox_status()[0],
                                 reason=f"no working bubblewrap here: {sandbox_status()[1]}")
request_cleanup: list[Path] = []


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    while request_cleanup:
        shutil.rmtree(request_cleanup.pop(), ignore_errors=True)


LIMITS = SandboxLimits(wall_timeout_s=60, memory_gib=4, nproc=64)

PROBE = r"""
import json, os, socket, sys
secret = sys.argv[1]
out = {"uid": os.getuid(), "secret_dir": sorted(os.listdir(secret)) if os.path.isdir(secret) else None,
       "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
for name, path in [("root_fs", "/usr/perflab-test"), ("secret_write", secret + "/x")]:
    try:
        open(path, "w").write("x")
        out[name] = "written"
    except OSError as e:
        out[name] = type(e).__name__ + str(e.errno)
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    out["net"] = "connected"
except OSError as e:
    out["net"] = "no network"
for name, folder in [("scratch_full", "."), ("tmp_full", "/tmp"), ("shm_full", "/dev/shm")]:
    try:
        with open(os.path.join(folder, "big.bin"), "wb") as f:
            for _ in range(8):
                f.write(b"x" * 2**20)
        out[name] = "written"
    except OSError as e:
        out[name] = type(e).__name__ + str(e.errno)
print("RESULT " + json.dumps(out))
"""


@needs_bwrap
def test_sandbox_hides_folders_is_read_only_and_offline(tmp_path):
    # outside /tmp (which the sandbox replaces anyway), so hiding is what is tested
    base = Path(__file__).resolve().parents[2] / "test-output"
    base.mkdir(exist_ok=True)
    secret = Path(tempfile.mkdtemp(dir=base, prefix="hidden-"))
    request_cleanup.append(secret)
    (secret / "01_solution.ipynb").write_text("the answers")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    limits = dataclasses.replace(LIMITS, tmpfs_gib=4 / 1024)  # 4 MiB each; it writes 8
    run = run_sandboxed([sys.executable, "-c", PROBE, str(secret)], scratch=scratch,
                        env={"PATH": "/usr/bin:/bin"}, limits=limits,
                        log_path=tmp_path / "log.txt", hide=[secret])
    log = (tmp_path / "log.txt").read_text()
    assert run.sandboxed and run.returncode == 0 and "NOT SANDBOXED" not in run.warning, log
    (line,) = [ln for ln in log.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    # scratch, /tmp and /dev/shm are size-limited tmpfs (ENOSPC), where bwrap has --size
    if _bwrap_has_size():
        assert out["scratch_full"] == out["tmp_full"] == out["shm_full"] == "OSError28", out
    assert not (scratch / "big.bin").exists()  # nothing reaches the host's disk
    # outside the allow-list (the checkout's test-output/): not there at all
    assert out["secret_dir"] is None
    assert out["root_fs"] == "OSError30"  # EROFS
    assert out["net"] == "no network"
    assert max(out["pids"]) < 10  # its own PID namespace
    assert (secret / "01_solution.ipynb").read_text() == "the answers"
    assert sorted(p.name for p in secret.iterdir()) == ["01_solution.ipynb"]


@needs_bwrap
def test_sandbox_kills_detached_children_and_never_waits_on_their_pipes(tmp_path):
    scratch = tmp_path / "s"
    scratch.mkdir()
    start = time.monotonic()
    run = run_sandboxed(["sh", "-c", "setsid sleep 987.25 & setsid sh -c 'sleep 987.25' & "
                         "echo started"], scratch=scratch, env={"PATH": "/usr/bin:/bin"},
                        limits=LIMITS, log_path=tmp_path / "log.txt")
    assert run.returncode == 0 and time.monotonic() - start < 20
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if "987.25" in (p.info["cmdline"] or [])]
    assert not left, left


@pytest.mark.slow  # a 2 s wall timeout by design, then a sandbox's start and a 0.5 s wait
@needs_bwrap
def test_sandbox_wall_timeout_kills_the_namespace(tmp_path):
    scratch = tmp_path / "s"
    scratch.mkdir()
    limits = SandboxLimits(wall_timeout_s=2, memory_gib=None)
    run = run_sandboxed(["sh", "-c", "sleep 986.5 & sleep 986.5"], scratch=scratch,
                        env={"PATH": "/usr/bin:/bin"}, limits=limits,
                        log_path=tmp_path / "log.txt")
    assert run.timed_out and run.returncode is None and run.wall_s < 15
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "986.5" in (p.info["cmdline"] or [])]


def test_sandbox_fallback_is_loud_and_required_mode_refuses(tmp_path, monkeypatch):
    scratch = tmp_path / "s"
    scratch.mkdir()
    run = run_sandboxed(["sh", "-c", "echo hi > out.txt"], scratch=scratch,
                        env={"PATH": "/usr/bin:/bin"}, limits=LIMITS,
                        log_path=tmp_path / "log.txt", mode="none")
    assert not run.sandboxed and run.warning.startswith("WARNING: NOT SANDBOXED")
    assert (scratch / "out.txt").read_text() == "hi\n"
    monkeypatch.setattr(sandbox, "sandbox_status", lambda: (False, "bwrap is not installed"))
    with pytest.raises(RuntimeError, match="sandbox required but unavailable: bwrap is not"):
        run_sandboxed(["true"], scratch=scratch, env={}, limits=LIMITS,
                      log_path=tmp_path / "log.txt", mode="bwrap")
    auto = run_sandboxed(["true"], scratch=scratch, env={"PATH": "/usr/bin:/bin"},
                         limits=LIMITS, log_path=tmp_path / "log.txt", mode="auto")
    assert not auto.sandboxed and "bwrap is not installed" in auto.warning


def test_sandbox_inside_path_is_the_scratch_folder():
    assert SANDBOX_WORK.startswith("/tmp/")


def test_two_graders_on_one_machine_claim_different_slot_uids(tmp_path, monkeypatch):
    """A slot uid held by another grader (another process) is skipped, so neither
    grader's kill-by-uid reaches the other's notebook; a released uid is reused."""
    import subprocess

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    holder = subprocess.Popen(  # another grader, holding slot 0's uid until stdin closes
        [sys.executable, "-c",
         "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
         "from perflab.course.sandbox import _claim_uid\n"
         "with _claim_uid(0) as uid:\n"
         "    print(uid, flush=True); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert int(holder.stdout.readline()) == sandbox.SLOT_UID_BASE
        with sandbox._claim_uid(0) as mine:
            assert mine == sandbox.SLOT_UID_BASE + 1
            with sandbox._claim_uid(0) as third:  # a third run, this process: the next
                assert third == sandbox.SLOT_UID_BASE + 2
        with sandbox._claim_uid(1) as again:       # released: slot 1's own uid again
            assert again == sandbox.SLOT_UID_BASE + 1
    finally:
        holder.communicate("", timeout=30)
    with sandbox._claim_uid(0) as free:            # the holder exited: slot 0 is free
        assert free == sandbox.SLOT_UID_BASE
