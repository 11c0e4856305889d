"""Record the per-rank compute times Lab 07's detector check grades against.

    .venv/bin/python benchmarks/record_stragglers.py   # writes perflab/recordings/straggler_timings.json

Two launches of real gloo ranks on this machine (2 ranks, then 4 sharing the cores)
train :func:`perflab.labs.lab07.straggler_rank`'s MLP through a list of cases (run
interleaved, one step of each case per round); each case injects a labelled straggler (which rank, how much slower, in which steps: the
hiccup steps are drawn from ``numpy.random.default_rng(SEED)``). The times themselves are
measurements, so a new recording differs in its noise; the grade never does, because the
check compares the student's detector with the reference on the *shipped* file.
"""
from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

SEED = 7
STEPS = 12
OUT = Path(__file__).resolve().parents[1] / "perflab" / "recordings" / "straggler_timings.json"


def cases() -> dict[int, list[dict]]:
    """world_size -> phases (one case each), seeded."""
    rng = np.random.default_rng(SEED)
    hiccups = [0.0] * STEPS
    for s in sorted(rng.choice(np.arange(2, STEPS), size=3, replace=False)):
        hiccups[int(s)] = 1.0            # 3 slow steps among the last 10: not a straggler
    recovered = [0.5] * 10 + [0.0] * 10  # slow for 10 steps, then fine for 10
    return {
        2: [{"name": "2r_none", "steps": STEPS, "slow": {}},
            {"name": "2r_rank1_20pct", "steps": STEPS, "slow": {1: 0.2}},
            {"name": "2r_rank0_100pct", "steps": STEPS, "slow": {0: 1.0}}],
        4: [{"name": "4r_none", "steps": STEPS, "slow": {}},
            {"name": "4r_rank2_50pct", "steps": STEPS, "slow": {2: 0.5}},
            {"name": "4r_rank3_hiccups", "steps": STEPS, "slow": {3: hiccups}},
            {"name": "4r_rank0_recovered", "steps": 20, "slow": {0: recovered}},
            {"name": "4r_rank1_25pct", "steps": STEPS, "slow": {1: 0.25}}],
    }


def main() -> None:
    from perflab.distributed import launch_fn
    from perflab.labs.lab07 import straggler_rank

    out: dict = {"source": "benchmarks/record_stragglers.py", "seed": SEED,
                 "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                 "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
                 "units": "seconds of compute (forward + backward + injected sleep) per step, "
                          "ranks x steps", "cases": {}}
    for ws, phases in cases().items():
        for p in phases:
            p["batch"] = "even"
        ranks = launch_fn(straggler_rank, ws, args=(phases, "perflab.course.references.lab07"),
                         device="cpu", timeout_s=300)
        for i, p in enumerate(phases):
            out["cases"][p["name"]] = {
                "world_size": ws, "injected": {str(k): v for k, v in p["slow"].items()},
                "compute_s": [[round(x, 7) for x in r["phases"][i]["compute_s"]] for r in ranks],
                "cpu_s": [[round(x, 7) for x in r["phases"][i]["cpu_s"]] for r in ranks],
            }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
