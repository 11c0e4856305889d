"""Every lab, the way a student sees it: JupyterLab in headless Chromium.

For each solution notebook: open it, run all cells, wait for the kernel to be idle,
press every experiment panel's Run button, and check that the panel's plot image loads
(non-zero natural width), that no widget failed to render and no traceback shows. A
screenshot per lab goes to ``test-output/browser/``.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .labserver import OUTPUT, solution_notebooks

pytestmark = pytest.mark.slow

OPEN_TIMEOUT_MS = 120_000
RUN_ALL_TIMEOUT_MS = 900_000  # the whole lab at the quick size, on a busy 2-core CPU
PANEL_TIMEOUT_MS = 180_000  # baseline + variant runs behind one press of Run

PROMPTS = ("[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
           ".map(p => p.textContent)")
RUN_STARTED = f"() => {PROMPTS}.some(t => t.includes('*'))"
RUN_SETTLED = f"""() => !{PROMPTS}.some(t => t.includes('*')) && document.querySelector(
  '.jp-NotebookPanel .jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle'"""
KERNEL_IDLE = """() => {
  const el = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
  return el !== null && el.dataset.status === 'idle';
}"""
PLOT_LOADED = """(i) => {
  const img = document.querySelectorAll('.perflab-panel')[i].querySelector('img.perflab-plot');
  return img !== null && img.complete && img.naturalWidth > 0;
}"""
OUTPUT_TEXT = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .map(o => o.innerText).join('\\n')"""


def _wait_kernel_idle(page, lab, name: str, timeout_s: float = 60.0) -> None:
    """Idle in the page and in the server's session for this notebook."""
    page.wait_for_function(KERNEL_IDLE, timeout=timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [s["kernel"]["execution_state"] for s in lab.api("GET", "sessions")
                  if s["path"].endswith(name)]
        if states == ["idle"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"kernel of {name} not idle after {timeout_s:g} s: {states}")


@pytest.mark.parametrize("notebook", solution_notebooks(), ids=lambda p: p.stem)
def test_lab_runs_in_jupyterlab(browser, lab_server, notebook: Path):
    page = browser.new_page()
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(lab_server.url_for(notebook.name))
        page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=OPEN_TIMEOUT_MS)
        _wait_kernel_idle(page, lab_server, notebook.name, OPEN_TIMEOUT_MS / 1000)

        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        page.wait_for_function(RUN_STARTED, timeout=OPEN_TIMEOUT_MS)
        page.wait_for_function(RUN_SETTLED, timeout=RUN_ALL_TIMEOUT_MS)  # done, or stopped
        _wait_kernel_idle(page, lab_server, notebook.name)             # at an error
        unrun = [t for t in page.evaluate(f"() => {PROMPTS}") if not re.search(r"\d", t)]
        assert not unrun, (f"{notebook.name}: {len(unrun)} cells did not run:\n"
                           + page.evaluate(OUTPUT_TEXT)[-3000:])

        panels = page.locator(".perflab-panel")
        assert panels.count() >= 1, f"{notebook.name}: no experiment panel rendered"
        for i in range(panels.count()):
            panel = panels.nth(i)
            panel.scroll_into_view_if_needed()
            panel.locator(".perflab-run").click()
            page.wait_for_function(PLOT_LOADED, arg=i, timeout=PANEL_TIMEOUT_MS)
            error = panel.locator(".perflab-error").inner_text().strip()
            assert not error, f"{notebook.name}: panel {i} shows an error: {error}"
        _wait_kernel_idle(page, lab_server, notebook.name)

        panels.last.locator("img.perflab-plot").scroll_into_view_if_needed()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"{notebook.stem}.png"))
        text = page.evaluate(OUTPUT_TEXT)
        assert "Error displaying widget" not in page.content(), (
            f"{notebook.name}: a widget failed to render; console errors: {console_errors}")
        assert "Traceback" not in text, f"{notebook.name}: a cell raised:\n{text[-3000:]}"
    except Exception:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"{notebook.stem}-FAILED.png"))
        raise
    finally:
        page.close()
        lab_server.shutdown_kernels()  # free the cores for the next lab
