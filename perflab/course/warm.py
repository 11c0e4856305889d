"""Inductor's precompiled header, built once per grading process and lent to every
sandbox read-only.

On a CPU, the first ``torch.compile`` of a process compiles Inductor's C++ prefix header
into a precompiled header (``<tmp>/torchinductor_<user>/precompiled_headers/*.h.gch``,
about 150 MB, 5-6 s of g++ on a 2-core machine). Inductor keeps it outside
``TORCHINDUCTOR_CACHE_DIR`` on purpose ("precompiled headers are persistent past
program runtime, but associated with one specific compiler version and set of flags",
``torch/_inductor/codecache.py``), so that every later process reuses it. Each graded
sandbox starts with an empty ``/tmp``, so every submission of a lab that compiles
(Lab 05) paid those seconds again.

:func:`build_inductor_headers` compiles a fixed function once, in the grader, before any
student runs (the grader's own code, so a student cannot poison it);
:func:`perflab.course.submission.grade_notebook` binds that folder read-only into the
sandbox, and :func:`seed_from_env` (run by the sandbox's pytest process before the
kernel starts) links its files into the sandbox's own ``/tmp`` where Inductor looks for
them. Inductor checks that the header's preprocessed text, flags and compiler match
(they are the same machine's) and skips only the compile it would have done; the lab's
own compile cache (``TORCHINDUCTOR_CACHE_DIR``, which Lab 05 empties to show cold
compiles) is untouched, so every compile time the lab prints is still its own.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["HEADERS_ENV", "SANDBOX_USER", "uses_compile", "build_inductor_headers",
           "seed_from_env"]

#: The environment variable naming the read-only folder of headers inside the sandbox.
HEADERS_ENV = "PERFLAB_INDUCTOR_HEADERS"
#: ``LOGNAME`` inside the sandbox: ``getpass.getuser()`` (and with it Inductor's
#: ``/tmp/torchinductor_<user>``) is the same whatever uid the slot runs as.
SANDBOX_USER = "perflab"

_BUILD = """
import torch
def f(x, w):
    return torch.softmax(torch.tanh((x * 2 + 1) @ w), -1)
with torch.no_grad():
    torch.compile(f)(torch.randn(8, 16), torch.randn(16, 16))
"""

_lock = threading.Lock()
_built: dict[str, Path | None] = {}


def uses_compile(notebook) -> bool:
    """Whether a notebook's code cells that grading runs call ``torch.compile`` (or
    Inductor's ``run_and_get_code``): only such labs get the headers. Cells tagged
    ``grading-skip`` never run in grading, so what they compile does not count."""
    return any(c.get("cell_type") == "code"
               and "grading-skip" not in c.get("metadata", {}).get("tags", [])
               and ("torch.compile" in c.get("source", "")
                    or "run_and_get_code" in c.get("source", ""))
               for c in notebook.get("cells", []))


def build_inductor_headers(timeout_s: float = 300) -> Path | None:
    """The folder of Inductor's precompiled headers for this machine's compiler and torch,
    built once per process (by a subprocess compiling a fixed function with its own
    ``TMPDIR``) and removed at exit.

    Returns:
        The folder (it holds ``*.h`` and ``*.h.gch``), or None when it could not be built
        (no C++ compiler, a torch without Inductor, a timeout): grading goes on and each
        sandbox compiles the header itself, as before.
    """
    with _lock:
        if "dir" in _built:
            return _built["dir"]
        root = Path(tempfile.mkdtemp(prefix="perflab-inductor-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        env = {**os.environ, "TMPDIR": str(root), "LOGNAME": SANDBOX_USER,
               "TORCHINDUCTOR_CACHE_DIR": str(root / "cache")}
        try:
            subprocess.run([sys.executable, "-c", _BUILD], env=env, timeout=timeout_s,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        except (OSError, subprocess.SubprocessError):
            _built["dir"] = None
            return None
        out = root / f"torchinductor_{SANDBOX_USER}" / "precompiled_headers"
        _built["dir"] = out if any(out.glob("*.gch")) else None
        return _built["dir"]


def seed_from_env() -> None:
    """In the sandbox, before the kernel starts: link every header of the folder named
    by :data:`HEADERS_ENV` into ``<tmp>/torchinductor_<LOGNAME>/precompiled_headers``
    (a writable folder of the sandbox's own ``/tmp``; the links' targets are read-only),
    and remove the variable from the environment. No variable or no folder: nothing."""
    src = os.environ.pop(HEADERS_ENV, "")
    if not src or not os.path.isdir(src):
        return
    dst = os.path.join(tempfile.gettempdir(), f"torchinductor_{os.environ.get('LOGNAME', '')}",
                       "precompiled_headers")
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith((".h", ".gch")) and not os.path.lexists(os.path.join(dst, name)):
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
