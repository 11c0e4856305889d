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

A notebook whose code reads the preset only to ask whether it is ``"full"``
(``PRESET == "full"``, ``PRESET != "full"``, or printing it) runs the same cells with the
same sizes at ``tiny`` as at ``quick``, which nbval already runs: it is left out
(:func:`tiny_runs_as_quick` decides from the code, each run; 07-10 today, about 140 s of
the 312 s).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow

from .labserver import solution_notebooks

CELL_TIMEOUT_S = 300
#: How a notebook may read PRESET and still run at ``tiny`` exactly as at ``quick``: its
#: definition, a comparison with "full", or a display inside an f-string.
_SAME_AS_QUICK = re.compile(r'PRESET\s*=\s*os\.environ\.get\(|PRESET\s*[!=]=\s*"full"|\{PRESET(!r)?\}')


def tiny_runs_as_quick(nb) -> bool:
    """True when every use of the preset in the notebook's code is one of
    :data:`_SAME_AS_QUICK`'s (or it never reads PERFLAB_PRESET at all)."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    if "PERFLAB_PRESET" not in code:
        return True
    uses = len(re.findall(r"\bPRESET\b", code))
    return uses == len(_SAME_AS_QUICK.findall(code))


def _differs_at_tiny() -> list[Path]:
    return [p for p in solution_notebooks()
            if not tiny_runs_as_quick(nbformat.read(p, as_version=4))]


def test_the_notebooks_run_at_tiny_are_those_whose_code_reads_the_preset():
    picked = {p.stem[:2] for p in _differs_at_tiny()}
    assert {"00", "01", "02", "03", "04", "05"} <= picked, picked   # RunConfig.preset(PRESET)
    for snippet, same in [('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nQUICK = PRESET != "full"', True),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nprint(f"{PRESET!r}")', True),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nc = RunConfig.preset(PRESET)', False),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nn = 8 if PRESET == "tiny" else 16', False),
                          ("x = 1", True)]:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(snippet)])
        assert tiny_runs_as_quick(nb) is same, snippet


@slow
@pytest.mark.parametrize("notebook", _differs_at_tiny(), ids=lambda p: p.stem)
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
