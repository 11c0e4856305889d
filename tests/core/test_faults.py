"""Fault injection: nothing measured is lost, nothing half-written is left, bad input is
refused before work starts (issue 13).

Each test injects one fault the way a student, instructor or practitioner meets it: a
full disk (a real size-limited tmpfs from bubblewrap where available, else a
monkeypatched ``fsync``), Ctrl-C (SIGINT to a subprocess), two dataset builders and a
reader at once, 40 simultaneous saves, a rank killed with SIGKILL (what the
out-of-memory killer sends), and a killed launcher (a notebook kernel that died).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest

from perflab import RunConfig, RunResult, run
from perflab.core import storage
from perflab.core.paths import EMBEDDED_NAME
from perflab.data.dataset import build_dataset
from perflab.distributed import RankFailedError, faults, launch_fn
from tests.synthetic import synthetic_result

ROOT = Path(__file__).resolve().parents[2]
BWRAP = shutil.which("bwrap")


def _tiny(dataset: str, **kw) -> RunConfig:
    return RunConfig(**{**dict(model="tiny", dataset=dataset, image_size=32, batch_size=4,
                               steps=3, warmup_steps=1), **kw})


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


def _sigint_default() -> None:
    # A job started in the background by a non-interactive shell (`make test &`) has
    # SIGINT ignored, and so would the child: Python then installs no KeyboardInterrupt
    # handler and Ctrl-C tests see nothing. The child gets the default, as in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _python(code: str, *args: str, env: dict | None = None, wrap: list[str] = (),
            **kw) -> subprocess.Popen:
    return subprocess.Popen([*wrap, sys.executable, "-c", textwrap.dedent(code), *args],
                            cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_sigint_default, **kw)


def _bwrap_works() -> bool:
    if BWRAP is None:
        return False
    probe = subprocess.run([BWRAP, "--dev-bind", "/", "/", "--size", "4096", "--tmpfs",
                            "/mnt", "true"], capture_output=True)
    return probe.returncode == 0


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="needs bubblewrap with user "
                                 "namespaces for a size-limited tmpfs (apt-get install "
                                 "bubblewrap); the monkeypatched full-disk test still runs")


# -- full disk ----------------------------------------------------------------------------
def test_full_disk_keeps_the_measurement_and_leaves_no_file(tiny_dataset, tmp_path,
                                                              monkeypatch):
    out = tmp_path / "results"

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", no_space)
    with pytest.warns(RuntimeWarning, match="measured but not saved.*disk is full"):
        result = run(_tiny(tiny_dataset), progress=False, results_dir=str(out))
    assert result.path is None and result.step.n == 3        # kept in memory
    assert _files(out) == []                                  # no 0-byte .json, no .tmp
    monkeypatch.undo()
    again = result.save(tmp_path / "elsewhere")               # and savable once there is room
    assert RunResult.load(again.path).step.times_s == result.step.times_s


@needs_bwrap
def test_full_disk_for_real_on_a_tiny_tmpfs(tiny_dataset):
    """The same on a real full filesystem: a 4 KiB tmpfs as the results folder."""
    code = """
        import os, sys, warnings
        from perflab import RunConfig, run
        warnings.simplefilter("always")
        os.makedirs("/mnt/full")
        try:                                   # fill the filesystem to the last byte
            with open("/mnt/full/filler", "wb") as f:
                while True:
                    f.write(b"x" * 512)
                    f.flush()
        except OSError:
            pass
        cfg = RunConfig(model="tiny", dataset=sys.argv[1], image_size=32, batch_size=4,
                        steps=3, warmup_steps=1)
        r = run(cfg, progress=False, results_dir="/mnt/full")
        print("KEPT", r.path, r.step.n)
        print("LEFT", sorted(os.listdir("/mnt/full")))
    """
    proc = _python(code, tiny_dataset,
                   wrap=[BWRAP, "--dev-bind", "/", "/", "--size", "4096", "--tmpfs", "/mnt"])
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    assert "measured but not saved" in text and "the disk is full" in text, text
    assert "KEPT None 3" in text, text
    assert "LEFT ['filler']" in text, text                    # no 0-byte .json, no .tmp


def test_mmap_cache_on_a_full_disk_is_a_clear_error_and_leaves_no_tmp(tiny_dataset, tmp_path,
                                                                        monkeypatch):
    from perflab.data import cache as cache_mod
    from perflab.data.loader import ImageFolderDataset

    monkeypatch.setenv("PERFLAB_DATA", str(tmp_path / "data"))
    ds = ImageFolderDataset(tiny_dataset, "train")

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "posix_fallocate", no_space)
    with pytest.raises(ValueError, match="cannot reserve .* MiB for the decoded cache"):
        cache_mod.get_cache(ds, 8, "mmap")
    assert [n for n in _files(tmp_path / "data") if n.endswith(".tmp")] == []
    # and when the disk is known to be too small, it is refused before any decoding
    monkeypatch.setattr(storage.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(ValueError, match="decoded cache.*needs .* MiB .* only 0 MiB are free"):
        cache_mod.get_cache(ds, 9, "mmap")


# -- Ctrl-C -------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_during_an_interleaved_comparison_keeps_finished_rounds(tiny_dataset,
                                                                         tmp_path):
    out = tmp_path / "results"
    code = """
        import sys
        from perflab import RunConfig
        from perflab.experiment import run_interleaved
        cfg = RunConfig(model="tiny", dataset=sys.argv[1], image_size=32, batch_size=4,
                        steps=20, warmup_steps=1)
        run_interleaved([cfg, cfg.replace(label="b")], rounds=50, progress=False,
                        results_dir=sys.argv[2])
    """
    proc = _python(code, tiny_dataset, str(out))
    rounds = out / "rounds"
    for _ in range(1200):                                     # up to 120 s under load
        if len(list(rounds.glob("*.json"))) >= 2 or proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=120)
    saved = sorted(rounds.glob("*.json"))
    assert len(saved) >= 2, text
    assert f"saved {len(saved)} finished round(s) in {rounds}" in text, text
    assert all(RunResult.load(p).step.n == 20 for p in saved)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# -- concurrency --------------------------------------------------------------------------
def test_forty_simultaneous_saves_never_overwrite(tmp_path):
    # one result: the same stamp and label for all 40 savers
    result = synthetic_result(RunConfig(model="tiny"), {"forward": 1.0, "backward": 2.0})
    barrier = threading.Barrier(40)
    paths, errors = [], []

    def save() -> None:
        barrier.wait()
        try:
            paths.append(result.save(tmp_path).path)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=save) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(paths)) == 40
    assert len(list(tmp_path.glob("*.json"))) == 40
    assert all(RunResult.load(p).to_dict() == result.to_dict() for p in paths)
    assert [p for p in tmp_path.iterdir() if p.suffix != ".json"] == []


def test_two_builders_and_a_reader_never_see_a_half_swapped_dataset(tmp_path):
    small = dict(train_per_class=3, val_per_class=1, progress=False, processes=1)
    build_dataset(tmp_path, **small)
    final = tmp_path / EMBEDDED_NAME
    stop, failures, reads = threading.Event(), [], [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                manifest = json.loads((final / "manifest.json").read_text())
                for split, per_class in manifest["counts"].items():
                    for cls, n in per_class.items():
                        for i in range(n):
                            (final / split / cls / f"{cls}_{i:05d}.jpg").read_bytes()
                reads[0] += 1
            except OSError as e:
                failures.append(repr(e))

    code = """
        import sys
        from perflab.data.dataset import build_dataset
        build_dataset(sys.argv[1], train_per_class=3, val_per_class=1, processes=1,
                      force=True, progress=True)
        print("BUILT")
    """
    t = threading.Thread(target=reader)
    t.start()
    try:
        builders = [_python(code, str(tmp_path)) for _ in range(2)]
        texts = [b.communicate(timeout=300)[0] for b in builders]
    finally:
        stop.set()
        t.join()
    assert all(b.returncode == 0 and "BUILT" in text for b, text in zip(builders, texts)), texts
    assert failures == [] and reads[0] > 0
    versions = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{EMBEDDED_NAME}.v-")]
    assert versions == [os.readlink(final)]                    # old versions cleaned up
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_second_builder_waits_and_then_reuses_the_set(tmp_path):
    code = """
        import sys
        from perflab.data.dataset import build_dataset
        m = build_dataset(sys.argv[1], train_per_class=20, val_per_class=2, processes=1,
                          progress=True)
        print("SHA", m["sha256"])
    """
    builders = [_python(code, str(tmp_path)) for _ in range(2)]
    texts = [b.communicate(timeout=300)[0] for b in builders]
    shas = {line for text in texts for line in text.splitlines() if line.startswith("SHA")}
    assert len(shas) == 1, texts
    versions = [p for p in tmp_path.iterdir() if p.name.startswith(f".{EMBEDDED_NAME}.v-")]
    assert len(versions) == 1                                  # built once, not twice


# -- the launcher -------------------------------------------------------------------------
def _rank_pids(proc: psutil.Process) -> list[int]:
    """The ranks under ``proc``: spawned ones, or children of launch_fn's forkserver."""
    try:
        return [c.pid for c in proc.children(recursive=True)
                if "spawn_main" in " ".join(c.cmdline())
                or "multiprocessing.forkserver" in " ".join(c.parent().cmdline())]
    except psutil.Error:
        return []


@pytest.mark.slow
def test_a_sigkilled_rank_is_named_as_the_cause():
    with pytest.raises(RankFailedError) as info:
        launch_fn(faults.sigkill_on_rank, 2, args=(1,))
    msg = str(info.value)
    assert info.value.rank == 1, msg
    # spawned ranks: the agent sees rank 1's SIGKILL first; forkserver ranks: rank 0's
    # "connection reset" may come first, and rank 1 is named as the rank that left none
    assert (msg.startswith("rank 1 died (signal SIGKILL) without a Python exception")
            or msg.startswith("rank 1 died without a Python exception (its peers lost")), msg
    assert "out-of-memory killer" in msg and "lower batch_size" in msg


@pytest.mark.slow
def test_ranks_die_with_a_killed_launcher(tmp_path):
    code = """
        import sys
        from perflab.distributed import faults, launch_fn
        launch_fn(faults.sleep_on_every_rank, 2, args=(300, sys.argv[1]), timeout_s=600)
    """
    proc = _python(code, str(tmp_path))
    parent = psutil.Process(proc.pid)
    pids: list[int] = []
    for _ in range(1800):                                      # ranks start (under load: slow)
        if len(list(tmp_path.glob("rank*.ready"))) == 2:
            pids = _rank_pids(parent)
            break
        time.sleep(0.1)
    assert len(pids) == 2, proc.communicate(timeout=5)[0] if proc.poll() is not None else pids
    proc.kill()                                                # SIGKILL: no clean-up runs
    proc.wait()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                    timeout=15)
    for p in alive:
        p.kill()
    assert alive == [], "ranks outlived their launcher"


@pytest.mark.slow
def test_launch_leaves_no_temp_folder_and_warns_when_oversubscribed(monkeypatch, tmp_path):
    # a private temp folder: other tests' launches (pytest-xdist) make their own meanwhile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("perflab-launch-*")) | set(tmp.glob("perflab-progress-*"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with pytest.warns(RuntimeWarning, match="2 ranks x 1 thread.*on 1 usable core.*"
                                            "oversubscribed"):
        assert launch_fn(faults.rank_and_sum, 2) == [(0, 2, 1.0), (1, 2, 1.0)]
    after = set(tmp.glob("perflab-launch-*")) | set(tmp.glob("perflab-progress-*"))
    assert after - before == set()


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), True, -1])
def test_launch_refuses_a_timeout_that_is_not_a_finite_positive_number(timeout_s):
    with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds"):
        launch_fn(faults.rank_and_sum, 2, timeout_s=timeout_s)


# -- bad input refused before work ---------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(results_dir="/proc/perflab-cannot-write-here"), "results_dir=.* is not writable"),
    (dict(save="yes"), "save must be True or False"),
    (dict(results_dir=5), "results_dir must be a folder path"),
])
def test_run_refuses_a_bad_destination_before_training(tiny_dataset, monkeypatch, kwargs,
                                                       match):
    import perflab.train.loop as loop_mod

    def must_not_build(*a, **k):
        raise AssertionError("training started before the destination was checked")

    monkeypatch.setattr(loop_mod, "build_training", must_not_build)
    with pytest.raises(ValueError, match=match):
        run(_tiny(tiny_dataset), progress=False, **kwargs)


def test_results_dir_that_is_a_file_is_refused(tiny_dataset, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        run(_tiny(tiny_dataset), progress=False, results_dir=str(f))


def test_dataset_root_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(ValueError, match="root=.* is a file, not a folder"):
        build_dataset(f, train_per_class=1, val_per_class=1, progress=False)


def test_a_diverging_run_warns():
    import dataclasses

    from perflab.experiment import _warn_diverged

    ok = synthetic_result(RunConfig(model="tiny", lr=50.0), {"forward": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_diverged(ok)                                    # finite losses: silent
    bad = dataclasses.replace(ok, losses=(2.3, 40.0, float("nan"), float("nan")))
    with pytest.warns(RuntimeWarning, match=r"loss became nan at step 2 \(training "
                                            r"diverged\): lower lr \(now 50\)"):
        _warn_diverged(bad)


def test_perflab_data_with_a_file_as_root_is_an_error_not_a_traceback(tmp_path, capsys):
    from perflab.cli import main

    f = tmp_path / "a-file"
    f.write_text("x")
    assert main(["data", "--root", str(f), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "perflab data: error: root=" in err and "is a file, not a folder" in err
    assert "Traceback" not in err


def test_ctrl_c_in_a_cli_command_says_where_results_are_and_exits_130(monkeypatch, capsys,
                                                                      results_dir):
    import perflab.cli.results as results_mod
    from perflab.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(results_mod, "cmd_results", interrupted)
    assert main(["results"]) == 130
    err = capsys.readouterr().err
    assert f"interrupted; results measured so far are in {results_dir}" in err
    assert "Traceback" not in err
