"""perflab.labs.predictions: a prediction is kept with its time; an edit made after the
measurement is flagged; an unanswered prediction does not break the summary."""
from __future__ import annotations

import json
import time

import pytest

from perflab.labs.predictions import Predictions


def test_record_then_beside_says_before(tmp_path, capsys):
    p = Predictions("03", folder=tmp_path)
    rec = p.record("amp_ratio", 0.6, unit="x")
    assert rec.value == 0.6 and rec.unit == "x" and not rec.changed
    assert "amp_ratio = 0.6x" in capsys.readouterr().out
    line = p.beside("amp_ratio", 8.123, fmt="{:.2f}")
    assert line.startswith("predicted 0.60x") and "before the measurement" in line
    assert line.endswith("measured 8.12x")
    data = json.loads((tmp_path / "lab03.json").read_text())
    assert data["predictions"]["amp_ratio"][0]["value"] == 0.6 and "amp_ratio" in data["measured"]


def test_edit_after_measurement_is_flagged_and_survives_a_new_kernel(tmp_path):
    p = Predictions("03", folder=tmp_path)
    p.record("amp_ratio", 0.6)
    p.beside("amp_ratio", 8.0)
    time.sleep(0.01)
    p.record("amp_ratio", 8.0)          # the student "fixes" the prediction afterwards
    again = Predictions("03", folder=tmp_path)   # a restarted kernel reads the file
    line = again.beside("amp_ratio", 8.0)
    assert "AFTER" in line and "changed after the measurement (it was 0.6)" in line
    assert again.get("amp_ratio").changed


def test_first_prediction_after_measurement_is_flagged(tmp_path):
    p = Predictions("04", folder=tmp_path)
    p.beside("peak", 3.0)
    time.sleep(0.01)
    p.record("peak", 3.0)
    line = p.beside("peak", 3.0)
    assert "AFTER" in line and "no prediction existed before the measurement" in line


def test_same_value_rerun_is_not_a_change(tmp_path):
    p = Predictions("04", folder=tmp_path)
    p.record("peak", 2.0)
    p.beside("peak", 3.0)
    p.record("peak", 2.0)
    assert "before the measurement" in p.beside("peak", 3.0)


@pytest.mark.parametrize("unanswered", [None, ...])
def test_unanswered_prediction_does_not_break_later_cells(tmp_path, capsys, unanswered):
    p = Predictions("05", folder=tmp_path)
    assert p.record("speedup", unanswered) is None
    assert "no prediction recorded" in capsys.readouterr().out
    assert p.beside("speedup", 1.5).startswith("no prediction was recorded for speedup")


def test_bad_values_name_the_fix(tmp_path):
    p = Predictions("05", folder=tmp_path)
    with pytest.raises(TypeError, match="give a number"):
        p.record("speedup", [1, 2])
    with pytest.raises(ValueError, match="finite"):
        p.record("speedup", float("nan"))
    with pytest.raises(ValueError, match="two-digit"):
        Predictions("5", folder=tmp_path)


def test_unwritable_folder_keeps_predictions_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = Predictions("06", folder=blocker / "sub")
    with pytest.warns(UserWarning, match="in memory only"):
        p.record("comm_ms", 12.0)
    assert p.get("comm_ms").value == 12.0


# -- an unanswered prediction breaks no later cell ---------------------------------------
import ast  # noqa: E402
from pathlib import Path  # noqa: E402

import nbformat  # noqa: E402

from perflab.course.build import prediction_stubs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def _code(source: str) -> str:
    """Cell source without IPython magics and shell lines (not Python)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _none_safe_uses(tree: ast.AST, names: set[str]) -> list[str]:
    """Uses of ``names`` that would break on None: every use but an argument of a
    ``.record(...)`` / ``.beside(...)`` call, an ``is (not) None`` test, a plain ``{name}``
    in an f-string, or a use under ``if name is not None`` (or ``... if name is not None
    else ...``)."""
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def guarded(node, name) -> bool:
        while node in parents:
            parent = parents[node]
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) \
                    and parent.func.attr in ("record", "beside"):
                return True
            if isinstance(parent, ast.Compare) and any(isinstance(c, ast.Constant) and
                                                       c.value is None for c in parent.comparators):
                return True
            if isinstance(parent, ast.FormattedValue) and parent.format_spec is None \
                    and parent.value is node:
                return True
            if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test:
                test = ast.unparse(parent.test)
                if f"{name} is not None" in test or f"{name} is None" in test:
                    return True
            node = parent
        return False

    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names \
                and not guarded(node, node.id):
            bad.append(f"line {node.lineno}: {ast.unparse(parents.get(node, node))[:80]}")
    return bad


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_an_unanswered_prediction_breaks_no_later_cell(path):
    """In labs/ a prediction cell's value is None until the student answers; every later
    use must cope with None (predictions.record / .beside do)."""
    nb = nbformat.read(str(path), as_version=4)
    stubs = prediction_stubs(nb)
    problems = []
    for i, cell in enumerate(nb.cells):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if gid not in stubs:
            continue
        names = {ln.split("=")[0].strip() for ln in stubs[gid].splitlines()
                 if "= None" in ln}
        if not names:  # a template dict filled in place: its values are None
            continue
        after = cell.source.split("### END SOLUTION", 1)[-1]
        sources = [(i, after)] + [(j, c.source) for j, c in enumerate(nb.cells[i + 1:], i + 1)
                                  if c.cell_type == "code"]
        for j, src in sources:
            try:
                tree = ast.parse(_code(src))
            except SyntaxError:
                continue
            problems += [f"cell {j}: {b}" for b in _none_safe_uses(tree, names)]
    assert not problems, (f"{path.name}: uses of an unanswered prediction ({sorted(names)}) "
                          "that fail on None:\n" + "\n".join(problems))


def test_the_none_check_catches_arithmetic_and_format_specs():
    names = {"p"}
    assert _none_safe_uses(ast.parse("x = 1 / p"), names)
    assert _none_safe_uses(ast.parse("print(f'{p:.2f}')"), names)
    assert not _none_safe_uses(ast.parse("predictions.record('a', p, unit='x')"), names)
    assert not _none_safe_uses(ast.parse("print(f'{p}')"), names)
    assert not _none_safe_uses(ast.parse("y = 1 / p if p is not None else None"), names)
    assert not _none_safe_uses(ast.parse("if p is not None:\n    y = 2 * p"), names)


def test_integers_print_in_full(tmp_path, capsys):
    p = Predictions("05", folder=tmp_path)
    p.record("break_even", 2000, unit=" steps")
    assert "break_even = 2,000 steps" in capsys.readouterr().out


def test_a_modelled_value_is_not_called_measured(tmp_path):
    """Lab 12 measures nothing: its predictions sit beside a model's result, named so."""
    p = Predictions("12", folder=tmp_path)
    p.record("tp_share", 0.2)
    line = p.beside("tp_share", 0.31, fmt="{:.2f}", source="modelled")
    assert "before the result at" in line and line.endswith("modelled 0.31")
    assert "measure" not in line
    assert p.beside("unanswered", 1.5, source="fitted").endswith("fitted 1.5")
