"""Lab 02's glue: a recording stand-in for the CUDA stream API (to grade the student's
device prefetcher on a CPU), the judge of its recording, and a line-by-line memory
profile of a function.

:class:`RecordedCuda` replaces, while its ``with`` block runs, the ``torch.cuda`` names
a prefetcher calls (:data:`PATCHED`) by recording stand-ins, so the student's real code
(``torch.cuda.Stream()``, ``with torch.cuda.stream(s):``, ``x.to(device,
non_blocking=True)``, ``torch.cuda.current_stream().wait_stream(s)``,
``x.record_stream(current)``) runs unchanged and leaves an event log. Like Lab 01's
:class:`perflab.train.workloads.FakeAsyncDevice` it models only what the check needs:
each stream counts the work queued on it (copies, ``prepare``), a ``wait_stream`` or
``wait_event`` notes how far the waiting stream waits for the other, and the source's
tensors (a ``torch.Tensor`` subclass) record their copies to ``"cuda"`` and ``record_stream`` calls. With
``real=True`` (a CUDA GPU) the same recording wraps the real API.

:func:`stream_problems` judges a log against the rules of PyTorch's "CUDA semantics"
notes (streams, ``wait_stream``, ``Tensor.record_stream``): each batch copied inside a
side stream's context with ``non_blocking=True`` (and ``prepare`` run there too), the
consumer stream made to wait for that work before the batch is handed out, and every
handed-out tensor marked with ``record_stream`` on the consumer stream.

Why our own code: nothing records CUDA stream use on a CPU (``torch.cuda._sanitizer``
needs a GPU).
"""
from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sys
import tempfile
import textwrap
from typing import Any, Callable, Iterable

import torch

__all__ = ["RecordedCuda", "stream_problems", "line_memory_profile"]

#: The torch.cuda names :class:`RecordedCuda` replaces while it is active.
PATCHED = ("Stream", "stream", "current_stream", "default_stream", "Event", "synchronize",
           "is_available", "current_device", "device_count")

_ACTIVE: list["RecordedCuda"] = []   # the recorder in force (tensor methods find it here)


class _Stream:
    """A stream stand-in: ``sid`` (0 is the default stream) and ``queued`` (how much work,
    in copies and ``prepare`` calls, was queued on it)."""

    def __init__(self, rec: "RecordedCuda", sid: int, real: Any = None):
        self._rec, self.sid, self.queued, self.real = rec, sid, 0, real

    def wait_stream(self, other: "_Stream") -> None:
        self._rec._wait(self, other, other.queued)
        if self.real is not None:
            self.real.wait_stream(other.real)

    def wait_event(self, event: "_Event") -> None:
        event.wait(self)

    def record_event(self, event: "_Event | None" = None) -> "_Event":
        (event := event or _Event(self._rec)).record(self)
        return event

    def synchronize(self) -> None:
        self._rec.log.append({"op": "host_sync", "what": f"stream {self.sid}"})
        if self.real is not None:
            self.real.synchronize()

    def __enter__(self):                  # `with stream:` as torch.cuda.Stream allows
        self._ctx = self._rec.stream(self)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class _Event:
    """An event stand-in: ``record(stream)`` notes how much work that stream had queued;
    ``wait(stream)`` makes ``stream`` wait for it."""

    def __init__(self, rec: "RecordedCuda", *args, **kwargs):
        self._rec, self.on, self.upto = rec, None, 0
        self.real = rec._saved["Event"](*args, **kwargs) if rec.real else None

    def record(self, stream: _Stream | None = None) -> None:
        stream = stream or self._rec.current_stream()
        self.on, self.upto = stream, stream.queued
        if self.real is not None:
            self.real.record(stream.real)

    def wait(self, stream: _Stream | None = None) -> None:
        stream = stream or self._rec.current_stream()
        if self.on is not None:
            self._rec._wait(stream, self.on, self.upto)
        if self.real is not None:
            self.real.wait(stream.real)

    def synchronize(self) -> None:
        self._rec.log.append({"op": "host_sync", "what": "event"})
        if self.real is not None:
            self.real.synchronize()


class _Recorded(torch.Tensor):
    """A tensor that reports its copies to ``cuda`` and ``record_stream`` calls to the
    active :class:`RecordedCuda`; results of ops on it inherit its batch number."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        tags = [a._sim for a in args if isinstance(a, _Recorded) and hasattr(a, "_sim")]
        if tags and isinstance(out, _Recorded) and not hasattr(out, "_sim"):
            out._sim = dict(tags[0], serial=None)
        return out

    def _copy(self, device, non_blocking: bool):
        rec = _ACTIVE[-1]
        stream = rec.current_stream()
        stream.queued += 1
        with torch._C.DisableTorchFunctionSubclass():
            data = (torch.Tensor.to(self, device, non_blocking=non_blocking) if rec.real
                    else self.clone())
        out = data.as_subclass(_Recorded)
        out._sim = {"batch": self._sim["batch"], "serial": None, "device": True}
        rec.log.append({"op": "copy", "batch": self._sim["batch"], "src": rec.serial(self),
                        "dst": rec.serial(out), "stream": stream.sid,
                        "non_blocking": bool(non_blocking), "queued": stream.queued})
        return out

    def to(self, *args, **kwargs):
        target = kwargs.get("device")
        for a in args:
            if isinstance(a, (str, torch.device)):
                target = a
        if target is not None and torch.device(target).type == "cuda" and _ACTIVE:
            blocking = [a for a in args if isinstance(a, bool)]
            return self._copy(target, kwargs.get("non_blocking", bool(blocking and blocking[-1])))
        return super().to(*args, **kwargs)

    def cuda(self, device=None, non_blocking: bool = False, **kwargs):
        return self._copy("cuda" if device is None else torch.device("cuda", torch.device(
            device).index if not isinstance(device, int) else device), non_blocking)

    def record_stream(self, stream) -> None:
        rec = _ACTIVE[-1]
        sid = stream.sid if isinstance(stream, _Stream) else None
        rec.log.append({"op": "record_stream", "tensor": rec.serial(self), "stream": sid})
        if rec.real and isinstance(stream, _Stream):
            with torch._C.DisableTorchFunctionSubclass():
                torch.Tensor.record_stream(self, stream.real)


class RecordedCuda:
    """While its ``with`` block runs, ``torch.cuda``'s stream API is a recording stand-in.

    Args:
        real: wrap the real ``torch.cuda`` API (a CUDA GPU): the copies, waits and
            ``record_stream`` calls really happen, and are recorded the same way.

    Attributes:
        log: the events, in call order (plain dicts, JSON-ready): ``new_stream``,
            ``take`` (the source gave batch k), ``copy`` (batch, stream, non_blocking,
            ``queued``: the stream's work count after it), ``prepare``, ``wait``
            (``waiter`` waits for ``on`` up to ``upto``), ``record_stream``,
            ``host_sync``, ``handed`` (a batch the prefetcher returned: serials, values
            as lists, batch numbers, whether on the device, the current stream).

    Raises:
        RuntimeError: ``real=True`` without a CUDA device.

    Use: ``with RecordedCuda() as cuda: for x, y in MyPrefetcher(cuda.source(batches),
    "cuda"): cuda.handed(x, y)``; then :func:`stream_problems` on ``cuda.log``.
    """

    def __init__(self, real: bool = False):
        if real and not torch.cuda.is_available():
            raise RuntimeError("RecordedCuda(real=True) needs a CUDA device: "
                               f"torch.cuda.is_available() is {torch.cuda.is_available()}")
        self.real, self.log = real, []
        self._serials = 0
        self._streams = [_Stream(self, 0)]
        self._stack = [self._streams[0]]
        self._saved: dict[str, Any] = {}

    # -- the torch.cuda stand-ins ------------------------------------------------------
    def _new_stream(self, device=None, priority: int = 0, **kwargs) -> _Stream:
        real = self._saved["Stream"](device, priority, **kwargs) if self.real else None
        s = _Stream(self, len(self._streams), real)
        self._streams.append(s)
        self.log.append({"op": "new_stream", "stream": s.sid})
        return s

    def current_stream(self, device=None) -> _Stream:
        return self._stack[-1]

    def default_stream(self, device=None) -> _Stream:
        return self._streams[0]

    @contextlib.contextmanager
    def stream(self, s: _Stream | None):
        if s is None:                      # torch.cuda.stream(None) is a no-op
            yield None
            return
        self._stack.append(s)
        real = self._saved["stream"](s.real) if self.real else contextlib.nullcontext()
        try:
            with real:
                yield s
        finally:
            self._stack.pop()

    def _synchronize(self, device=None) -> None:
        self.log.append({"op": "host_sync", "what": "device"})
        if self.real:
            self._saved["synchronize"](device)

    def _wait(self, waiter: _Stream, on: _Stream, upto: int) -> None:
        self.log.append({"op": "wait", "waiter": waiter.sid, "on": on.sid, "upto": upto})

    def __enter__(self) -> "RecordedCuda":
        fakes = {"Stream": self._new_stream, "stream": self.stream,
                 "current_stream": self.current_stream, "default_stream": self.default_stream,
                 "Event": lambda *a, **k: _Event(self, *a, **k), "synchronize": self._synchronize,
                 "is_available": lambda: True, "current_device": lambda: 0,
                 "device_count": lambda: 1}
        self._saved = {name: getattr(torch.cuda, name) for name in PATCHED}
        self._streams[0].real = self._saved["current_stream"]() if self.real else None
        for name, fake in fakes.items():
            setattr(torch.cuda, name, fake)
        return _ACTIVE.append(self) or self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)
        for name, original in self._saved.items():
            setattr(torch.cuda, name, original)

    # -- the harness --------------------------------------------------------------------
    def serial(self, t: torch.Tensor) -> int:
        """A tensor's number in this log (given at first sight)."""
        if (sim := getattr(t, "_sim", None)) is None:
            return -1
        if sim.get("serial") is None:
            self._serials += 1
            sim["serial"] = self._serials
        return sim["serial"]

    def source(self, batches: Iterable) -> Iterable:
        """The batches ``(x, y)`` (host tensors), numbered 1, 2, ... and recorded as taken."""
        for k, batch in enumerate(batches, start=1):
            self.log.append({"op": "take", "batch": k})
            out = []
            for t in batch:
                t = (t.pin_memory() if self.real else t).as_subclass(_Recorded)
                t._sim = {"batch": k, "serial": None, "device": False}
                self.serial(t)
                out.append(t)
            yield tuple(out)

    def prepare(self, fn: Callable) -> Callable:
        """``fn(x, y)`` recorded as work queued on the current stream."""
        def prepared(x, y):
            s = self.current_stream()
            s.queued += 1
            batch = getattr(x, "_sim", {}).get("batch")
            self.log.append({"op": "prepare", "batch": batch, "stream": s.sid, "queued": s.queued})
            return fn(x, y)
        return prepared

    def handed(self, *tensors: torch.Tensor) -> None:
        """Record a batch the prefetcher returned (call it right after ``next``)."""
        sims = [getattr(t, "_sim", None) or {} for t in tensors]
        on_device = [(t.device.type == "cuda") if self.real else bool(s.get("device"))
                     for t, s in zip(tensors, sims)]
        with torch._C.DisableTorchFunctionSubclass():
            values = [t.detach().cpu().tolist() if torch.is_tensor(t) else None for t in tensors]
        self.log.append({"op": "handed", "serials": [self.serial(t) for t in tensors],
                         "batches": [s.get("batch") for s in sims], "on_device": on_device,
                         "values": values, "stream": self.current_stream().sid})


def stream_problems(log: list[dict], *, prepared: bool) -> list[str]:
    """What a recorded prefetcher run (:attr:`RecordedCuda.log`) does against the CUDA
    stream rules; an empty list when it follows them.

    Rules (PyTorch "CUDA semantics" notes: streams, ``wait_stream``, ``record_stream``):
    batch k's copies to the device run inside a side stream's context (not the default
    stream 0) with ``non_blocking=True``, and ``prepare`` (when ``prepared``) on a side
    stream too; before batch k is handed out, the stream current at that moment waited
    (``wait_stream`` or an event) for every stream that queued work of batch k, up to
    that work; every tensor handed out was ``record_stream``-ed on that stream before.
    A host synchronize is not a wait of the consumer stream (it blocks Python instead).

    Args:
        log: the events, in order.
        prepared: whether the run passed a ``prepare`` function.

    Returns:
        Messages, one per broken rule and batch, in log order.
    """
    problems: list[str] = []
    work: dict[int, list[tuple[int, int]]] = {}         # batch -> [(stream, queued)]
    waited: dict[tuple[int, int], int] = {}              # (waiter, on) -> upto
    recorded: dict[int, set] = {}                        # tensor serial -> streams
    for i, e in enumerate(log):
        op = e["op"]
        if op in ("copy", "prepare"):
            work.setdefault(e["batch"], []).append((e["stream"], e["queued"]))
        if op == "copy" and e["stream"] == 0:
            problems.append(f"batch {e['batch']} was copied on the default stream: copy "
                            "inside `with torch.cuda.stream(side_stream):`")
        elif op == "copy" and not e["non_blocking"]:
            problems.append(f"batch {e['batch']} was copied with non_blocking=False: a "
                            "blocking copy waits for the host; pass non_blocking=True")
        elif op == "prepare" and e["stream"] == 0:
            problems.append(f"prepare ran on the default stream for batch {e['batch']}: run "
                            "it inside the side stream's context, after the copy")
        elif op == "wait":
            key = (e["waiter"], e["on"])
            waited[key] = max(waited.get(key, -1), e["upto"])
        elif op == "record_stream":
            recorded.setdefault(e["tensor"], set()).add(e["stream"])
        elif op == "handed":
            consumer = e["stream"]
            for k in {b for b in e["batches"] if b is not None}:
                copies = work.get(k, [])
                if not any(ev["op"] == "copy" and ev["batch"] == k for ev in log[:i]):
                    problems.append(f"batch {k} was handed out without a copy to the device")
                    continue
                if prepared and not any(ev["op"] == "prepare" and ev["batch"] == k
                                        for ev in log[:i]):
                    problems.append(f"batch {k} was handed out without prepare(x, y)")
                for sid, queued in copies:
                    if sid != consumer and waited.get((consumer, sid), -1) < queued:
                        problems.append(
                            f"batch {k} was handed out before the consumer stream waited for "
                            f"side stream {sid}'s work on it: call "
                            "torch.cuda.current_stream().wait_stream(side_stream) first")
                        break
            for serial in e["serials"]:
                if consumer not in recorded.get(serial, set()):
                    problems.append(
                        f"a tensor of batch {e['batches']} was handed out without "
                        "tensor.record_stream(torch.cuda.current_stream()) on the consumer "
                        "stream: the allocator may reuse its memory while the consumer uses it")
                    break
            if not all(e["on_device"]):
                problems.append(f"batch {e['batches']} was handed out on the host, not the device")
    return problems


def line_memory_profile(fn: Callable, *args: Any, **kwargs: Any):
    """``memory_profiler``'s line-by-line resident set size (RSS) of one call ``fn(*args)``.

    memory_profiler (psutil backend) reads the process's RSS after each line of ``fn``:
    what the OS gives the whole process -- tensors, NumPy arrays, pages of a memory map
    read in, Python objects, and memory allocators keep for reuse; not the memory of
    DataLoader worker processes (other processes) nor a GPU's. memory_profiler reads the
    lines from the function's file on disk, so a function defined in a notebook cell
    (no such file) is compiled again from a temporary file holding its source.

    Returns:
        ``(result of fn, DataFrame)`` with one row per executed line of ``fn``:
        ``lineno`` (in its file), ``mem_usage_mib`` (RSS after the line, MiB),
        ``increment_mib`` (change over the line, MiB; the ``def`` row counts from 0),
        ``occurrences``, ``source`` (the line).

    Raises:
        ValueError: ``fn`` lives in no file and is a closure (its free variables cannot
            be rebuilt from its source).
    """
    import memory_profiler
    import pandas as pd

    with tempfile.TemporaryDirectory(prefix="perflab-mprof-") as folder:
        if not os.path.exists(fn.__code__.co_filename):
            if fn.__code__.co_freevars:
                raise ValueError(f"{fn.__name__} is a closure defined outside a file: define "
                                 "it at the top level of a cell")
            source = textwrap.dedent(inspect.getsource(fn))
            path = os.path.join(folder, f"{fn.__name__}.py")
            with open(path, "w") as f:
                f.write(source)
            scope = dict(fn.__globals__)
            exec(compile(source, path, "exec"), scope)
            fn = scope[fn.__name__]
        mp = memory_profiler.LineProfiler(backend="psutil")
        mp.add_function(fn)
        previous = sys.gettrace()
        try:
            with mp:
                result = fn(*args, **kwargs)
        finally:
            sys.settrace(previous)
        rows = [(lineno, mem[1], mem[0], mem[2], linecache.getline(file, lineno).rstrip())
                for file, lines in mp.code_map.items() for lineno, mem in lines if mem]
    return result, pd.DataFrame(rows, columns=["lineno", "mem_usage_mib", "increment_mib",
                                               "occurrences", "source"])
