"""Shared pytest fixtures and markers (CPU-first; hardware tests skip and say why)."""
from __future__ import annotations

import os

import pytest
import torch

# Lab 11 runs Triton kernels in Triton's interpreter, which must be on before Triton is
# imported (triton.language's own helpers are jitted at import), and other tests import it
# first (torch.compile's Inductor does) in the same worker. On a CPU nothing else runs
# Triton kernels (Inductor writes C++ there); on a CUDA machine (make gpu-check) it is left
# off, so compiled GPU kernels stay compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_no_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                              reason="needs a CUDA device; this machine has none")


def requires_cuda(obj):
    """Mark a test (function or class) ``cuda``, which ``make gpu-check`` selects
    (``pytest -m cuda``), and skip it, with the reason, where no CUDA device is."""
    return pytest.mark.cuda(_no_cuda(obj))
slow = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A small embedded-style ImageFolder (2 train / 1 val images per class) for fast runs."""
    from perflab.data.dataset import build_dataset

    root = tmp_path_factory.mktemp("data")
    build_dataset(root, train_per_class=4, val_per_class=1, progress=False)
    return str(root / "photo-patches")


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """Send saved RunResults to a temporary folder."""
    monkeypatch.setenv("PERFLAB_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


# -- the order of files for `make test`'s pytest-xdist workers -------------------------------

def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    """Longest files first, the many short ones last (``make test``: ``--dist loadfile
    --no-loadscope-reorder`` hands each worker a whole file in this order when it is
    nearly out of work): the solution notebooks (one 10-170 s unit each), then every test
    file that has a ``slow`` test (a sandboxed grading, rank launches, a browser), then the
    files with none (each test under ~3 s alone). The run then ends on small files that
    fill whichever worker frees up first, instead of one worker running a long lab file it
    took late while the other waits. A stable sort: within a group, and within every file,
    the collection order is kept (module fixtures, the browser's session server as
    before); ``make test-fast`` deselects the slow tests as before. Only in an xdist
    worker: a serial run (``make test TEST_WORKERS=0``) keeps the collection order."""
    if not hasattr(config, "workerinput"):
        return
    slow_files = {_file_of(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def group(item) -> int:
        path = _file_of(item.nodeid)
        return 0 if path.endswith(".ipynb") else 1 if path in slow_files else 2

    items[:] = sorted(items, key=group)


# -- per-file wall time and each worker's end, printed by the xdist controller ---------------

_FILES: dict[str, list] = {}    # file -> [summed seconds, worker, seconds since start at end]
_WORKER_END: dict[str, float] = {}
_START: list[float] = []


def pytest_sessionstart(session):
    import time

    _START[:] = [time.monotonic()]


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set on the controller's copy of a worker's report
    if node is None or not _START:
        return
    import time

    worker = getattr(getattr(node, "gateway", None), "id", "?")
    now = time.monotonic() - _START[0]
    entry = _FILES.setdefault(_file_of(report.nodeid), [0.0, worker, now])
    entry[0] += report.duration
    entry[2] = now
    _WORKER_END[worker] = now


def pytest_terminal_summary(terminalreporter):
    """Under pytest-xdist: the 15 longest files (their tests' summed setup, call and
    teardown) and when each worker ran its last test: the spread is how long one worker
    sat idle at the end, the figure to watch when a long file lands late."""
    if not _FILES or not _WORKER_END:
        return
    tr = terminalreporter
    tr.section("wall time per test file (pytest-xdist)")
    for path, (s, worker, end) in sorted(_FILES.items(), key=lambda kv: -kv[1][0])[:15]:
        tr.write_line(f"{s:8.1f} s  {path}  ({worker}, done at {end:.0f} s)")
    ends = ", ".join(f"{w} at {t:.0f} s" for w, t in sorted(_WORKER_END.items()))
    spread = max(_WORKER_END.values()) - min(_WORKER_END.values())
    tr.write_line(f"last test per worker: {ends} (spread {spread:.0f} s)")
