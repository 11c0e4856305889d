"""Spies on public perflab functions while a block runs: :func:`calls_to` (by patching
the names a caller can reach) and :func:`watch_calls` (by the code that runs, in every
thread, child process and copy of the code: however the function is reached).
:func:`resolve` turns a name into the object; :func:`code_fingerprint` is how a copy of a
function's code is recognised.

A check cell uses it to fail an answer that only delegates to the perflab helper the
exercise asks the student to write themselves::

    with calls_to("train_step", namespace=globals()) as delegated:
        my_loss = my_amp_step(model, x, y, opt, scaler, dtype)
    assert not delegated, "write the autocast + GradScaler step yourself"

While the block runs, the function is replaced by a recording wrapper everywhere a
caller can reach it: in the module that defines it, on ``perflab`` itself when the name
is on its face, and in ``namespace`` (the notebook's globals: ``from perflab import
train_step`` binds the name there). Everything is restored afterwards, also when the block raises.

Why our own code: ``unittest.mock.patch`` patches one target at a time and would need
the defining module spelled out in the notebook; this finds it from the modules' own
``__all__`` lists.

Graded calls use :func:`watch_calls` instead (``forbid=[...]`` in
:mod:`perflab.course.cases`): names can be bypassed, the code that runs cannot. Its
docstring says what it sees (every thread, forked and spawned children, copies of the
code, C functions) and what it does not. Importing this module installs nothing: the
interpreter hooks exist only while a ``watch_calls`` block is open.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading
import types
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, MutableMapping

__all__ = ["calls_to", "watch_calls", "watching", "code_fingerprint", "SWITCHED_OFF",
           "resolve"]


@contextmanager
def calls_to(*names: str, namespace: MutableMapping[str, Any] | None = None
             ) -> Iterator[list[str]]:
    """Record calls to the public perflab functions ``names`` inside the block.

    Args:
        names: public perflab names: on ``perflab``'s face or in the ``__all__`` of the
            library module that defines them (e.g. ``"count_compiles"``).
        namespace: a globals dict whose bindings of these functions are patched too.

    Yields:
        A list that gets the name of each function as it is called.

    Raises:
        ValueError: a name is in no perflab module's ``__all__``, or is not a function
            (before anything changes).
    """
    import perflab

    targets = []
    for name in names:
        module = _home(name)
        real = getattr(module, name)
        if not callable(real):
            raise ValueError(f"perflab.{name} is not a function: nothing to spy on")
        targets.append((name, module, real))
    calls: list[str] = []
    undo: list[tuple[Any, str, Any, bool]] = []   # (owner, attribute, old, was_there)

    def patch(owner: Any, attr: str, new: Any) -> None:
        if isinstance(owner, MutableMapping):
            undo.append((owner, attr, owner.get(attr), attr in owner))
            owner[attr] = new
        else:
            undo.append((owner, attr, owner.__dict__.get(attr), attr in owner.__dict__))
            setattr(owner, attr, new)

    try:
        for name, module, real in targets:
            def recorder(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any):
                calls.append(_name)
                return _real(*args, **kwargs)

            patch(module, name, recorder)
            if name in perflab.__all__:
                patch(perflab, name, recorder)
            if namespace is not None:
                for key, value in list(namespace.items()):
                    if value is real:
                        patch(namespace, key, recorder)
        yield calls
    finally:
        for owner, attr, old, was_there in reversed(undo):
            if isinstance(owner, MutableMapping):
                if was_there:
                    owner[attr] = old
                else:
                    owner.pop(attr, None)
            elif was_there:
                setattr(owner, attr, old)
            else:
                delattr(owner, attr)


def _codes(obj: Any) -> list[Any]:
    """The Python code objects that run when ``obj`` is called: a function's (unwrapped),
    a class's own ``__init__``/``__call__``/``__new__``. C functions have none."""
    targets = [obj]
    if isinstance(obj, type):
        targets = [obj.__dict__[m] for m in ("__init__", "__call__", "__new__")
                   if m in obj.__dict__]
    out = []
    for fn in targets:
        fn = getattr(fn, "__func__", fn)
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        code = getattr(fn, "__code__", None)
        if code is not None:
            out.append(code)
    return out


# --- the code a forbidden function runs, recognised in any copy -----------------------------
#: ``co_flags`` bits that describe the function itself; the higher ones (``__future__``
#: imports, which follow the file the copy was compiled in) are left out of a fingerprint.
_OWN_FLAGS = 0x3FF
#: Python 3.13 marks a code object whose first constant is its docstring.
_CO_HAS_DOCSTRING = 0x4000000
_CO_NEWLOCALS = 0x2     # a function's code (not a module's or a class body's)


def _feed_const(h: Any, value: Any) -> None:
    if isinstance(value, types.CodeType):
        h.update(b"<code>")
        _feed_code(h, value)
    elif isinstance(value, tuple):
        h.update(b"(")
        for v in value:
            _feed_const(h, v)
        h.update(b")")
    elif isinstance(value, frozenset):
        h.update(b"{" + b",".join(sorted(repr(v).encode() for v in value)) + b"}")
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - an odd constant still has a type
            text = "?"
        h.update(f"{type(value).__name__}:{text};".encode())


def _docstring_slot(code: types.CodeType) -> bool:
    """Whether ``co_consts[0]`` is the docstring's place: up to 3.12 a function's first
    constant is its docstring or None (so a copy without the docstring keeps the other
    constants' indices); 3.13 keeps it only when there is one (flagged), so there a copy
    stripped of its docstring has other indices and another fingerprint."""
    if not code.co_consts:
        return False
    if sys.version_info >= (3, 13):
        return bool(code.co_flags & _CO_HAS_DOCSTRING)
    return bool(code.co_flags & _CO_NEWLOCALS) and (code.co_consts[0] is None
                                                     or isinstance(code.co_consts[0], str))


def _feed_code(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_name, code.co_argcount, code.co_posonlyargcount,
                   code.co_kwonlyargcount, code.co_flags & _OWN_FLAGS, code.co_names,
                   code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    for k, const in enumerate(code.co_consts):
        if k == 0 and _docstring_slot(code):
            h.update(b"<doc>")
        else:
            _feed_const(h, const)


def code_fingerprint(code: types.CodeType) -> tuple[str, str]:
    """(qualified name, digest) of a code object, the same for every copy of the same
    source: the digest covers the bytecode (``co_code``, which CPython returns without its
    run-time specialisations), the constants (nested functions' code included,
    recursively), the names it reads and calls, its local and argument names and its
    argument counts; it leaves out the file name, the line numbers, the docstring and the
    ``__future__`` flags. So running a module's source again (``exec``, ``runpy``,
    ``cProfile.Profile().runctx``, ``importlib`` from a copied file), or pasting a
    function with its comments and blank lines changed, gives the same fingerprint; a
    copy with renamed variables or a changed body does not (the similarity review looks
    at those). Needs Python 3.11's ``co_qualname`` for the qualified name (3.10: the
    plain name)."""
    h = hashlib.blake2b(digest_size=16)
    _feed_code(h, code)
    return getattr(code, "co_qualname", code.co_name), h.hexdigest()


# --- the spy: two interpreter hooks in every thread and child process ------------------------
# Module state shared by every thread (a forked child inherits it). The hooks read only the
# first three, rebound (never mutated) under _LOCK.
_ARMED = False                          # a watch is open (else the hooks remove themselves)
_NAMES: frozenset[str] = frozenset()    # co_name of every watched code: the cheap first filter
_C_IDS: frozenset[int] = frozenset()    # id() of every watched C function (this process)
_WATCHES: tuple["_Watch", ...] = ()
_LOCK = threading.RLock()
_SEEN: dict[int, tuple[Any, tuple[str, str] | None]] = {}  # id(code) -> (code, key or None)
_SAVED: dict[str, Any] = {}             # what the installing thread had before
#: The label a watch records when, at the end of the block, something started inside it
#: (``sys.setprofile``/``sys.settrace``, ``cProfile``, ``line_profiler``, a debugger)
#: holds both of the spy's hooks in the block's thread: what ran while it was blind is
#: unknown.
SWITCHED_OFF = "(the spy switched off: a profiler or tracer held both of its hooks)"


class _Watch:
    """One open :func:`watch_calls` block: what it looks for and where children report."""

    def __init__(self, codes: dict[tuple[str, str], str], c_funcs: dict[int, str],
                 c_names: list[list[str]], path: str, fd: int, pid: int) -> None:
        self.codes = codes              # (qualname, digest) -> label
        self.c_funcs = c_funcs          # id(C function) -> label, in this process
        self.c_names = c_names          # [[module, qualname, label]]: for spawned children
        self.path = path                # the hits file children append to
        self.fd = fd                    # an O_APPEND descriptor on it (forked children inherit it)
        self.pid = pid                  # the process that reads the file (-1: none here)
        self.hits: list[str] = []       # labels seen in this process, in order
        self.sent: set[str] = set()     # labels this (child) process wrote to the file

    def record(self, label: str) -> None:
        if label not in self.hits:
            self.hits.append(label)
        if os.getpid() != self.pid and label not in self.sent:
            self.sent.add(label)
            try:
                os.write(self.fd, json.dumps(label).encode() + b"\n")
            except OSError:
                pass  # the block is over and its file gone: nobody reads this hit

    def spec(self) -> dict:
        return {"path": self.path, "codes": [[q, d, label] for (q, d), label in self.codes.items()],
                "c": self.c_names}


def _seen_code(code: Any) -> None:
    entry = _SEEN.get(id(code))
    if entry is None or entry[0] is not code:
        qualname = getattr(code, "co_qualname", code.co_name)
        wanted = any(q == qualname for w in _WATCHES for q, _ in w.codes)
        entry = (code, code_fingerprint(code) if wanted else None)
        _SEEN[id(code)] = entry   # the code object is kept, so its id is not reused
    if entry[1] is not None:
        for w in _WATCHES:
            label = w.codes.get(entry[1])
            if label is not None:
                w.record(label)


def _seen_c(address: int) -> None:
    for w in _WATCHES:
        label = w.c_funcs.get(address)
        if label is not None:
            w.record(label)


_gettrace, _settrace, _getprofile, _setprofile = (sys.gettrace, sys.settrace, sys.getprofile,
                                                  sys.setprofile)


def _trace(frame: Any, event: str, arg: Any) -> None:
    """The global trace hook (``sys.settrace``; it asks for no line events, so it runs on
    Python calls only): matches the code that starts, and puts the profile hook back in
    this thread once a profiler has let it go."""
    if not _ARMED:
        _settrace(None)
        return None
    code = frame.f_code
    if code.co_name in _NAMES:
        _seen_code(code)
    if _getprofile() is None:
        _setprofile(_profile)
    return None


def _profile(frame: Any, event: str, arg: Any) -> None:
    """The profile hook (``sys.setprofile``; every call, return and C call): matches C
    functions, and does the trace hook's work while a tracer holds that slot (and puts
    it back once the slot is free)."""
    if event == "call":
        if _gettrace() is not _trace:
            if not _ARMED:
                _setprofile(None)
                return
            code = frame.f_code
            if code.co_name in _NAMES:
                _seen_code(code)
            if _gettrace() is None:
                _settrace(_trace)
    elif event == "c_call" and _C_IDS and id(arg) in _C_IDS:
        _seen_c(id(arg))


# CPython 3.10 and 3.11 have no setprofile_all_threads; 3.12 builds it on the C function
# _PyEval_SetProfile(thread state, C hook, arg), which 3.10/3.11 export too. The C hook
# set here runs once per thread: on the thread's next event it installs the two Python
# hooks in that thread (sys.setprofile/sys.settrace act on the calling thread) and hands
# the event to them. It is never freed: a thread may be inside it when a block ends.
_BOOTSTRAP: Any = None


def _bootstrap_hook(obj: Any, frame: Any, what: int, arg: Any) -> int:
    try:
        if not _ARMED:
            sys.setprofile(None)
            return 0
        sys.setprofile(_profile)
        if sys.gettrace() is None:
            sys.settrace(_trace)
        if what == 0:      # PyTrace_CALL
            _trace(frame, "call", None)
        elif what == 4 and arg in _C_IDS:   # PyTrace_C_CALL: arg is the function's address
            _seen_c(arg)
    except BaseException:  # noqa: BLE001 - a C hook must not raise
        pass
    return 0


def _install_in_other_threads() -> bool:
    """Put the bootstrap hook on every other thread that exists now (CPython 3.10/3.11).
    False where that C API is not there (then threads started before the block are not
    watched)."""
    global _BOOTSTRAP
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 10), (3, 11)):
        return False
    try:
        import ctypes

        api = ctypes.pythonapi
        if _BOOTSTRAP is None:
            hook_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.py_object,
                                          ctypes.c_int, ctypes.c_void_p)
            for fn, res, args in [
                    ("PyThreadState_Get", ctypes.c_void_p, []),
                    ("PyThreadState_GetInterpreter", ctypes.c_void_p, [ctypes.c_void_p]),
                    ("PyInterpreterState_ThreadHead", ctypes.c_void_p, [ctypes.c_void_p]),
                    ("PyThreadState_Next", ctypes.c_void_p, [ctypes.c_void_p]),
                    ("_PyEval_SetProfile", ctypes.c_int,
                     [ctypes.c_void_p, hook_type, ctypes.c_void_p])]:
                getattr(api, fn).restype, getattr(api, fn).argtypes = res, args
            _BOOTSTRAP = hook_type(_bootstrap_hook)
        me = api.PyThreadState_Get()
        ts = api.PyInterpreterState_ThreadHead(api.PyThreadState_GetInterpreter(me))
        while ts:
            if ts != me:
                api._PyEval_SetProfile(ts, _BOOTSTRAP, None)
            ts = api.PyThreadState_Next(ts)
        return True
    except Exception:  # noqa: BLE001 - no such API here: documented limit
        return False


def _install() -> None:
    """Both hooks in this thread, in every thread started from now on, in every thread
    that exists (3.12+: ``*_all_threads``; 3.10/3.11: the bootstrap hook), and the
    multiprocessing launcher that starts the spy in spawned children."""
    _SAVED.update(thread=threading.get_ident(), profile=sys.getprofile(),
                  trace=sys.gettrace(), threading_profile=threading.getprofile(),
                  threading_trace=threading.gettrace())
    if hasattr(threading, "setprofile_all_threads"):  # Python 3.12+
        threading.setprofile_all_threads(_profile)
        threading.settrace_all_threads(_trace)
    else:
        _install_in_other_threads()
        threading.setprofile(_profile)
        threading.settrace(_trace)
        sys.setprofile(_profile)
        sys.settrace(_trace)
    _patch_multiprocessing()


def _uninstall() -> None:
    """Hooks off in this thread and for new threads (the saved ones back); in other
    threads each hook removes itself on its next event; the launcher restored."""
    threading.setprofile(_SAVED.get("threading_profile"))
    threading.settrace(_SAVED.get("threading_trace"))
    mine = _SAVED.get("thread") == threading.get_ident()
    sys.setprofile(_SAVED.get("profile") if mine else None)
    sys.settrace(_SAVED.get("trace") if mine else None)
    _unpatch_multiprocessing()
    _SEEN.clear()


def _publish() -> None:
    """Rebind what the hooks read from the open watches (under _LOCK)."""
    global _NAMES, _C_IDS
    _NAMES = frozenset(q.rpartition(".")[2] for w in _WATCHES for q, _ in w.codes)
    _C_IDS = frozenset(a for w in _WATCHES for a in w.c_funcs)


# --- spawned children: the spy starts before anything else runs in them ---------------------
_REAL_SPAWNV: Any = None
#: The ``-c`` programs of multiprocessing's spawn and forkserver launchers (not its
#: resource tracker, which runs no user code).
_LAUNCHERS = ("from multiprocessing.spawn import spawn_main",
              "from multiprocessing.forkserver import main")


def _spawnv_passfds(path: Any, args: Any, passfds: Any) -> int:
    """``multiprocessing.util.spawnv_passfds`` while a watch is open: a spawn or
    forkserver child first runs :func:`_spy_child`, reading the open watches from a pipe
    (so the hits file's path is in no command line and no environment variable)."""
    args = list(args)
    k = args.index("-c") + 1 if "-c" in args else 0
    if not (_ARMED and k and k < len(args) and args[k].startswith(_LAUNCHERS)):
        return _REAL_SPAWNV(path, args, passfds)
    spec = json.dumps([w.spec() for w in _WATCHES]).encode()
    r, w = os.pipe()
    try:
        if len(spec) <= 60_000:   # fits the pipe's buffer (64 KiB on Linux): no wait
            _write_all(w, spec)
        else:                     # the child reads it while a thread here writes
            threading.Thread(target=_write_all, args=(w, spec), daemon=True).start()
        w = -1                    # _write_all closes it
        args[k] = f"from perflab.labs.checking import _spy_child; _spy_child({r}); {args[k]}"
        return _REAL_SPAWNV(path, args, [*passfds, r])
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to pipe ``fd`` and close it (the reader then sees its end)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _stop_forkserver() -> None:
    """Stop multiprocessing's forkserver if one runs (its children live on). One started
    before a block never got the spy, and one started inside it carries the spy of a
    block that is over: the block's first forkserver child starts a fresh one through
    the patched launcher, and the first use after the block another fresh one. Uses
    ``ForkServer._stop`` (CPython 3.8+, private but what multiprocessing's own tests
    call); where it is missing the forkserver stays (the documented limit)."""
    fs = sys.modules.get("multiprocessing.forkserver")
    server = getattr(fs, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        try:
            server._stop()
        except Exception:  # noqa: BLE001 - never let the spy break the graded call
            pass


def _patch_multiprocessing() -> None:
    global _REAL_SPAWNV
    import multiprocessing.util as mp_util

    if mp_util.spawnv_passfds is not _spawnv_passfds:
        _REAL_SPAWNV = mp_util.spawnv_passfds
        mp_util.spawnv_passfds = _spawnv_passfds
        _stop_forkserver()


def _unpatch_multiprocessing() -> None:
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None and mp_util.spawnv_passfds is _spawnv_passfds:
        mp_util.spawnv_passfds = _REAL_SPAWNV
        _stop_forkserver()


def _spy_child(fd: int) -> None:
    """Run first in a child that multiprocessing spawns while a watch is open: read the
    open watches from pipe ``fd``, open their hits files, and watch this whole process
    (its threads and its own children too) until it exits. C functions are looked up
    here by module and qualified name; one that does not import is skipped."""
    global _WATCHES, _ARMED
    with os.fdopen(fd, "rb") as pipe:
        specs = json.loads(pipe.read())
    watches = []
    for spec in specs:
        c_funcs = {}
        for module, qualname, label in spec["c"]:
            for dotted in (f"{module}.{qualname}", label):
                try:
                    obj = _import_dotted(dotted)
                except Exception:  # noqa: BLE001 - not importable here: try the other name
                    continue
                c_funcs[id(obj)] = label
                _KEEP.append(obj)
                break
        try:
            out = os.open(spec["path"], os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue  # that block is already over
        watches.append(_Watch({(q, d): label for q, d, label in spec["codes"]}, c_funcs,
                              spec["c"], spec["path"], out, pid=-1))
    with _LOCK:
        _WATCHES = tuple(watches)
        _publish()
        _ARMED = True
        _install()


_KEEP: list[Any] = []   # C functions a child watches (their ids must stay theirs)


def _import_dotted(dotted: str) -> Any:
    """The object ``a.b.c`` names: the longest importable module prefix, then attributes.

    Raises:
        ImportError: no prefix of it is an importable module.
        AttributeError: the rest is not an attribute chain of that module.
    """
    parts = dotted.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for part in parts[k:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"no module in {dotted!r}")


def _targets(targets: Mapping[str, Any]) -> tuple[dict, dict, list]:
    """(code fingerprints, C functions by id, C functions by name) of ``targets``.

    Raises:
        ValueError: a target has no Python code and is not a C function (a class written
            in C, a bound method of a C object): the spy could not see it run.
    """
    codes: dict[tuple[str, str], str] = {}
    c_funcs: dict[int, str] = {}
    c_names: list[list[str]] = []
    for label, obj in targets.items():
        found = _codes(obj)
        for code in found:
            codes[code_fingerprint(code)] = label
        if found:
            continue
        if isinstance(obj, types.BuiltinFunctionType) and getattr(obj, "__module__", None):
            c_funcs[id(obj)] = label
            c_names.append([obj.__module__, getattr(obj, "__qualname__", obj.__name__), label])
            continue
        raise ValueError(f"{label!r} ({type(obj).__name__}) has no Python code and is not a "
                         "C function: the spy cannot see it run; forbid the Python function "
                         "that calls it instead")
    return codes, c_funcs, c_names


def watching() -> bool:
    """Whether a :func:`watch_calls` block is open in this process (a launcher must then
    spawn its children, so that the spy starts in them)."""
    return bool(_WATCHES)


@contextmanager
def watch_calls(targets: Mapping[str, Any]) -> Iterator[list[str]]:
    """Record which of ``targets`` (label -> function or class) run inside the block,
    however they are reached, in every thread and every child process, and in any copy
    of their code.

    * **however reached**: an alias, a default argument, a closure, an import: the spy
      is on the interpreter (two hooks, ``sys.setprofile`` and ``sys.settrace``), not on
      names. A class is watched through its own ``__init__``, ``__call__`` and
      ``__new__``; a C function (a ``builtin_function_or_method`` such as a pybind
      binding) through the profile hook's C calls.
    * **every copy**: a Python function is matched by :func:`code_fingerprint` (qualified name
      and a digest of its bytecode, constants and names, without file name, line numbers
      or docstring), not by object identity: running its module's source again (``exec``,
      ``runpy``, ``cProfile.Profile().runctx``, a copied file imported) is seen.
    * **every thread**: threads started inside the block (``threading``,
      ``concurrent.futures``, DataLoader's pin-memory thread) and the ones that already
      run (Python 3.12+: ``threading.setprofile_all_threads``; CPython 3.10/3.11: the same
      C API that 3.12 uses, ``_PyEval_SetProfile`` through ``ctypes``: a thread that
      exists is watched from its next Python event on).
    * **every child process**: a forked child (``multiprocessing`` fork, DataLoader
      workers, ``ProcessPoolExecutor``) inherits the hooks; a child that multiprocessing
      spawns inside the block (``spawn``, ``forkserver``, DataLoader's
      ``multiprocessing_context="spawn"``, ``torch.multiprocessing.spawn``) starts the spy
      before any of its own code: while the block runs, multiprocessing's launcher
      (``multiprocessing.util.spawnv_passfds``) prepends :func:`_spy_child` to the child's
      ``-c`` program and passes the targets through a pipe. Children append what they
      see to a file in a fresh private temporary directory (``tempfile.mkdtemp``), which
      this block reads at its end and removes; the file's path is in no command line
      and no environment variable. No ``import perflab`` side effect is involved: the
      hooks exist only while a block is open (and in children started inside it).
    * **profilers and tracers**: an honest answer may run ``cProfile``, ``line_profiler``
      or ``torch.profiler``, which take one of the two hooks; the other keeps watching
      and puts its partner back once it is free. If, when the block ends, both hooks of
      this thread are held by others (``sys.setprofile(None)`` and ``sys.settrace(None)``
      both called, or two profilers left on), :data:`SWITCHED_OFF` is recorded.

    Limits (what it does not see): processes started *before* the block (a persistent
    DataLoader worker or a ``Pool`` made in an earlier cell never got the hooks; a
    forkserver running when the block opens is stopped, so the block's forkserver
    children come from a fresh, watched one); programs started with ``subprocess``,
    ``os.exec*`` or ``os.posix_spawn`` (no spy in them; the answer scan flags those
    modules); threads that C code starts inside the block without ``threading``
    (``_thread.start_new_thread``, which the scan flags,
    or a C library's own threads); threads that existed before the block on an
    interpreter with neither ``threading.setprofile_all_threads`` nor CPython 3.10/3.11's
    ``_PyEval_SetProfile``; a copy whose code was changed (renamed, variables renamed,
    body edited: the scan flags the exec family that makes such copies at run time, and
    the similarity review compares sources); on Python 3.13+, a copy stripped of its
    docstring (:func:`code_fingerprint`); C methods and classes written in C (refused, see
    Raises); a child that finds the hits file and truncates it. While two blocks are
    open in different threads of one process, each sees the other's calls.

    Overhead, while a block is open: every Python call in the process runs the two
    hooks, about +0.37 µs of CPU per call (CPython 3.11); a tiny CPU training step (an
    MLP 64-64-10, batch 32, ~0.2-0.5 ms) takes 33-45 % longer, a 15 ms step (MLP 512x4,
    batch 128, AdamW) the same within noise. Nothing is paid outside a block.

    Yields:
        A list that gets each label once, when its code first runs in this process;
        the labels that only children saw are added when the block ends (read it after
        the block).

    Raises:
        ValueError: a target has no Python code and is not a C function (checked before
            anything is installed).
    """
    global _WATCHES, _ARMED
    codes, c_funcs, c_names = _targets(targets)
    if not codes and not c_funcs:
        yield []
        return
    folder = tempfile.mkdtemp(prefix="perflab-spy-")
    path = os.path.join(folder, "hits")
    reader = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
    writer = os.open(path, os.O_WRONLY | os.O_APPEND)   # for forked children
    watch = _Watch(codes, c_funcs, c_names, path, writer, os.getpid())
    with _LOCK:
        first = not _ARMED
        _WATCHES = (*_WATCHES, watch)
        _publish()
        _ARMED = True
        if first:
            _install()
    try:
        yield watch.hits
    finally:
        mine = _SAVED.get("thread") == threading.get_ident()
        if mine and sys.getprofile() is not _profile and sys.gettrace() is not _trace \
                and SWITCHED_OFF not in watch.hits:
            watch.hits.append(SWITCHED_OFF)
        with _LOCK:
            _WATCHES = tuple(w for w in _WATCHES if w is not watch)
            _publish()
            if not _WATCHES:
                _ARMED = False
                _uninstall()
        try:
            data = b""
            while chunk := os.read(reader, 1 << 16):
                data += chunk
        finally:
            os.close(reader)
            os.close(writer)
            shutil.rmtree(folder, ignore_errors=True)
        labels = set(codes.values()) | set(c_funcs.values())
        for line in data.decode(errors="replace").splitlines():
            try:
                label = json.loads(line)
            except ValueError:
                continue
            if isinstance(label, str) and label in labels:
                watch.hits.append(label)
        watch.hits[:] = list(dict.fromkeys(watch.hits))  # each label once, first seen first


def resolve(name: str) -> Any:
    """The object a public perflab name (``"measure"``) or a dotted path
    (``"torch.utils.flop_counter.FlopCounterMode"``) names.

    Raises:
        ValueError: no such public perflab name, or the dotted path does not resolve.
    """
    if "." not in name:
        return getattr(_home(name), name)
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{name!r} does not name an importable object ({e})") from e


def _home(name: str) -> Any:
    """The library module whose ``__all__`` holds ``name`` (modules already imported are
    looked at first).

    Raises:
        ValueError: no library module exports ``name``.
    """
    import sys

    import perflab

    if name in perflab._HOME:
        return importlib.import_module(f"perflab.{perflab._HOME[name]}")
    modules = perflab._library_modules()
    loaded = [m for m in modules if m in sys.modules]   # before importing any: an import
    for dotted in loaded + [m for m in modules if m not in loaded]:  # loads others too
        module = importlib.import_module(dotted)
        if name in getattr(module, "__all__", ()):
            return module
    raise ValueError(f"{name!r} is not a public perflab name; see docs/API.md")
