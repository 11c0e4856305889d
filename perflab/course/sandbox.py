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
  process count, file size;
* a memory cap for the run's processes *together* (``SandboxLimits.total_memory_gib``):
  a memory cgroup made for the run where the grader can make one
  (:func:`memory_cap_mechanism`; cgroup v2 ``memory.max``, or v1
  ``memory.limit_in_bytes``, a child of the grader's own cgroup), which every process
  of the run joins before exec; else a watchdog in the grader that adds up the resident
  memory of the run's processes (the command's process tree, and the slot uid's
  processes) every :data:`WATCH_INTERVAL_S` and stops the run above the cap;
* an output cap (``SandboxLimits.output_mib``): stdout and stderr of every process
  inside go to one log file on the grader's disk (the command's stdout and stderr,
  inherited by pytest, the kernel and every child); the grader watches its size and
  stops the run above the cap, then cuts the log there (``RLIMIT_FSIZE`` is the hard
  bound between two looks).

Outputs go to files, never to pipes the grader waits on, so a child that keeps a pipe
open cannot make the grader hang. Stopping a run (the wall-clock limit, a cap) kills the
whole namespace (bwrap's process group; ``--die-with-parent`` takes the PID namespace),
every member of the run's cgroup (detached ones too, sandboxed or not), the slot uid's
processes and, unsandboxed, the command's descendants; :class:`SandboxRun` says why.

When bubblewrap is missing or cannot create namespaces here (a container without user
namespaces), :func:`sandbox_status` says why and grading falls back to a plain
subprocess with the same rlimits and a loud warning (``sandbox="auto"``), or refuses
(``sandbox="bwrap"``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Sequence

from perflab.course.slots import SLOT_UID_BASE, SLOT_UIDS  # noqa: F401 - re-exported
from perflab.course.slots import claim_uid as _claim_uid
from perflab.course.slots import kill_group as _kill_group
from perflab.course.slots import kill_uid as _kill_uid
from perflab.course.slots import processes_of as _processes_of

__all__ = ["SandboxUnavailable", "SandboxLimits", "SandboxRun", "sandbox_status",
           "run_sandboxed", "allowed_paths", "grader_only_paths", "visible_hides",
           "memory_cap_mechanism", "SANDBOX_WORK", "WATCH_INTERVAL_S",
           "SLOT_UID_BASE"]


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made here: the one error that stops a grading batch."""


#: Where the scratch folder appears inside the sandbox.
SANDBOX_WORK = "/tmp/work"
#: How often the grader looks at a running sandbox (its clock, memory and output), s.
WATCH_INTERVAL_S = 0.2


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
    total_memory_gib: float | None = None
    """Memory of all the run's processes together, GiB; None: no cap. A cgroup counts
    what the kernel charges them (resident pages, tmpfs pages they wrote, page cache);
    the watchdog, where no cgroup can be made, their resident memory (shared pages
    counted once, by PSS, before it stops a run)."""
    output_mib: float | None = None
    """Bytes the run may write to its log (stdout and stderr of every process inside),
    MiB; None: only ``file_gib`` (RLIMIT_FSIZE) bounds it."""


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    """What one sandboxed run did."""

    returncode: int | None
    """Exit status; None when the grader killed it (the wall-clock limit, a cap)."""
    timed_out: bool
    wall_s: float
    sandboxed: bool
    """False: ran as a plain subprocess (no bubblewrap), see ``warning``."""
    warning: str = ""
    stopped: str = ""
    """Why the grader stopped the run before it ended (the memory or the output cap, with
    the numbers and the option to raise it); empty when it ended by itself or at the
    wall-clock limit (``timed_out``)."""


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


def _preexec(limits: SandboxLimits, nproc: int, cgroup_procs: int | None = None):
    def apply() -> None:  # in the child, between fork and exec; inherited by all inside
        import resource

        if cgroup_procs is not None:  # join the run's memory cgroup before anything runs
            try:
                os.write(cgroup_procs, str(os.getpid()).encode())
            except OSError:
                pass  # the grader sees it is not a member and watches RSS instead

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


# -- the memory cap of a run's processes together ------------------------------------------

#: The name of each run's cgroup starts with this, then the grader's pid and a counter.
_CGROUP_PREFIX = "perflab-run-"
_cgroup_numbers = itertools.count()


def _own_cgroups() -> tuple[list[tuple[int, Path]], str]:
    """([(version, this process's own cgroup folder)] in the cgroup v2 hierarchy and in a
    v1 hierarchy with the memory controller, as mounted here, v2 first (whether v2 has
    the memory controller is :meth:`_MemoryGroup.make`'s question); why there is none)."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        return [], f"cannot read /proc/self/cgroup or /proc/self/mountinfo ({e.strerror})"
    v2 = next((ln.split(":", 2)[2] for ln in own if ln.startswith("0::")), None)
    v1 = next((ln.split(":", 2)[2] for ln in own if ln.count(":") >= 2
               and "memory" in ln.split(":", 2)[1].split(",")), None)
    out = []
    for ln in mounts:
        left, _, right = ln.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        if rest[0] == "cgroup2" and v2 is not None:
            version, entry = 2, v2
        elif rest[0] == "cgroup" and "memory" in rest[2].split(",") and v1 is not None:
            version, entry = 1, v1
        else:
            continue
        if root != "/" and not (entry == root or entry.startswith(root + "/")):
            continue  # this mount shows another part of the hierarchy
        rel = entry[len(root):] if root != "/" else entry
        out.append((version, Path(point) / rel.lstrip("/")))
    out.sort(key=lambda vp: -vp[0])
    return out, "" if out else "no cgroup hierarchy with a memory controller is mounted here"


@dataclasses.dataclass(frozen=True)
class _MemoryGroup:
    """A memory cgroup made for one run: every process of the run joins it before exec
    (:func:`_preexec`), the kernel holds their memory together under the cap, and
    killing it kills every member, detached ones included."""

    path: Path
    version: int

    @classmethod
    def make(cls, limit_bytes: int) -> "_MemoryGroup | str":
        """A fresh group under this process's own cgroup, capped at ``limit_bytes``; or
        why none could be made (a one-line reason)."""
        found, why = _own_cgroups()
        reasons = [why] if why else []
        for version, parent in found:
            limit = "memory.max" if version == 2 else "memory.limit_in_bytes"
            if version == 2:
                try:
                    enabled = (parent / "cgroup.subtree_control").read_text().split()
                except OSError as e:
                    reasons.append(f"cgroup v2: cannot read {parent}/cgroup.subtree_control "
                                   f"({e.strerror})")
                    continue
                if "memory" not in enabled:
                    reasons.append(f"cgroup v2: the memory controller is not delegated to "
                                   f"{parent}'s children")
                    continue
            _remove_stale(parent)
            path = parent / f"{_CGROUP_PREFIX}{os.getpid()}-{next(_cgroup_numbers)}"
            try:
                path.mkdir()
            except OSError as e:
                reasons.append(f"cgroup v{version}: cannot make a group in {parent} "
                               f"({e.strerror})")
                continue
            group = cls(path, version)
            try:
                (path / limit).write_text(str(limit_bytes))
                if int((path / limit).read_text()) > limit_bytes + 2**16:
                    raise OSError(0, "the limit did not hold")
            except (OSError, ValueError) as e:
                group.remove()
                reasons.append(f"cgroup v{version}: cannot set {limit} in {parent} "
                               f"({getattr(e, 'strerror', None) or e})")
                continue
            # no swap beyond the cap, and (v2) the kernel's OOM killer takes the whole
            # group; where a file is missing (no swap accounting) the cap still holds
            for name, value in ([("memory.swap.max", "0"), ("memory.oom.group", "1")]
                                if version == 2 else
                                [("memory.memsw.limit_in_bytes", str(limit_bytes))]):
                with contextlib.suppress(OSError):
                    (path / name).write_text(value)
            return group
        return "; ".join(reasons)

    def pids(self) -> list[int]:
        try:
            return [int(t) for t in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """How many processes the kernel's out-of-memory killer took in this group."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for ln in (self.path / name).read_text().splitlines():
                key, _, value = ln.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> None:
        """SIGKILL every member until none is left (v2's ``cgroup.kill`` where it exists)."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill()
        for _ in range(50):  # the last members leave the group a moment after SIGKILL
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


def _remove_stale(parent: Path) -> None:
    """Remove the empty run groups that graders which died left in ``parent``."""
    try:
        entries = list(parent.glob(_CGROUP_PREFIX + "*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(_CGROUP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that grader is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        with contextlib.suppress(OSError):
            entry.rmdir()  # fails while a member is left: kept for its owner to see


@functools.lru_cache(maxsize=None)
def memory_cap_mechanism() -> str:
    """How a run's memory cap (``SandboxLimits.total_memory_gib``) is held on this
    machine, in one line for the grading header: a cgroup (the version and the folder
    the runs' groups are made in) when the grader can make one here, otherwise the
    watchdog and why no cgroup could be made. Tries once per process (makes and removes
    an empty group)."""
    group = _MemoryGroup.make(2**30)
    if isinstance(group, _MemoryGroup):
        group.remove()
        limit = "memory.max" if group.version == 2 else "memory.limit_in_bytes"
        return (f"a cgroup v{group.version} memory controller ({limit} of a group per run "
                f"in {group.path.parent})")
    return (f"a watchdog in the grader adding up the resident memory of the run's "
            f"processes every {WATCH_INTERVAL_S:g} s (no cgroup here: {group})")


def _processes(pid: int, uid: int | None) -> list:
    """The command's process tree, and every process of the slot's uid."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    if uid is not None:
        seen = {p.pid for p in procs}
        for p in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if p.info["uids"].real == uid and p.pid not in seen:
                    procs.append(p)
    return procs


def _memory_used(procs: list, cap: int) -> int:
    """Resident bytes of ``procs`` together: their RSS, cheap, while it is below ``cap``;
    above it, their PSS (each shared page counted once, ``/proc/PID/smaps_rollup``)."""
    import psutil

    def total(measure) -> int:
        n = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                n += measure(p)
        return n

    rss = total(lambda p: p.memory_info().rss)
    if rss <= cap:
        return rss
    try:
        return total(lambda p: p.memory_full_info().pss)
    except AttributeError:  # no PSS on this system
        return rss


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


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
    cap = None if limits.total_memory_gib is None else int(limits.total_memory_gib * 2**30)
    group = _MemoryGroup.make(cap) if cap is not None else None
    group = group if isinstance(group, _MemoryGroup) else None
    procs_fd = os.open(group.path / "cgroup.procs", os.O_WRONLY) if group else None
    start = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=tuple(pass_fds), start_new_session=True,
                                    preexec_fn=_preexec(limits, nproc, procs_fd))
            # the cgroup holds the cap only if the command joined it; else the watchdog
            watched = group if group is not None and proc.pid in group.pids() else None
            rc, timed_out, stopped = _watch(proc, log, limits, cap, watched, uid)
            if rc is None:  # the wall-clock limit or a cap: everything of the run goes
                if group is not None:
                    group.kill()
                if not sandboxed:  # a Jupyter kernel runs in a session of its own
                    _kill_tree(proc.pid)
            _kill_group(proc)  # also after a normal exit: detached children in the group
            if group is not None:
                group.kill()  # and every member of the run's cgroup, detached or not
            if not stopped and watched is not None and watched.oom_kills():
                stopped = _memory_message(limits, None)  # it ended after the kernel's kill
        if uid is not None:
            _kill_uid(uid)
    finally:
        if procs_fd is not None:
            os.close(procs_fd)
        if group is not None:
            group.remove()
    _close_log(log_path, limits, stopped, timed_out)
    return SandboxRun(rc, timed_out, time.monotonic() - start, sandboxed, warning,
                      stopped=stopped)


def _kill_tree(pid: int) -> None:
    """Unsandboxed: SIGKILL a live process and its descendants at once, without waiting
    for them (a killed child's zombie waits for its parent's reaper, and holds no
    memory). A child that detached from a parent that already exited escapes this; the
    run's cgroup, where there is one, does not let it."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def _memory_message(limits: SandboxLimits, used: int | None) -> str:
    return ((f"its processes together used {_gib(used)} GiB, more than " if used is not None
             else "its processes together reached ")
            + f"the memory cap of {limits.total_memory_gib:g} GiB (--total-memory-gib)"
            + (": the kernel stopped one and the grader the rest" if used is None else ""))


def _watch(proc: subprocess.Popen, log, limits: SandboxLimits, cap: int | None,
           group: _MemoryGroup | None, uid: int | None) -> tuple[int | None, bool, str]:
    """Wait for ``proc``, looking every :data:`WATCH_INTERVAL_S` at the clock, the log's
    size and the memory of the run's processes (its cgroup's out-of-memory kills, or
    their resident memory). Returns (exit status or None, whether the wall-clock limit
    was reached, why a cap stopped it or "")."""
    out_cap = None if limits.output_mib is None else int(limits.output_mib * 2**20)
    deadline = time.monotonic() + limits.wall_timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, True, ""
        try:
            return proc.wait(timeout=min(WATCH_INTERVAL_S, left)), False, ""
        except subprocess.TimeoutExpired:
            pass
        if out_cap is not None and os.fstat(log.fileno()).st_size > out_cap:
            return None, False, (f"it wrote more than {limits.output_mib:g} MiB of output "
                                 "(stdout and stderr; the output cap, --output-mib)")
        if cap is None:
            continue
        if group is not None:
            if group.oom_kills():
                return None, False, _memory_message(limits, None)
            continue
        used = _memory_used(_processes(proc.pid, uid), cap)
        if used > cap:
            return None, False, _memory_message(limits, used)


def _close_log(log_path: Path, limits: SandboxLimits, stopped: str, timed_out: bool) -> None:
    """Cut the log at the output cap and say at its end why the grader stopped the run."""
    try:
        if limits.output_mib is not None and \
                log_path.stat().st_size > int(limits.output_mib * 2**20):
            os.truncate(log_path, int(limits.output_mib * 2**20))
        why = (f"run stopped: {stopped}" if stopped else
               f"the wall-clock limit ({limits.wall_timeout_s:g} s) was reached: the run "
               "was killed" if timed_out else "")
        if why:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(f"\n[perflab grader] {why}\n")
    except OSError:
        pass
