"""The rule that trims a lab to its set-up and panel cells (no browser needed)."""
from __future__ import annotations

import ast

import nbformat
import pytest

from .labserver import solution_notebooks
from .trim import (_bindings, _reads, python_source, tiny_runs_as_quick, trim_to_panels,
                   whole_at_tiny)


def _nb(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab")] + [
        nbformat.v4.new_code_cell(c) for c in cells]
    return nb


SETUP = "import os\nimport perflab\nfrom perflab import experiment_panel\nconfig = make()"
LAB = _nb(
    SETUP,                                                     # 1: kept whole
    "result = run(config)  # minutes\nresult",                 # 2: nobody needs result
    "def helper(r):\n    return fmt(r)\n"                      # 3: def kept, loop dropped
    "for r in sweep(config):\n    print(helper(r))",
    "fmt = str\nunused = 1",                                   # 4: fmt kept (helper reads it)
    "knobs = {'a': [1, 2]}\nif flag:\n    knobs['b'] = [3]\n"  # 5: all three kept
    "knobs.update(c=[4])\nprint(knobs)",
    "config = config.replace(label='x')",                      # 6: kept, reads config too
    "assert result.ok  # a check cell",                        # 7: dropped
    "panel = experiment_panel(config, knobs, run_fn=helper)\npanel",   # 8: panel
    "print(result)",                                           # 9: after the panel
)


def test_backward_slice_keeps_what_the_panel_needs():
    t = trim_to_panels(LAB, name="lab.ipynb")
    assert t.panel_cells == [8]
    assert t.kept == {1: None, 3: [0], 4: [0], 5: [0, 1, 2], 6: None, 8: None}
    assert "cells 1, 3[statements 0], 4[statements 0]" in t.describe()
    sources = [c.source for c in t.notebook.cells]
    assert t.notebook.cells[0].cell_type == "markdown" and "lab.ipynb" in sources[0]
    assert sources[1:] == [SETUP, "def helper(r):\n    return fmt(r)", "fmt = str",
                           "knobs = {'a': [1, 2]}\nif flag:\n    knobs['b'] = [3]\n"
                           "knobs.update(c=[4])", "config = config.replace(label='x')",
                           "panel = experiment_panel(config, knobs, run_fn=helper)\npanel"]
    assert all(c.outputs == [] and c.execution_count is None
               for c in t.notebook.cells if c.cell_type == "code")


def test_latest_unconditional_binding_wins_but_a_conditional_one_does_not():
    nb = _nb("import perflab", "x = slow()", "x = fast()", "y = slow()",
             "if cond:\n    y = fast()", "perflab.experiment_panel(x, y)")
    assert list(trim_to_panels(nb).kept) == [1, 3, 4, 5, 6]  # not 2: x = slow()


def test_every_panel_cell_is_kept_and_later_cells_dropped():
    nb = _nb("import perflab", "a = 1", "bucket_panel(a)", "b = a + 1",
             "perflab.link_panel(b)", "check(b)")
    t = trim_to_panels(nb)
    assert t.panel_cells == [3, 5] and list(t.kept) == [1, 2, 3, 4, 5]


def test_a_notebook_without_a_panel_is_kept_whole():
    nb = _nb("import perflab", "perflab.env_summary()")
    t = trim_to_panels(nb)
    assert t.panel_cells == [] and t.kept == {1: None, 2: None}
    assert [c.source for c in t.notebook.cells] == [c.source for c in nb.cells]


def test_reads_see_free_names_of_functions_but_not_their_locals():
    stmt = ast.parse("def f(a, b=D):\n    r = g(a)\n    return [x for x in r if x > Z]").body[0]
    assert _reads(stmt) == ({"D"}, {"g", "Z"})  # the body reads when f is called
    cls = ast.parse("class C(B):\n    n = [K for _ in J]\n"
                    "    def m(self):\n        return L").body[0]
    assert _reads(cls) == ({"B", "K", "J"}, {"L"})
    sure, maybe = _bindings(stmt, set())
    assert sure == maybe == {"f"}


def test_writefile_cells_before_the_last_panel_are_kept_whole():
    nb = _nb("import importlib, perflab", "%%writefile mine.py\ndef f():\n    return 1",
             "mine = importlib.import_module('mine')", "perflab.experiment_panel(mine.f)",
             "%%writefile later.py\nx = 1")
    assert trim_to_panels(nb).kept == {1: None, 2: None, 3: None, 4: None}


def test_magics_are_transformed_before_parsing():
    nb = _nb("%matplotlib inline\nimport perflab", "!echo hi\nk = 1", "perflab.experiment_panel(k)")
    assert trim_to_panels(nb).kept == {1: None, 2: [1], 3: None}
    assert "get_ipython" in python_source("%time x = 1")


@pytest.mark.parametrize("notebook", solution_notebooks(), ids=lambda p: p.stem)
def test_solutions_trim_to_a_closed_slice(notebook):
    """Every lab after 00 has a panel; reading forward through the trimmed copy, each name
    a kept statement reads that the lab binds before its last panel is already bound."""
    nb = nbformat.read(notebook, as_version=4)
    t = trim_to_panels(nb, name=notebook.name)
    if not notebook.name.startswith("00_"):
        assert t.panel_cells, f"{notebook.name}: no cell calls a *_panel function"
    if not t.panel_cells:
        return
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert code[0] in t.kept and all(t.kept[i] is None for i in t.panel_cells)
    bound_in_lab = set()
    for i in code:
        if i <= t.panel_cells[-1]:
            for s in ast.parse(python_source(nb.cells[i].source)).body:
                bound_in_lab |= _bindings(s, set())[1]
    bound, later = set(), set()
    for cell in t.notebook.cells[1:]:
        for s in ast.parse(python_source(cell.source)).body:
            own = _bindings(s, set())[1]
            now, deferred = _reads(s)
            missing = (now & bound_in_lab) - bound - own
            assert not missing, f"{notebook.name}: {ast.unparse(s)[:80]!r} reads {missing}"
            bound, later = bound | own, later | deferred
    missing = (later & bound_in_lab) - bound
    assert not missing, f"{notebook.name}: functions kept read {missing}, never bound"


def test_the_notebooks_served_whole_are_those_whose_code_reads_the_preset():
    picked = {p.stem[:2] for p in solution_notebooks()
              if not tiny_runs_as_quick(nbformat.read(p, as_version=4))}
    assert {"00", "01", "02", "03", "04", "05"} <= picked, picked   # RunConfig.preset(PRESET)
    for snippet, same in [('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nQUICK = PRESET != "full"', True),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nprint(f"{PRESET!r}")', True),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nc = RunConfig.preset(PRESET)', False),
                          ('PRESET = os.environ.get("PERFLAB_PRESET", "quick")\nn = 8 if PRESET == "tiny" else 16', False),
                          ("x = 1", True)]:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(snippet)])
        assert tiny_runs_as_quick(nb) is same, snippet


def test_whole_at_tiny_keeps_every_cell_and_clears_the_hidden_tests():
    pytest.importorskip("nbgrader")
    check = nbformat.v4.new_code_cell(
        "# CHECK\nassert answer == 42\n### BEGIN HIDDEN TESTS\nassert secret()\n"
        "### END HIDDEN TESTS",
        metadata={"nbgrader": {"grade": True, "grade_id": "check_answer", "points": 1,
                               "solution": False, "locked": True, "schema_version": 3}})
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_markdown_cell("# text"),
        nbformat.v4.new_code_cell("answer = 42"),
        nbformat.v4.new_code_cell("experiment_panel(config)"), check])
    whole = whole_at_tiny(nb)
    assert whole.whole and "whole at tiny" in whole.describe()
    assert [c.cell_type for c in whole.notebook.cells] == [c.cell_type for c in nb.cells]
    assert whole.panel_cells == trim_to_panels(nb).panel_cells == [3]
    assert "assert answer == 42" in whole.notebook.cells[4].source
    assert "secret" not in whole.notebook.cells[4].source
    assert "secret" in nb.cells[4].source  # the source notebook is not changed
