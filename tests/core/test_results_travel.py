"""Results travel: a result measured on a GPU machine loads, lists, shows, compares and
plots on a CPU-only one; the machine is checked when a run starts, not when a saved
config is read back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from perflab import RunConfig, compare_results, list_results, load_results, run
from perflab.core.result import RunResult
from perflab.experiment import run_ranks
from perflab.viz.plots import plot_results
from tests.synthetic import synthetic_result

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                                    reason="fakes a CUDA result on a machine without CUDA")

#: What a GPU box writes that this CPU-only machine cannot run.
GPU_FIELDS = {"device": "cuda", "amp": "fp16", "pin_memory": True,
              "compile": "reduce-overhead"}


def _gpu_result_on_disk(tmp_path, label="gpu run", ms=4.0):
    """A saved result whose JSON says it ran on CUDA (faked into the file)."""
    cpu = synthetic_result(RunConfig(device="cpu", model="tiny", batch_size=8, label=label),
                           {"forward": ms, "backward": 2 * ms},
                           env={"device": "cuda", "device_name": "NVIDIA H100"})
    path = Path(cpu.save(tmp_path).path)
    data = json.loads(path.read_text())
    data["config"].update(GPU_FIELDS)
    path.write_text(json.dumps(data))
    return path


@needs_cpu_only
def test_a_cuda_result_loads_lists_compares_and_plots_on_cpu(tmp_path):
    gpu = _gpu_result_on_disk(tmp_path)
    here = synthetic_result(RunConfig(device="cpu", model="tiny", batch_size=8,
                                      label="cpu run"), {"forward": 8.0, "backward": 16.0})
    here.save(tmp_path)

    (loaded,) = load_results(gpu)
    assert loaded.config.device == "cuda" and loaded.config.amp == "fp16"
    assert RunResult.load(gpu).config.pin_memory is True
    assert str(loaded)  # shows
    table = list_results(tmp_path)
    assert sorted(table.label) == ["cpu run", "gpu run"] and not table.attrs["skipped"]
    assert len(compare_results([gpu, here])) == 2
    assert plot_results([gpu, here]) is not None


@needs_cpu_only
def test_a_restored_cuda_config_is_refused_when_a_run_starts(tmp_path, results_dir):
    config = load_results(_gpu_result_on_disk(tmp_path))[0].config
    with pytest.raises(ValueError, match="CUDA is not available"):
        run(config, save=False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_ranks(config, save=False)
    # building one by hand still fails at once, before any work (wrong answer kept out)
    with pytest.raises(ValueError, match="CUDA is not available"):
        RunConfig(device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        config.replace(label="again")


def test_a_restored_config_still_rejects_values_no_machine_runs():
    bad = RunConfig(model="tiny").to_dict() | {"batch_size": 0}
    with pytest.raises(ValueError, match="batch_size"):
        RunConfig.from_dict(bad)


def test_a_missing_dataset_folder_is_checked_at_run_start(tmp_path, results_dir):
    d = RunConfig(model="tiny").to_dict() | {"dataset": str(tmp_path / "gone")}
    config = RunConfig.from_dict(d)  # reads back: the folder was on another machine
    with pytest.raises(ValueError, match="is not a directory"):
        config.check_machine()
    with pytest.raises(ValueError, match="is not a directory"):
        run(config, save=False)
