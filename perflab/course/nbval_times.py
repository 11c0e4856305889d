"""pytest plugin (loaded by pyproject's addopts): wall time per notebook under nbval.

nbval runs a notebook as one test per code cell; this adds up the setup (kernel start),
call and teardown time of each notebook's cells and prints the totals in the terminal
summary, so CI shows what each lab costs against the course's time budget.

At the end of the session the totals of lab notebooks (``NN_*.ipynb``) are also merged
into ``lab_times.json`` in the results folder (:func:`perflab.labs.catalog.lab_times_path`)
with the date, preset and machine, written atomically; ``labs/00_start_here.ipynb`` and
``perflab labs`` show them. A lab not run in this session keeps its earlier entry. A
session that ran its tests in several pytest-xdist workers (``make test``) prints the
totals but saves nothing: a notebook that shared the cores with other tests did not take
its own time (``make check-solutions`` runs the labs one at a time).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["write_lab_times", "machine_summary"]

_seconds: dict[str, float] = {}
_failed: dict[str, int] = {}
_cells: dict[str, int] = {}
_written: list[Path] = []
_not_saved: list[str] = []

_LAB_FILE = re.compile(r"(?:^|/)(\d\d)_[^/]*\.ipynb$")


def pytest_configure(config) -> None:
    _seconds.clear()
    _failed.clear()
    _cells.clear()
    _written.clear()
    _not_saved.clear()


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _seconds[path] = _seconds.get(path, 0.0) + report.duration
        _failed[path] = _failed.get(path, 0) + int(report.failed)
        _cells[path] = _cells.get(path, 0) + int(getattr(report, "when", "call") == "call")


def machine_summary() -> str:
    """``"Intel(R) Xeon(R) ... (cpu, 2 cores), torch 2.13.0+cpu"``: where times were taken."""
    from perflab.core.env import env_summary

    env = env_summary()
    return (f"{env.device_name} ({env.device}, {env.cpu_cores} cores), "
            f"torch {env.torch}")


def write_lab_times(seconds: dict[str, float], failed: dict[str, int],
                    cells: dict[str, int], path: str | Path, *, machine: str,
                    preset: str, now: datetime | None = None) -> Path | None:
    """Merge this session's per-notebook totals into the lab-times file at ``path``.

    Only lab notebooks (``NN_*.ipynb``) count; each is keyed by its number, so a lab run
    again replaces its entry and the others stay. The file is written to a temporary
    name beside it and renamed over it (readers never see half a file).

    Args:
        seconds / failed / cells: per notebook path (pytest node id): summed wall time,
            failed cells, cells run.
        path: the JSON file (its folder is created).
        machine: :func:`machine_summary`'s text; preset: the labs' preset in this run.
        now: the timestamp to record (default: now, UTC).

    Returns:
        ``path``, or None when no lab notebook ran (nothing written).
    """
    from perflab.labs.catalog import LAB_TIMES_FORMAT, read_lab_times

    stamp = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    new = {}
    for nb, s in sorted(seconds.items()):
        m = _LAB_FILE.search(nb)
        if m:
            new[m.group(1)] = {"notebook": nb, "seconds": round(s, 1),
                               "cells": cells.get(nb, 0), "failed_cells": failed.get(nb, 0),
                               "measured_at": stamp, "preset": preset, "machine": machine}
    if not new:
        return None
    path = Path(path)
    try:
        old = read_lab_times(path)
    except ValueError:
        old = {}  # not ours or damaged: replaced by this run's measurements
    data = {"format": LAB_TIMES_FORMAT, "notebooks": dict(sorted({**old, **new}.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".lab_times.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def pytest_sessionfinish(session, exitstatus) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller gets every report and writes
    if not any(_LAB_FILE.search(nb) for nb in _seconds):
        return
    workers = getattr(getattr(session.config, "option", None), "numprocesses", None) or 0
    if workers > 1:
        _not_saved.append(f"lab times not saved: the notebooks shared the cores with other "
                          f"tests ({workers} pytest-xdist workers); `make check-solutions` "
                          "times each lab alone")
        return
    import torch

    from perflab.labs.catalog import lab_times_path

    preset = os.environ.get("PERFLAB_PRESET") or (
        "full" if torch.cuda.is_available() else "quick")
    try:
        path = write_lab_times(_seconds, _failed, _cells, lab_times_path(),
                               machine=machine_summary(), preset=preset)
    except OSError as e:  # a read-only results folder must not fail the test run
        session.config.get_terminal_writer().line(f"lab times not saved: {e}")
        return
    if path is not None:
        _written.append(path)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    tr = terminalreporter
    tr.section("nbval wall time per notebook")
    for path, s in sorted(_seconds.items()):
        failed = f"  ({_failed[path]} failed cells)" if _failed[path] else ""
        tr.write_line(f"{s:8.1f} s  {path}{failed}")
    tr.write_line(f"{sum(_seconds.values()):8.1f} s  all {len(_seconds)} notebooks")
    for path in _written:
        tr.write_line(f"saved to {path} (shown by labs/00_start_here.ipynb, `perflab labs`)")
    for why in _not_saved:
        tr.write_line(why)
