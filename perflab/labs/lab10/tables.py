"""Lab 10's tables, from the ranks' raw records (no clock read here, no launch).

* :func:`tp_comm_share`: the tensor-parallel block's all-reduces on simulated links
  (the alpha-beta model, :class:`perflab.core.simulated.LinkModel`) beside its measured
  compute: the share of a step the communication would take on each link.
* :func:`model_comm_share`: the same share from a model of the step's communication
  time (the student's ``tp_step_comm_s``) evaluated on each link.
* :func:`tp_mlp_flops` and :func:`datasheet_peak`: a GPU-class compute time for the same
  block, its analytic FLOPs over a datasheet peak (this machine's CPU is far slower than a
  GPU, so its measured compute would make every link look cheap).
* :func:`bubble_table`: the pipeline runs' measured idle fraction per schedule and
  micro-batch count, beside the bubble formula (p - 1) / (m + p - 1) (GPipe: Huang et al.
  2019, arXiv:1811.06965, §2.2; the same for 1F1B: Narayanan et al. 2021,
  arXiv:2104.04473, §2.2) as the student wrote it, and the interleaved schedule's
  (p - 1) / (v·m + p - 1) with v stages per rank (Narayanan et al. 2021, §2.2.2).
* :func:`p2p_table`: the point-to-point messages each run's recorded step sent, counted
  on the ranks, beside the student's count.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

import pandas as pd

from perflab.analysis.peak import PEAK_TFLOPS, PeakFlops
from perflab.core.simulated import LinkModel, SimulatedLink

__all__ = ["tp_comm_share", "model_comm_share", "tp_mlp_flops", "datasheet_peak", "bubble_table",
           "p2p_table"]


def tp_comm_share(compute_s: float, message_bytes: Sequence[int], links: Sequence[SimulatedLink],
                  world_size: int) -> pd.DataFrame:
    """One row per link: the modelled time of the step's all-reduces (each ``2(p-1) *
    alpha + 2(p-1)/p * n / beta``, a ring; Hockney 1994, Patarasuk & Yuan 2009) and its share of
    ``compute_s + comm_s``, without overlap (Megatron's f and g block the next matmul).

    Args:
        compute_s: measured seconds of the block's forward+backward on one rank, no
            collective (the slowest rank's median).
        message_bytes: the all-reduce message sizes of one step (bytes, as counted).
        links: the simulated links.
        world_size: ranks in each all-reduce.

    Raises:
        ValueError: ``compute_s`` not > 0, or no messages.
    """
    if not compute_s > 0:
        raise ValueError(f"compute_s must be > 0 seconds, got {compute_s!r}")
    if not message_bytes:
        raise ValueError("message_bytes is empty: no all-reduce was counted")
    rows = []
    for link in links:
        model = LinkModel(link, world_size=world_size)
        comm_s = sum(model.duration_s(n) for n in message_bytes)
        rows.append({"link": link.name, "beta_bytes_per_s": link.beta_bytes_per_s,
                     "allreduces_per_step": len(message_bytes),
                     "bytes_per_step": sum(message_bytes), "compute_ms": 1e3 * compute_s,
                     "comm_ms": 1e3 * comm_s, "comm_share": comm_s / (compute_s + comm_s)})
    return pd.DataFrame(rows).set_index("link")


def model_comm_share(comm_s: Callable[[float, float], float], compute_s: float,
                     links: Sequence[SimulatedLink]) -> pd.DataFrame:
    """One row per link: ``comm_s(alpha_s, beta_bytes_per_s)`` (a model's seconds of
    communication per step on that link, e.g. the student's ``tp_step_comm_s`` with the
    shape bound) and its share ``comm / (compute_s + comm)`` of the step, no overlap.

    Args:
        comm_s: the model; a raising call or a non-number leaves that link's row NaN.
        compute_s: measured seconds of compute per step (> 0).
        links: the simulated links.

    Returns:
        Columns ``link, alpha_s, beta_bytes_per_s, comm_ms, comm_share``.

    Raises:
        ValueError: ``compute_s`` not > 0.
    """
    if not compute_s > 0:
        raise ValueError(f"compute_s must be > 0 seconds, got {compute_s!r}")
    rows = []
    for link in links:
        try:
            c = float(comm_s(link.alpha_s, link.beta_bytes_per_s))
        except Exception:  # noqa: BLE001 - the student's model: shown as missing
            c = math.nan
        share = c / (compute_s + c) if c >= 0 else math.nan
        rows.append({"link": link.name, "alpha_s": link.alpha_s,
                     "beta_bytes_per_s": link.beta_bytes_per_s, "comm_ms": 1e3 * c,
                     "comm_share": share})
    return pd.DataFrame(rows)


def tp_mlp_flops(tokens: int, d: int, tp: int) -> float:
    """FLOPs ONE rank spends on a training step (forward + backward) of its shard of the
    tensor-parallel MLP block ``Linear(d, 4d) -> GELU -> Linear(4d, d)`` over ``tokens``
    tokens (batch * seq), matmuls only: ``48 * tokens * d**2 / tp``.

    Biases and GELU are O(tokens * d), left out::

        forward  = 2 * tokens * (d * 4d + 4d * d) / tp       (2 FLOPs per multiply-add)
        backward = 2 * forward                                (dL/dinput and dL/dweight)
        total    = 3 * forward = 48 * tokens * d**2 / tp

    The count of Narayanan et al. 2021 (Megatron-LM, arXiv:2104.04473, appendix "Floating-point
    operations": a GEMM's backward costs twice its forward) and of Kaplan et al. 2020's ``6 N`` FLOPs per token
    (here ``N = 8 d**2 / tp``, the shard's weights).

    Raises:
        ValueError: ``tokens``, ``d`` or ``tp`` not >= 1, or ``tp`` not dividing ``4d``.
    """
    for name, v in (("tokens", tokens), ("d", d), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if (4 * d) % tp:
        raise ValueError(f"tp={tp} must divide the hidden width 4d = {4 * d}")
    forward = 2 * tokens * (d * 4 * d + 4 * d * d) / tp
    return 3 * forward


def datasheet_peak(chip: str = "H100 SXM", dtype: str = "tf32") -> PeakFlops:
    """The dense datasheet peak of ``chip`` (a key of
    :data:`perflab.analysis.peak.PEAK_TFLOPS`, e.g. "H100 SXM", "A100 SXM") in ``dtype``,
    without that GPU being here: a :class:`~perflab.analysis.peak.PeakFlops` in FLOP/s whose
    ``source`` names the datasheet, as :func:`perflab.analysis.peak.peak_flops` gives on that
    GPU. No real step reaches it, so a time modelled from it is a lower bound.

    Raises:
        ValueError: an unknown chip, or a dtype that chip's datasheet lists no figure for.
    """
    if chip not in PEAK_TFLOPS:
        raise ValueError(f"unknown chip {chip!r}; choose one of {sorted(PEAK_TFLOPS)}")
    tflops = PEAK_TFLOPS[chip].get(dtype)
    if tflops is None:
        raise ValueError(f"the {chip} datasheet lists no {dtype!r} figure; it has "
                         f"{sorted(PEAK_TFLOPS[chip])}")
    return PeakFlops(tflops * 1e12, dtype, chip,
                     f"datasheet: NVIDIA {chip.split()[0]} datasheet, {chip}, dense")


def _formula_for(formula: Any, schedule: str) -> Callable | None:
    if isinstance(formula, dict):
        return formula.get(schedule)
    return formula


def _failed_runs(runs: Sequence[dict[str, Any]], per_rank: Sequence[Sequence[dict[str, Any]]],
                 i: int, p: int) -> list[dict[str, Any]]:
    """Run i's records on its p ranks; raises ValueError naming the failure."""
    run = runs[i]
    recs = [r[i] for r in per_rank[:p]]
    bad = [f"rank {k}: {rec['error']}" for k, rec in enumerate(recs) if "error" in rec]
    if bad or len(recs) < p:
        raise ValueError(f"run {run['schedule']}, p={p}, m={run['m']} failed: "
                         + ("; ".join(bad) or f"records of {len(recs)} ranks"))
    return recs


def bubble_table(runs: Sequence[dict[str, Any]], per_rank: Sequence[Sequence[dict[str, Any]]],
                 formula: Callable | dict[str, Callable] | None = None,
                 schedules: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per run: the measured bubble ``1 - busy_s / step_s`` (per stage, median
    over its timed steps; the row holds the mean over the stages and each stage's), the
    formula's value at the run's ``(p, m)`` (``(p, m, v)`` for a run with ``"virtual"``
    stages per rank), the step time and the peak micro-batches in flight per stage
    (``peak_in_flight``: a hand-written schedule's stash at its fullest, or counted from
    the order torch's schedule ran its ops in; an interleaved rank's over all its stages).

    Args:
        runs: the runs given to :func:`~perflab.labs.lab10.ranks.pp_rank`; a run's p is
            its ``"stages"`` (default: all ranks of ``per_rank``), on ranks 0 .. p-1.
        per_rank: ``pp_rank``'s result on each rank (``[rank][run]``).
        formula: ``formula(p, m)`` (the student's), or a dict schedule -> formula (an
            interleaved run's is called ``formula(p, m, v)``); None, a schedule missing
            from the dict or a raising formula leaves the column NaN.
        schedules: the schedules to tabulate (None: every run's).

    Returns:
        Columns ``schedule, m, stages, virtual, bubble_measured, bubble_rank<k>,
        bubble_formula, step_ms, in_flight_rank<k>`` (NaN for a stage k the run does not
        have; ``virtual`` is 1 but for an interleaved run).

    Raises:
        ValueError: a run's record holds an error (its text is in the message), or no
            run is of ``schedules``.
    """
    rows = []
    for i, run in enumerate(runs):
        if schedules is not None and run["schedule"] not in schedules:
            continue
        p = int(run.get("stages", len(per_rank)))
        v = int(run.get("virtual", 1))
        recs = _failed_runs(runs, per_rank, i, p)
        bubbles = [statistics.median(1 - b / s for b, s in zip(rec["busy_s"], rec["step_s"]))
                   for rec in recs]
        fn = _formula_for(formula, run["schedule"])
        try:
            want = (math.nan if fn is None else
                    float(fn(p, int(run["m"]), v)) if "virtual" in run else float(fn(p, int(run["m"]))))
        except Exception:  # noqa: BLE001 - the student's formula: shown as missing
            want = math.nan
        rows.append({"schedule": run["schedule"], "m": int(run["m"]), "stages": p, "virtual": v,
                     "bubble_measured": statistics.fmean(bubbles),
                     **{f"bubble_rank{k}": b for k, b in enumerate(bubbles)},
                     "bubble_formula": want,
                     "step_ms": 1e3 * max(statistics.median(rec["step_s"]) for rec in recs),
                     **{f"in_flight_rank{k}": rec["peak_in_flight"] for k, rec in enumerate(recs)}})
    if not rows:
        raise ValueError(f"no run of the schedules {list(schedules or [])} to tabulate")
    table = pd.DataFrame(rows)
    flights = [c for c in table.columns if c.startswith("in_flight_rank")]
    table[flights] = table[flights].astype("Int64")   # whole counts, <NA> where no such stage
    bubbles = sorted(c for c in table.columns if c.startswith("bubble_rank"))
    return table[["schedule", "m", "stages", "virtual", "bubble_measured", *bubbles,
                  "bubble_formula", "step_ms", *sorted(flights)]]


def p2p_table(runs: Sequence[dict[str, Any]], per_rank: Sequence[Sequence[dict[str, Any]]],
              count: Callable[[int, int, int], Any] | None = None,
              schedules: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per run: the point-to-point sends its recorded step made, summed over its
    ranks (counted on the ranks by :class:`~perflab.labs.lab10.pipeline.P2PTrace`: every
    ``isend``, however reached), their bytes (float32 tensors: 4 bytes an element, as
    the pipeline model's), and ``count(p, m, v)`` (the student's).

    Args:
        runs, per_rank, schedules: as :func:`bubble_table`.
        count: messages per step for p ranks, m micro-batches, v stages per rank (None,
            or a raising one: NaN).

    Returns:
        Columns ``schedule, stages, virtual, m, sends_counted, sent_bytes, sends_formula``.

    Raises:
        ValueError: a run failed, holds no record of its sends, or no run is of
            ``schedules``.
    """
    rows = []
    for i, run in enumerate(runs):
        if schedules is not None and run["schedule"] not in schedules:
            continue
        p, v, m = int(run.get("stages", len(per_rank))), int(run.get("virtual", 1)), int(run["m"])
        recs = _failed_runs(runs, per_rank, i, p)
        if any(not isinstance(rec.get("sends"), list) for rec in recs):
            raise ValueError(f"run {run['schedule']}, p={p}, m={m}: no record of its sends")
        sends = [shape for rec in recs for _, shape in rec["sends"]]
        try:
            want = float(count(p, m, v)) if count is not None else math.nan
        except Exception:  # noqa: BLE001 - the student's count: shown as missing
            want = math.nan
        rows.append({"schedule": run["schedule"], "stages": p, "virtual": v, "m": m,
                     "sends_counted": len(sends),
                     "sent_bytes": 4 * sum(math.prod(shape or [0]) for shape in sends),
                     "sends_formula": want})
    if not rows:
        raise ValueError(f"no run of the schedules {list(schedules or [])} to tabulate")
    return pd.DataFrame(rows)
