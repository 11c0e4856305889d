"""benchmarks/gpu_check.py (`make gpu-check`): on a machine without a CUDA GPU it says so
with torch's own answers and exits 0; its parts list what a GPU machine would run; the
report merges parts run separately."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_says_so_and_exits_0():
    p = subprocess.run([sys.executable, "benchmarks/gpu_check.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "no CUDA GPU here: torch.cuda.is_available() is False" in p.stdout
    assert f"torch.version.cuda = {torch.version.cuda}" in p.stdout


def test_parts_name_every_solution_notebook_and_benchmark():
    labs = gpu_check.part_commands("labs")
    assert [n for n, _, _ in labs] == sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    assert all(env == {"PERFLAB_PRESET": "full"} for _, _, env in labs)
    assert [n for n, _, _ in gpu_check.part_commands("labs", ["03", "05"])] == [
        "03_mixed_precision", "05_torch_compile"]
    for name, cmd, _ in gpu_check.part_commands("benchmarks"):
        assert (ROOT / cmd[-1]).is_file(), name
    (_, cmd, _), = gpu_check.part_commands("tests")
    assert cmd[cmd.index("-m", 2) + 1] == "cuda"


def test_dry_run_lists_commands(capsys):
    assert gpu_check.main(["--dry-run", "--part", "labs", "--labs", "01"]) == 0
    assert "labs: 01_profile_resnet18: PERFLAB_PRESET=full" in capsys.readouterr().out


def test_report_merges_parts(tmp_path):
    gpu_check.write_report("labs", [{"name": "01_x", "status": "passed", "rc": 0, "wall_s": 12.0,
                                     "command": "c", "tail": ""}], tmp_path)
    gpu_check.write_report("figures", {"device": "X", "step_time": {"median_ms": 30.0}}, tmp_path)
    gpu_check.write_report("labs", [{"name": "02_y", "status": "failed", "rc": 1, "wall_s": 3.0,
                                     "command": "c", "tail": ""}], tmp_path)
    rep = json.loads((tmp_path / "report.json").read_text())
    assert set(rep["parts"]) == {"labs", "figures"}
    assert rep["parts"]["labs"]["result"][0]["name"] == "02_y"     # the later run replaced it
    md = (tmp_path / "report.md").read_text()
    assert "| 02_y | failed | 3 |" in md and "**step_time**" in md


def test_a_failing_item_is_reported_not_raised(tmp_path):
    r = gpu_check._run_item("boom", [sys.executable, "-c", "import sys; print('x'); sys.exit(3)"],
                            {}, 30)
    assert r["status"] == "failed" and r["rc"] == 3 and "x" in r["tail"]
    r = gpu_check._run_item("slow", [sys.executable, "-c", "import time; time.sleep(5)"], {}, 0.5)
    assert r["status"] == "timed out"
