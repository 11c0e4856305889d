"""Course build: labs/ is generated from solutions/ by nbgrader's preprocessors."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from perflab.course.build import build_lab, build_labs, graded_cells, record_check_outputs

ROOT = Path(__file__).resolve().parents[2]


def test_labs_are_up_to_date():
    stale = build_labs(ROOT / "solutions", ROOT / "labs", check=True)
    assert not stale, f"labs/ differs from solutions/: run `perflab course build` ({stale})"


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")),
                         ids=lambda p: p.name)
def test_student_version_hides_solutions(solution):
    student = nbformat.reads(build_lab(solution), as_version=4)
    src = "\n".join(c.source for c in student.cells)
    assert "### BEGIN SOLUTION" not in src and "### BEGIN HIDDEN TESTS" not in src
    assert "# YOUR CODE HERE" in src and "raise NotImplementedError()" in src
    assert all(not c.get("outputs") for c in student.cells if c.cell_type == "code")
    ref = nbformat.read(str(solution), as_version=4)
    assert graded_cells(student) == graded_cells(ref) and len(graded_cells(ref)) >= 2


def _nb(tmp_path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python"}
    sol = tmp_path / "solutions"
    sol.mkdir(exist_ok=True)
    nbformat.write(nb, str(sol / "01_x.ipynb"))
    return sol


def _cell(src, **nbg):
    c = nbformat.v4.new_code_cell(src)
    if nbg:
        c.metadata["nbgrader"] = {"schema_version": 3, **nbg}
    return c


def test_build_and_check(tmp_path):
    sol = _nb(tmp_path, [
        _cell("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION", solution=True,
              grade=False, locked=False, grade_id="s1"),
        _cell("assert x == 2\n### BEGIN HIDDEN TESTS\nassert x > 1\n### END HIDDEN TESTS",
              grade=True, solution=False, locked=True, grade_id="c1", points=1),
    ])
    labs = tmp_path / "labs"
    assert build_labs(sol, labs, check=True) == [labs / "01_x.ipynb"]
    assert build_labs(sol, labs) == [labs / "01_x.ipynb"]
    assert build_labs(sol, labs, check=True) == []
    text = (labs / "01_x.ipynb").read_text()
    assert "x = 2" not in text and "assert x > 1" not in text and "assert x == 2" in text


def test_build_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no solution notebooks"):
        build_labs(tmp_path / "none", tmp_path / "labs")
    sol = _nb(tmp_path, [_cell("x = 1")])
    with pytest.raises(ValueError, match="no graded cells"):
        build_labs(sol, tmp_path / "labs")
    sol = _nb(tmp_path, [
        _cell("### BEGIN SOLUTION\nx = 2\n### END SOLUTION"),
        _cell("assert x", grade=True, solution=False, grade_id="c", points=1),
    ])
    with pytest.raises(ValueError, match="non-solution cell"):
        build_labs(sol, tmp_path / "labs")


def test_build_globs_every_lab_and_ignores_other_files(tmp_path):
    sol = _nb(tmp_path, [_cell("assert True", grade=True, solution=False, grade_id="c",
                               points=1)])
    (sol / "01_x.ipynb").rename(sol / "07_y.ipynb")
    _nb(tmp_path, [_cell("assert True", grade=True, solution=False, grade_id="c", points=1)])
    (sol / "scratch.ipynb").write_text("not a lab")
    labs = tmp_path / "labs"
    assert build_labs(sol, labs) == [labs / "01_x.ipynb", labs / "07_y.ipynb"]
    assert sorted(p.name for p in labs.iterdir()) == ["01_x.ipynb", "07_y.ipynb"]


def test_record_check_outputs_keeps_only_check_outputs(tmp_path):
    check = _cell('x = 3\nprint("PASS: x is", x)', grade=True, solution=False, grade_id="c",
                  points=1)
    check.metadata["tags"] = ["nbval-check-output"]
    sol = _nb(tmp_path, [_cell('print("timing: 1.2 ms")\ny = 1'), check])
    path = sol / "01_x.ipynb"
    assert record_check_outputs(path, cell_timeout_s=60) == ["PASS: x is 3\n"]
    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None
    assert nb.cells[1].outputs[0].text == "PASS: x is 3\n" and nb.cells[1].execution_count


def test_record_check_outputs_errors(tmp_path):
    sol = _nb(tmp_path, [_cell("x = 1")])
    with pytest.raises(ValueError, match="no cell is tagged 'nbval-check-output'"):
        record_check_outputs(sol / "01_x.ipynb")
    check = _cell("1 / 0", grade=True, solution=False, grade_id="c", points=1)
    check.metadata["tags"] = ["nbval-check-output"]
    sol = _nb(tmp_path, [check])
    before = (sol / "01_x.ipynb").read_text()
    with pytest.raises(ValueError, match="a cell raised, nothing written"):
        record_check_outputs(sol / "01_x.ipynb", cell_timeout_s=60)
    assert (sol / "01_x.ipynb").read_text() == before


def test_nbval_times_summary():
    from types import SimpleNamespace

    from perflab.course import nbval_times as times

    times.pytest_configure(None)
    for nodeid, s, failed in [("solutions/01_a.ipynb::Cell 0", 2.0, False),
                              ("solutions/01_a.ipynb::Cell 1", 1.5, True),
                              ("tests/test_x.py::test_y", 9.0, False)]:
        times.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=s,
                                                       failed=failed))
    lines: list[str] = []
    tr = SimpleNamespace(section=lambda title: lines.append(f"== {title}"),
                         write_line=lines.append)
    times.pytest_terminal_summary(tr)
    times.pytest_configure(None)
    assert lines == ["== nbval wall time per notebook",
                     "     3.5 s  solutions/01_a.ipynb  (1 failed cells)",
                     "     3.5 s  all 1 notebooks"]
