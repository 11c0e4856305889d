"""Run one untrusted command in a bubblewrap sandbox, with limits, and kill all it started.

Used by :mod:`perflab.course.grading` to run a student's notebook. The sandbox is
bubblewrap (Debian's ``bubblewrap``, the tool Flatpak uses), not our own code: it gives

* an allow-list file system: an empty root with, read-only, only what a notebook needs
  (:func:`allowed_paths`): the operating system (``/usr``, ``/etc``, the ``/bin``,
  ``/lib``... links), the interpreter (``sys.base_prefix``), the environment
  (``sys.prefix``), the ``perflab`` package folder *alone* (never the repository it
  sits in, its ``.git``, ``solutions/`` or ``tests/``: with an editable install the
  package is bound at its own path, so the editable finder still finds it) and the
  dataset. The folders in ``hide`` (the grader's own files, grader-only tools such as
  nbgrader, whose test notebooks hold solution markers) are covered by empty tmpfs.
  :mod:`perflab.course.selftest` proves it before a batch: a probe inside walks every
  readable path for reference solutions, hidden tests and git object stores;
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
           "run_sandboxed", "allowed_paths", "grader_only_paths", "visible_hides",
           "SANDBOX_WORK",
           "SLOT_UID_BASE"]


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


#: The operating system's folders a process needs (read-only): programs, libraries,
#: configuration (``/etc``: the dynamic loader's cache, ``passwd`` for
#: ``getpass.getuser``, time zones) and ``/sys`` (CPU topology for torch and psutil).
#: Entries that are symbolic links on the host (``/bin -> usr/bin`` on a merged-/usr
#: system) are recreated as links.
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/sys")


def _needed() -> list[Path]:
    """Folders the notebook must read: the interpreter, the venv, perflab, the data.

    perflab is its package folder alone (``perflab/``), never its parent: with an
    editable install the parent is the course repository (solutions, tests, ``.git``).
    """
    import perflab
    from perflab.core.paths import default_data_root

    out = [Path(sys.base_prefix), Path(sys.prefix), Path(perflab.__file__).parent,
           default_data_root()]
    return [p.resolve() for p in out if p.exists()]


def allowed_paths() -> list[Path]:
    """Every host path bound (read-only) into the sandbox, outermost first: the system
    folders of :data:`SYSTEM_PATHS` that exist, then :func:`_needed` (a needed folder
    already inside another bound one is not bound twice). Nothing else of the host is
    visible inside; ``/tmp``, ``/dev/shm`` and the scratch folder are fresh tmpfs."""
    out: list[Path] = [Path(p) for p in SYSTEM_PATHS if os.path.lexists(p)]
    for p in _needed():
        if not any(p == q or q in p.parents for q in out if not q.is_symlink()):
            out.append(p)
    return out


def grader_only_paths() -> list[Path]:
    """What only the grader uses, hidden inside the sandbox (covered by an empty tmpfs)
    even though the folder it lives in is bound: perflab's grader-only references
    (:mod:`perflab.course.references`, what judges compare with) and nbgrader (its test
    notebooks carry ``### BEGIN SOLUTION`` regions; the graded kernel never imports it)."""
    import importlib.util

    import perflab

    out = [Path(perflab.__file__).resolve().parent / "course" / "references"]
    for name in ("nbgrader",):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and spec.submodule_search_locations:
            out.append(Path(spec.origin).resolve().parent)
    return out


def visible_hides(hide: Sequence[Path]) -> list[Path]:
    """What hiding ``hide`` (and :func:`grader_only_paths`) changes inside the sandbox:
    the existing paths among them that lie inside a bound folder (anything else is not
    visible anyway), resolved, sorted, once each."""
    bound = [b.resolve() for b in allowed_paths() if not b.is_symlink()]
    out = set()
    for h in [*hide, *grader_only_paths()]:
        h = Path(h).resolve()
        if h.exists() and any(b == h or b in h.parents for b in bound):
            out.add(h)
    return sorted(out)


def _unreadable_by_others() -> list[Path]:
    """Needed folders (or their sub-folders) that an unprivileged uid cannot read. Their
    parents do not matter: inside the sandbox bubblewrap makes them (mode 0755)."""
    import stat

    bad = []
    for p in _needed():
        for q in [p, *(c for c in p.iterdir() if c.is_dir())]:
            try:
                mode = q.stat().st_mode
            except OSError:
                continue
            if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
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

    The root is empty (bwrap's own tmpfs); :func:`allowed_paths` are bound read-only at
    their host paths (their parent folders made, mode 0755, so an unprivileged uid can
    reach them), ``/dev``, ``/proc``, ``/tmp`` and ``/dev/shm`` are fresh. As root with
    ``uid``, bwrap runs privileged (no user namespace needed) and the command drops to
    ``uid`` with setpriv (:func:`_drop_to`). As root without ``uid``, bwrap makes a user
    namespace and drops every capability. As an ordinary user, bwrap makes a user
    namespace (``--unshare-all``).
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
    argv = [shutil.which("bwrap") or "bwrap", *ns, "--die-with-parent", "--new-session"]
    made: set[Path] = {Path("/")}
    for keep in allowed_paths():
        if keep.is_symlink():  # /bin -> usr/bin: the same link inside
            argv += ["--symlink", os.readlink(keep), str(keep)]
            continue
        for parent in reversed(keep.parents):
            if parent not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        flag = "--ro-bind-try" if str(keep) == "/sys" else "--ro-bind"
        argv += [flag, str(keep), str(keep)]
        made.add(keep)
    argv += ["--dev", "/dev", "--proc", "/proc",
             *size, "--perms", "1777", "--tmpfs", "/tmp",
             # multiprocessing's semaphores (and with them launch_fn's ranks) need a
             # writable /dev/shm; bwrap's --dev makes it root-owned 0755
             *size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    # what the notebook needs under /tmp (a venv in /tmp, as in a CI clone) is bound
    # back over the fresh /tmp
    for keep in _needed():
        if Path("/tmp").resolve() in keep.parents:
            for parent in reversed(keep.parents):
                if Path("/tmp").resolve() in parent.parents:
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
                  mode: Literal["auto", "bwrap", "none"] = "auto",
                  ro_binds: Sequence[tuple[Path, str]] = ()) -> SandboxRun:
    """Run ``cmd`` in ``scratch`` (seen as :data:`SANDBOX_WORK` inside the sandbox).

    Args:
        cmd: the command; paths in it must be as seen inside (use ``SANDBOX_WORK``).
        scratch: host folder the command may write (it is made writable for the slot's
            uid); nothing else is writable.
        env: the whole environment of the command (nothing is inherited).
        limits: wall-clock, memory, CPU, process and file-size limits.
        log_path: host file that receives stdout and stderr (a file, not a pipe).
        hide: host folders (or files) made invisible inside (empty tmpfs / /dev/null)
            when they lie inside a bound folder (anything else is not visible anyway);
            :func:`grader_only_paths` are always hidden.
        pass_fds: open file descriptors the command inherits (the verdict channel).
        slot: parallel slot number: the first unprivileged uid tried when running as
            root (a uid another grader on this machine holds is skipped, see
            ``_claim_uid``).
        mode: ``"bwrap"`` requires bubblewrap; ``"auto"`` falls back to a plain
            subprocess with a warning; ``"none"`` never sandboxes (tests, debugging).
        ro_binds: (host path, path inside under :data:`SANDBOX_WORK`) pairs bound
            read-only: files the grader made for every sandbox (Inductor's precompiled
            header, :mod:`perflab.course.warm`). Ignored when not sandboxed.

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
                    warning=warning, ro_binds=ro_binds)


def _run(cmd: Sequence[str], *, scratch: Path, env: dict[str, str], limits: SandboxLimits,
         log_path: Path, hide: Sequence[Path], pass_fds: Sequence[int], uid: int | None,
         sandboxed: bool, warning: str,
         ro_binds: Sequence[tuple[Path, str]] = ()) -> SandboxRun:
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
        for h in visible_hides(hide):
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
        for host, inside in ro_binds:
            if not inside.startswith(SANDBOX_WORK + "/"):
                raise ValueError(f"ro_binds: {inside!r} must lie under {SANDBOX_WORK}/")
            argv += ["--ro-bind", str(host), inside]
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
