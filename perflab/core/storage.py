"""Writing results so that nothing measured is lost and nothing half-written is left.

Every file perflab writes for a measurement goes through here:

* :func:`write_atomic` writes a temp file in the target folder, flushes it to disk
  (``fsync``) and renames it over the target (``os.replace``): a reader sees the old
  file or the new one, never a torn one, and a full disk leaves no 0-byte file.
* :func:`write_new_json` chooses a *new* name without a check-then-write race: the
  finished temp file is hard-linked to the name (``os.link`` fails when the name
  exists), so 40 processes saving at once get 40 files. Where a filesystem has no hard
  links it falls back to ``O_CREAT | O_EXCL`` (exclusive, not atomic).
* :func:`check_writable` and :func:`require_free_bytes` validate a destination before
  any work starts.
* :class:`FileLock` (``fcntl.flock``) serialises builders of one dataset or cache.

Why our own code: the standard library has the pieces (``tempfile``, ``os.replace``,
``os.link``, ``fcntl``) but no one call that is atomic *and* exclusive; the ``filelock``
package would add a dependency for twenty lines. Linux and macOS semantics (POSIX).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "write_new_json", "check_writable", "require_free_bytes",
           "FileLock", "StorageError"]


class StorageError(OSError):
    """A result could not be written; the message says where, why and what to do."""


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temp(folder: Path, data: bytes, prefix: str) -> Path:
    """Write ``data`` to a new temp file in ``folder``, fsynced; remove it on failure."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(0o644)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _explain(e: OSError, path: Path) -> StorageError:
    if e.errno == errno.ENOSPC:
        why = "the disk is full: free space there or choose another folder"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "no permission to write there: choose a folder you own"
    else:
        why = str(e)
    err = StorageError(e.errno or 0, f"could not write {path}: {why}")
    return err


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, ``os.replace``).

    Args:
        path: the file to write; its folder is created.
        data: bytes, or str (UTF-8).

    Returns:
        ``path`` as a Path.

    Raises:
        StorageError: the write failed (full disk, no permission); ``path`` is unchanged
            and no temp file is left.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_temp(path.parent, raw, f".{path.name}.")
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise _explain(e, path) from e
    _fsync_dir(path.parent)
    return path


def write_new_json(folder: str | Path, stem: str, obj: Any) -> Path:
    """Save ``obj`` as JSON under a name no other writer has: ``stem.json``, else
    ``stem-2.json``, ``stem-3.json``, ...; atomically (never a partial file).

    The object is serialised before anything touches the disk, so an unserialisable
    object raises ``TypeError`` with nothing written.

    Raises:
        TypeError: ``obj`` is not JSON-serialisable.
        StorageError: the folder is not writable or the disk is full; nothing is left.
    """
    folder = Path(folder)
    raw = json.dumps(obj, indent=1).encode()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = _write_temp(folder, raw, f".{stem[:40]}.")
    except OSError as e:
        raise _explain(e, folder / f"{stem}.json") from e
    try:
        for path in _names(folder, stem):
            try:
                os.link(tmp, path)             # atomic, and fails when the name exists
                _fsync_dir(folder)
                return path
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP,
                                   errno.EXDEV, errno.EMLINK):
                    raise _explain(e, path) from e
                return _write_exclusive(folder, stem, raw)   # no hard links here
        raise StorageError(errno.EEXIST, f"could not find a free name for {stem}.json "
                           f"in {folder}: 9,999 exist")
    finally:
        tmp.unlink(missing_ok=True)


def _names(folder: Path, stem: str):
    """The candidate names, in order: ``stem.json``, ``stem-2.json``, ... ``stem-9999.json``."""
    for n in range(1, 10_000):
        yield folder / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")


def _write_exclusive(folder: Path, stem: str, raw: bytes) -> Path:
    """Fallback for filesystems without hard links: O_EXCL names, written in place."""
    for path in _names(folder, stem):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            path.unlink(missing_ok=True)
            raise _explain(e, path) from e
        return path
    raise StorageError(errno.EEXIST, f"no free name for {stem}.json in {folder}")


def check_writable(folder: str | Path, *, field: str = "results_dir") -> Path:
    """Make sure files can be created in ``folder`` (created if missing), before work.

    Raises:
        ValueError: naming ``field``, when the folder is a file, cannot be created or
            is not writable.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{field}={str(folder)!r} is a file, not a folder: pass a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".perflab-write-test-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise ValueError(f"{field}={str(folder)!r} is not writable ({e.strerror or e}): "
                         "pass a folder you can write to, or save=False") from e
    return folder


def require_free_bytes(folder: str | Path, nbytes: int, *, what: str,
                       field: str = "root") -> None:
    """Refuse to start writing ``nbytes`` (plus 5 % headroom) where there is less free.

    Raises:
        ValueError: naming ``field``, with the bytes needed and free.
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    need = int(nbytes * 1.05)
    if free < need:
        raise ValueError(f"{what} needs {need / 2**20:,.0f} MiB in {folder} but only "
                         f"{free / 2**20:,.0f} MiB are free: free disk space or set "
                         f"{field} to another disk")


class FileLock:
    """An exclusive inter-process lock on ``path`` (``fcntl.flock``), as a context
    manager; the lock file is created if missing and left in place (removing it would
    race with a waiting process).

    Args:
        path: the lock file.
        timeout_s: give up after this long (None waits forever).
        on_wait: called once with a message when another process holds the lock.

    Raises:
        TimeoutError: the lock was not free within ``timeout_s``.
    """

    def __init__(self, path: str | Path, *, timeout_s: float | None = None,
                 on_wait=None) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.on_wait = on_wait
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        import fcntl  # POSIX only; imported here so Windows can still import perflab

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and self.on_wait is not None:
                    self.on_wait(f"waiting for another process that holds {self.path}")
                    told = True
                if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                    os.close(fd)
                    raise TimeoutError(f"{self.path} is still locked by another process "
                                       f"after {self.timeout_s:.0f} s") from None
                time.sleep(0.05)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def read_recording(name: str, prefix: str) -> dict:
    """The parsed JSON of ``perflab/recordings/<name>``, a recording shipped with the
    package (see perflab/recordings/README.md); ``prefix`` is the kind of recording
    (``"allreduce_"``, ``"straggler_"``) the caller reads.

    Raises:
        ValueError: ``name`` does not start with ``prefix`` or is not shipped (the
            message lists the shipped recordings of that kind).
    """
    from importlib.resources import files

    folder = files("perflab") / "recordings"
    path = folder / name
    if not name.startswith(prefix) or not path.is_file():
        shipped = sorted(p.name for p in folder.iterdir()
                         if p.name.startswith(prefix) and p.name.endswith(".json"))
        raise ValueError(f"no shipped {prefix.rstrip('_')} recording {name!r}; shipped: "
                         f"{shipped} (perflab/recordings/)")
    return json.loads(path.read_text())
