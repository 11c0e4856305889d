"""A batch that no file can stop (issue 43): what the grader opens, lists and bounds.

* The grader opens only regular files, within a size cap and a time limit
  (:func:`perflab.course.submission.read_submitted_notebook`), and lists the submissions
  folder by names and ``lstat`` only: a named pipe, a notebook at the top, a dot-folder
  each get a row (:func:`perflab.course.grading.student_folders`). No kernel.
* A run's processes together are bounded in memory (a cgroup where the grader can make
  one, else the RSS watchdog) and in output (the log), and the wall-clock limit kills
  every one of them (:func:`perflab.course.sandbox.run_sandboxed`). No kernel: small
  Python and shell commands, a second or less each.
* The nbval plugin stops a kernel that keeps printing past its cell timeout
  (:mod:`perflab.course.nbval_channel`). One kernel.
* One batch through ``perflab course grade`` with all of the above and an endless
  printer: a row and a feedback file for every entry, never blocked. Two graded runs.
"""
from __future__ import annotations

import argparse
import csv
import errno
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from perflab.course import sandbox, submission
from perflab.course.command import add_grade_arguments, grade_command
from perflab.course.grading import (INVALID_PREFIX, student_folders, submitted_labs)
from perflab.course.report import student_file_stem
from perflab.course.sandbox import (SandboxLimits, memory_cap_mechanism, run_sandboxed,
                                    sandbox_status)
from perflab.course.submission import Limits, read_submitted_notebook
from tests.conftest import slow
from tests.course.test_grading import _write, reference_nb, student_nb

HAS_CGROUP = memory_cap_mechanism().startswith("a cgroup")
#: The caps are tested in the sandbox where there is one (its processes join the cgroup
#: inside bubblewrap's namespaces), else unsandboxed; the unsandboxed kills below.
MODE = "bwrap" if sandbox_status()[0] else "none"


def _in_thread(fn, timeout_s: float, release=None):
    """fn() in a daemon thread: its result, or a failure when it is still running after
    ``timeout_s`` (``release()`` then frees it, so the test process can end)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        if release is not None:
            release()
        pytest.fail(f"still running after {timeout_s:g} s: it blocked")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _unblock(fifo: Path):
    """Open a FIFO's other end and close it: a reader blocked on it gets EOF."""
    def release():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    return release


# -- reading a submitted notebook -------------------------------------------------------

def test_read_submitted_notebook_reads_a_regular_notebook(tmp_path):
    nbformat.write(reference_nb(), str(tmp_path / "09_x.ipynb"))
    nb = read_submitted_notebook(tmp_path / "09_x.ipynb")
    assert nb.cells[0].source == "# Lab 09 — synthetic"


def test_read_submitted_notebook_refuses_special_files_without_opening_them(tmp_path):
    fifo = tmp_path / "09_fifo.ipynb"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "09_sock.ipynb"))
    (tmp_path / "09_dir.ipynb").mkdir()
    (tmp_path / "09_link.ipynb").symlink_to(tmp_path / "09_dir.ipynb")
    try:
        for name, kind in [("09_fifo.ipynb", "a named pipe (FIFO)"),
                           ("09_sock.ipynb", "a socket"), ("09_dir.ipynb", "a folder"),
                           ("09_link.ipynb", "a symbolic link")]:
            with pytest.raises(ValueError, match=rf"^{re.escape(f'{name} is {kind}')}, not a "
                                                 r"notebook file; .*put the notebook file"):
                _in_thread(lambda: read_submitted_notebook(tmp_path / name), 10,
                           _unblock(fifo))
        with pytest.raises(ValueError, match="^null is a character device"):
            read_submitted_notebook("/dev/null")
    finally:
        sock.close()


def test_read_submitted_notebook_checks_what_it_opened(tmp_path, monkeypatch):
    """A file swapped between the lstat and the open: a FIFO opens without waiting for a
    writer (O_NONBLOCK) and is refused by fstat; a link is not followed (O_NOFOLLOW)."""
    fifo, link = tmp_path / "09_fifo.ipynb", tmp_path / "09_link.ipynb"
    os.mkfifo(fifo)
    nbformat.write(reference_nb(), str(tmp_path / "real.ipynb"))
    link.symlink_to(tmp_path / "real.ipynb")
    regular = os.lstat(tmp_path / "real.ipynb")
    monkeypatch.setattr(submission.os, "lstat", lambda p: regular)  # it looked regular
    with pytest.raises(ValueError, match=r"09_fifo.ipynb is a named pipe \(FIFO\)"):
        _in_thread(lambda: read_submitted_notebook(fifo), 10, _unblock(fifo))
    with pytest.raises(ValueError, match="09_link.ipynb is a symbolic link"):
        read_submitted_notebook(link)

    def denied(path, flags):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(submission.os, "open", denied)  # any other error of the open
    with pytest.raises(PermissionError):
        read_submitted_notebook(tmp_path / "real.ipynb")


def test_read_submitted_notebook_caps_size_and_time(tmp_path, monkeypatch):
    path = tmp_path / "09_big.ipynb"
    nbformat.write(reference_nb(), str(path))
    size = path.stat().st_size
    with pytest.raises(ValueError, match=r"09_big.ipynb is larger than the 0.000977 MiB "
                                         r"\(1,024 bytes\) the grader reads .*clear its outputs"):
        read_submitted_notebook(path, max_bytes=1024)
    assert read_submitted_notebook(path, max_bytes=size).cells  # exactly the cap: read
    real_fstat, real_read = os.fstat, os.read

    class Small:  # a file that grew after the fstat: reading stops at the cap + 1 byte
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 10

    monkeypatch.setattr(submission.os, "fstat", lambda fd: Small(real_fstat(fd)))
    with pytest.raises(ValueError, match="09_big.ipynb is larger than"):
        read_submitted_notebook(path, max_bytes=size - 1)
    monkeypatch.setattr(submission.os, "fstat", real_fstat)

    def stalled(fd, n):  # a stalled network or FUSE file system
        time.sleep(1.0)
        return real_read(fd, n)

    monkeypatch.setattr(submission.os, "read", stalled)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"09_big.ipynb could not be read within 0.2 s; copy"):
        read_submitted_notebook(path, timeout_s=0.2)
    assert time.monotonic() - start < 0.9

    def broken(fd, n):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(submission.os, "read", broken)
    with pytest.raises(OSError, match="Input/output error"):
        read_submitted_notebook(path)


def test_read_submitted_notebook_refuses_what_is_not_a_notebook(tmp_path):
    (tmp_path / "latin1.ipynb").write_bytes(b'{"caf\xe9": 1}')
    with pytest.raises(ValueError, match=r"latin1.ipynb is not UTF-8 text \(byte 0xe9 at "
                                         r"byte 5\); save the notebook"):
        read_submitted_notebook(tmp_path / "latin1.ipynb")
    (tmp_path / "script.ipynb").write_text("#!/bin/sh\nrm -rf /\n")
    with pytest.raises(ValueError):  # nbformat's NotJSONError
        read_submitted_notebook(tmp_path / "script.ipynb")
    with pytest.raises(FileNotFoundError):
        read_submitted_notebook(tmp_path / "missing.ipynb")


# -- listing the submissions folder -----------------------------------------------------

def _zoo(subs: Path, reference: Path | None = None) -> Path:
    """An ordinary student, a FIFO notebook, a notebook at the top, dot-folders, a FIFO at
    the top, a link, and the hidden files tools leave."""
    nb = student_nb(reference) if reference else reference_nb()
    _write(subs, "grace", nb)
    (subs / "ada").mkdir(parents=True)
    os.mkfifo(subs / "ada" / "09_synthetic.ipynb")
    nbformat.write(nb, str(subs / "09_misplaced.ipynb"))
    for name in ("...", ".ada"):
        _write(subs, name, nb)
    os.mkfifo(subs / "pipe")
    (subs / "zed").symlink_to(subs / "grace")
    (subs / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (subs / "._grace").write_bytes(b"\0\5\26\7")
    (subs / ".ipynb_checkpoints").mkdir()
    (subs / ".Trashes").mkdir()
    (subs / ".gitkeep").touch()
    return subs


def test_every_entry_but_hidden_files_gets_a_row(tmp_path):
    subs = _zoo(tmp_path / "submissions")
    folders = {f.id: f for f in _in_thread(lambda: student_folders(subs), 10)}
    assert sorted(folders) == ["...", ".ada", "09_misplaced.ipynb", "ada", "grace", "pipe",
                               "zed"]
    assert folders["grace"].error == folders["ada"].error == ""  # ada's FIFO: when graded
    assert folders["09_misplaced.ipynb"].error == (
        "refused: '09_misplaced.ipynb' is a file at the top of the submissions folder, not a "
        "student folder; put it in a folder named after the student "
        "(submissions/<student>/09_misplaced.ipynb) and grade again")
    for name in ("...", ".ada"):
        assert folders[name].error.startswith(f"refused: the folder name '{name}' starts "
                                              "with '.', which hides it")
        assert "rename the folder" in folders[name].error
    assert folders["pipe"].error.startswith("refused: 'pipe' is a named pipe (FIFO) at the "
                                            "top of the submissions folder")
    assert "symbolic link" in folders["zed"].error
    assert folders["grace"].twins == () and folders[".ada"].twins == ()  # not ada's twin
    # the lab of a misplaced notebook is a lab someone submitted: its row has a column
    assert submitted_labs(list(folders.values())) == {"09"}


def test_an_entry_with_a_refused_name_keeps_its_own_problem(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / ("x" * 70 + ".ipynb")).write_text("{}")
    (subs / ".DS_Store").touch()
    (f,) = student_folders(subs)
    assert f.id.startswith(INVALID_PREFIX) and "is a file at the top" in f.error
    (subs / f.path.name).unlink()
    with pytest.raises(FileNotFoundError, match="no student folders in"):
        student_folders(subs)  # nothing but hidden files


# -- the caps of one run --------------------------------------------------------------------

# Two processes of 100 MiB each: each under an address-space limit of 1 GiB, together
# over a cap of 0.15 GiB; then a sleep of argv[1] seconds that only the cap cuts short.
HOG = ("import os, sys, time\nos.fork()\nb = [bytearray(2**20) for _ in range(100)]\n"
       "time.sleep(float(sys.argv[1]))")


def _run(tmp_path, cmd, mode=MODE, **limits) -> tuple:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    lim = SandboxLimits(**{"wall_timeout_s": 30, "memory_gib": 1, "nproc": 64, **limits})
    start = time.monotonic()
    run = run_sandboxed(cmd, scratch=scratch, env={"PATH": "/usr/bin:/bin"}, limits=lim,
                        log_path=tmp_path / "log.txt", mode=mode)
    return run, time.monotonic() - start, (tmp_path / "log.txt").read_bytes()


@pytest.fixture(params=["cgroup", "watchdog"])
def mechanism(request, monkeypatch):
    if request.param == "cgroup" and not HAS_CGROUP:
        pytest.skip(f"no cgroup can be made here: {memory_cap_mechanism()}")
    if request.param == "watchdog":
        monkeypatch.setattr(sandbox._MemoryGroup, "make",
                            classmethod(lambda cls, limit: "no cgroup (the test)"))
    return request.param


def test_memory_of_a_runs_processes_together_is_capped(tmp_path, mechanism):
    run, wall, log = _run(tmp_path, [sys.executable, "-c", HOG, "60"], total_memory_gib=0.15)
    # stopped by the grader (None), or ended by the kernel's out-of-memory kill (-9/137)
    assert run.returncode in (None, -9, 137) and not run.timed_out and wall < 10, (run, log)
    assert run.stopped.startswith("its processes together ")
    assert "the memory cap of 0.15 GiB (--total-memory-gib)" in run.stopped
    assert log.endswith(f"[perflab grader] run stopped: {run.stopped}\n".encode())
    # the same processes under a cap they fit in run to their end
    ok, _, _ = _run(tmp_path, [sys.executable, "-c", HOG, "0.2"], total_memory_gib=0.5)
    assert ok.returncode == 0 and ok.stopped == ""


def test_output_is_capped_and_the_log_cut(tmp_path):
    run, wall, log = _run(tmp_path, ["sh", "-c", "yes endless"], output_mib=0.5)
    assert run.returncode is None and wall < 10
    assert run.stopped == ("it wrote more than 0.5 MiB of output (stdout and stderr; the "
                           "output cap, --output-mib)")
    head, marker = log[:2**19], log[2**19:]
    assert head.startswith(b"endless\n") and marker == (
        b"\n[perflab grader] run stopped: " + run.stopped.encode() + b"\n")
    ok, _, log = _run(tmp_path, ["sh", "-c", "echo done"], output_mib=0.5)
    assert ok.returncode == 0 and ok.stopped == "" and log == b"done\n"


def _left(tag: str) -> list:
    time.sleep(0.3)
    return [p for p in psutil.process_iter(["cmdline"]) if tag in (p.info["cmdline"] or [])]


def test_the_wall_clock_limit_kills_the_whole_unsandboxed_tree(tmp_path):
    run, wall, log = _run(tmp_path, ["sh", "-c", "setsid sleep 986.75 & sleep 986.75"],
                          "none", wall_timeout_s=1)
    assert run.timed_out and run.returncode is None and wall < 5
    assert log.endswith(b"[perflab grader] the wall-clock limit (1 s) was reached: the run "
                        b"was killed\n")
    assert not _left("986.75")


@pytest.mark.skipif(not HAS_CGROUP, reason=f"no cgroup here: {memory_cap_mechanism()}")
def test_the_runs_cgroup_kills_a_detached_child_after_the_run_ends(tmp_path):
    """Unsandboxed, a child that detached from a parent that exited escapes the process
    tree; the run's cgroup still holds it. No group is left behind."""
    run, wall, _ = _run(tmp_path, ["sh", "-c", "setsid sh -c 'sleep 986.25' & exit 0"],
                        "none", total_memory_gib=1)
    try:
        assert run.returncode == 0 and run.stopped == ""
        assert not _left("986.25")
    finally:
        for p in _left("986.25"):
            p.kill()
    parents = [parent for _, parent in sandbox._own_cgroups()[0]]
    assert not [g for parent in parents for g in parent.glob(f"perflab-run-{os.getpid()}-*")]


# -- the nbval plugin: a kernel that keeps printing past its timeout -------------------------

STUBBORN = ("import time\nwhile True:\n    try:\n        print('still here')\n"
            "        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass")


@slow  # one kernel: ~5 s alone, more on a loaded machine
def test_a_kernel_printing_past_its_cell_timeout_is_stopped(tmp_path):
    """nbval interrupts the cell at its timeout, then reads output until the kernel is
    idle: a cell that swallows the interrupt and keeps printing kept it reading until the
    wall-clock limit. The plugin stops the kernel a little after the timeout."""
    import json

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(STUBBORN),
                                         nbformat.v4.new_code_cell("print('after')")])
    nbformat.write(nb, str(tmp_path / "stubborn.ipynb"))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    fd = os.open(tmp_path / "channel.jsonl", os.O_WRONLY | os.O_CREAT, 0o600)
    start = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", str(tmp_path / "stubborn.ipynb"), "-c",
             str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-p", "nbval", "-p",
             "perflab.course.nbval_channel", "-p", "no:cacheprovider", "-q", "--color=no",
             "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=1",
             "--perflab-output-mib=64", "--perflab-after-timeout-s=1"],
            pass_fds=[fd], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PERFLAB_VERDICT_FD": str(fd),
                 "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    finally:
        os.close(fd)
    assert time.monotonic() - start < 60, p.stdout[-2000:]
    records = [json.loads(ln) for ln in (tmp_path / "channel.jsonl").read_text().splitlines()]
    assert [r["cell_num"] for r in records] == [0], records  # the session stopped there
    assert records[0]["stopped"] and records[0]["outcome"] == "failed"
    assert records[0]["message"] == (
        "Timeout of 1 seconds exceeded executing cell, and the kernel was still sending "
        "output 1 s after it was interrupted; the kernel was stopped")
    assert 2 <= records[0]["seconds"] < 10


# -- the caps are limits like the others ------------------------------------------------

def test_the_caps_are_validated_described_and_options():
    for field in ("total_memory_gib", "output_mib"):
        for bad in (0, -1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"{field} must be a finite number > 0"):
                Limits(**{field: bad})
    with pytest.raises(ValueError, match="output_mib must be a finite number > 0, got None"):
        Limits(output_mib=None)
    assert Limits(total_memory_gib=None).total_memory_gib is None
    text = Limits().describe()
    assert "6 GiB for its processes together, 64 MiB of output" in text
    parser = argparse.ArgumentParser()
    add_grade_arguments(parser)
    args = parser.parse_args(["subs", "--total-memory-gib", "none", "--output-mib", "2"])
    assert args.total_memory_gib is None and args.output_mib == 2
    for flag, value in [("--total-memory-gib", "0"), ("--output-mib", "nan")]:
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            grade_command(parser.parse_args(["missing", flag, value]))


# -- one batch through the command ----------------------------------------------------------

# It sets `answer`, so the grading process runs it too (it runs only the cells a check
# needs), and then prints without end.
ENDLESS = "answer = 42\nwhile True:\n    print('answer' * 1000)"


@slow  # two notebooks graded (each a grading process and a kernel)
def test_a_batch_no_entry_can_stop(tmp_path, capsys):
    """A FIFO notebook, a notebook at the top, '...' and '.ada' folders, a FIFO at the
    top, an endless printer and an honest student: the batch ends, every entry has a row
    and a feedback file, and each error row says why."""
    ref = tmp_path / "reference"
    ref.mkdir()
    nbformat.write(reference_nb(), str(ref / "09_synthetic.ipynb"))
    subs = _zoo(tmp_path / "submissions", ref)
    (subs / "zed").unlink()
    _write(subs, "printer", student_nb(ref, answer=ENDLESS))
    out = tmp_path / "out" / "scores.csv"
    parser = argparse.ArgumentParser()
    add_grade_arguments(parser)
    args = parser.parse_args([str(subs), "--reference", str(ref), "--out", str(out),
                              "--sandbox", "none", "--jobs", "2", "--cell-timeout", "30",
                              "--wall-timeout", "90", "--output-mib", "1",
                              "--total-memory-gib", "3", "--seed", "7"])
    start = time.monotonic()
    assert _in_thread(lambda: grade_command(args), 240,
                      _unblock(subs / "ada" / "09_synthetic.ipynb")) == 0
    wall = time.monotonic() - start
    printed = capsys.readouterr().out
    assert "memory cap per notebook: 3 GiB for its processes together, held by a " in printed
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    assert sorted(rows) == ["...", ".ada", "09_misplaced.ipynb", "ada", "grace", "pipe",
                            "printer"]
    feedback = sorted(p.name for p in (tmp_path / "out" / "feedback").iterdir())
    assert feedback == sorted(student_file_stem(s) + ".md" for s in rows)
    assert rows["grace"]["total"] == "4" and rows["grace"]["error"] == ""
    assert "09_synthetic.ipynb is a named pipe (FIFO), not a notebook file" in rows["ada"]["error"]
    assert "put it in a folder named after the student" in rows["09_misplaced.ipynb"]["error"]
    assert "starts with '.'" in rows["..."]["error"] and "starts with '.'" in rows[".ada"]["error"]
    assert "is a named pipe (FIFO) at the top" in rows["pipe"]["error"]
    assert {s: r["total"] for s, r in rows.items() if s != "grace"} == dict.fromkeys(
        ["...", ".ada", "09_misplaced.ipynb", "ada", "pipe", "printer"], "0"), rows["printer"]
    # the endless printer: stopped at the output cap in the grading process (the row says
    # so) and in its kernel (the plugin's cap, in the instructor's log and notes)
    assert rows["printer"]["error"] == (
        "lab 09: stopped: it wrote more than 1 MiB of output (stdout and stderr; the output "
        "cap, --output-mib)")
    log = (tmp_path / "out" / "instructor" / "printer-09.log").read_text()
    assert "Output cap: the notebook's cells printed more than 1 MiB" in log
    assert len(log) < 3 * 2**20
    assert "graded 1, errored 6" in printed
    assert wall < 200
