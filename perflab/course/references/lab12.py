"""Lab 12's references, grader-only: hidden models, clusters, layouts and batches, drawn
so that every rule the lab teaches matters in some case (ZeRO-3 with dp > 1, sequence
parallelism, interleaved and plain 1F1B pipelines, tensor parallelism with and without SP,
every recomputation mode, links inside and across nodes, overlapped and exposed data
parallelism), and the judges of the student's ``memory_per_gpu``, ``step_time``,
``utilization``, ``best_layout`` and calibrated efficiency against
:mod:`perflab.analysis.planner` (run on the lab's types through
:mod:`perflab.labs.lab12`).

Tolerances (stated in the notebook): memory terms exact (relative 1e-9, float rounding);
each time term within 1 % of the planner's or 0.1 % of its step; MFU and HFU within 1 %;
a best layout valid, fitting when any layout fits, and no slower than 1.01 x the
planner's best (or, when nothing fits, no larger than its smallest)."""
from __future__ import annotations

import functools
import math
import random

from perflab.labs.lab12 import (Cluster, ParallelLayout, Model, assumptions_of, cluster_of,
                                layout_of, model_of, narayanan_rows, reference_best,
                                reference_plan)

__all__ = ["MEMORY_KEYS", "TIME_KEYS", "TIME_RTOL", "draw_model", "draw_cluster",
           "draw_layout", "memory_cases", "time_cases", "best_cases", "reference_memory",
           "reference_time", "judge_memory", "judge_time", "judge_utilization", "judge_best",
           "CALIBRATION_IDS", "reference_efficiency", "judge_calibration"]

#: The parts of ``memory_per_gpu``'s answer (bytes per GPU on the fuller stage).
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "buffers", "total")
#: The parts of ``step_time``'s answer (seconds per step).
TIME_KEYS = ("compute", "recompute", "tp_comm", "bubble", "pp_p2p", "dp_comm", "optimizer",
             "step")
#: A time term passes within this fraction of the planner's (or of 0.1 x it of the step).
TIME_RTOL = 0.01
#: The two rows of Narayanan et al. 2021 Table 1 the student calibrates on.
CALIBRATION_IDS = ("narayanan2021/1.7B", "narayanan2021/1T")


def draw_model(rng: random.Random) -> dict:
    """A random decoder shape (GPT-like or Llama-like: grouped K/V, gated MLP)."""
    heads = rng.choice([8, 16, 32])
    head_dim = rng.choice([64, 128])
    hidden = heads * head_dim
    gated = rng.random() < 0.5
    ffn = (rng.choice([8, 11]) * hidden // 3) // 256 * 256 if gated else 4 * hidden
    return {"layers": rng.choice([8, 12, 16, 24]), "hidden": hidden, "heads": heads,
            "seq_len": rng.choice([512, 1024, 2048, 4096]),
            "vocab": rng.choice([32000, 50304, 51200]),
            "kv_heads": rng.choice([heads, heads // 2, heads // 4]) if gated else heads,
            "ffn_hidden": ffn, "gated": gated}


def draw_cluster(rng: random.Random) -> dict:
    """Random GPUs and links (figures of the order of A100s and H100s)."""
    return {"name": "hidden", "peak_flops": rng.uniform(150e12, 1000e12),
            "hbm_bytes": float(rng.choice([24, 40, 80, 96]) * 2 ** 30),
            "hbm_bytes_per_s": rng.uniform(1.5e12, 4e12), "gpus_per_node": rng.choice([4, 8]),
            "nvlink_alpha_s": rng.uniform(2e-6, 8e-6), "nvlink_busbw": rng.uniform(150e9, 450e9),
            "net_alpha_s": rng.uniform(5e-6, 20e-6), "net_busbw": rng.uniform(12.5e9, 50e9),
            "efficiency": round(rng.uniform(0.3, 0.8), 3), "dp_overlap": rng.random() < 0.5}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_layout(rng: random.Random, model: dict, node: int, *, tp: int | None = None,
                pp: int | None = None, vpp: int | None = None, dp: int | None = None,
                zero: int | None = None, sp: bool | None = None,
                recompute: str | None = None, num_microbatches: int | None = None) -> dict:
    """A random valid layout of ``model`` (the fields given are held)."""
    tps = [d for d in _divisors(node) if model["heads"] % d == 0 and model["kv_heads"] % d == 0
           and model["ffn_hidden"] % d == 0]
    tp = tp or rng.choice(tps)
    pp = pp or rng.choice([d for d in _divisors(model["layers"]) if d <= 8])
    if vpp is None:
        vpp = rng.choice([d for d in _divisors(model["layers"] // pp) if d <= 4]) if pp > 1 else 1
    dp = dp or rng.choice([1, 2, 4, 8])
    m = num_microbatches or (pp * rng.randint(1, 4) if vpp > 1 else rng.randint(1, 12))
    return {"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "micro_batch": rng.choice([1, 2, 4]),
            "num_microbatches": m,
            "zero": rng.choice([0, 1, 2, 3] if dp > 1 else [0]) if zero is None else zero,
            "sp": (tp > 1 and rng.random() < 0.5) if sp is None else sp,
            "recompute": rng.choice(["none", "selective", "full"]) if recompute is None
            else recompute}


def _forced(rng: random.Random, node: int) -> list[dict]:
    """ParallelLayout constraints that make each taught rule count in at least one case."""
    return [dict(dp=4, zero=3, pp=1), dict(tp=2, sp=True, recompute="none"),
            dict(pp=2, vpp=2), dict(pp=4, vpp=1, recompute="none", num_microbatches=rng.randint(4, 12)),
            dict(tp=2, sp=False, recompute="none"), dict(tp=2, sp=False, recompute="full"),
            dict(dp=2, zero=2, recompute="selective"), dict(dp=8, zero=1, pp=2)]


def _cases(rng: random.Random, with_cluster: bool) -> list[dict]:
    out = []
    for force in _forced(rng, 8):
        while True:
            model = draw_model(rng)
            cluster = draw_cluster(rng)
            if force.get("tp", 1) > 1 and model["heads"] % force["tp"]:
                continue
            if model["layers"] % force.get("pp", 1):
                continue
            layout = draw_layout(rng, model, cluster["gpus_per_node"], **force)
            break
        case = {"model": model, "layout": layout}
        if with_cluster:
            case["cluster"] = cluster
        out.append(case)
    return out


def memory_cases(rng: random.Random) -> list[dict]:
    """Hidden cases of ``memory_per_gpu``: ``{"model", "layout"}``."""
    return _cases(rng, with_cluster=False)


def time_cases(rng: random.Random) -> list[dict]:
    """Hidden cases of ``step_time`` and ``utilization``: ``{"model", "cluster",
    "layout"}``."""
    return _cases(rng, with_cluster=True)


def best_cases(rng: random.Random, n: int = 3) -> list[dict]:
    """Hidden cases of ``best_layout``: ``{"model", "cluster", "gpus", "batch"}``, small
    enough to search in a second, with HBM that some layouts overflow and some fit."""
    out = []
    while len(out) < n:
        model = draw_model(rng)
        model["layers"] = rng.choice([8, 12, 16])
        cluster = draw_cluster(rng)
        cluster["gpus_per_node"] = rng.choice([4, 8])
        gpus, batch = rng.choice([8, 16, 32]), rng.choice([16, 32, 64])
        case = {"model": model, "cluster": cluster, "gpus": gpus, "batch": batch}
        params = reference_plan(model_of(model), cluster_of(cluster),
                                ParallelLayout(dp=gpus, num_microbatches=batch // gpus or 1,
                                       zero=1 if gpus > 1 else 0)
                                if batch % gpus == 0 else ParallelLayout()).memory
        # HBM between the smallest layouts' and the simple one's: the choice matters
        cluster["hbm_bytes"] = float(max(4 * 2 ** 30, params.total_bytes * rng.uniform(0.3, 0.9)))
        best = reference_best(model_of(model), cluster_of(cluster), gpus, batch)
        if best and best[0][1].fits:
            out.append(case)
    return out


def reference_memory(case: dict) -> dict:
    """The planner's memory per GPU of the case's layout, by part (bytes)."""
    mem = reference_plan(model_of(case["model"]), _any_cluster(), layout_of(case["layout"])).memory
    return {"params": mem.params_bytes, "grads": mem.grads_bytes,
            "optimizer": mem.optimizer_bytes, "activations": mem.activations_bytes,
            "buffers": mem.comm_buffers_bytes, "total": mem.total_bytes}


def _any_cluster() -> Cluster:
    return Cluster(name="any", peak_flops=1e15, hbm_bytes=80 * 2 ** 30, hbm_bytes_per_s=3e12,
                   gpus_per_node=8, nvlink_alpha_s=5e-6, nvlink_busbw=300e9, net_alpha_s=1e-5,
                   net_busbw=25e9)


def reference_time(case: dict) -> dict:
    """The planner's step time by part (seconds) and ``mfu``, ``hfu``."""
    p = reference_plan(model_of(case["model"]), cluster_of(case["cluster"]),
                       layout_of(case["layout"]))
    t = p.time
    return {"compute": t.compute_s + t.elementwise_s, "recompute": t.recompute_s,
            "tp_comm": t.tp_comm_s, "bubble": t.bubble_s, "pp_p2p": t.pp_p2p_s,
            "dp_comm": t.dp_comm_s, "optimizer": t.optimizer_s, "step": t.step_s,
            "mfu": p.mfu, "hfu": p.hfu}


def _where(case: dict) -> str:
    return f"model {case['model']}, layout {case['layout']}"


def _number(got, key: str, where: str) -> float:
    assert isinstance(got, dict), f"{where}: expected a dict of parts, got {type(got).__name__}"
    assert key in got, f"{where}: your dict has no {key!r} (keys: {sorted(got)})"
    v = got[key]
    assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), (
        f"{where}: {key} = {v!r} is not a finite number")
    return float(v)


def judge_memory(case: dict, got) -> None:
    """Every memory part equal to the planner's (relative 1e-9)."""
    want = reference_memory(case)
    where = _where(case)
    for key in MEMORY_KEYS:
        v = _number(got, key, where)
        assert abs(v - want[key]) <= 1e-9 * max(abs(want[key]), 1.0), (
            f"{where}: {key} = {v:,.0f} bytes, expected {want[key]:,.0f}")


def judge_time(case: dict, got) -> None:
    """Every time part within :data:`TIME_RTOL` of the planner's, or within 0.1 x that of
    its step."""
    want = reference_time(case)
    where = _where(case) + f", cluster {case['cluster']}"
    for key in TIME_KEYS:
        v = _number(got, key, where)
        tol = TIME_RTOL * max(abs(want[key]), 0.1 * want["step"])
        assert abs(v - want[key]) <= tol, (
            f"{where}: {key} = {v:.6g} s, expected {want[key]:.6g} s (within {tol:.2g} s)")


def judge_utilization(case: dict, got) -> None:
    """MFU and HFU within 1 % of the planner's."""
    want = reference_time(case)
    where = _where(case) + f", cluster {case['cluster']}"
    for key in ("mfu", "hfu"):
        v = _number(got, key, where)
        assert abs(v - want[key]) <= 0.01 * want[key], (
            f"{where}: {key} = {v:.5f}, expected {want[key]:.5f}")


def judge_best(case: dict, got) -> None:
    """A valid layout of ``gpus`` GPUs and ``batch`` sequences that fits when the planner's
    best fits and is no slower than 1.01 x it (when nothing fits: no larger than the
    planner's smallest)."""
    model, cluster = model_of(case["model"]), cluster_of(case["cluster"])
    gpus, batch = case["gpus"], case["batch"]
    where = f"model {case['model']}, cluster {case['cluster']}, {gpus} GPUs, batch {batch}"
    assert isinstance(got, dict), f"{where}: best_layout returned {got!r}, not a ParallelLayout"
    try:
        layout = layout_of(got)
    except (TypeError, ValueError) as e:
        raise AssertionError(f"{where}: best_layout returned an invalid ParallelLayout {got}: {e}")
    assert layout.gpus == gpus, f"{where}: your layout {layout.label()} uses {layout.gpus} GPUs"
    assert layout.global_batch == batch, (
        f"{where}: your layout {layout.label()} runs {layout.global_batch} sequences, not {batch}")
    try:
        mine = reference_plan(model, cluster, layout)
    except ValueError as e:
        raise AssertionError(f"{where}: your layout {layout.label()} cannot run: {e}")
    (best_layout, best), = reference_best(model, cluster, gpus, batch)
    if best.fits:
        assert mine.fits, (f"{where}: your layout {layout.label()} needs "
                           f"{mine.memory.total_bytes / 2 ** 30:.2f} GiB per GPU, more than HBM; "
                           f"{best_layout.label()} fits")
        assert mine.step_s <= 1.01 * best.step_s, (
            f"{where}: your layout {layout.label()} takes {mine.step_s:.4g} s per step; "
            f"{best_layout.label()} takes {best.step_s:.4g} s")
    else:
        assert mine.memory.total_bytes <= best.memory.total_bytes * (1 + 1e-9), (
            f"{where}: nothing fits; your layout needs {mine.memory.total_bytes / 2 ** 30:.2f} "
            f"GiB, {best_layout.label()} {best.memory.total_bytes / 2 ** 30:.2f} GiB")


def _row_tflops(row: dict, cluster: Cluster) -> float:
    p = reference_plan(row["model"], cluster, row["layout"])
    return p.hardware_flops / p.step_s / row["layout"].gpus / 1e12


@functools.lru_cache(maxsize=4)
def reference_efficiency(ids: tuple[str, ...] = CALIBRATION_IDS) -> float:
    """The efficiency that minimises the sum of squared log ratios of predicted to
    published hardware TFLOP/s per GPU over the rows ``ids`` (the A100 preset's links;
    each row's own DDP overlap). Cached: a batch of submissions fits it once."""
    from scipy.optimize import minimize_scalar

    from perflab.labs.lab12 import preset_cluster

    rows = [r for r in narayanan_rows() if r["id"] in ids]

    def loss(e: float) -> float:
        return sum(math.log(_row_tflops(r, preset_cluster("a100-80gb", e,
                                                           dp_overlap=r["dp_overlap"]))
                            / r["published_tflops"]) ** 2 for r in rows)

    return float(minimize_scalar(loss, bounds=(0.05, 1.0), method="bounded",
                                 options={"xatol": 1e-6}).x)


def judge_calibration(efficiency, predicted) -> None:
    """The student's fitted efficiency within 0.002 of :func:`reference_efficiency`, and
    each row's predicted TFLOP/s within 1 % of the planner's at that efficiency."""
    from perflab.labs.lab12 import preset_cluster

    assert isinstance(efficiency, (int, float)) and 0 < efficiency <= 1, (
        f"my_efficiency = {efficiency!r} is not a fraction in (0, 1]")
    want = reference_efficiency()
    assert abs(efficiency - want) <= 0.002, (
        f"my_efficiency = {efficiency:.4f}; the efficiency that minimises the squared log "
        f"errors on {', '.join(CALIBRATION_IDS)} is {want:.4f}")
    assert isinstance(predicted, dict), "my_predicted must be a dict {row id: TFLOP/s}"
    for r in narayanan_rows():
        assert r["id"] in predicted, f"my_predicted has no row {r['id']!r}"
        ref = _row_tflops(r, preset_cluster("a100-80gb", efficiency, dp_overlap=r["dp_overlap"]))
        v = predicted[r["id"]]
        assert isinstance(v, (int, float)) and abs(v - ref) <= 0.01 * ref, (
            f"{r['id']}: you predict {v!r} TFLOP/s per GPU at efficiency {efficiency:.4f}; "
            f"the planner {ref:.1f}")
