"""perflab.distributed: the launcher (and its fault handling), the DDP worker, the CLI.

Ranks are real gloo processes started by the elastic launcher. Fault tests count this
process's rank children (psutil) before and after: none may be left behind.
"""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from perflab.core.config import RunConfig
from perflab.distributed import (LaunchTimeoutError, RankFailedError, launch, launch_fn,
                                 launch_sweep)
from perflab.distributed import faults
from perflab.core.config_flags import parse_straggler
from perflab.distributed.__main__ import main
from perflab.distributed.ddp import check_ddp_config
from perflab.distributed.launch import _innermost_frame
from perflab.viz.rank_plots import plot_loss_vs_prediction, plot_rank_timeline
from perflab.core.simulated import SimulatedLink
from perflab.analysis.overlap import overlap_metrics
from perflab.core.simulated import Straggler
from perflab.core.timing import Stopwatch
from tests.synthetic import synthetic_result

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def _dataset_before_any_launch(tiny_dataset):
    """Build the test dataset first: its builder forks a multiprocessing Pool, and a
    fork after torch.distributed ran in this process can deadlock in the child."""
    return tiny_dataset


def _rank_children() -> set[int]:
    """Processes under this one that are ranks (not multiprocessing's resource tracker
    or the forkserver that launch_fn keeps for the next launch)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if not any(k in " ".join(p.cmdline())
                       for k in ("resource_tracker", "multiprocessing.forkserver"))}


def _nested():
    def local_fn():  # a function typed into a notebook cell is just as unimportable
        return 1
    return local_fn


# -- launch_fn --------------------------------------------------------------------------
@pytest.mark.slow
def test_launch_fn_returns_by_rank_even_with_the_default_port_busy():
    before = _rank_children()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with socket.socket() as s:  # torchrun's default port taken: must not matter
        try:
            s.bind(("127.0.0.1", 29500))
            s.listen()
        except OSError:
            pass  # already busy on this machine: the same situation
        out = launch_fn(faults.rank_and_sum, 2)
    assert out == [(0, 2, 1.0), (1, 2, 1.0)]
    assert _rank_children() == before
    # the elastic agent's signal handlers are gone again (a notebook kernel keeps its own)
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.slow
def test_a_rank_that_raises_is_named_at_once_and_nothing_is_left():
    before = _rank_children()
    with Stopwatch() as sw:
        with pytest.raises(RankFailedError) as info:
            launch_fn(faults.raise_on_rank, 2, args=(1, "boom at step 3"), timeout_s=600)
    # found at the agent's next poll, not by the 600 s watchdog (the bound leaves room for
    # two ranks importing torch on a loaded 2-core machine: 45 s measured)
    assert sw.elapsed_s < 180
    msg = str(info.value)
    assert msg.startswith("rank 1 raised ZeroDivisionError: boom at step 3"), msg
    assert info.value.rank == 1
    assert _rank_children() == before


@pytest.mark.slow
def test_a_hung_rank_is_stopped_by_the_timeout_and_every_rank_reaped():
    before = _rank_children()
    with Stopwatch() as sw:
        with pytest.raises(LaunchTimeoutError) as info:
            launch_fn(faults.hang_on_rank, 2, args=(0,), timeout_s=3)
    assert sw.elapsed_s < 3 + 60     # stopped by the ranks' watchdog, before the backstop
    assert "timeout_s=3" in str(info.value)
    assert "hang_on_rank" in str(info.value)  # the hung rank's stack is in the message
    assert info.value.ranks == [0, 1]  # the hung rank and the one waiting for it
    assert _rank_children() == before


@pytest.mark.slow
def test_a_rank_that_dies_without_an_exception_is_named():
    before = _rank_children()
    # it ran its body (rank0.started), so it is not taken for a rank that failed to start
    with pytest.raises(RankFailedError,
                       match=r"rank 0 died \(exit code 3\) without a Python exception"):
        launch_fn(faults.exit_on_rank, 2, args=(0, 3))
    assert _rank_children() == before


def _died_before_starting(tmp_path) -> RankFailedError:
    """What the launcher reports when rank 0 exited (code 1) without leaving
    ``rank0.started`` (multiprocessing's set-up of the rank failed) and the agent stopped
    rank 1."""
    from torch.distributed.elastic.multiprocessing.errors import (ChildFailedError,
                                                                  ProcessFailure)

    from perflab.distributed.launch import _failure

    failures = {0: ProcessFailure(0, 100, 1, str(tmp_path / "none0.json")),
                1: ProcessFailure(1, 101, -15, str(tmp_path / "none1.json"))}
    return _failure(ChildFailedError("rank_entry", failures), str(tmp_path), 2, 60.0)


def test_a_rank_that_died_before_its_body_names_the_main_guard(tmp_path, monkeypatch):
    """A script without ``if __name__ == "__main__":`` (it runs again in every rank,
    simulated here: the failure as the agent reports it, and this process's __main__)."""
    script = SimpleNamespace(__file__="/home/me/train.py", __spec__=None)
    monkeypatch.setitem(sys.modules, "__main__", script)
    err = _died_before_starting(tmp_path)
    assert isinstance(err, RankFailedError) and err.rank == 0
    msg = str(err)
    assert msg.startswith("rank 0 died (exit code 1) before its rank body started: every "
                          "rank first runs the launching script (/home/me/train.py) again")
    assert 'put the launch under `if __name__ == "__main__":`' in msg
    assert "without a Python exception" not in msg
    # a rank that started and then exited is still told apart
    (tmp_path / "rank0.started").touch()
    assert str(_died_before_starting(tmp_path)).startswith(
        "rank 0 died (exit code 1) without a Python exception")


def test_what_runs_again_in_a_rank_decides_the_likely_cause():
    from perflab.distributed.launch import _before_start_why

    spec = lambda name: SimpleNamespace(name=name)
    assert "(train.py) again" in _before_start_why(SimpleNamespace(__file__="train.py",
                                                                    __spec__=None))
    assert "(tools.train) again" in _before_start_why(SimpleNamespace(
        __file__="/x/tools/train.py", __spec__=spec("tools.train")))  # python -m tools.train
    for main in (SimpleNamespace(__spec__=None),                  # a notebook kernel, -c
                 SimpleNamespace(__file__="/x/tools/__main__.py",
                                 __spec__=spec("tools.__main__"))):  # python -m tools
        why = _before_start_why(main)  # multiprocessing does not run these again
        assert why.startswith("the rank could not import fn's module")
        assert "__main__" not in why


def test_a_launch_inside_a_starting_rank_is_refused_with_the_fix(monkeypatch):
    """What the script's launch does when it runs again inside a rank that multiprocessing
    is still setting up (its ``_inheriting`` flag, simulated here): it refuses at once,
    naming the guard, instead of starting an agent of its own."""
    import multiprocessing
    import multiprocessing.spawn

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match="bootstrapping phase"):  # the flag is theirs
        multiprocessing.spawn._check_not_importing_main()
    before = _rank_children()
    with pytest.raises(RuntimeError, match=r'launch_fn was called while a rank process was '
                       r'starting: .* `if __name__ == "__main__":`'):
        launch_fn(faults.rank_and_sum, 2)
    assert _rank_children() == before


@pytest.mark.slow
def test_a_forked_rank_that_crashes_is_launched_again_with_spawn(tmp_path, monkeypatch):
    import importlib

    launch = importlib.import_module("perflab.distributed.launch")
    monkeypatch.setattr(launch, "_start_method", lambda: "forkserver")
    before = _rank_children()
    with pytest.warns(RuntimeWarning, match="died of SIGSEGV; launching the ranks again"):
        assert launch_fn(faults.segfault_once, 2, args=(str(tmp_path / "crashed"),)) == [0, 1]
    assert _rank_children() == before


def test_a_crash_signal_is_read_from_the_failures():
    from types import SimpleNamespace

    from perflab.distributed.launch import _crash_signal

    failed = lambda *codes: SimpleNamespace(failures={r: SimpleNamespace(exitcode=c)
                                                      for r, c in enumerate(codes)})
    assert _crash_signal(failed(-11, -15)) == "SIGSEGV"
    assert _crash_signal(failed(1, -6)) == "SIGABRT"
    assert _crash_signal(failed(3)) is None and _crash_signal(failed(-9, -15)) is None


def test_innermost_frame_reads_the_main_thread_of_a_dump():
    dump = ('TimeoutError: rank 0 ...\nCurrent thread 0x1 (most recent call first):\n'
            '  File "launch.py", line 94 in fire\n\nThread 0x2 (most recent call first):\n'
            '  File "faults.py", line 36 in hang_on_rank\n  File "x.py", line 1 in f\n')
    assert _innermost_frame(dump) == 'File "faults.py", line 36 in hang_on_rank'
    assert _innermost_frame("no frames") == "(no stack)"


@pytest.mark.parametrize("kwargs, match", [
    (dict(fn=_nested(), world_size=2), "module-level function"),
    (dict(fn=lambda: 1, world_size=2), "module-level function"),
    (dict(fn=faults.rank_and_sum, world_size=0), "world_size must be an int >= 1"),
    (dict(fn=faults.rank_and_sum, world_size=2, timeout_s=0), "timeout_s must be a finite"),
    (dict(fn=faults.rank_and_sum, world_size=2, threads_per_rank=0), "threads_per_rank"),
    (dict(fn=faults.rank_and_sum, world_size=2, backend="mpi"), "backend must be"),
    (dict(fn=faults.rank_and_sum, world_size=64, backend="nccl"), "one GPU per rank"),
])
def test_launch_fn_rejects_bad_arguments_before_starting(kwargs, match):
    before = _rank_children()
    with pytest.raises(ValueError, match=match):
        launch_fn(**kwargs)
    assert _rank_children() == before


# -- the DDP worker ---------------------------------------------------------------------
def _tiny(**kw) -> RunConfig:
    base = dict(model="tiny", image_size=32, batch_size=4, steps=4, warmup_steps=2,
                world_size=2, compute_only=True)
    return RunConfig(**{**base, **kw})


@pytest.mark.slow
def test_launch_trains_every_rank_and_measures_what_the_labs_read(tiny_dataset, tmp_path):
    config = _tiny(dataset=tiny_dataset, straggler=Straggler(rank=1, delay_s=0.02))
    results = launch(config, results_dir=str(tmp_path), progress=False, timeout_s=120)
    assert [r.rank for r in results] == [0, 1]
    for r in results:
        assert {"data", "forward", "backward", "optimizer", "other", "step", "compute",
                "comm", "comm_cpu"} <= set(r.phases)
        assert (r.phases["step"].n == r.phases["compute"].n == r.phases["comm"].n
                == r.phases["comm_cpu"].n == 4)
        assert min(r.phases["comm_cpu"].times_s) >= 0
        assert len(r.losses) == 6 and all(math.isfinite(v) for v in r.losses)
        assert Path(r.path).name.endswith(f"-rank{r.rank}.json")
        b = r.extra["buckets"]
        assert b and [x["index"] for x in b] == list(range(len(b)))
        assert sum(x["nbytes"] for x in b) == r.extra["gradient_bytes"]
        ps = r.extra["per_step"]
        assert {len(v) for v in ps.values()} == {4}
        for c, w, s in zip(ps["compute_s"], ps["wait_s"], ps["step_s"]):
            assert c > 0 and w >= 0 and c + w == pytest.approx(s)
        assert [len(v) for v in r.extra["all_ranks_compute_s"]] == [4, 4]
        assert r.extra["straggler"] == "straggler rank 1 +20 ms before_forward"
        assert r.extra["launch_overhead_s"] > 0
    assert [r.extra["delay_s"] for r in results] == [0.0, 0.02]
    assert results[0].extra["data_seed"] != results[1].extra["data_seed"]
    # DDP kept the replicas identical: same parameters on both ranks at the end
    assert results[0].extra["param_checksum"] == pytest.approx(
        results[1].extra["param_checksum"], rel=1e-6)
    # the delayed rank's compute holds its 20 ms sleep in every step (a lower bound that
    # holds under any load; how long the other rank waits for it moves with the load)
    assert min(results[1].extra["per_step"]["compute_s"]) >= 0.02
    assert results[0].extra["all_ranks_compute_s"] == results[1].extra["all_ranks_compute_s"]


@pytest.mark.parametrize("kw", [
    dict(comm_hook="fp16", accumulation_steps=2, gradient_as_bucket_view=True,
         link=SimulatedLink.preset("1gbe"), bucket_cap_mb=0.001),
    dict(comm_hook="powersgd"),
])
@pytest.mark.slow
def test_hooks_links_and_accumulation_run_and_keep_replicas_equal(tiny_dataset, kw):
    results = launch(_tiny(dataset=tiny_dataset, **kw), save=False, timeout_s=120,
                     progress=kw.get("comm_hook") == "powersgd")  # the bar in this process
    assert results[0].extra["param_checksum"] == pytest.approx(
        results[1].extra["param_checksum"], rel=1e-5)
    assert results[0].extra["per_step"] is None
    buckets = results[0].extra["buckets"]
    assert sum(b["num_params"] for b in buckets) == 8  # the tiny CNN's parameter tensors
    assert len(buckets) > 1 or "bucket_cap_mb" not in kw  # 1 KB buckets: several
    if kw.get("link"):
        assert results[0].extra["link"].startswith("simulated link 1gbe")
        assert results[0].phases["comm"].median > 0
        m = overlap_metrics(results[0])  # every term of this machine's bound measured
        assert m["last_bucket_s"] > 0 and m["comm_cpu_s"] >= 0
        assert m["ideal_machine_s"] >= m["ideal_ddp_s"]


@pytest.mark.parametrize("kw, match", [
    (dict(straggler=Straggler(rank=1, delay_s=0.1), link=SimulatedLink.preset("1gbe")),
     "set link=None"),
    (dict(straggler=Straggler(rank=1, delay_s=0.1), comm_hook="powersgd"),
     "not supported"),
    (dict(straggler=Straggler(rank=1, delay_frac=0.2), warmup_steps=1), "warmup_steps >= 2"),
])
def test_launch_rejects_unsupported_combinations_before_starting(kw, match):
    with pytest.raises(ValueError, match=match):
        launch(_tiny(**kw), save=False)
    with pytest.raises(ValueError, match="backend must be"):
        check_ddp_config(_tiny(), "mpi")


def test_launch_sweep_rejects_empty_or_mixed_configs():
    with pytest.raises(ValueError, match="non-empty list of RunConfig"):
        launch_sweep([])
    with pytest.raises(ValueError, match="non-empty list of RunConfig"):
        launch_sweep(["not a config"])
    with pytest.raises(ValueError, match="must share world_size, device and threads"):
        launch_sweep([_tiny(), _tiny(world_size=3)])


def test_plots_draw_synthetic_ranks_and_reject_runs_without_per_step():
    results = []
    for rank in (0, 1):
        r = synthetic_result(_tiny(), {"forward": 10.0, "backward": 20.0})
        per_step = {"compute_s": [0.03, 0.031], "wait_s": [0.01, 0.0],
                    "step_s": [0.04, 0.031]}
        results.append(dataclasses.replace(r, rank=rank, extra={"per_step": per_step}))
    fig = plot_rank_timeline(results)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]
    with pytest.raises(ValueError, match="straggler run"):
        plot_rank_timeline([dataclasses.replace(results[0], extra={"per_step": None})])
    fig = plot_loss_vs_prediction([0.01, 0.02], [[0.1, 0.11], [0.2, 0.19]], [0.1, 0.2],
                                  ci95=[[(0.0, 0.2), (0.0, 0.2)], [(0.1, 0.3), (0.1, 0.3)]])
    assert fig.axes[0].get_ylabel() == "throughput loss (%)"
    with pytest.raises(ValueError, match="one entry per delay"):
        plot_loss_vs_prediction([0.01], [[0.1, 0.1], [0.2, 0.2]], [0.1])


def test_launch_world_size_argument_overrides_the_config():
    with pytest.raises(ValueError, match="only apply to data-parallel runs"):
        launch(_tiny(straggler=Straggler(rank=1, delay_s=0.1)), world_size=1)


# -- the command line -------------------------------------------------------------------
def test_parse_straggler():
    assert parse_straggler("1:0.05") == Straggler(rank=1, delay_s=0.05)
    assert parse_straggler("0:0.1:data").where == "data"
    for bad in ("1", "x:0.1", "1:0.1:data:extra"):
        with pytest.raises(ValueError, match="RANK:DELAY_S"):
            parse_straggler(bad)


def test_cli_rejects_a_world_size_torchrun_did_not_start(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--model", "tiny", "--world-size", "1"]) == 2
    assert "pass --world-size 2" in capsys.readouterr().err
    assert main(["--model", "tiny", "--straggler", "oops"]) == 2


@pytest.mark.slow
def test_the_same_worker_runs_under_torchrun(tiny_dataset):
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nnodes", "1", "--nproc_per_node", "2", "-m",
           "perflab.distributed", "--preset", "quick", "--model", "tiny", "--steps", "3",
           "--warmup-steps", "2", "--image-size", "32", "--batch-size", "4",
           "--world-size", "2", "--straggler", "1:0.01", "--dataset", tiny_dataset,
           "--no-save", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 ranks, backend gloo" in out.stdout
    assert "compute_ms" in out.stdout


def test_an_empty_error_report_is_no_report(tmp_path):
    """A rank stopped by the agent (SIGTERM) while writing its error file leaves it
    empty: the failure names the rank that died, not an IndexError (seen under load)."""
    from torch.distributed.elastic.multiprocessing.errors import (ChildFailedError,
                                                                  ProcessFailure)

    from perflab.distributed.launch import _failure

    (tmp_path / "rank1.err").write_text("")
    (tmp_path / "rank0.started").touch()  # rank 0 ran its body, then died
    failures = {0: ProcessFailure(0, 100, 3, str(tmp_path / "none0.json")),
                1: ProcessFailure(1, 101, -15, str(tmp_path / "none1.json"))}
    err = _failure(ChildFailedError("rank_entry", failures), str(tmp_path), 2, 60.0)
    assert isinstance(err, RankFailedError) and err.rank == 0
    assert "rank 0 died (exit code 3)" in str(err), str(err)
