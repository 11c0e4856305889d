"""perflab.course.build: prediction cells get a None stub in labs/."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _predict_nb(source: str):
    import nbformat
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "grade_id": "predict_x", "locked": False,
                                 "schema_version": 3, "solution": True, "task": False}
    nb.cells.append(cell)
    return nb


def test_prediction_cells_get_a_none_stub_not_a_raise():
    """An unanswered prediction must not break later cells: the lab's stub assigns None."""
    from perflab.course.build import prediction_stubs
    nb = _predict_nb("# PREDICT\n### BEGIN SOLUTION\nmy_ratio = 0.6\n### END SOLUTION\n"
                     "print(my_ratio)")
    assert prediction_stubs(nb) == {"predict_x": "my_ratio = None  # YOUR PREDICTION: "
                                                  "replace None, then run this cell"}
    # a template assigned before the region is kept, not overwritten by None
    nb = _predict_nb('my_p = {"a": None}\n### BEGIN SOLUTION\nmy_p = {"a": 1.0}\n'
                     '### END SOLUTION\n')
    assert "my_p = None" not in prediction_stubs(nb)["predict_x"]
    # a prediction written as a function is an exercise: nbgrader's own stub applies
    nb = _predict_nb("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n")
    assert prediction_stubs(nb) == {}


def test_built_labs_prediction_cells_run_unanswered():
    import json
    from perflab.course.build import build_lab
    nb = json.loads(build_lab(ROOT / "solutions" / "03_mixed_precision.ipynb"))
    cell = next(c for c in nb["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == "predict_amp_ratio")
    src = "".join(cell["source"])
    assert "NotImplementedError" not in src and "= None  # YOUR PREDICTION" in src
