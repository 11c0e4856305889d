"""The package a student installs: the wheel holds every module, its requirements are a
student's (course tooling is an extra), and the entry points work.

The wheel is built from a copy of the package's sources (no stale ``build/`` folder, no
network: the environment's setuptools builds it). CI installs it into a fresh venv and
runs it (``make wheel-smoke``); that is too slow for a unit test.
"""
from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import perflab

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "perflab", src / "perflab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = src / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("perflab-*.whl")
    with zipfile.ZipFile(path) as z:
        yield z


def _metadata(wheel: zipfile.ZipFile):
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return email.message_from_bytes(wheel.read(name))


def _requirements(wheel) -> tuple[list[str], dict[str, list[str]]]:
    """(base requirements, {extra: requirements}) from the wheel's METADATA."""
    base, extras = [], {}
    for req in _metadata(wheel).get_all("Requires-Dist"):
        spec, _, marker = req.partition(";")
        if "extra ==" in marker:
            extra = marker.split("extra ==")[1].strip().strip("'\"")
            extras.setdefault(extra, []).append(spec.strip())
        else:
            base.append(spec.strip())
    return base, extras


def _name(spec: str) -> str:
    for i, ch in enumerate(spec):
        if ch in "<>=!~[ ;":
            return spec[:i].lower().replace("_", "-")
    return spec.lower().replace("_", "-")


def test_wheel_holds_every_module(wheel):
    names = set(wheel.namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "perflab").rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sources - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for must in ("perflab/__main__.py", "perflab/distributed/__main__.py",
                 "perflab/course/grading.py", "perflab/labs/catalog.py"):
        assert must in names
    assert not [n for n in names if n.startswith(("tests/", "solutions/", "benchmarks/"))]


def test_version_comes_from_one_place(wheel):
    assert _metadata(wheel)["Version"] == perflab.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_student_requirements_leave_course_tooling_to_an_extra(wheel):
    base, extras = _requirements(wheel)
    names = {_name(r) for r in base}
    assert {"torch", "jupyterlab", "ipywidgets", "ipykernel", "line-profiler",
            "memory-profiler"} <= names
    assert not names & {"nbgrader", "nbval", "nbclient", "pytest", "playwright"}
    assert {"nbgrader", "nbval"} <= {_name(r) for r in extras["course"]}
    assert "perflab[course]" in extras["dev"]  # developers run the course tooling's tests
    assert {"pytest", "build", "import-linter", "hypothesis", "setuptools"} <= {
        _name(r) for r in extras["dev"]}
    assert {_name(r) for r in extras["browser"]} == {"playwright"}


def test_line_profiler_is_5_or_later(wheel):
    """LineProfiler.add_callable (perflab.analysis.profiling) appeared in line_profiler 5.0."""
    (spec,) = [r for r in _requirements(wheel)[0] if _name(r) == "line-profiler"]
    assert spec.replace(" ", "").endswith(">=5.0")
    import line_profiler

    assert hasattr(line_profiler.LineProfiler(), "add_callable")


def test_torch_is_a_range_not_a_build(wheel):
    (spec,) = [r for r in _requirements(wheel)[0] if _name(r) == "torch"]
    assert ">=" in spec and "==" not in spec and "+" not in spec


def test_console_script(wheel):
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "perflab = perflab.cli:main" in wheel.read(name).decode()


def test_packages_are_found_not_listed():
    """A listed `packages = ["perflab"]` once left perflab/distributed/ out of the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"] == {"find": {"include": ["perflab*"]}}


def test_python_m_perflab_version(tmp_path):
    out = subprocess.run([sys.executable, "-m", "perflab", "--version"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"perflab {perflab.__version__} (torch ")


def test_make_setup_installs_the_course_extra_and_the_kernel():
    makefile = (ROOT / "Makefile").read_text()
    assert 'pip install -e ".[dev,course,browser,kernels]"' in makefile   # Triton: Lab 11
    assert "perflab kernel install" in makefile
    assert "wheel-smoke:" in makefile and "make wheel-smoke" in (ROOT / ".ci/run").read_text()
