"""Set up the student release in one command: ``python3 install.py``.

``perflab course release`` copies this file to the release's top as ``install.py``. It
uses the standard library only (it runs before anything is installed) and does what the
repository's ``make setup`` does, for a student:

1. a virtual environment ``.venv`` in the release folder, made with
   ``--system-site-packages`` so that a torch the machine already has is seen;
2. torch: one that already imports in that environment is kept (a student's own CUDA
   build stays). Otherwise the tested version, :data:`TESTED_TORCH`:

   * Linux with no NVIDIA GPU: the CPU-only build from PyTorch's own package index
     (:data:`CPU_INDEX`; https://pytorch.org/get-started/locally/), a few hundred MB
     instead of the CUDA build and its ``nvidia-*`` wheels (several GB) that PyPI's
     Linux wheel pulls in. Where that index cannot be reached, the pinned version from
     the default index, saying so;
   * Linux with an NVIDIA GPU, and macOS (whose wheel is the CPU/MPS one): the pinned
     version from the default index;

3. perflab itself (``pip install -e .``, torch held at the version now installed, so the
   range ``torch>=2.4`` cannot pull another build); with uv (installed beside the torch
   this script installs), as ``make setup`` does: it installs the packages in parallel.
   On Linux also the ``kernels`` extra (Triton, about 1 GB, for Lab 11's kernels; Triton
   ships wheels for Linux only: elsewhere Lab 11's Triton cells say why they skip);
4. the lab dataset (``perflab data``) and the Jupyter kernel ``perflab``
   (``perflab kernel install``).

Each step says what it runs. Exit status 0 when the release is ready to open
``labs/00_start_here.ipynb``; 1 (with the failing step named) otherwise.

Options: ``--venv PATH`` (default ``.venv`` beside this file), ``--python EXE`` (the
interpreter that makes the environment; default the one running this file),
``--skip-data`` (build the dataset later with ``perflab data``), ``--no-kernels`` (no
Triton: Lab 11's PyTorch parts still run).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: The torch version the kit is tested with (the repository's Makefile: TORCH_TESTED).
TESTED_TORCH = "2.13.0"
#: PyTorch's index of CPU-only wheels (https://pytorch.org/get-started/locally/).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: Seconds to wait for :data:`CPU_INDEX` before installing from the default index.
INDEX_TIMEOUT_S = 10.0

_START = time.monotonic()


def say(message: str) -> None:
    print(f"[install {time.monotonic() - _START:5.0f} s] {message}", flush=True)


def run(cmd: list[str], what: str) -> None:
    """Run ``cmd``, echoing it; raise SystemExit(1) naming ``what`` when it fails."""
    say("$ " + " ".join(cmd))
    if subprocess.call(cmd) != 0:
        say(f"FAILED: {what}. Fix what the lines above say, then run "
            f"`python3 install.py` again (finished steps are kept).")
        raise SystemExit(1)


def has_nvidia_gpu() -> bool:
    """An NVIDIA GPU with its driver loaded: ``nvidia-smi -L`` lists one, or Linux's
    ``/proc/driver/nvidia/gpus`` has an entry."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def index_reachable(url: str = CPU_INDEX, timeout_s: float = INDEX_TIMEOUT_S) -> str:
    """"" when ``url``'s torch page answers within ``timeout_s``, else why not."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout_s) as r:
            return "" if r.status == 200 else f"HTTP {r.status}"
    except Exception as e:  # noqa: BLE001 - any failure means: use the default index
        return f"{type(e).__name__}: {e}"


def torch_plan(system: str, gpu: bool, reachable: str) -> tuple[list[str], str]:
    """The pip arguments that install the tested torch, and why that build.

    Args:
        system: ``platform.system()`` ("Linux", "Darwin", ...).
        gpu: whether an NVIDIA GPU is present (:func:`has_nvidia_gpu`).
        reachable: :func:`index_reachable`'s answer for :data:`CPU_INDEX` ("" = yes);
            read only on Linux without a GPU.
    """
    pin = f"torch=={TESTED_TORCH}"
    if system == "Linux" and not gpu:
        if not reachable:
            return ([pin, "--index-url", CPU_INDEX],
                    f"no NVIDIA GPU: the CPU-only build from {CPU_INDEX}")
        return ([pin], f"no NVIDIA GPU, but {CPU_INDEX} cannot be reached ({reachable}): "
                       f"{pin} from the default index instead (on Linux PyPI's wheel is "
                       "the CUDA build, several GB, unless your pip is set up otherwise)")
    if system == "Linux":
        return [pin], "an NVIDIA GPU: the CUDA build from the default index"
    return [pin], f"{system}: the default index's build (CPU, and MPS on Apple silicon)"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _probe(py: Path, code: str) -> str | None:
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def cuda_packages(py: Path) -> list[str]:
    """Installed distributions named ``nvidia-*`` (CUDA's wheels) in ``py``'s
    environment."""
    listed = _probe(py, "import importlib.metadata as m; print('\\n'.join(sorted({"
                        "d.metadata['Name'] for d in m.distributions() if "
                        "(d.metadata['Name'] or '').lower().startswith('nvidia')})))")
    return [line for line in (listed or "").splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(prog="python3 install.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=here / ".venv")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--skip-data", action="store_true")
    parser.add_argument("--no-kernels", action="store_true",
                        help="skip Triton (Lab 11's kernels; Linux only, about 1 GB)")
    args = parser.parse_args(argv)
    if not (here / "pyproject.toml").is_file():
        say(f"no pyproject.toml beside {Path(__file__).name}: run this file from the "
            "perflab release folder it came in")
        return 1
    if sys.version_info < (3, 10):
        say(f"Python {platform.python_version()} is too old: perflab needs >= 3.10")
        return 1

    venv = args.venv.resolve()
    py = venv_python(venv)
    if py.exists():
        say(f"1/4 virtual environment: {venv} exists, kept")
    else:
        say(f"1/4 virtual environment: {venv} (--system-site-packages keeps a torch "
            "this machine already has)")
        run([args.python, "-m", "venv", "--system-site-packages", str(venv)],
            "making the virtual environment")

    have = _probe(py, "import torch, sys; print(torch.__version__, "
                      "torch.__file__.startswith(sys.prefix))")
    if have is not None:
        version, inside = have.split()
        say(f"2/4 torch {version} already imports "
            f"({'in' if inside == 'True' else 'outside'} {venv.name}): kept")
    else:
        gpu = has_nvidia_gpu()
        system = platform.system()
        reachable = index_reachable() if system == "Linux" and not gpu else ""
        pip_args, why = torch_plan(system, gpu, reachable)
        say(f"2/4 torch {TESTED_TORCH} (the tested version): {why}")
        # uv (https://docs.astral.sh/uv/) installs the ~100 other packages in parallel
        # (make setup: 70-85 s instead of 105 s with pip alone on 2 cores)
        run([str(py), "-m", "pip", "install", "--no-compile", *pip_args, "uv>=0.8"],
            "installing torch")
        version = _probe(py, "import torch; print(torch.__version__)") or "?"
        inside = "True"
    cuda = cuda_packages(py)
    if cuda and not has_nvidia_gpu():
        say(f"note: {len(cuda)} CUDA package(s) are installed on a machine with no "
            f"NVIDIA GPU ({', '.join(cuda[:3])}...): they are unused")

    kernels = platform.system() == "Linux" and not args.no_kernels
    target = str(here) + ("[kernels]" if kernels else "")
    say("3/4 perflab and what the labs use (torch held at " + version + ")" + (
        "; Triton for Lab 11 (--no-kernels skips it)" if kernels else
        "; no Triton (Lab 11's Triton cells will say why they skip)"))
    constraint = venv / "torch-constraint.txt"
    held = ["-c", str(constraint)] if inside == "True" else []
    if held:
        constraint.write_text(f"torch=={version}\n")
    uv = venv / ("Scripts/uv.exe" if os.name == "nt" else "bin/uv")
    if held and uv.exists():  # uv sees only the venv: with a torch outside it, pip
        run([str(uv), "pip", "install", "--python", str(py), *held, "-e", target],
            "installing perflab")
    else:
        run([str(py), "-m", "pip", "install", "--no-compile", *held, "-e", target],
            "installing perflab")

    perflab = venv / ("Scripts/perflab.exe" if os.name == "nt" else "bin/perflab")
    say("4/4 the lab dataset and the Jupyter kernel")
    if args.skip_data:
        say("dataset skipped (--skip-data): build it with `perflab data` before Lab 00")
    else:
        run([str(perflab), "data", "--quiet"], "building the lab dataset")
    run([str(perflab), "kernel", "install"], "installing the Jupyter kernel")
    rel = os.path.relpath(venv, Path.cwd())
    say(f"ready: open the labs with `{rel}/bin/jupyter lab labs/` and start with "
        "labs/00_start_here.ipynb (kernel: Python (perflab))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
