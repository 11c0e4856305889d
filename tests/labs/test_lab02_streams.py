"""perflab.labs.lab02: the recording stand-in for torch.cuda's stream API, the judge of
its log, and the line-by-line memory profile."""
from __future__ import annotations

import contextlib

import pytest
import torch

from perflab.labs.lab02 import PATCHED, RecordedCuda, line_memory_profile, stream_problems
from tests.conftest import requires_cuda
from tests.labs.labcheck import Lab

PREFETCHER = Lab("02").solution("my_prefetcher")


def _run(real: bool, n: int = 3, rows: int = 2):
    scope = {"torch": torch, "contextlib": contextlib}
    exec(compile(PREFETCHER, "<prefetcher>", "exec"), scope)
    with RecordedCuda(real=real) as cuda:
        source = cuda.source((torch.full((rows, 3), float(k)), torch.tensor([k, -k]))
                             for k in range(1, n + 1))
        for x, y in scope["MyPrefetcher"](source, "cuda", prepare=cuda.prepare(lambda x, y: (x * 2, y))):
            cuda.handed(x, y)
    return cuda.log


def test_the_reference_prefetcher_follows_the_rules_on_the_stand_in():
    log = _run(real=False)
    assert stream_problems(log, prepared=True) == []
    handed = [e for e in log if e["op"] == "handed"]
    assert [e["values"] for e in handed] == [[[[2.0 * k] * 3] * 2, [k, -k]] for k in (1, 2, 3)]
    assert all(e["on_device"] == [True, True] and e["stream"] == 0 for e in handed)


def test_torch_cuda_is_restored_even_after_an_error():
    before = {name: getattr(torch.cuda, name) for name in PATCHED}
    with pytest.raises(ValueError):
        with RecordedCuda():
            assert torch.cuda.is_available() is True
            raise ValueError("boom")
    assert {name: getattr(torch.cuda, name) for name in PATCHED} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_real_mode_needs_a_cuda_device():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        RecordedCuda(real=True)


@requires_cuda
def test_the_reference_prefetcher_follows_the_rules_on_a_real_gpu():
    log = _run(real=True, n=4, rows=256)
    assert stream_problems(log, prepared=True) == []
    assert all(e["on_device"] == [True, True] for e in log if e["op"] == "handed")


def test_stream_problems_reads_waits_up_to_the_work():
    copy = {"op": "copy", "batch": 1, "src": 1, "dst": 3, "stream": 1, "non_blocking": True}
    handed = {"op": "handed", "serials": [3], "batches": [1], "on_device": [True], "stream": 0,
              "values": [[1.0]]}
    record = {"op": "record_stream", "tensor": 3, "stream": 0}
    ok = [dict(copy, queued=1), {"op": "wait", "waiter": 0, "on": 1, "upto": 1}, record, handed]
    assert stream_problems(ok, prepared=False) == []
    early = [{"op": "wait", "waiter": 0, "on": 1, "upto": 0}, dict(copy, queued=1), record, handed]
    assert "wait_stream" in stream_problems(early, prepared=False)[0]
    assert "without prepare" in stream_problems(ok, prepared=True)[0]
    assert stream_problems([], prepared=True) == []


def test_line_memory_profile_gives_one_row_per_line():
    def grow(n):
        data = [0] * n
        return len(data)

    result, table = line_memory_profile(grow, 1000)
    assert result == 1000
    assert list(table.columns) == ["lineno", "mem_usage_mib", "increment_mib", "occurrences", "source"]
    assert [s.strip() for s in table.source] == ["def grow(n):", "data = [0] * n", "return len(data)"]


def _defined_in_no_file(source: str, name: str):
    """A function compiled from ``source`` under a file name that does not exist (as a
    notebook cell's), its lines registered in linecache as IPython does."""
    import linecache

    filename = f"<cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope: dict = {}
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


def test_line_memory_profile_reads_a_function_defined_in_no_file():
    fn = _defined_in_no_file("def grow(n):\n    data = [0] * n\n    return len(data)\n", "grow")
    result, table = line_memory_profile(fn, 10)
    assert result == 10 and [s.strip() for s in table.source][1:] == ["data = [0] * n",
                                                                        "return len(data)"]


def test_line_memory_profile_rejects_a_closure_defined_in_no_file():
    outer = _defined_in_no_file("def outer():\n    k = 3\n    def inner():\n        return k\n"
                                "    return inner\n", "outer")
    with pytest.raises(ValueError, match="closure"):
        line_memory_profile(outer())
