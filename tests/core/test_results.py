"""perflab.core.result_store and `perflab results`: saved results listed, loaded, compared, re-plotted."""
from __future__ import annotations

import argparse
import json

import pytest

from perflab import RunConfig
from perflab.cli.results import add_parser as add_results_parser
from perflab.core.result_store import (
    compare_results, find_saved, list_results, load_results,
)
from perflab.viz.plots import plot_results
from tests.synthetic import synthetic_result

BASE = RunConfig(device="cpu", model="tiny", batch_size=8)


def _saved(tmp_path, config, ms):
    return synthetic_result(config, {"forward": ms, "backward": 2 * ms}).save(tmp_path)


@pytest.fixture
def two(tmp_path):
    a = _saved(tmp_path, BASE, 10.0)
    b = _saved(tmp_path, BASE.replace(label="faster"), 5.0)
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a result"}))
    (tmp_path / "broken.json").write_text("{")
    return tmp_path, a, b


def test_list_load_and_skip_what_is_not_a_result(two):
    folder, a, b = two
    table = list_results(folder)
    # one timestamp for both: then by file name ("...-faster.json" < "...-model=tiny...")
    assert list(table.label) == ["faster", "model=tiny bs=8"]
    assert table.step_ms.tolist() == pytest.approx([b.step.median * 1e3, a.step.median * 1e3])
    # other JSON is not a result (silently left out); a broken file is listed with why
    assert set(table.attrs["skipped"]) == {str(folder / "broken.json")}
    with pytest.raises(ValueError, match="notes.json is not a perflab result"):
        load_results(folder / "notes.json")
    assert [r.label for r in load_results([a.path, b.path])] == ["model=tiny bs=8", "faster"]
    with pytest.raises(ValueError, match="broken.json is not a perflab result"):
        load_results(folder)
    with pytest.raises(FileNotFoundError, match="neither a result file nor a folder"):
        list_results(folder / "missing")


def test_compare_and_plot_saved_results(two):
    _, a, b = two
    table = compare_results([a.path, b.path])
    assert table.label.tolist() == ["model=tiny bs=8", "faster"]
    assert table.speedup.iloc[1] == pytest.approx(2.0, rel=0.05)
    assert plot_results([a, b.path]).axes                   # RunResults and paths mix
    with pytest.raises(ValueError, match="no results given"):
        compare_results([])


def test_find_saved_matches_the_exact_config_on_this_device(two):
    folder, a, b = two
    assert find_saved(BASE, folder, device="cpu").path == a.path
    assert find_saved(BASE.replace(batch_size=4), folder, device="cpu") is None
    assert find_saved(BASE, folder, device="cuda") is None
    assert find_saved(BASE, folder / "nowhere", device="cpu") is None


def test_cli_lists_shows_compares_and_plots(two, capsys, tmp_path):
    folder, a, b = two
    parser = argparse.ArgumentParser()
    add_results_parser(parser.add_subparsers(dest="command"))

    def cli(*argv):
        args = parser.parse_args(["results", *argv])
        assert args.fn(args) == 0
        return capsys.readouterr().out

    out = cli("list", str(folder))
    assert "faster" in out and "2 results" in out and "skipped" in out
    assert "peak memory" in cli("show", a.path)
    assert "speedup" in cli("compare", a.path, b.path)
    png = tmp_path / "fig.png"
    assert f"wrote {png}" in cli("plot", a.path, b.path, "--out", str(png))
    assert png.read_bytes().startswith(b"\x89PNG")
    args = parser.parse_args(["results", "compare"])
    with pytest.raises(ValueError, match="needs result files or folders"):
        args.fn(args)
