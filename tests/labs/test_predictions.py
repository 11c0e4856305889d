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
