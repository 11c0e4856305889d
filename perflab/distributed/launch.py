"""``launch_fn(fn, world_size)``: run a function on N ranks with torch.distributed ready.

Built on torch.distributed's elastic launcher (``torch.distributed.launcher.api.
elastic_launch`` with a ``LaunchConfig``: the engine behind ``torchrun``), configured as
``torchrun --standalone`` is: a c10d rendezvous on ``localhost:0``, so the operating
system picks a free port (a busy default port such as 29500 is not an error) and no
rendezvous server has to be set up by hand.

Each rank is a fresh process that imports ``fn`` by name, so ``fn`` must be a
module-level function of an importable module (perflab's workers are; a function typed
into a notebook cell is not). Ranks start from a **forkserver** that has imported torch
once (:func:`_start_method`): a spawned rank spends 1.5-3 s of CPU importing torch (and
``torch.distributed.pipelining`` or ``.tensor``) before ``fn`` runs, 4 ranks on 2 cores
about 5 s of every launch. ``spawn`` is used instead whenever the forkserver could give
a rank something other than a fresh process would: the environment changed since the
forkserver started (a variable torch reads at import, such as ``TORCH_CPP_LOG_LEVEL``,
would be stale), a :func:`perflab.labs.checking.watch_calls` block is open (its spy
reaches spawned children only), or ``PERFLAB_START_METHOD=spawn``. A forked rank that
dies of a crash signal (SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE: a native library that
was not safe to fork) makes the whole launch run once more with ``spawn``, with a
RuntimeWarning (seen once in a CI run: a 4-rank Lab 10 launch, SIGSEGV).

Inside ``fn`` the default process group is already initialised (gloo on CPU with
``threads_per_rank`` torch threads, NCCL on CUDA with one GPU per local rank), so
``dist.get_rank()`` works.

Faults (STYLE: failure paths are tested with deliberate faults, see
:mod:`perflab.distributed.faults`):

* a rank that raises: the agent sees it fail at its next poll (0.1 s), stops the other
  ranks (SIGTERM, then SIGKILL after ``_SHUTDOWN_S``) and :func:`launch_fn` raises
  :class:`RankFailedError` naming the rank and its exception (type and message);
* a rank that hangs: a watchdog thread in every rank dumps all threads' stacks
  (``faulthandler``) and exits once ``timeout_s`` has passed; the launcher raises
  :class:`LaunchTimeoutError`. A second timer in the launching process kills any rank
  still alive ``_BACKSTOP_S`` later, so no process is left behind either way;
* a rank killed without a Python exception (SIGKILL from the out-of-memory killer, a
  segfault) is named as the cause, not its peers' "connection closed" errors, with the
  cgroup's OOM-kill count when the kernel exposes it;
* a rank that exits before its rank body starts (no ``rank<N>.started`` file: it failed
  while multiprocessing set the process up, re-running the launching script or
  importing ``fn``'s module) is named with the likely cause and its fix: a script that
  launches at its top level, without ``if __name__ == "__main__":``, or a module the
  rank cannot import (:func:`_before_start_why`). Such a script's launch, run again
  inside a starting rank, raises at once with the fix (:func:`_refuse_while_bootstrapping`)
  instead of starting ranks of its own;
* the launching process dies (a killed notebook kernel): every rank notices within
  ``PARENT_POLL_S`` (it polls its parent's pid) and exits, instead of living on until
  its watchdog.

What runs in each rank (the watchdog, the parent heartbeat, core pinning) and the
launcher's clean-up of rank processes and signal handlers are
:mod:`perflab.distributed.lifecycle`; this module starts the ranks and turns their
failures into exceptions.

Ranks that outnumber the usable cores (``world_size x threads_per_rank``) are allowed
(oversubscription is a lab topic) but warned about: their step times include waiting
for a core. The launch's temporary folder (rank logs, error files) is removed after.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil
import torch

from perflab.distributed.lifecycle import (kill_new_children, oom_kills, rank_entry,
                                           restore_signals, save_signals)

__all__ = ["launch_fn", "RankFailedError", "LaunchTimeoutError", "default_backend"]

#: Seconds the agent waits after SIGTERM before SIGKILL when stopping ranks.
_SHUTDOWN_S = 3
#: Extra seconds the launching process waits before killing ranks itself (counted from
#: the launch, so it includes the ranks' start-up: importing torch can take 15 s or more
#: on a loaded 2-core machine, before a rank's own watchdog is even running).
_BACKSTOP_S = 60.0
#: Text of the errors a rank raises when a peer vanished: effects, never the cause.
_PEER_LOSS = ("Connection closed by peer", "Connection reset", "ECONNRESET", "Broken pipe",
              "DistNetworkError", "recvBytes", "Socket Timeout", "connection refused")


class RankFailedError(RuntimeError):
    """A rank raised (or died). ``rank``: the first failing rank; ``errors``: text per rank."""

    def __init__(self, message: str, rank: int, errors: dict[int, str]):
        super().__init__(message)
        self.rank = rank
        self.errors = errors


class LaunchTimeoutError(TimeoutError):
    """Ranks were still running after ``timeout_s``; all were stopped. ``ranks``: which."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


#: What the forkserver imports once, so that no rank pays for it: torch and what
#: perflab's rank bodies and the labs' student modules import. Student modules are never
#: preloaded: each rank imports them fresh, so an edited file is what runs.
_PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor",
            "torch.distributed.pipelining", "perflab.distributed.lifecycle",
            "perflab.distributed.worker")
_forkserver: dict[str, Any] = {}   # the forkserver this module started: "pid", "env"
_forkserver_lock = threading.Lock()


def _start_method() -> str:
    """``"forkserver"`` (torch preloaded, started on first use) or ``"spawn"``; see the
    module docstring for when spawn is chosen. Never raises: a forkserver that cannot
    start means spawn."""
    import multiprocessing
    import multiprocessing.forkserver as mp_forkserver
    import sys

    if os.environ.get("PERFLAB_START_METHOD", "forkserver") == "spawn":
        return "spawn"
    checking = sys.modules.get("perflab.labs.checking")
    if checking is not None and checking.watching():
        return "spawn"
    with _forkserver_lock:
        try:
            server = mp_forkserver._forkserver   # multiprocessing's one ForkServer
            running = getattr(server, "_forkserver_pid", None)
            if running is None:
                multiprocessing.get_context("forkserver").set_forkserver_preload(
                    list(_PRELOAD))
                mp_forkserver.ensure_running()
                _forkserver.update(pid=server._forkserver_pid, env=dict(os.environ))
            elif running != _forkserver.get("pid"):
                return "spawn"   # started by someone else, with an unknown environment
        except Exception:  # noqa: BLE001 - any failure to start it: spawn, as before
            return "spawn"
        return "forkserver" if dict(os.environ) == _forkserver.get("env") else "spawn"


def default_backend(device: str = "auto") -> str:
    """"nccl" when ranks use CUDA (device "cuda"/"auto" with a GPU present), else "gloo"."""
    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "nccl" if use_cuda else "gloo"


def _check_importable(fn: Callable[..., Any]) -> None:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not callable(fn) or module in (None, "__main__") or "<locals>" in qualname \
            or "<lambda>" in qualname:
        raise ValueError(
            f"fn must be a module-level function of an importable module (spawned ranks "
            f"import it by name), got {fn!r} from module {module!r}; move it into a .py "
            "module (e.g. perflab.distributed.worker) and import it from there")


#: The fix for a launch at a script's top level, as both messages below give it.
_GUARD_FIX = ("put the launch under `if __name__ == \"__main__\":` (or in a function "
              "called from there)")


def _refuse_while_bootstrapping() -> None:
    """Raise if this process is a rank still being set up by multiprocessing.

    The spawn and forkserver start methods run the launching program's main script again
    in every new process (as ``__mp_main__``) before its target; a launch at the script's
    top level then runs inside each starting rank, where multiprocessing would refuse to
    start processes only after the elastic agent and its rendezvous were set up, with its
    generic bootstrapping message. Multiprocessing's own test is the same flag."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "launch_fn was called while a rank process was starting: the launching script "
            "runs again in every rank (multiprocessing's spawn and forkserver start methods "
            "import the main script in each new process), and this script launches at its "
            f"top level; {_GUARD_FIX}")


def launch_fn(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
              backend: str | None = None, device: str = "auto", timeout_s: float = 300,
              threads_per_rank: int = 1, pin_cores: bool | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` local ranks; return their results by rank.

    Args:
        fn: a module-level function (imported by name in each spawned rank); its return
            value must be picklable.
        world_size: ranks (processes) on this machine, >= 1.
        args: positional arguments for ``fn`` (picklable).
        backend: "gloo", "nccl" or None (= :func:`default_backend` of ``device``).
        device: "auto", "cpu" or "cuda": only used to choose the backend.
        timeout_s: seconds after which a rank still running is stopped (> 0); also the
            process group's collective timeout.
        threads_per_rank: ``torch.set_num_threads`` in each rank (>= 1).
        pin_cores: bind each rank to its own ``threads_per_rank`` cores
            (``os.sched_setaffinity``; round-robin when ranks outnumber cores). None =
            on for gloo (CPU ranks), off for NCCL.

    Returns:
        ``[fn's return value on rank 0, on rank 1, ...]``.

    Raises:
        ValueError: bad arguments (before any process starts).
        RankFailedError: a rank raised or died; names the rank and its exception.
        LaunchTimeoutError: ranks still ran after ``timeout_s``; all were stopped.
        RuntimeError: called in a rank that multiprocessing is still starting (a script
            that launches at its top level, without ``if __name__ == "__main__":``, runs
            again in each rank).
    """
    _refuse_while_bootstrapping()
    _check_importable(fn)
    backend, pin_cores = _checked_launch(world_size, backend, device, timeout_s,
                                         threads_per_rank, pin_cores)
    _warn_if_oversubscribed(backend, world_size, threads_per_rank)
    oom_before = oom_kills()
    method = _start_method()
    while True:
        results, crashed = _launch_once(fn, tuple(args), world_size, backend, timeout_s,
                                        threads_per_rank, pin_cores, method, oom_before)
        if crashed is None:
            return results
        # A process forked from a parent that imported torch can crash where a fresh one
        # does not (fork-safety of native libraries); rank bodies are rerunnable, so the
        # launch runs once more from fresh interpreters, and says so
        warnings.warn(f"a rank forked from perflab's forkserver died of {crashed}; "
                      "launching the ranks again with start method 'spawn'",
                      RuntimeWarning, stacklevel=2)
        method = "spawn"


def _checked_launch(world_size: Any, backend: str | None, device: str, timeout_s: Any,
                    threads_per_rank: Any, pin_cores: bool | None) -> tuple[str, bool]:
    """:func:`launch_fn`'s arguments checked before any process starts; returns the
    backend and whether to pin cores (None: on for gloo). Raises ValueError naming the
    argument and the fix."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (ranks), got {world_size!r}")
    if (not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool)
            or not math.isfinite(timeout_s) or timeout_s <= 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    if (not isinstance(threads_per_rank, int) or isinstance(threads_per_rank, bool)
            or threads_per_rank < 1):
        raise ValueError(f"threads_per_rank must be an int >= 1, got {threads_per_rank!r}")
    backend = backend or default_backend(device)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} "
                         f"but {torch.cuda.device_count()} GPU(s) here; use backend='gloo' "
                         "(device='cpu') or fewer ranks")
    return backend, (backend == "gloo") if pin_cores is None else pin_cores


def _warn_if_oversubscribed(backend: str, world_size: int, threads_per_rank: int) -> None:
    """A RuntimeWarning when gloo ranks x threads outnumber the usable cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if backend == "gloo" and world_size * threads_per_rank > (cores or 1):
        warnings.warn(f"{world_size} ranks x {threads_per_rank} thread(s) on {cores} usable "
                      "core(s): the ranks are oversubscribed and share cores, so step times "
                      "include waiting for a core (label such runs as oversubscribed)",
                      RuntimeWarning, stacklevel=3)


def _launch_once(fn: Callable[..., Any], args: tuple, world_size: int, backend: str,
                 timeout_s: float, threads_per_rank: int, pin_cores: bool, method: str,
                 oom_before: int | None) -> tuple[list[Any] | None, str | None]:
    """One elastic launch of the ranks (as ``torchrun --standalone``), with a backstop
    that kills them ``_BACKSTOP_S`` after ``timeout_s`` and the caller's signal handlers
    put back afterwards. Returns (results by rank, None), or (None, the crash signal) when
    a rank forked from the forkserver crashed (worth one relaunch with spawn).

    Raises:
        RankFailedError, LaunchTimeoutError: as :func:`launch_fn`.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    err_dir = tempfile.mkdtemp(prefix="perflab-launch-")
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=uuid.uuid4().hex,
        rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # as `torchrun --standalone`
        max_restarts=0, monitor_interval=0.1, start_method=method,
        logs_specs=DefaultLogsSpecs(log_dir=err_dir), shutdown_timeout=_SHUTDOWN_S)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # the agent installs handlers that turn these signals into SignalException (so a
    # Ctrl-C / kernel interrupt stops every rank); put the caller's back afterwards, so
    # a notebook kernel's own SIGTERM/SIGINT handling is unchanged once launch_fn returns
    saved_signals = save_signals(config.signals_to_handle)
    backstop_fired = threading.Event()

    def backstop_kill() -> None:
        backstop_fired.set()
        kill_new_children(before)

    backstop = threading.Timer(timeout_s + _BACKSTOP_S, backstop_kill)
    backstop.daemon = True
    backstop.start()
    try:
        out = elastic_launch(config, rank_entry)(fn, args, backend, float(timeout_s),
                                                  threads_per_rank, err_dir, pin_cores,
                                                  os.getpid(), method == "spawn")
    except ChildFailedError as e:
        if backstop_fired.is_set():
            raise LaunchTimeoutError(
                f"ranks still running {timeout_s + _BACKSTOP_S:g} s after the launch "
                f"(timeout_s={timeout_s:g} s plus {_BACKSTOP_S:g} s for start-up); the "
                "launcher killed them all. A rank's own watchdog did not fire: were the "
                "ranks still starting (a heavily loaded machine)?",
                list(range(world_size))) from None
        crashed = _crash_signal(e) if method == "forkserver" else None
        if crashed is None:
            raise _failure(e, err_dir, world_size, timeout_s, oom_before) from None
        return None, crashed
    finally:
        backstop.cancel()
        kill_new_children(before)  # normally none left: the agent reaped them
        restore_signals(saved_signals)
        shutil.rmtree(err_dir, ignore_errors=True)
    return [out[r] for r in range(world_size)], None


#: Signals that end a forked rank by a crash (not a stop): worth one relaunch with spawn.
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT", "SIGFPE")


def _crash_signal(e: Any) -> str | None:
    """The name of the crash signal (:data:`_CRASH_SIGNALS`) that ended a rank of the
    failed launch ``e`` (elastic's ChildFailedError), or None."""
    import signal

    for failure in getattr(e, "failures", {}).values():
        code = getattr(failure, "exitcode", None)
        if isinstance(code, int) and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                continue
            if name in _CRASH_SIGNALS:
                return name
    return None


def _failure(e: Any, err_dir: str, world_size: int, timeout_s: float,
             oom_before: int | None = None) -> Exception:
    """Turn elastic's ChildFailedError into a RankFailedError or LaunchTimeoutError."""
    errors: dict[int, str] = {}
    for r in range(world_size):
        p = Path(err_dir) / f"rank{r}.err"
        text = p.read_text() if p.is_file() else ""
        if text.strip():  # an empty file: a rank stopped (SIGTERM) while writing it
            errors[r] = text
    if any(text.startswith("TimeoutError") for text in errors.values()):
        # every rank that had not finished was still running (the hung one and the
        # ranks waiting for it); the watchdogs' stack dumps show where each was
        running = [r for r in range(world_size)
                   if not (Path(err_dir) / f"rank{r}.done").exists()]
        dumps = sorted(r for r, text in errors.items() if text.startswith("TimeoutError"))
        where = "\n".join(f"  rank {r}: {_innermost_frame(errors[r])}" for r in dumps)
        return LaunchTimeoutError(
            f"rank(s) {running} still running after timeout_s={timeout_s:g} s; all "
            f"{world_size} ranks were stopped. Where they were:\n{where}\n\n"
            f"{errors[dumps[0]]}", running)
    raised = sorted(errors, key=lambda r: (Path(err_dir) / f"rank{r}.err").stat().st_mtime_ns)
    # A rank that raised its own exception is the cause; "connection closed" and the
    # like on a rank are only the effect of a peer that vanished.
    genuine = [r for r in raised if not any(s in errors[r] for s in _PEER_LOSS)]
    # A rank that died without a Python exception (a crash, os._exit, SIGKILL from the
    # OOM killer) is the cause too. SIGTERM is the agent stopping the other ranks.
    died = sorted(r for r, f in e.failures.items() if r not in errors and f.exitcode != -15)
    if genuine and not died:
        rank = genuine[0]
        first_line = errors[rank].splitlines()[0]
        return RankFailedError(f"rank {rank} raised {first_line}\n\n{errors[rank]}",
                               rank, errors)
    silent = [r for r in range(world_size) if r not in errors
              and not (Path(err_dir) / f"rank{r}.done").exists()]
    if not genuine and not died and silent:
        # Only peers' "connection lost" errors came back: the elastic agent reports the
        # first process it saw end, and a forkserver child that raised exits at once
        # (os._exit), often before the SIGKILLed one is reported. The rank that left no
        # exception and never finished is the cause; its signal is not known here.
        rank = silent[0]
        after = "".join(f"\nthen rank {r}: {errors[r].splitlines()[0]}" for r in raised)
        return RankFailedError(
            f"rank {rank} died without a Python exception (its peers lost their connection "
            f"to it){_oom_why(oom_before)}{after}", rank,
            {**{r: str(f) for r, f in e.failures.items()}, **errors})
    if not died:
        rank = raised[0] if raised else min(e.failures)
        text = errors.get(rank, str(e.failures.get(rank)))
        return RankFailedError(f"rank {rank} raised {text.splitlines()[0]}\n\n{text}",
                               rank, {**{r: str(f) for r, f in e.failures.items()},
                                      **errors})
    rank = died[0]
    failure = e.failures[rank]
    how = (f"signal {failure.signal_name()}" if failure.exitcode < 0
           else f"exit code {failure.exitcode}")
    after = "".join(f"\nthen rank {r}: {errors[r].splitlines()[0]}" for r in raised)
    everything = {**{r: str(f) for r, f in e.failures.items()}, **errors}
    if failure.exitcode > 0 and not (Path(err_dir) / f"rank{rank}.started").exists():
        return RankFailedError(f"rank {rank} died ({how}) before its rank body started: "
                               f"{_before_start_why()}{after}", rank, everything)
    why = _oom_why(oom_before) if failure.exitcode == -9 else ""
    return RankFailedError(f"rank {rank} died ({how}) without a Python exception{why}{after}",
                           rank, everything)


def _before_start_why(main: Any = None) -> str:
    """Why a rank exited while multiprocessing was still setting it up (before
    :func:`~perflab.distributed.lifecycle.rank_entry` ran), and the fix. ``main``: the
    launching process's ``__main__`` module (default: this process's).

    Multiprocessing's spawn and forkserver start methods run the launching script again
    in each new process, then import ``fn``'s module to unpickle it; the rank's own
    traceback goes to its standard error (a script's terminal; for a notebook, the
    terminal that started Jupyter), not to this process."""
    main = sys.modules.get("__main__") if main is None else main
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        script = None if name == "__main__" or name.endswith(".__main__") else name
    else:
        script = getattr(main, "__file__", None)
    if script is not None:
        return (f"every rank first runs the launching script ({script}) again, and a "
                "launch at the script's top level cannot start ranks from a rank that is "
                "itself still starting (multiprocessing's bootstrapping phase); "
                f"{_GUARD_FIX}. If it is there already, the rank could not import the "
                "script or fn's module: its traceback is on the rank's standard error")
    return ("the rank could not import fn's module (each rank imports it by name, from "
            "the launching process's working folder and sys.path: a `%%writefile` module "
            "must be in the notebook's folder) or unpickle the arguments; its traceback is "
            "on the rank's standard error (for a notebook, the terminal that started "
            "Jupyter)")


def _oom_why(oom_before: int | None) -> str:
    """Why a rank was killed without an exception: the out-of-memory killer when this
    cgroup's ``oom_kill`` count went up during the launch, else most likely it."""
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return (f": the out-of-memory killer (this cgroup's oom_kill count went "
                f"{oom_before} -> {oom_after}); lower batch_size, image_size or world_size")
    return (": killed from outside, most likely by the out-of-memory killer "
            "(check `dmesg`); lower batch_size, image_size or world_size")


def _innermost_frame(dump: str) -> str:
    """The main thread's innermost ``File ... line N in f`` from a faulthandler dump."""
    blocks = dump.split("\nThread ")
    for block in reversed(blocks):
        frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        if frames and "in fire" not in frames[0]:
            return frames[0]
    return "(no stack)"
