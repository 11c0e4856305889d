"""Every solution runs whole at the ``tiny`` preset, so that a preset cannot break a lab
unseen: nbval runs the solutions at ``quick`` (the labs' default on a CPU), and the
browser tests run each lab at ``tiny`` only up to its panels (:mod:`.trim`); a cell
after that slice whose sizes come from the preset (a batch of 1 that BatchNorm refuses,
an empty sweep) failed at ``tiny`` alone.

Each notebook runs in a fresh kernel of this environment, in a scratch folder (its
``%%writefile`` modules and results land there), with its hidden tests cleared as
``perflab course build`` clears them for students: they draw their own cases, whatever
the preset, and nbval runs them at ``quick``. The test fails on the first cell that
raises; outputs are not compared. Marked ``slow``: 12-43 s a lab, 312 s for the 11
one after another (one OpenMP thread, 2 cores shared with other jobs, 2026-11-27).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow

from .labserver import solution_notebooks

CELL_TIMEOUT_S = 300


@slow
@pytest.mark.parametrize("notebook", solution_notebooks(), ids=lambda p: p.stem)
def test_solution_runs_whole_at_tiny(notebook: Path, tmp_path, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbgrader.preprocessors import ClearHiddenTests

    nb, _ = ClearHiddenTests().preprocess(nbformat.read(notebook, as_version=4), {})
    monkeypatch.setenv("PERFLAB_PRESET", "tiny")       # the kernel inherits the environment
    monkeypatch.setenv("PERFLAB_RESULTS", str(tmp_path / "results"))
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{notebook.name} at PERFLAB_PRESET=tiny: a cell raised\n{e}",
                    pytrace=False)
