"""Fixtures for the real-browser tests: one JupyterLab server and one headless Chromium
for the whole session. They skip, saying why, when Debian's chromium or Playwright for
Python is missing (`.ci/run` installs both, so CI runs them).

The server serves each solution trimmed to what its panels need (:mod:`.trim`; nbval
runs the whole notebooks) and runs kernels at the ``tiny`` preset: the browser tests
check that the panels work in JupyterLab, not the labs' numbers. A solution whose sizes
come from the preset (not :func:`.trim.tiny_runs_as_quick`) is served whole instead, its
hidden tests cleared (:func:`.trim.whole_at_tiny`): its browser run is also its run whole
at ``tiny``, so that a preset cannot break a lab unseen."""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from .labserver import OUTPUT, LabServer, solution_notebooks
from .trim import Trimmed, tiny_runs_as_quick, trim_to_panels, whole_at_tiny

CHROMIUM = Path(os.environ.get("PERFLAB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def trimmed_labs() -> dict[str, Trimmed]:
    """Solution file name -> its copy trimmed to the set-up and panel cells, or whole
    (hidden tests cleared) when its sizes come from the preset."""
    labs = {}
    for path in solution_notebooks():
        nb = nbformat.read(path, as_version=4)
        labs[path.name] = (trim_to_panels(nb, name=path.name) if tiny_runs_as_quick(nb)
                           else whole_at_tiny(nb, name=path.name))
    return labs


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory, trimmed_labs):
    """JupyterLab on 127.0.0.1 (free port, random token) serving the trimmed solutions,
    kernels at ``PERFLAB_PRESET`` (default ``tiny``)."""
    for old in OUTPUT.glob("*.png"):  # screenshots of this run only
        old.unlink()
    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "notebooks"
    root.mkdir()
    for name, trimmed in trimmed_labs.items():
        nbformat.write(trimmed.notebook, root / name)
    env = {"PERFLAB_RESULTS": str(tmp / "results"),
           "PERFLAB_PRESET": os.environ.get("PERFLAB_PRESET", "tiny")}
    server = LabServer(root, tmp, log=OUTPUT / "jupyterlab.log", env=env)
    server.start()
    yield server
    server.stop()
    assert not server.processes(), f"left behind: {server.processes()}"


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """A persistent headless Chromium context with a fresh user-data dir (no download)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium "
                    "(apt-get install chromium) or set PERFLAB_CHROMIUM")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed "
        "(pip install -e '.[browser]')")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        yield context
        context.close()
