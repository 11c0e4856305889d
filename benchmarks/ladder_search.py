"""Does the ladder finish in its time, and does its search find the best configuration?

In one run:

1. **wall time**: ``perflab ladder --size S --quiet`` for each size of ``--wall-sizes``
   (default tiny and quick), each in its own process with an empty torch.compile cache
   (``TORCHINDUCTOR_CACHE_DIR`` a fresh folder: a student's first run) and the CLI's
   default budget (:data:`perflab.ladder.rungs.BUDGET_S`), timed from the outside
   (imports included), against the goals (tiny <= 90 s, quick <= 300 s);
2. **the search's quality** at ``--size`` (default tiny): every combination of the rungs
   measured in interleaved rounds (:func:`perflab.ladder.search.search_all`: each round
   runs every combination once, so drift hits all alike), then a ladder climbed here over
   the same rungs with the size's default budget; its greedy first pass and its final
   configuration, each at its time per sample *as measured in the exhaustive rounds*,
   and whether the ladder's final configuration lies within the 95 % CI of the
   exhaustive best (the goal).

Timings on a loaded machine are noise: the load average is printed next to them.

Usage: python benchmarks/ladder_search.py [--size tiny] [--rounds 3]
       [--rungs data_loading,amp,channels_last,compile] [--wall-sizes tiny,quick]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from perflab import climb
from perflab.core.paths import default_results_dir
from perflab.ladder.rungs import BUDGET_S, ROUNDS, naive_config
from perflab.ladder.search import search_all

GOALS_S = {"tiny": 90.0, "quick": 300.0}


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def time_cli(size: str, out: Path, model: str) -> tuple[float, int]:
    """Seconds ``perflab ladder --size size`` takes in a fresh process with an empty
    compile cache (its results go to ``out``; its output is printed), and the number of
    comparisons it measured (from its last line).

    Raises:
        RuntimeError: the CLI failed (its exit status and last output lines).
    """
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "perflab", "ladder", "--size", size,
                               "--model", model, "--quiet", "--out", str(out)],
                              env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"perflab ladder --size {size} exited {proc.returncode}:\n{tail}")
    print(proc.stdout.rstrip())
    found = re.search(r"search: (\d+) comparisons", proc.stdout)
    return wall, int(found.group(1)) if found else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", help="size of the exhaustive comparison")
    ap.add_argument("--rounds", type=int, default=3, help="exhaustive rounds (3)")
    ap.add_argument("--rungs", default="data_loading,amp,channels_last,compile",
                    help="rungs of the exhaustive comparison and of the ladder it checks")
    ap.add_argument("--wall-sizes", default="tiny,quick",
                    help="sizes whose CLI ladder is timed ('' for none)")
    ap.add_argument("--model", default="resnet18")
    args = ap.parse_args()
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    sizes = [s.strip() for s in args.wall_sizes.split(",") if s.strip()]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = default_results_dir() / "ladder_search" / stamp
    print(f"load average {_load():.1f} on {os.cpu_count()} CPUs at start; results in {root}")

    walls = []
    for size in sizes:
        out = root / f"cli-{size}"
        print(f"\n== perflab ladder --size {size} (default budget {BUDGET_S.get(size)} s, "
              "empty compile cache)")
        wall, comparisons = time_cli(size, out, args.model)
        goal = GOALS_S.get(size)
        walls.append(dict(size=size, wall_s=round(wall, 1), goal_s=goal,
                          met=None if goal is None else wall <= goal,
                          comparisons=comparisons, load_after=round(_load(), 1)))

    config = naive_config(args.size, model=args.model)
    table = search_all(config, size=args.size, rungs=rungs, rounds=args.rounds)
    base = table.set_index("key").loc["baseline", "ms_per_sample"]
    table["speedup_vs_baseline"] = base / table.ms_per_sample
    with pd.option_context("display.width", 160):
        print(f"\nexhaustive at {args.size}: {len(table)} combinations x {args.rounds} "
              "rounds (fastest first)")
        print(table[["key", "batch_size", "ms_per_sample", "ms_per_sample_ci_low",
                     "ms_per_sample_ci_high", "speedup_vs_baseline"]].round(3)
              .to_string(index=False))

    ladder = climb(config, size=args.size, rungs=rungs, rounds=ROUNDS[args.size],
                   out_dir=root / f"climb-{args.size}", budget_s=BUDGET_S.get(args.size))
    ladder.write_report()
    by_key = table.set_index("key")
    best = table.iloc[0]
    rows = []
    for name, on in (("greedy first pass", ladder.greedy_on), ("ladder search", ladder.best_on),
                     ("exhaustive best", best.on)):
        key = "+".join(on) or "baseline"
        r = by_key.loc[key]
        rows.append(dict(config=name, rungs=key, ms_per_sample=r.ms_per_sample,
                         ci_low=r.ms_per_sample_ci_low, ci_high=r.ms_per_sample_ci_high,
                         speedup_vs_baseline=r.speedup_vs_baseline))
    side = pd.DataFrame(rows)
    print(f"\nside by side (times from the exhaustive rounds; ladder: {ladder.trials} "
          f"comparisons, exhaustive: {len(table)} combinations x {args.rounds} rounds; "
          f"load average {_load():.1f} at the end)")
    print(side.round(3).to_string(index=False))
    final_key = rows[1]["rungs"]
    final = by_key.loc[final_key, "ms_per_sample"]
    within = best.ms_per_sample_ci_low <= final <= best.ms_per_sample_ci_high
    print(f"\nladder final {final_key} {final:.3f} ms/sample, {base / final:.2f}x the "
          f"baseline, vs exhaustive best {best.key} {best.ms_per_sample:.3f} ms/sample, "
          f"{best.speedup_vs_baseline:.2f}x (95 % CI {best.ms_per_sample_ci_low:.3f}-"
          f"{best.ms_per_sample_ci_high:.3f}): goal (within the best's CI) "
          f"{'met' if within else 'NOT met'}; "
          f"{'the same configuration' if final_key == best.key else 'a different one'}")
    if walls:
        print("\nladder wall time (CLI, default budget, empty compile cache):")
        print(pd.DataFrame(walls).to_string(index=False))


if __name__ == "__main__":
    main()
