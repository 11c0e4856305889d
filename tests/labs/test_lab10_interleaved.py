"""Lab 10's interleaved pipeline schedule (issue 35, item 3), the parts that need no ranks:
the tables and the plot read an interleaved run (v stages per rank) beside the others, an
interleaved rank's probes record its stages' ops in one order, the shared graded launch
runs and hands out the interleaved configs apart from the others, and the judge places
a rank's stages the looped way (Narayanan et al. 2021, §2.2.2). What the ranks record of
torch's ``ScheduleInterleaved1F1B`` is tested on the real launch of test_lab10_checks.py.
"""
from __future__ import annotations

import math

import pytest


def _rec(busy, step, sends=(), **extra):
    return {"busy_s": [busy], "step_s": [step], "peak_in_flight": 2, "losses": [None],
            "stage_layers": 1, "stages": 2, "sends": [list(s) for s in sends], **extra}


def test_bubble_table_calls_each_schedules_formula_with_v_for_interleaved_runs():
    from perflab.labs.lab10.tables import bubble_table

    runs = [{"schedule": "torch_1f1b", "m": 4, "stages": 2},
            {"schedule": "torch_interleaved", "m": 4, "stages": 2, "virtual": 2},
            {"schedule": "gpipe", "m": 4, "stages": 2}]
    per_rank = [[_rec(0.8, 1.0), _rec(0.85, 1.0), _rec(0.8, 1.0)]] * 2
    formulas = {"torch_1f1b": lambda p, m: (p - 1) / (m + p - 1),
                "torch_interleaved": lambda p, m, v: (p - 1) / (v * m + p - 1)}
    t = bubble_table(runs, per_rank, formulas)
    assert t.virtual.tolist() == [1, 2, 1]
    assert t.bubble_formula[:2].tolist() == pytest.approx([1 / 5, 1 / 9])
    assert math.isnan(t.bubble_formula[2])   # no formula given for that schedule
    assert t.bubble_measured.tolist() == pytest.approx([0.2, 0.15, 0.2])
    # one formula for every run: an interleaved run calls it with v
    t = bubble_table(runs[1:2], [[r[1]] for r in per_rank], lambda p, m, v=1: v)
    assert t.bubble_formula.tolist() == [2.0]


def test_p2p_table_sums_the_sends_of_every_stage_and_shows_the_count():
    from perflab.labs.lab10.tables import p2p_table

    runs = [{"schedule": "torch_interleaved", "m": 2, "stages": 2, "virtual": 2},
            {"schedule": "1f1b", "m": 2, "stages": 2}]
    shape = [4, 16]
    per_rank = [[_rec(1, 1, [[1, shape]] * 4 + [[1, shape]] * 2), _rec(1, 1, [[1, shape]] * 2)],
                [_rec(1, 1, [[0, shape]] * 6), _rec(1, 1, [[0, shape]] * 2)],
                [{"idle": True}, {"idle": True}]]
    t = p2p_table(runs, per_rank, lambda p, m, v: 2 * m * (p * v - 1))
    assert t.sends_counted.tolist() == [12, 4]
    assert t.sends_formula.tolist() == [12.0, 4.0]
    assert t.sent_bytes.tolist() == [12 * 4 * 64, 4 * 4 * 64]
    t = p2p_table(runs, per_rank, lambda p, m, v: 1 / 0)
    assert t.sends_formula.isna().all()
    per_rank[0][1] = {"error": "RuntimeError: boom"}
    with pytest.raises(ValueError, match="failed: rank 0: RuntimeError: boom"):
        p2p_table(runs, per_rank)
    per_rank[0][1] = _rec(1, 1)
    del per_rank[0][1]["sends"]
    with pytest.raises(ValueError, match="no record of its sends"):
        p2p_table(runs, per_rank)
    with pytest.raises(ValueError, match="no run of the schedules"):
        p2p_table(runs, per_rank, schedules=("gpipe",))


def test_an_interleaved_ranks_probes_share_one_order_labelled_by_stage():
    import torch

    from perflab.labs.lab10.pipeline import StageProbe, in_flight_peak

    chunks = [torch.nn.Sequential(torch.nn.Linear(3, 3)) for _ in range(2)]
    order: list[str] = []
    probes = [StageProbe(c, order=order, label=f"S{2 * k}:") for k, c in enumerate(chunks)]
    for probe in probes:
        probe.reset()
        probe.recording = True
    h = chunks[0](torch.ones(1, 3))
    out = chunks[1](h)
    out.sum().backward()
    assert order == ["S0:F0", "S2:F0", "S2:B0", "S0:B0"]
    assert in_flight_peak(order) == 2 and all(p.busy_s > 0 for p in probes)
    probes[0].reset()
    assert order == [] and probes[1].order is order   # emptied in place: shared


def test_the_graded_launch_runs_interleaved_configs_alone_and_hands_them_to_their_check(monkeypatch):
    """check_runs runs an interleaved config with torch's schedule only; each check gets the
    records of the configs it judges (judged_by), in order, from the one launch."""
    import perflab.labs.lab10.ranks as lab10_ranks
    from perflab.labs.lab10.ranks import check_runs, judged_by, pipeline_check_records

    configs = [{"stages": 2, "m": 2, "torch": "gpipe", "tag": "a"},
               {"stages": 2, "m": 2, "virtual": 2, "torch": "interleaved", "tag": "b"},
               {"stages": 4, "m": 4, "torch": "1f1b", "tag": "c"}]
    runs = check_runs(configs)
    assert [(r["tag"], r["schedule"]) for r in runs] == [
        ("a", "gpipe"), ("a", "1f1b"), ("a", "torch_gpipe"), ("b", "torch_interleaved"),
        ("c", "gpipe"), ("c", "1f1b"), ("c", "torch_1f1b")]

    def fake(runs_, module, world, timeout):
        return [[{"schedule": r["schedule"], "tag": r["tag"]} for r in runs_] for _ in range(world)]

    monkeypatch.setattr(lab10_ranks, "_CHECK_LAUNCH", {})
    monkeypatch.setattr(lab10_ranks, "_CHECK_KEYS", ("schedule", "tag"))
    monkeypatch.setattr(lab10_ranks, "pipeline_on_ranks", fake)
    got = pipeline_check_records({"configs": configs, "seal": "s"}, "gpipe")
    assert [recs[0] for recs in got["records"]] == [{"schedule": "gpipe", "tag": "a"},
                                                   {"schedule": "gpipe", "tag": "c"}]
    assert [recs[3]["schedule"] for recs in pipeline_check_records(None, "torch")["records"]] == [
        "torch_gpipe", "torch_1f1b"]
    inter = pipeline_check_records(None, "interleaved")
    assert inter["configs"] == configs and inter["seal"] == "s"
    assert [recs[0] for recs in inter["records"]] == [{"schedule": "torch_interleaved", "tag": "b"}]
    assert [judged_by(c, "interleaved") for c in configs] == [False, True, False]
    with pytest.raises(ValueError, match="check must be one of"):
        judged_by(configs[0], "zero_bubble")


def _interleaved_records(config, placement):
    """What the ranks would record for an interleaved config, from the reference itself,
    with each rank holding the stages ``placement(s)``."""
    from perflab.course.references.lab10 import pipeline_reference, stage_blocks

    p, v = config["stages"], config["virtual"]
    ref = pipeline_reference(config["width"], config["blocks"], config["batch"], config["seed"], config["m"])
    split = stage_blocks(config["blocks"], p * v)
    recs = []
    for s in range(p):
        mine = placement(s)
        recs.append({"schedule": "torch_interleaved", "stages": p, "virtual": v,
                     "stage_layers": [len(split[c]) for c in mine],
                     "losses": [ref["loss"] if s == p - 1 else None],
                     "grads": [g for c in mine for b in split[c] for g in ref["grads"][b]]})
    return recs + [{"idle": True}] * (4 - p)


@pytest.mark.parametrize("p, v, blocks", [(2, 2, 5), (4, 2, 9), (2, 3, 6)])
def test_the_interleaved_judge_wants_the_looped_placement(p, v, blocks):
    """Records of the looped placement (rank s holds stages s, s + p, ...) pass; the
    contiguous one (rank s holds stages s·v .. s·v + v - 1), which holds the same number
    of blocks per rank, fails on the first rank (its stages' sizes where they differ, its
    gradients where they do not); so does a loss from the wrong rank."""
    from perflab.course.references.lab10 import judge_pipeline

    config = {"stages": p, "virtual": v, "m": p, "width": 4, "blocks": blocks, "batch": 2 * p,
              "seed": 3, "torch": "interleaved"}
    other = {"stages": 2, "m": 2, "width": 4, "blocks": 3, "batch": 2, "seed": 1, "torch": "gpipe"}
    looped = _interleaved_records(config, lambda s: range(s, p * v, p))
    judge_pipeline("interleaved", [other, config], [looped])   # the gpipe config is not its to judge
    contiguous = _interleaved_records(config, lambda s: range(s * v, s * v + v))
    with pytest.raises(AssertionError, match=r"rank 0('s parameter gradients differ| stages of)"):
        judge_pipeline("interleaved", [config], [contiguous])   # the blocks per stage, or their gradients
    wrong_loss = [dict(r) for r in looped]
    wrong_loss[p - 1]["losses"], wrong_loss[0]["losses"] = [None], [1.0]
    with pytest.raises(AssertionError, match="loss"):
        judge_pipeline("interleaved", [config], [wrong_loss])
    with pytest.raises(AssertionError, match="records of 1 runs expected"):
        judge_pipeline("interleaved", [config], [])


def test_pp_rank_refuses_virtual_stages_outside_the_interleaved_schedule(monkeypatch):
    """A run with ``virtual`` on a one-stage-per-rank schedule, or the interleaved one
    without it, is refused before the model is built (the error names the field)."""
    import torch.distributed as dist

    from perflab.labs.lab10.ranks import _pp_run

    for run in ({"schedule": "1f1b", "virtual": 2}, {"schedule": "torch_interleaved"}):
        with pytest.raises(ValueError, match="virtual="):
            _pp_run(object(), {**run, "m": 2, "stages": 2, "width": 4, "blocks": 4, "batch": 4,
                               "seed": 0}, 0, None)
    assert dist.is_available()


def test_the_plot_draws_the_interleaved_formula_apart():
    import pandas as pd

    from perflab.viz.pipeline_plots import plot_bubble

    table = pd.DataFrame({"schedule": ["1f1b", "1f1b", "torch_interleaved", "torch_interleaved"],
                          "m": [2, 4, 2, 4], "stages": [2, 2, 2, 2], "virtual": [1, 1, 2, 2],
                          "bubble_measured": [0.35, 0.22, 0.22, 0.17],
                          "bubble_formula": [1 / 3, 1 / 5, 1 / 5, 1 / 9]})
    labels = [t.get_text() for t in plot_bubble(table).axes[0].get_legend().get_texts()]
    assert "(p-1)/(m+p-1), p=2" in labels and "(p-1)/(v·m+p-1), v=2, p=2" in labels
    assert "torch_interleaved, measured, p=2" in labels
