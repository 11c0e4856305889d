"""pytest plugin (loaded by pyproject's addopts): wall time per notebook under nbval.

nbval runs a notebook as one test per code cell; this adds up the setup (kernel start),
call and teardown time of each notebook's cells and prints the totals in the terminal
summary, so CI shows what each lab costs against the course's time budget.
"""
from __future__ import annotations

_seconds: dict[str, float] = {}
_failed: dict[str, int] = {}


def pytest_configure(config) -> None:
    _seconds.clear()
    _failed.clear()


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _seconds[path] = _seconds.get(path, 0.0) + report.duration
        _failed[path] = _failed.get(path, 0) + int(report.failed)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    tr = terminalreporter
    tr.section("nbval wall time per notebook")
    for path, s in sorted(_seconds.items()):
        failed = f"  ({_failed[path]} failed cells)" if _failed[path] else ""
        tr.write_line(f"{s:8.1f} s  {path}{failed}")
    tr.write_line(f"{sum(_seconds.values()):8.1f} s  all {len(_seconds)} notebooks")
