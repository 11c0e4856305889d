"""Every lab's experiment panels, the way a student sees them: JupyterLab in headless
Chromium.

For each solution notebook, the server holds a copy trimmed to its set-up and panel
cells (:mod:`.trim` states the rule; nbval runs the whole notebooks) and runs it at the
``tiny`` preset; a notebook whose sizes come from the preset is served whole, its hidden
tests cleared (:func:`.trim.whole_at_tiny`), so its run here is also its only run whole
at ``tiny`` (00-06 today; this replaced a separate nbclient run of each, which ran the
same set-up cells again in a kernel of its own). The test opens it, runs all cells, checks that every cell ran and that
exactly one panel rendered per panel cell, each with its Run button enabled, presses the
FIRST panel's Run button once (what the UI has to prove; every panel's runs are measured
by nbval and the panel unit tests), waits until the panel is ready for the next run (Run
enabled again), and checks that its plot image loaded (non-zero natural width), that no
panel shows an error, no widget failed to render and no traceback shows. A notebook
without a panel is run whole with the same checks. A screenshot per lab goes to
``test-output/browser/``.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .labserver import OUTPUT, solution_notebooks

pytestmark = pytest.mark.slow

OPEN_TIMEOUT_MS = 120_000
RUN_ALL_TIMEOUT_MS = 600_000  # a whole lab at the tiny size (<= 93 s alone), busy 2-core CPU
PANEL_TIMEOUT_MS = 300_000  # baseline + variant runs (two launches, or a ladder) per Run

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
# The run is over in the page: Run is enabled again, and the plot loaded or an error shows.
PANEL_SETTLED = f"""(i) => {{
  const panel = document.querySelectorAll('.perflab-panel')[i];
  const button = panel.querySelector('button.perflab-run');
  const error = panel.querySelector('.perflab-error');
  return button !== null && !button.disabled
    && ((error !== null && error.innerText.trim() !== '') || ({PLOT_LOADED})(i));
}}"""
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
def test_lab_runs_in_jupyterlab(browser, lab_server, trimmed_labs, notebook: Path):
    trimmed = trimmed_labs[notebook.name]
    what = f"{notebook.name} ({'' if trimmed.whole else 'trimmed: '}{trimmed.describe()})"
    page = browser.new_page()
    clock, phases = time.monotonic(), {}  # seconds per phase, printed (pytest -rA)

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[name], clock = round(now - clock, 1), now

    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(lab_server.url_for(notebook.name))
        page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=OPEN_TIMEOUT_MS)
        _wait_kernel_idle(page, lab_server, notebook.name, OPEN_TIMEOUT_MS / 1000)
        lap("open_s")

        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        page.wait_for_function(RUN_STARTED, timeout=OPEN_TIMEOUT_MS)
        page.wait_for_function(RUN_SETTLED, timeout=RUN_ALL_TIMEOUT_MS)  # done, or stopped
        _wait_kernel_idle(page, lab_server, notebook.name)             # at an error
        lap("run_all_s")
        prompts = page.evaluate(f"() => {PROMPTS}")
        unrun = [t for t in prompts if not re.search(r"\d", t)]
        assert prompts and not unrun, (f"{what}: {len(unrun)} of {len(prompts)} cells did "
                                       f"not run:\n" + page.evaluate(OUTPUT_TEXT)[-3000:])

        panels = page.locator(".perflab-panel")
        assert panels.count() == len(trimmed.panel_cells), (
            f"{what}: {panels.count()} experiment panels rendered, expected one per panel "
            f"cell:\n" + page.evaluate(OUTPUT_TEXT)[-3000:])
        for i in range(panels.count()):
            assert panels.nth(i).locator(".perflab-run").is_enabled(), (
                f"{what}: panel {i} rendered without an enabled Run button")
        for i in range(min(1, panels.count())):  # Run once per lab
            panel = panels.nth(i)
            panel.scroll_into_view_if_needed()
            panel.locator(".perflab-run").click()
            page.wait_for_function(PANEL_SETTLED, arg=i, timeout=PANEL_TIMEOUT_MS)
            error = panel.locator(".perflab-error").inner_text().strip()
            assert not error, f"{what}: panel {i} shows an error: {error}"
            assert page.evaluate(PLOT_LOADED, i), f"{what}: panel {i} shows no plot"
            lap(f"panel_{i}_s")
        _wait_kernel_idle(page, lab_server, notebook.name)

        if panels.count():
            panels.last.locator("img.perflab-plot").scroll_into_view_if_needed()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"{notebook.stem}.png"))
        text = page.evaluate(OUTPUT_TEXT)
        assert "Error displaying widget" not in page.content(), (
            f"{what}: a widget failed to render; console errors: {console_errors}")
        assert "Traceback" not in text, f"{what}: a cell raised:\n{text[-3000:]}"
    except Exception:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"{notebook.stem}-FAILED.png"))
        raise
    finally:
        print(f"{notebook.stem}: {phases}")
        page.close()
        lab_server.shutdown_kernels()  # free the cores for the next lab
