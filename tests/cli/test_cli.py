"""The perflab command: each subcommand runs, bad flags give RunConfig's errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perflab
from perflab.cli import main
from perflab.core.config_flags import DDP_FIELDS, config_from_args

ROOT = Path(__file__).resolve().parents[2]


def test_doctor(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch_threads" in out and "01 Profile ResNet-18" in out and "08 Capstone" in out
    # the bf16 conclusion comes from the measured roofline, the CPU flags are context
    assert "Roofline of" in out and "bf16 matmul runs at" in out and "(flags: " in out
    assert "bf16 fast" not in out


def test_run_prints_phases_and_saves(tiny_dataset, results_dir, capsys):
    rc = main(["run", "--model", "tiny", "--dataset", tiny_dataset, "--image-size", "32",
               "--batch-size", "4", "--steps", "3", "--warmup-steps", "1", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    for phase in ("data", "forward", "backward", "optimizer", "step"):
        assert phase in out
    saved = list(results_dir.glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["config"]["batch_size"] == 4


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "batch_size must be an int in 2.."),
    (["--prefetch-factor", "2"], "prefetch_factor needs num_workers > 0"),
    (["--dataset", "/nope"], "is not a directory"),
])
def test_bad_flags_clear_errors(flags, message, capsys):
    assert main(["run", *flags]) == 2
    assert message in capsys.readouterr().err


def test_flags_reach_the_config():
    from perflab.cli import build_parser

    args = build_parser().parse_args(["run", "--checkpointing", "2", "--amp", "bf16",
                                      "--channels-last", "--prefetch-factor", "none"])
    cfg = config_from_args(args)
    assert (cfg.checkpointing, cfg.amp, cfg.channels_last, cfg.prefetch_factor) == (
        2, "bf16", True, None)


def test_unknown_choice_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--model", "vgg"])
    assert "invalid choice" in capsys.readouterr().err


def test_profile_command(tiny_dataset, results_dir, capsys):
    rc = main(["profile", "--model", "tiny", "--dataset", tiny_dataset, "--image-size", "32",
               "--batch-size", "4", "--active", "2", "--quiet"])
    assert rc == 0
    assert "forward" in capsys.readouterr().out


def test_data_command(tmp_path, capsys, monkeypatch):
    import perflab.data.dataset as ds

    real = ds.build_dataset
    monkeypatch.setattr(ds, "build_dataset", lambda root, **kw: real(
        root, train_per_class=1, val_per_class=1, **kw))
    assert main(["data", "--root", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "photo-patches" in out and "fingerprint" in out


# -- --version, python -m perflab ------------------------------------------------------
def test_version(capsys):
    import torch

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"perflab {perflab.__version__} (torch {torch.__version__}, Python ")


def test_version_falls_back_to_the_installed_metadata(monkeypatch):
    import importlib.metadata

    from perflab.cli.app import perflab_version

    monkeypatch.delattr(perflab, "__version__")
    assert perflab_version() == importlib.metadata.version("perflab")


def test_python_m_perflab_is_the_same_command():
    out = subprocess.run([sys.executable, "-m", "perflab", "run", "--batch-size", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "perflab run: error: batch_size must be an int in 2.." in out.stderr


# -- data-parallel flags: perflab run routes them, perflab profile does not take them --
def test_ddp_flags_reach_the_config():
    from perflab.cli import build_parser
    from perflab.core.simulated import SimulatedLink
    from perflab.core.simulated import Straggler

    args = build_parser().parse_args(["run", "--world-size", "2", "--link", "1gbe",
                                      "--straggler", "1:0.05:data", "--comm-hook", "fp16",
                                      "--bucket-cap-mb", "5"])
    cfg = config_from_args(args)
    assert cfg.world_size == 2 and cfg.link == SimulatedLink.preset("1gbe")
    assert cfg.straggler == Straggler(rank=1, delay_s=0.05, where="data")
    assert (cfg.comm_hook, cfg.bucket_cap_mb) == ("fp16", 5.0)
    args = build_parser().parse_args(["run", "--world-size", "2", "--link", "none",
                                      "--straggler", "off"])
    cfg = config_from_args(args)
    assert cfg.link is None and cfg.straggler is None


def test_ddp_fields_are_the_ones_runconfig_keeps_for_ddp():
    """Each DDP_FIELDS entry (but world_size itself) is refused by a 1-rank RunConfig."""
    import dataclasses

    from perflab.core.config import RunConfig
    from perflab.core.simulated import SimulatedLink
    from perflab.core.simulated import Straggler

    assert set(DDP_FIELDS) <= {f.name for f in dataclasses.fields(RunConfig)}
    on = {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True, "comm_hook": "fp16",
          "link": SimulatedLink.preset("1gbe"), "straggler": Straggler(rank=0, delay_s=0.1)}
    assert set(on) == set(DDP_FIELDS) - {"world_size"}
    for name, value in on.items():
        with pytest.raises(ValueError, match="only apply to data-parallel runs"):
            RunConfig(**{name: value})
        RunConfig(world_size=2, **{name: value})


@pytest.mark.parametrize("flags, message", [
    (["--link", "1gbe"], "only apply to data-parallel runs; set world_size >= 2"),
    (["--straggler", "0:0.05"], "only apply to data-parallel runs"),
    (["--bucket-cap-mb", "5"], "only apply to data-parallel runs"),
    (["--timeout-s", "5"], "--timeout-s applies to data-parallel runs only; add --world-size"),
    (["--world-size", "2", "--link", "5gbe"], "unknown link preset '5gbe'"),
    (["--world-size", "2", "--straggler", "slow"], "--straggler must be RANK:DELAY_S[:WHERE]"),
    (["--world-size", "2", "--straggler", "2:0.1"], "straggler.rank=2 but world_size=2"),
])
def test_run_refuses_ddp_flags_it_cannot_honour(flags, message, capsys):
    assert main(["run", "--model", "tiny", *flags]) == 2  # before any rank starts
    assert message in capsys.readouterr().err


def test_profile_does_not_take_ddp_flags(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--world-size", "2"])
    assert "unrecognized arguments: --world-size 2" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["perflab run", "python -m perflab.distributed"])
@pytest.mark.parametrize("error", ["failed", "timeout"])
def test_a_failed_launch_is_reported(command, error, monkeypatch, capsys, results_dir):
    import perflab.distributed
    from perflab.distributed import __main__ as ddp_main
    from perflab.distributed.launch import LaunchTimeoutError, RankFailedError

    def fake_launch(config, **kw):
        assert config.world_size == 2 and kw["timeout_s"] == 30.0
        if error == "failed":
            raise RankFailedError("rank 1 failed: ZeroDivisionError: deliberate", 1, {})
        raise LaunchTimeoutError("ranks [0, 1] still running after 30 s; stopped", [0, 1])

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(perflab.distributed, "launch", fake_launch)
    flags = ["--model", "tiny", "--world-size", "2", "--timeout-s", "30"]
    rc = main(["run", *flags]) if command == "perflab run" else ddp_main.main(flags)
    assert rc == 1
    err = capsys.readouterr().err
    assert ("rank 1 failed" if error == "failed" else "still running after 30 s") in err


def test_run_under_torchrun_points_to_the_distributed_entry_point(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    assert main(["run", "--model", "tiny", "--world-size", "2"]) == 2
    assert "-m perflab.distributed --world-size 2" in capsys.readouterr().err


@pytest.mark.slow
def test_run_with_world_size_runs_the_ranks(tiny_dataset, tmp_path):
    """`perflab run --world-size 2` takes python -m perflab.distributed's path (in a
    subprocess: torch.distributed in this process would make later forks unsafe)."""
    cmd = [sys.executable, "-m", "perflab", "run", "--model", "tiny", "--dataset",
           tiny_dataset, "--image-size", "32", "--batch-size", "4", "--steps", "2",
           "--warmup-steps", "1", "--world-size", "2", "--straggler", "1:0.01", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1",
                              "PERFLAB_RESULTS": str(tmp_path / "results")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ranks=2" in out.stdout and "2 ranks, backend gloo" in out.stdout
    assert "compute_ms" in out.stdout and "delay_ms" in out.stdout
    assert len(list((tmp_path / "results").glob("*-rank*.json"))) == 2


def test_distributed_entry_point_shares_the_cli_flags():
    from perflab.distributed import __main__ as ddp_main

    assert ddp_main.config_from_args is config_from_args
    args = ddp_main.build_parser().parse_args(["--world-size", "2", "--link", "ib100"])
    assert config_from_args(args).link.name == "ib100"


@pytest.mark.parametrize("command", ["perflab run", "python -m perflab.distributed"])
def test_run_and_the_distributed_entry_point_print_the_same_rank_table(command, monkeypatch,
                                                                       capsys, results_dir):
    """Both print one row per rank with perflab.distributed.runs.print_rank_results;
    `perflab run` gets the ranks' results from perflab.experiment.run_ranks."""
    import dataclasses

    import perflab.distributed
    import perflab.experiment
    from perflab.core.config import RunConfig
    from perflab.distributed import __main__ as ddp_main
    from tests.synthetic import synthetic_result

    def fake_results(config, **kw):
        assert config.world_size == 2 and kw["timeout_s"] == 30.0 and kw["save"] is False
        r = synthetic_result(RunConfig(model="tiny", world_size=2),
                             {"compute": 2.0, "comm": 1.0})
        return [dataclasses.replace(r, rank=rank, extra={"backend": "gloo", "delay_s": 0.0})
                for rank in range(2)]

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(perflab.experiment, "run_ranks", fake_results)
    monkeypatch.setattr(perflab.distributed, "launch", fake_results)
    flags = ["--model", "tiny", "--world-size", "2", "--timeout-s", "30", "--no-save"]
    rc = main(["run", *flags]) if command == "perflab run" else ddp_main.main(flags)
    assert rc == 0
    out = capsys.readouterr().out
    assert "2 ranks, backend gloo" in out and "compute_ms" in out and "delay_ms" in out


# -- perflab labs, perflab kernel install ----------------------------------------------
def test_labs_command(results_dir, capsys):
    from perflab.labs.catalog import LABS

    assert main(["labs"]) == 0
    out = capsys.readouterr().out
    for lab in LABS:
        assert f"{lab.number}  {lab.title}" in out and lab.question in out
    assert "not measured yet on this machine (run `make check-solutions`" in out
    results_dir.mkdir(parents=True)
    (results_dir / "lab_times.json").write_text(json.dumps({"format": 1, "notebooks": {
        "01": {"seconds": 95.2, "preset": "quick"}}}))
    assert main(["labs"]) == 0
    out = capsys.readouterr().out
    assert "95 s (quick)" in out and "the last test run" in out


def test_labs_command_bad_times_file(results_dir, capsys):
    results_dir.mkdir(parents=True)
    (results_dir / "lab_times.json").write_text("{not json")
    assert main(["labs"]) == 2
    assert "is not a lab-times file" in capsys.readouterr().err


def test_kernel_install(tmp_path, capsys):
    assert main(["kernel", "install", "--prefix", str(tmp_path)]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/perflab/kernel.json").read_text())
    assert spec["display_name"] == "Python (perflab)"
    assert spec["argv"][0] == sys.executable and "ipykernel_launcher" in spec["argv"]
    assert "installed Jupyter kernel 'perflab'" in capsys.readouterr().out


def test_kernel_install_sys_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert main(["kernel", "install", "--sys-prefix", "--name", "perflab-test"]) == 0
    assert (tmp_path / "share/jupyter/kernels/perflab-test/kernel.json").is_file()


def test_kernel_install_bad_name(tmp_path, capsys):
    assert main(["kernel", "install", "--name", "no spaces!", "--prefix", str(tmp_path)]) == 2
    assert "Invalid kernel name" in capsys.readouterr().err


def test_kernel_install_one_place_only(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["kernel", "install", "--sys-prefix", "--prefix", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err


def test_course_grade_is_the_course_command(tmp_path, capsys):
    from perflab.cli import build_parser
    from perflab.course.command import grade_command

    args = build_parser().parse_args(["course", "grade", str(tmp_path), "--jobs", "2"])
    assert args.fn is grade_command and args.jobs == 2
    assert main(["course", "grade", str(tmp_path / "nope"), "--reference",
                 str(ROOT / "solutions")]) == 2
    assert "no submissions folder" in capsys.readouterr().err


def test_profile_tensorboard_flag_is_refused_before_work(capsys):
    """The TensorBoard profiler plugin is gone: the flag fails with the replacement views."""
    from perflab.cli import main
    rc = main(["profile", "--tensorboard", "--dataset", "/nonexistent"])
    err = capsys.readouterr().err
    assert rc != 0 and "--tensorboard" in err and "ui.perfetto.dev" in err
