"""Published large training runs, and the planner (:mod:`perflab.analysis.planner`)
calibrated on a few of them and checked against the rest.

The runs are ``perflab/recordings/published_runs.json`` (package data): Narayanan et al.
2021 (SC21) Table 1 (GPT 1.7B-1T on up to 3,072 A100s), Korthikanti et al. 2022 Table 5
(22B-1T, sequence parallelism + selective recomputation and full recomputation) and the
H100 weak-scaling table of NVIDIA's Megatron-LM README (1.7B-462B on up to 6,144 H100s).
Its ``tables`` say where every figure and layout was read (paper, README image, the
authors' own launch script, with commits); only figures are carried over, with citation.

* :func:`published_tables`, :func:`published_runs`: the metadata and the rows.
* :func:`predict_published`: the planner's prediction of one row's published metric
  (the row's layout as published; the fields a source leaves out are searched, the
  planner's best), and the throughput error.
* :data:`CALIBRATION_ROWS`, :func:`fit_efficiency`: each GPU preset's two fitted numbers
  (matmul efficiency and elementwise HBM passes) come from three named rows of one table,
  its first, middle and last; every other row is a prediction.
* :func:`validation_rows`: every row predicted, calibration rows marked
  (``benchmarks/planner_validation.py`` prints them; docs/PLANNER.md holds its output).
"""
from __future__ import annotations

import functools
import json
import math
from importlib.resources import files

from perflab.analysis.planner import (
    LAYOUT_FIELDS, Assumptions, Layout, LayoutPlan, TransformerShape, evaluate_layout,
    gpu_preset, plan,
)

__all__ = ["published_tables", "published_runs", "CALIBRATION_ROWS", "predict_published",
           "fit_efficiency", "calibration_loss", "validation_rows", "PUBLISHED_METRICS"]

#: Calibration rows per GPU preset: the first, middle and last row of the one table run
#: on that GPU (Narayanan et al. 2021 Table 1 for the A100; the Megatron-LM README's table
#: for the H100). Everything else is predicted.
CALIBRATION_ROWS = {
    "a100-80gb": ("narayanan2021/1.7B", "narayanan2021/39B", "narayanan2021/1T"),
    "h100-sxm": ("megatron-h100/1.7B", "megatron-h100/70B", "megatron-h100/462B"),
}

#: The metrics a row publishes, and how a prediction is compared: ``hardware_tflops_per_gpu``
#: (recomputation counted: Narayanan's Eq. 3), ``model_tflops_per_gpu`` (Megatron-LM's
#: count, no recomputation), ``step_s`` (iteration time). The error is always of throughput:
#: predicted / published - 1 for FLOP/s, published / predicted - 1 for a time.
PUBLISHED_METRICS = ("hardware_tflops_per_gpu", "model_tflops_per_gpu", "step_s")


@functools.lru_cache(maxsize=1)
def _document() -> dict:
    path = files("perflab").joinpath("recordings", "published_runs.json")
    return json.loads(path.read_text(encoding="utf-8"))


def published_tables() -> dict:
    """The source tables: name -> ``citation``, ``figures_from``, (``layouts_from``),
    ``setting``, ``metric``, ``metric_meaning``, ``licence``."""
    return _document()["tables"]


def published_runs(table: str | None = None) -> list[dict]:
    """The published rows (copies), all or those of ``table``.

    Each row: ``id`` (``"narayanan2021/1.7B"``), ``table``, ``model`` (the
    :class:`~perflab.analysis.planner.TransformerShape` fields), ``gpu`` (a preset name),
    ``gpus``, ``global_batch``, ``layout`` (the fields the source states), ``assumptions``
    (the source's overlap and fused attention), ``published`` (its figures: the table's
    metric and the rest, e.g. ``percent_of_peak``).

    Raises:
        ValueError: an unknown table (the message lists them).
    """
    tables = published_tables()
    if table is not None and table not in tables:
        raise ValueError(f"no published table {table!r}; tables: {sorted(tables)}")
    return [json.loads(json.dumps(r)) for r in _document()["rows"]
            if table is None or r["table"] == table]


def _row(row_or_id: dict | str) -> dict:
    if isinstance(row_or_id, dict):
        return row_or_id
    for r in _document()["rows"]:
        if r["id"] == row_or_id:
            return r
    raise ValueError(f"no published row {row_or_id!r}; e.g. "
                     f"{[r['id'] for r in _document()['rows']][:3]} (published_runs())")


def predict_published(row: dict | str, *, matmul_efficiency: float | None = None,
                      elementwise_passes: float | None = None) -> dict:
    """The planner's prediction of one published row.

    The row's layout is evaluated as published when complete; otherwise the planner's
    best layout holding the published fields (:func:`perflab.analysis.planner.plan`).
    Its ``assumptions`` (fused attention, overlap) apply; the GPU preset's fitted
    efficiency and elementwise passes unless given.

    Args:
        row: a row of :func:`published_runs` or its ``id``.
        matmul_efficiency, elementwise_passes: override the preset's (for fitting).

    Returns:
        dict: ``id``, ``metric`` (of :data:`PUBLISHED_METRICS`), ``published``,
        ``predicted`` (same unit), ``error`` (throughput error, a fraction), ``layout``
        (the evaluated layout's label), ``fits`` and ``plan`` (the
        :class:`~perflab.analysis.planner.LayoutPlan`).

    Raises:
        ValueError: an unknown row id.
    """
    r = _row(row)
    model = TransformerShape(**r["model"])
    gpu = gpu_preset(r["gpu"])
    assumptions = Assumptions(matmul_efficiency=matmul_efficiency,
                              elementwise_passes=elementwise_passes, **r["assumptions"])
    layout = r["layout"]
    if set(layout) >= set(LAYOUT_FIELDS):
        result: LayoutPlan = evaluate_layout(model, Layout(**layout), gpu, r["global_batch"],
                                             assumptions)
    else:
        result = plan(model, gpu, r["gpus"], r["global_batch"], fixed=layout,
                      assumptions=assumptions, top=1)[0]
    metric = published_tables()[r["table"]]["metric"]
    gpus = result.layout.gpus
    predicted = {"hardware_tflops_per_gpu": result.hardware_flops / result.step_s / gpus / 1e12,
                 "model_tflops_per_gpu": result.tflops_per_gpu,
                 "step_s": result.step_s}[metric]
    published = r["published"][metric]
    error = published / predicted - 1 if metric == "step_s" else predicted / published - 1
    return {"id": r["id"], "metric": metric, "published": published, "predicted": predicted,
            "error": error, "layout": result.layout.label(), "fits": result.fits,
            "plan": result}


def fit_efficiency(gpu: str, rows: tuple[str, ...] | None = None) -> tuple[float, float]:
    """Fit a GPU preset's matmul efficiency and elementwise HBM passes to published rows.

    Minimises the sum of squared log throughput errors (:func:`predict_published`) over
    the rows with Nelder-Mead (scipy.optimize.minimize) from (0.6, 2.0), the efficiency
    kept in (0, 1] and the passes >= 0; both rounded to 3 decimals, the values the preset
    stores.

    Args:
        gpu: a preset name; rows: row ids (default :data:`CALIBRATION_ROWS` [gpu]).

    Returns:
        ``(matmul_efficiency, elementwise_passes)``.

    Raises:
        ValueError: an unknown preset, fewer than 2 rows, or a row of another GPU.
    """
    if gpu not in CALIBRATION_ROWS:
        raise ValueError(f"no calibration rows for GPU preset {gpu!r}; presets: "
                         f"{sorted(CALIBRATION_ROWS)}")
    ids = tuple(rows or CALIBRATION_ROWS[gpu])
    chosen = [_row(i) for i in ids]
    if len(chosen) < 2 or any(r["gpu"] != gpu for r in chosen):
        raise ValueError(f"fit_efficiency needs >= 2 rows run on {gpu}, got {ids}")

    def loss(x) -> float:
        eff, passes = float(x[0]), float(x[1])
        if not 0.05 <= eff <= 1 or passes < 0:
            return 1e6
        return calibration_loss(gpu, eff, passes, ids)

    from scipy.optimize import minimize

    best = minimize(loss, x0=[0.6, 2.0], method="Nelder-Mead",
                    options={"xatol": 1e-4, "fatol": 1e-10, "maxiter": 400})
    return round(float(best.x[0]), 3), round(float(best.x[1]), 3)


def calibration_loss(gpu: str, matmul_efficiency: float, elementwise_passes: float,
                     rows: tuple[str, ...] | None = None) -> float:
    """What :func:`fit_efficiency` minimises: the sum over the rows (default
    :data:`CALIBRATION_ROWS` [gpu]) of ``log(1 + error)^2``, the squared log ratio of
    predicted to published throughput.

    Raises:
        ValueError: an unknown row id.
    """
    ids = tuple(rows or CALIBRATION_ROWS[gpu])
    return sum(math.log1p(predict_published(i, matmul_efficiency=matmul_efficiency,
                                            elementwise_passes=elementwise_passes)["error"]) ** 2
               for i in ids)


def validation_rows() -> list[dict]:
    """Every published row predicted with the GPU presets' stored parameters.

    Returns:
        One dict per row (:func:`predict_published`'s keys but ``plan``, plus ``table``
        and ``calibration``: whether the row was used to fit its preset).
    """
    calibration = {i for ids in CALIBRATION_ROWS.values() for i in ids}
    out = []
    for r in published_runs():
        p = predict_published(r)
        p.pop("plan")
        out.append({**p, "table": r["table"], "calibration": r["id"] in calibration})
    return out
