"""Run one untrusted command in a bubblewrap sandbox, with limits, and kill all it started.

Used by :mod:`perflab.course.grading` to run a student's notebook. The sandbox is
bubblewrap (Debian's ``bubblewrap``, the tool Flatpak uses), not our own code: it gives

* a read-only view of the whole file system (``--ro-bind / /``: the venv and perflab
  import, nothing can be changed), with the folders in ``hide`` (the reference
  notebooks, the other submissions, the grader's own files) covered by empty tmpfs;
* a fresh ``/tmp``, ``/dev/shm`` and the submission's own scratch folder (the only
  writable places), each a tmpfs of at most ``SandboxLimits.tmpfs_gib`` (bubblewrap >=
  0.7's ``--size``; the grader's files in scratch are bound in read-only);
* no network (``--unshare-net``: loopback only, which the Jupyter kernel needs), its own
  PID, IPC, UTS and user namespaces, and ``--die-with-parent``: when the grader kills
  the sandbox (wall-clock limit) or exits, every process inside dies with it, including
  detached ``setsid`` children;
* when the grader runs as root, bwrap sets up the mounts privileged and the command
  drops to an unprivileged uid per parallel slot (``setpriv``, no capabilities, no new
  privileges), so the process-count limit (``RLIMIT_NPROC``, counted per uid) holds;
  ``/root`` and ``/home`` are covered by tmpfs (the interpreter and venv are bound back
  read-only when they live there); as an ordinary user, bwrap uses a user namespace;
* rlimits set before exec and inherited by every process: address space, CPU seconds,
  process count, file size.

Outputs go to files, never to pipes the grader waits on, so a child that keeps a pipe
open cannot make the grader hang. The wall-clock limit kills the whole namespace.

When bubblewrap is missing or cannot create namespaces here (a container without user
namespaces), :func:`sandbox_status` says why and grading falls back to a plain
subprocess with the same rlimits and a loud warning (``sandbox="auto"``), or refuses
(``sandbox="bwrap"``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Sequence

from perflab.course.slots import SLOT_UID_BASE, SLOT_UIDS  # noqa: F401 - re-exported
from perflab.course.slots import claim_uid as _claim_uid
from perflab.course.slots import kill_children as _kill_children
from perflab.course.slots import kill_group as _kill_group
from perflab.course.slots import kill_uid as _kill_uid
from perflab.course.slots import processes_of as _processes_of

__all__ = ["SandboxUnavailable", "SandboxLimits", "SandboxRun", "sandbox_status",
           "run_sandboxed", "SANDBOX_WORK", "SLOT_UID_BASE"]


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made here: the one error that stops a grading batch."""


#: Where the scratch folder appears inside the sandbox.
SANDBOX_WORK = "/tmp/work"
@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (validated by the caller, see ``Limits``)."""

    wall_timeout_s: float
    """Wall-clock seconds before the whole sandbox is killed."""
    memory_gib: float | None = 8.0
    """Address-space limit (RLIMIT_AS) per process, GiB; None: no limit."""
    cpu_s: float | None = None
    """CPU-time limit (RLIMIT_CPU) per process, seconds; None: the wall timeout."""
    nproc: int = 256
    """Processes and threads of the sandbox's uid (RLIMIT_NPROC)."""
    file_gib: float = 1.0
    """Largest file a process may write (RLIMIT_FSIZE), GiB."""
    tmpfs_gib: float = 1.0
    """Size of each writable file system inside: the scratch folder, ``/tmp`` and
    ``/dev/shm`` are tmpfs mounts of at most this many GiB each (their pages are RAM, not
    counted by RLIMIT_AS: the three together stay within the memory budget)."""


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    """What one sandboxed run did."""

    returncode: int | None
    """Exit status; None when killed at the wall-clock limit."""
    timed_out: bool
    wall_s: float
    sandboxed: bool
    """False: ran as a plain subprocess (no bubblewrap), see ``warning``."""
    warning: str = ""


def _needed() -> list[Path]:
    """Folders the notebook must read: the interpreter, the venv, perflab, the data."""
    import perflab
    from perflab.core.paths import default_data_root

    out = [Path(sys.base_prefix), Path(sys.prefix), Path(perflab.__file__).parents[1],
           default_data_root()]
    return [p.resolve() for p in out if p.exists()]


def _unreadable_by_others() -> list[Path]:
    """Needed folders (or their entries) that an unprivileged uid cannot read."""
    import stat

    bad = []
    private = [Path("/root"), Path("/home")]  # replaced by tmpfs in the sandbox
    for p in _needed():
        for q in [p, *p.parents, *(c for c in p.iterdir() if c.is_dir())]:
            if q in private or any(d in q.parents for d in private) and q in p.parents:
                continue
            try:
                mode = q.stat().st_mode
            except OSError:
                continue
            if not (mode & stat.S_IXOTH and (q in p.parents or mode & stat.S_IROTH)):
                if not any(q in b.parents or q == b for b in bad):
                    bad.append(q)
    return bad


def _root_mode() -> tuple[bool, str]:
    """As root: (drop to a slot uid with setpriv, why not). Dropping needs every needed
    folder readable by other users; else the notebook runs as root inside a user
    namespace with no capabilities, where RLIMIT_NPROC cannot hold (root is exempt)."""
    bad = _unreadable_by_others()
    if not bad:
        return True, ""
    names = " ".join(str(b) for b in bad[:3])
    return False, (f"the process-count limit is not enforced: {names} cannot be read by an "
                   f"unprivileged uid (fix: chmod -R a+rX {names})")


def _size(tmpfs_gib: float | None) -> list[str]:
    """bwrap's ``--size`` option for the next tmpfs (bubblewrap >= 0.7), or nothing."""
    if tmpfs_gib is None or not _bwrap_has_size():
        return []
    return ["--size", str(int(tmpfs_gib * 2**30))]


@functools.cache
def _bwrap_has_size() -> bool:
    try:
        out = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in out.stdout + out.stderr


def _bwrap_argv(uid: int | None = None, tmpfs_gib: float | None = None) -> list[str]:
    """bubblewrap's options for the file system and namespaces (before hides/binds).

    As root with ``uid``, bwrap runs privileged (no user namespace needed) and the
    command drops to ``uid`` with setpriv (:func:`_drop_to`). As root without ``uid``,
    bwrap makes a user namespace and drops every capability. As an ordinary user, bwrap
    makes a user namespace (``--unshare-all``). As root, /root and /home are covered by
    tmpfs (the interpreter, venv, perflab and data bound back read-only when there).
    """
    root = os.geteuid() == 0
    size = _size(tmpfs_gib)
    if root and uid is not None:
        ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
              "--unshare-cgroup-try"]
    elif root:
        ns = ["--unshare-all", "--unshare-user", "--uid", str(SLOT_UID_BASE), "--gid",
              str(SLOT_UID_BASE), "--cap-drop", "ALL"]
    else:
        ns = ["--unshare-all"]
    argv = [shutil.which("bwrap") or "bwrap", *ns, "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            *size, "--perms", "1777", "--tmpfs", "/tmp",
            # multiprocessing's semaphores (and with them launch_fn's ranks) need a
            # writable /dev/shm; bwrap's --dev makes it root-owned 0755
            *size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    # /tmp is always a fresh tmpfs; as root /root and /home are too. What the notebook
    # needs under them (a checkout or venv in /tmp, as in a CI clone) is bound back.
    private = [Path("/tmp").resolve()]
    if root:
        homes = [Path(d) for d in ("/root", "/home") if Path(d).is_dir()]
        argv += [a for d in homes for a in ("--tmpfs", str(d))]
        private += homes
    if private:
        for keep in _needed():
            top = next((d for d in private if d in keep.parents), None)
            if top is None:
                continue
            for parent in reversed(keep.parents):  # traversable, like on the host
                if top in parent.parents:
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(keep), str(keep)]
    return argv


def _drop_to(uid: int | None) -> list[str]:
    """The command prefix that drops root to ``uid`` inside the sandbox, every
    capability gone and no way back (no_new_privs)."""
    if uid is None:
        return []
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
            "--"]


@functools.lru_cache(maxsize=None)
def sandbox_status() -> tuple[bool, str]:
    """(whether bubblewrap sandboxes work here, a one-line reason when they do not).

    Tries ``bwrap ... true`` once per process, in the mode :func:`run_sandboxed` uses.
    """
    if shutil.which("bwrap") is None:
        return False, ("bubblewrap (bwrap) is not installed: apt-get install bubblewrap "
                       "(.ci/run installs it)")
    uid = SLOT_UID_BASE if os.geteuid() == 0 and _root_mode()[0] else None
    if uid is not None and shutil.which("setpriv") is None:
        return False, "running as root and setpriv (util-linux) is missing"
    try:
        p = subprocess.run(_bwrap_argv(uid) + ["--", *_drop_to(uid), sys.executable, "-c", ""],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap could not start: {e}"
    if p.returncode != 0:
        return False, (f"bwrap cannot create namespaces here (no user namespaces in this "
                       f"container?): {p.stderr.strip()[:300]}")
    return True, ""


def _preexec(limits: SandboxLimits, nproc: int):
    def apply() -> None:  # in the child, between fork and exec; inherited by all inside
        import resource

        def cap(which, value):
            resource.setrlimit(which, (value, value))

        if limits.memory_gib is not None:
            cap(resource.RLIMIT_AS, int(limits.memory_gib * 2**30))
        cpu = limits.cpu_s if limits.cpu_s is not None else limits.wall_timeout_s
        cap(resource.RLIMIT_CPU, max(1, int(cpu) + 1))
        cap(resource.RLIMIT_NPROC, nproc)
        cap(resource.RLIMIT_FSIZE, int(limits.file_gib * 2**30))
        cap(resource.RLIMIT_CORE, 0)
    return apply


def run_sandboxed(cmd: Sequence[str], *, scratch: Path, env: dict[str, str],
                  limits: SandboxLimits, log_path: Path, hide: Sequence[Path] = (),
                  pass_fds: Sequence[int] = (), slot: int = 0,
                  mode: Literal["auto", "bwrap", "none"] = "auto") -> SandboxRun:
    """Run ``cmd`` in ``scratch`` (seen as :data:`SANDBOX_WORK` inside the sandbox).

    Args:
        cmd: the command; paths in it must be as seen inside (use ``SANDBOX_WORK``).
        scratch: host folder the command may write (it is made writable for the slot's
            uid); nothing else is writable.
        env: the whole environment of the command (nothing is inherited).
        limits: wall-clock, memory, CPU, process and file-size limits.
        log_path: host file that receives stdout and stderr (a file, not a pipe).
        hide: host folders (or files) made invisible inside (empty tmpfs / /dev/null).
        pass_fds: open file descriptors the command inherits (the verdict channel).
        slot: parallel slot number: the first unprivileged uid tried when running as
            root (a uid another grader on this machine holds is skipped, see
            ``_claim_uid``).
        mode: ``"bwrap"`` requires bubblewrap; ``"auto"`` falls back to a plain
            subprocess with a warning; ``"none"`` never sandboxes (tests, debugging).

    Returns:
        A :class:`SandboxRun`; never raises for anything the command does.

    Raises:
        SandboxUnavailable: ``mode="bwrap"`` and bubblewrap does not work here.
    """
    ok, why = sandbox_status() if mode != "none" else (False, "sandbox disabled (mode='none')")
    if mode == "bwrap" and not ok:
        raise SandboxUnavailable(f"sandbox required but unavailable: {why}")
    sandboxed = ok and mode != "none"
    warning = "" if sandboxed else (
        f"WARNING: NOT SANDBOXED ({why}): this submission ran as a plain subprocess with "
        "rlimits only; it could read and write your files")
    as_root = sandboxed and os.geteuid() == 0
    drop = as_root and _root_mode()[0]
    if as_root and not drop:
        warning = f"WARNING: {_root_mode()[1]}"
    with _claim_uid(slot) if drop else contextlib.nullcontext(None) as uid:
        return _run(cmd, scratch=scratch, env=env, limits=limits, log_path=log_path,
                    hide=hide, pass_fds=pass_fds, uid=uid, sandboxed=sandboxed,
                    warning=warning)


def _run(cmd: Sequence[str], *, scratch: Path, env: dict[str, str], limits: SandboxLimits,
         log_path: Path, hide: Sequence[Path], pass_fds: Sequence[int], uid: int | None,
         sandboxed: bool, warning: str) -> SandboxRun:
    """:func:`run_sandboxed` with the slot's uid claimed (None: no uid to drop to)."""
    if uid is not None:
        _kill_uid(uid)  # nothing may be left from an earlier run in this slot
        for root, dirs, files in os.walk(scratch):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, uid, uid)
        nproc = limits.nproc
    else:  # RLIMIT_NPROC counts every process of this user: leave room for ours
        nproc = limits.nproc + _processes_of(os.getuid())
    if sandboxed:
        inner_cmd = [c.replace(str(scratch), SANDBOX_WORK) for c in cmd]
        argv = _bwrap_argv(uid, limits.tmpfs_gib)
        for h in hide:
            h = Path(h).resolve()
            if h.is_dir():
                argv += ["--tmpfs", str(h)]
            elif h.exists():
                argv += ["--ro-bind", "/dev/null", str(h)]
        if _size(limits.tmpfs_gib):
            # scratch is a size-limited tmpfs with the grader's files bound in read-only
            argv += [*_size(limits.tmpfs_gib), "--perms", "1777", "--tmpfs", SANDBOX_WORK]
            for entry in sorted(scratch.iterdir()):
                inside = f"{SANDBOX_WORK}/{entry.name}"
                argv += (["--perms", "1777", "--dir", inside] if entry.is_dir()
                         else ["--ro-bind", str(entry), inside])
        else:
            argv += ["--bind", str(scratch), SANDBOX_WORK]
        argv += ["--chdir", SANDBOX_WORK, "--clearenv"]
        for k, v in env.items():
            argv += ["--setenv", k, v.replace(str(scratch), SANDBOX_WORK)]
        argv += ["--", *_drop_to(uid), *inner_cmd]
        run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        cwd = "/"
    else:
        argv, run_env, cwd = list(cmd), dict(env), str(scratch)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, pass_fds=tuple(pass_fds),
                                start_new_session=True, preexec_fn=_preexec(limits, nproc))
        try:
            rc: int | None = proc.wait(timeout=limits.wall_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
            if not sandboxed:  # a Jupyter kernel runs in a session of its own
                _kill_children(proc.pid)
        _kill_group(proc)  # also after a normal exit: detached children in the group
    if uid is not None:
        _kill_uid(uid)
    return SandboxRun(rc, timed_out, time.monotonic() - start, sandboxed, warning)
