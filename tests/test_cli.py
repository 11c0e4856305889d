"""The perflab command: each subcommand runs, bad flags give RunConfig's errors."""
from __future__ import annotations

import json

import pytest

from perflab.cli import main


def test_doctor(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch_threads" in out and "01 Profile ResNet-18" in out and "08 Capstone" in out


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
    (["--batch-size", "0"], "batch_size must be an int >= 2"),
    (["--prefetch-factor", "2"], "prefetch_factor needs num_workers > 0"),
    (["--dataset", "/nope"], "is not a directory"),
])
def test_bad_flags_clear_errors(flags, message, capsys):
    assert main(["run", *flags]) == 2
    assert message in capsys.readouterr().err


def test_flags_reach_the_config():
    from perflab.cli import _config_from, build_parser

    args = build_parser().parse_args(["run", "--checkpointing", "2", "--amp", "bf16",
                                      "--channels-last", "--prefetch-factor", "none"])
    cfg = _config_from(args)
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
    import perflab.dataset as ds

    real = ds.build_dataset
    monkeypatch.setattr(ds, "build_dataset", lambda root, **kw: real(
        root, train_per_class=1, val_per_class=1, **kw))
    assert main(["data", "--root", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "photo-patches" in out and "fingerprint" in out
