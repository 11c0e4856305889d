"""``perflab course release``: the folder students get holds the labs, the package without
the grader, the dataset's README, docs/STUDENTS.md, a README and pyproject.toml, and no
answer: no line of a reference solution, hidden test or rubric, no nbgrader marker. The
released package imports on its own (the repository out of reach) and every ``perflab``
import of the released labs resolves in it."""
from __future__ import annotations

import argparse
import ast
import gzip
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from perflab.course import release as release_module
from perflab.course.release import (MARKERS, add_release_arguments, release, release_command,
                                    student_pyproject)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The release of this repository (labs/ freshness is checked by its own test below:
    other work may have left labs/ behind solutions/ without any answer in it)."""
    dest = tmp_path_factory.mktemp("release") / "perflab-course"
    report = release(dest, repo=ROOT, check_labs=False)
    return dest, report


def _files(dest: Path) -> list[Path]:
    return sorted(p for p in dest.rglob("*") if p.is_file())


def _text_of(path: Path) -> str:
    """A released file's text (a gzipped recording: the text it holds)."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


def _lines_of(path: Path) -> set[str]:
    """The stripped lines of a released file (a notebook: its cells and outputs too)."""
    text = _text_of(path)
    parts = [text]
    if path.suffix == ".ipynb":
        for cell in nbformat.reads(text, as_version=4).cells:
            parts.append(cell.source)
            for out in cell.get("outputs", []):
                parts += [str(out.get("text", "")), *map(str, out.get("data", {}).values())]
    return {ln.strip() for part in parts for ln in part.splitlines()}


def _secret_lines() -> dict[str, str]:
    """Every line over 25 characters of a solution region, a hidden-test region or a
    written answer's rubric cell (nbgrader ``solution`` markdown) of solutions/."""
    out = {}
    for nb in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(str(nb), as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            rubric = cell.cell_type == "markdown" and meta.get("solution")
            inside = False
            for line in cell.source.splitlines():
                s = line.strip()
                if s in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
                    inside = True
                elif s in ("### END SOLUTION", "### END HIDDEN TESTS"):
                    inside = False
                elif (inside or rubric) and len(s) > 25:
                    out.setdefault(s, f"{nb.name} {meta.get('grade_id')}")
    return out


def test_release_holds_what_students_get_and_nothing_else(released):
    dest, report = released
    assert {p.name for p in dest.iterdir()} == {"README.md", "pyproject.toml", "labs",
                                                "perflab", "data", "docs", "install.py"}
    assert (dest / "install.py").read_bytes() == (
        ROOT / "perflab" / "course" / "student_setup.py").read_bytes()
    assert sorted(p.name for p in (dest / "labs").iterdir()) == sorted(
        p.name for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    for nb in (dest / "labs").iterdir():
        assert nb.read_bytes() == (ROOT / "labs" / nb.name).read_bytes()
    assert [p.name for p in (dest / "data").iterdir()] == ["README.md"]
    assert [p.name for p in (dest / "docs").iterdir()] == ["STUDENTS.md"]
    assert not (dest / "perflab" / "course").exists()
    assert not list(dest.rglob("__pycache__")) and not list(dest.rglob("*_student.py"))
    assert {p.relative_to(dest / "perflab") for p in _files(dest / "perflab" / "recordings")
            } == {p.relative_to(ROOT / "perflab")
                  for p in _files(ROOT / "perflab" / "recordings")}
    stub = (dest / "perflab" / "cli" / "course.py").read_text()
    assert "def add_parser" in stub and "perflab.course" not in stub
    assert sorted(str(p.relative_to(dest)) for p in _files(dest)) == list(report.files)
    left = "\n".join(report.left_out)
    for gone in ("solutions/", "tests/", ".git/", "Makefile", "perflab/course/",
                 "docs/INSTRUCTORS.md"):
        assert gone in left
    readme = (dest / "README.md").read_text()
    setup = readme[readme.index("## Set up"):readme.index("## Open the labs")]
    assert "```bash\npython3 install.py\n```" in setup   # the one set-up command leads
    assert "labs/00_start_here.ipynb" in readme


def test_release_holds_no_reference_line_hidden_test_or_rubric(released):
    dest, _ = released
    secret = _secret_lines()
    public = {ln.strip() for nb in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb")
              for c in nbformat.read(str(nb), as_version=4).cells for ln in c.source.splitlines()}
    public |= {ln.strip() for p in (dest / "perflab").rglob("*.py")
               for ln in p.read_text().splitlines()}
    checked = {ln: w for ln, w in secret.items() if ln not in public}
    assert len(checked) > 500  # the solutions hold that many answer lines: not vacuous
    assert any(ln.startswith("**Rubric") for ln in checked)  # rubrics are among them
    for path in _files(dest):
        text = _text_of(path)
        assert not [m for m in MARKERS if m in text], path
        assert "**Rubric" not in text and "model answer, for the grader" not in text, path
        leaked = _lines_of(path) & set(checked)
        assert not leaked, {str(path.relative_to(dest)): {ln: checked[ln] for ln in leaked}}


def _lab_imports(labs: Path) -> list[tuple[str, list[str]]]:
    """``(module, [name, ...])`` of every ``import perflab...`` / ``from perflab... import``
    in the labs' code cells (magic lines blanked)."""
    found = set()
    for nb in sorted(labs.glob("*.ipynb")):
        for cell in nbformat.read(str(nb), as_version=4).cells:
            if cell.cell_type != "code":
                continue
            src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                            for ln in cell.source.split("\n"))
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perflab"):
                    found.add((node.module, tuple(a.name for a in node.names)))
                elif isinstance(node, ast.Import):
                    found |= {(a.name, ()) for a in node.names if a.name.startswith("perflab")}
    return sorted((m, list(n)) for m, n in found)


_PROBE = textwrap.dedent('''
    import importlib, json, sys
    release, imports = sys.argv[1], json.loads(sys.argv[2])
    # perflab is installed editable (a finder pointing at the repository): drop it
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not getattr(f, "__module__", "").startswith("__editable__")]
    sys.path_importer_cache.clear()
    sys.path.insert(0, release)
    import perflab
    assert perflab.__file__.startswith(release), perflab.__file__
    try:
        import perflab.course
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("perflab.course imports from the release")
    for module, names in imports:
        mod = importlib.import_module(module)
        assert mod.__file__.startswith(release), mod.__file__
        for name in names:
            if not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")
    from perflab.cli.app import build_parser
    choices = build_parser()._subparsers._group_actions[0].choices
    assert "course" not in choices and {"data", "doctor", "kernel"} <= set(choices)
    print("resolved", len(imports))
''')


def test_released_package_imports_without_the_repository(released, tmp_path):
    dest, _ = released
    imports = _lab_imports(dest / "labs")
    assert len(imports) > 50
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE, str(dest.resolve()), json.dumps(imports)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg",
             "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resolved {len(imports)}" in proc.stdout


def test_student_pyproject_drops_the_extras_and_pytest():
    text = (ROOT / "pyproject.toml").read_text()
    out = student_pyproject(text)
    assert "[tool.pytest" not in out
    assert "perflab.course" not in out and "perflab[" not in out
    for kept in ("[project]", "[project.scripts]", "[tool.setuptools.package-data]",
                 'perflab = "perflab.cli:main"', '"torch>=2.4"'):
        assert kept in out
    tomllib = pytest.importorskip("tomllib")
    parsed = tomllib.loads(out)
    # only the kernels extra stays (Triton, which install.py installs on Linux for Lab 11)
    assert parsed["project"]["optional-dependencies"] == {
        "kernels": tomllib.loads(text)["project"]["optional-dependencies"]["kernels"]}
    assert "pytest" not in parsed["tool"] and "nbgrader>=" not in out and "playwright>=" not in out
    assert parsed["project"]["dependencies"] == tomllib.loads(text)["project"]["dependencies"]


def test_student_pyproject_keeps_the_comments_of_the_next_table():
    text = ("[a]\nx = 1\n\n# about b\n[b]\ny = 2\n# about c\n[c]\nz = 3\n")
    out = student_pyproject(text.replace("[b]", "[tool.pytest.ini_options]"))
    assert out == "[a]\nx = 1\n\n# about c\n[c]\nz = 3\n"


# --- refusals: a fake course repository -----------------------------------------------------

def _notebook(cells) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return nbformat.writes(nb)


def _fake_repo(root: Path, *, students_doc: str = "# Students\n") -> Path:
    answer = "total_samples_per_second = batch_size_value / step_seconds_value"
    meta = {"nbgrader": {"grade_id": "rate", "solution": True, "grade": False}}
    (root / "solutions").mkdir(parents=True)
    (root / "solutions" / "00_x.ipynb").write_text(_notebook([nbformat.v4.new_code_cell(
        f"### BEGIN SOLUTION\n{answer}\n### END SOLUTION", metadata=meta)]))
    (root / "labs").mkdir()
    (root / "labs" / "00_x.ipynb").write_text(_notebook([nbformat.v4.new_code_cell(
        "# YOUR CODE HERE\nraise NotImplementedError()", metadata=meta)]))
    (root / "perflab" / "cli").mkdir(parents=True)
    (root / "perflab" / "course").mkdir()
    (root / "perflab" / "__init__.py").write_text('__version__ = "9.9"\n')
    (root / "perflab" / "cli" / "course.py").write_text("from perflab.course import x\n")
    (root / "perflab" / "course" / "grader.py").write_text(f"def judge():\n    {answer}\n")
    (root / "perflab" / "course" / "student_setup.py").write_text("print('set up')\n")
    (root / "pyproject.toml").write_text('[project]\nname = "perflab"\n')
    (root / "docs").mkdir()
    (root / "docs" / "STUDENTS.md").write_text(students_doc)
    (root / "data").mkdir()
    (root / "data" / "README.md").write_text("# data\n")
    return root


def test_release_of_a_small_repository_leaves_the_grader_out(tmp_path, capsys):
    repo = _fake_repo(tmp_path / "repo")
    parser = argparse.ArgumentParser()
    add_release_arguments(parser)
    args = parser.parse_args([str(tmp_path / "out"), "--repo", str(repo), "--no-labs-check"])
    assert release_command(args) == 0
    assert "wrote" in capsys.readouterr().out
    files = {str(p.relative_to(tmp_path / "out")) for p in _files(tmp_path / "out")}
    assert files == {"README.md", "pyproject.toml", "labs/00_x.ipynb", "perflab/__init__.py",
                     "perflab/cli/course.py", "data/README.md", "docs/STUDENTS.md",
                     "install.py"}
    assert "perflab 9.9" in (tmp_path / "out" / "README.md").read_text()


def test_release_refuses_a_file_that_holds_a_solution_line(tmp_path):
    repo = _fake_repo(tmp_path / "repo", students_doc=(
        "# Students\nFor example:\n    total_samples_per_second = batch_size_value / "
        "step_seconds_value\n"))
    with pytest.raises(ValueError, match=r"refusing to release: docs/STUDENTS.md: a line of "
                                         r"00_x.ipynb rate"):
        release(tmp_path / "out", repo=repo, check_labs=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # nothing left behind


def test_release_refuses_a_marker(tmp_path):
    repo = _fake_repo(tmp_path / "repo", students_doc="### BEGIN HIDDEN TESTS\n")
    with pytest.raises(ValueError, match="### BEGIN HIDDEN TESTS"):
        release(tmp_path / "out", repo=repo, check_labs=False)


@pytest.mark.parametrize("where", ["out", "repo", ".", "repo/labs/new", "repo/perflab/x"])
def test_release_refuses_a_used_or_unsafe_destination(tmp_path, where):
    repo = _fake_repo(tmp_path / "repo")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("x")
    with pytest.raises(ValueError, match="name a new folder|outside it"):
        release(tmp_path / where, repo=repo, check_labs=False)


def test_release_into_an_empty_folder(tmp_path):
    repo = _fake_repo(tmp_path / "repo")
    (tmp_path / "out").mkdir()
    assert release(tmp_path / "out", repo=repo, check_labs=False).files


def test_release_refuses_a_repository_without_labs(tmp_path):
    repo = _fake_repo(tmp_path / "repo")
    (repo / "labs" / "00_x.ipynb").unlink()
    with pytest.raises(FileNotFoundError, match="no labs/NN_"):
        release(tmp_path / "out", repo=repo, check_labs=False)
    _fake_repo(tmp_path / "repo2")
    (tmp_path / "repo2" / "docs" / "STUDENTS.md").unlink()
    with pytest.raises(FileNotFoundError, match="STUDENTS.md is missing"):
        release(tmp_path / "out", repo=tmp_path / "repo2", check_labs=False)


def test_release_refuses_labs_behind_the_solutions(tmp_path, monkeypatch):
    repo = _fake_repo(tmp_path / "repo")
    import perflab.course.build

    monkeypatch.setattr(perflab.course.build, "build_labs",
                        lambda sol, labs, check: [Path(labs) / "00_x.ipynb"])
    with pytest.raises(ValueError, match=r"labs/ is out of date .*00_x.ipynb.*course build"):
        release(tmp_path / "out", repo=repo)
    assert not (tmp_path / "out").exists()


def test_grader_only_code_is_left_out():
    assert release_module.GRADER_ONLY == ("course/",)


# -- install.py, the release's one set-up command --------------------------------------------

def test_install_script_pins_the_makefiles_tested_torch():
    from perflab.course import student_setup

    tested = re.search(r"^TORCH_TESTED := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert tested and student_setup.TESTED_TORCH == tested.group(1)


@pytest.mark.parametrize("system, gpu, reachable, args, says", [
    ("Linux", False, "", ["--index-url", "https://download.pytorch.org/whl/cpu"], "CPU-only"),
    ("Linux", False, "URLError: no route", [], "cannot be reached (URLError: no route)"),
    ("Linux", True, "", [], "CUDA build"),
    ("Darwin", False, "", [], "Darwin"),
])
def test_install_script_chooses_the_cpu_build_without_a_gpu(system, gpu, reachable, args,
                                                             says):
    from perflab.course.student_setup import TESTED_TORCH, torch_plan

    pip_args, why = torch_plan(system, gpu, reachable)
    assert pip_args == [f"torch=={TESTED_TORCH}", *args]
    assert says in why


def test_install_script_uses_the_standard_library_only():
    """It runs before anything is installed: no import outside the standard library."""
    tree = ast.parse((ROOT / "perflab" / "course" / "student_setup.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_install_script_refuses_to_run_outside_a_release(tmp_path, capsys):
    import shutil

    script = tmp_path / "install.py"
    shutil.copyfile(ROOT / "perflab" / "course" / "student_setup.py", script)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 1 and "no pyproject.toml beside install.py" in out.stdout
    assert not (tmp_path / ".venv").exists()
