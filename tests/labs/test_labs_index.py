"""The lab map (perflab.labs.catalog) and the lab run times the nbval plugin records."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from perflab.course import nbval_times
from perflab.labs.catalog import LABS, START_HERE, lab_map, lab_times_path, read_lab_times

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


# -- the map agrees with the README, perflab doctor and the notebooks on disk ----------
def test_labs_match_doctor_and_the_notebooks():
    from perflab.labs.catalog import lab_capabilities

    assert [row["lab"] for row in lab_capabilities()] == [f"{lab.number} {lab.title}"
                                                          for lab in LABS]
    assert {row["status"] for row in lab_capabilities()} == {"ready"}  # in this checkout
    for lab in (START_HERE, *LABS):
        assert lab.notebook.startswith(lab.number + "_")
        assert (ROOT / "solutions" / lab.notebook).is_file()
        assert (ROOT / "labs" / lab.notebook).is_file()


def test_readme_lab_table_is_the_lab_map():
    rows = re.findall(r"^\| (\d\d) \| ([^|]+) \| ([^|]+) \|", (ROOT / "README.md").read_text(),
                      re.MULTILINE)
    assert [(n, t.strip(), q.strip()) for n, t, q in rows] == [
        (lab.number, lab.title, lab.question) for lab in LABS]


# -- reading lab_times.json ------------------------------------------------------------
def test_nothing_measured_yet(tmp_path):
    assert read_lab_times(tmp_path / "lab_times.json") == {}
    table = lab_map({})
    assert list(table.lab) == [lab.number for lab in LABS]
    assert set(table.nbval_time) == {"not measured yet"} and table.nbval_s.isna().all()
    assert list(lab_map({}, start_here=True).lab)[0] == "00"


def test_default_path_follows_perflab_results(results_dir):
    assert lab_times_path() == results_dir / "lab_times.json"
    assert lab_times_path("elsewhere") == Path("elsewhere/lab_times.json")


@pytest.mark.parametrize("text", ["{oops", "[]", '{"format": 99, "notebooks": {}}',
                                  '{"format": 1, "notebooks": []}', '{"format": 1}'])
def test_a_file_that_is_not_lab_times(tmp_path, text):
    path = tmp_path / "lab_times.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="is not a lab-times file .* run `make check-solutions`"):
        read_lab_times(path)


def test_lab_map_shows_measured_times():
    table = lab_map({"01": {"seconds": 95.4, "preset": "quick", "failed_cells": 0},
                     "02": {"seconds": 120.0, "preset": "full", "failed_cells": 2}})
    rows = table.set_index("lab")
    assert rows.loc["01", "nbval_time"] == "95 s (quick)" and rows.loc["01", "nbval_s"] == 95.4
    assert rows.loc["02", "nbval_time"] == "120 s (full, 2 failed cells)"
    assert rows.loc["03", "nbval_time"] == "not measured yet"


# -- writing it: perflab.course.nbval_times --------------------------------------------
def test_write_merges_lab_notebooks_by_number(tmp_path):
    path = tmp_path / "results" / "lab_times.json"
    first = nbval_times.write_lab_times(
        {"solutions/01_a.ipynb": 10.04, "solutions/02_b.ipynb": 20.0,
         "tests/scratch.ipynb": 5.0}, {"solutions/02_b.ipynb": 1},
        {"solutions/01_a.ipynb": 7}, path, machine="box", preset="quick", now=NOW)
    assert first == path
    times = read_lab_times(path)
    assert sorted(times) == ["01", "02"]
    assert times["01"] == {"notebook": "solutions/01_a.ipynb", "seconds": 10.0, "cells": 7,
                           "failed_cells": 0, "measured_at": "2026-01-02T03:04:05+00:00",
                           "preset": "quick", "machine": "box"}
    later = NOW.replace(day=3)
    nbval_times.write_lab_times({"solutions/02_b.ipynb": 25.0}, {}, {}, path,
                                machine="box", preset="quick", now=later)
    times = read_lab_times(path)
    assert times["01"]["seconds"] == 10.0 and times["02"]["seconds"] == 25.0  # 01 kept
    assert times["02"]["failed_cells"] == 0 and times["02"]["measured_at"].startswith(
        "2026-01-03")
    assert [p.name for p in path.parent.iterdir()] == ["lab_times.json"]  # no temp file


def test_write_nothing_without_a_lab_notebook(tmp_path):
    path = tmp_path / "lab_times.json"
    assert nbval_times.write_lab_times({"x/notes.ipynb": 1.0}, {}, {}, path,
                                       machine="box", preset="quick") is None
    assert not path.exists()


def test_write_replaces_a_damaged_file(tmp_path):
    path = tmp_path / "lab_times.json"
    path.write_text("{half a fi")
    nbval_times.write_lab_times({"solutions/03_c.ipynb": 3.0}, {}, {}, path,
                                machine="box", preset="quick", now=NOW)
    assert list(read_lab_times(path)) == ["03"]


@pytest.fixture(autouse=True)
def _keep_the_running_sessions_times():
    """The plugin's per-session totals are module state, and this very pytest session may
    be timing notebooks: put them back after each test here."""
    saved = [dict(nbval_times._seconds), dict(nbval_times._failed),
             dict(nbval_times._cells), list(nbval_times._written)]
    yield
    for live, old in zip((nbval_times._seconds, nbval_times._failed, nbval_times._cells,
                          nbval_times._written), saved):
        live.clear()
        live.update(old) if isinstance(live, dict) else live.extend(old)


def _session(lines):
    writer = SimpleNamespace(line=lines.append)
    return SimpleNamespace(config=SimpleNamespace(get_terminal_writer=lambda: writer))


def _report(nodeid, duration, failed=False, when="call"):
    return SimpleNamespace(nodeid=nodeid, duration=duration, failed=failed, when=when)


def test_plugin_saves_the_session_times(results_dir, monkeypatch):
    monkeypatch.delenv("PERFLAB_PRESET", raising=False)
    nbval_times.pytest_configure(None)
    for rep in (_report("solutions/04_d.ipynb::Cell 0", 1.5, when="setup"),
                _report("solutions/04_d.ipynb::Cell 0", 2.0),
                _report("solutions/04_d.ipynb::Cell 1", 0.5, failed=True),
                _report("tests/test_x.py::test_y", 9.0)):
        nbval_times.pytest_runtest_logreport(rep)
    nbval_times.pytest_sessionfinish(_session([]), 0)
    lines: list[str] = []
    tr = SimpleNamespace(section=lambda title: lines.append(f"== {title}"),
                         write_line=lines.append)
    nbval_times.pytest_terminal_summary(tr)
    nbval_times.pytest_configure(None)
    entry = read_lab_times()["04"]
    assert (entry["seconds"], entry["cells"], entry["failed_cells"]) == (4.0, 2, 1)
    assert entry["preset"] in ("quick", "full") and "torch" in entry["machine"]
    assert lines[-1] == (f"saved to {results_dir / 'lab_times.json'} (shown by "
                         "labs/00_start_here.ipynb, `perflab labs`)")


def test_plugin_survives_an_unwritable_results_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PERFLAB_RESULTS", str(blocker / "results"))
    nbval_times.pytest_configure(None)
    nbval_times.pytest_runtest_logreport(_report("solutions/05_e.ipynb::Cell 0", 1.0))
    lines: list[str] = []
    nbval_times.pytest_sessionfinish(_session(lines), 0)
    nbval_times.pytest_configure(None)
    assert len(lines) == 1 and lines[0].startswith("lab times not saved: ")


def test_plugin_saves_nothing_when_notebooks_ran_beside_other_tests(results_dir):
    """`make test` runs nbval in 2 pytest-xdist workers: a lab's time there is not its
    own, so it is printed, not saved; one process (-n 0) saves it."""
    lines: list[str] = []
    tr = SimpleNamespace(section=lambda title: None, write_line=lines.append)
    for workers, saved in ((2, False), (0, True)):
        nbval_times.pytest_configure(None)
        nbval_times.pytest_runtest_logreport(_report("solutions/03_c.ipynb::Cell 0", 2.0))
        session = _session([])
        session.config.option = SimpleNamespace(numprocesses=workers)
        nbval_times.pytest_sessionfinish(session, 0)
        nbval_times.pytest_terminal_summary(tr)
        assert (results_dir / "lab_times.json").exists() == saved, workers
        assert ("2 pytest-xdist workers" in lines[-1]) == (not saved), lines[-1]
    nbval_times.pytest_configure(None)


def test_plugin_writes_nothing_without_notebooks(results_dir):
    nbval_times.pytest_configure(None)
    nbval_times.pytest_runtest_logreport(_report("tests/test_x.py::test_y", 9.0))
    nbval_times.pytest_sessionfinish(_session([]), 0)
    assert not (results_dir / "lab_times.json").exists()
