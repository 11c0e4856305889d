"""Does the ladder's search find the best configuration? Greedy vs search vs exhaustive.

In one run, at one size (default tiny):

1. the exhaustive search: every combination of the rungs (:func:`perflab.ladder.search.search_all`),
   all measured in interleaved rounds (each round runs every combination once);
2. the ladder (:func:`perflab.ladder.search.climb`): its greedy first pass and the search's
   final configuration.

Then prints, side by side, each configuration's time per sample *as measured in the
exhaustive rounds* (the same measurement for all, so they compare), with the 95 % CI of
the median, and whether the ladder's final configuration lies within the 95 % CI of
the exhaustive best (the goal). Timings on a loaded machine are noise: the load average
is printed next to them.

Usage: python benchmarks/ladder_search.py [--size tiny] [--rounds 3]
       [--rungs data_loading,amp,channels_last,compile] [--ladder-rounds N]
"""
from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone

import pandas as pd

from perflab import climb
from perflab.core.paths import default_results_dir
from perflab.ladder.rungs import naive_config
from perflab.ladder.search import search_all
from perflab.ladder.rungs import ROUNDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--rounds", type=int, default=3, help="exhaustive rounds (3)")
    ap.add_argument("--ladder-rounds", type=int, default=None,
                    help="ladder rounds per comparison (default: the size's)")
    ap.add_argument("--rungs", default="data_loading,amp,channels_last,compile")
    ap.add_argument("--model", default="resnet18")
    args = ap.parse_args()
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    config = naive_config(args.size, model=args.model)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"size {args.size}, rungs {rungs}, load average {load:.1f} on "
          f"{os.cpu_count()} CPUs at start")

    table = search_all(config, size=args.size, rungs=rungs, rounds=args.rounds)
    base = table.set_index("key").loc["baseline", "ms_per_sample"]
    table["speedup_vs_baseline"] = base / table.ms_per_sample
    with pd.option_context("display.width", 160):
        print(f"\nexhaustive: {len(table)} combinations x {args.rounds} rounds "
              "(fastest first)")
        print(table[["key", "batch_size", "ms_per_sample", "ms_per_sample_ci_low",
                     "ms_per_sample_ci_high", "speedup_vs_baseline"]].round(3)
              .to_string(index=False))

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = default_results_dir() / "ladder_search" / stamp
    rounds = args.ladder_rounds or ROUNDS[args.size]
    ladder = climb(config, size=args.size, rungs=rungs, rounds=rounds, out_dir=out)
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
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nside by side (times from the exhaustive rounds; ladder: {ladder.trials} "
          f"comparisons x {rounds} rounds, exhaustive: {len(table)} combinations x "
          f"{args.rounds} rounds; load average {load_end:.1f} at the end)")
    print(side.round(3).to_string(index=False))
    final = by_key.loc["+".join(ladder.best_on) or "baseline", "ms_per_sample"]
    within = best.ms_per_sample_ci_low <= final <= best.ms_per_sample_ci_high
    print(f"\nladder final {final:.3f} ms/sample vs exhaustive best {best.key} "
          f"{best.ms_per_sample:.3f} ms/sample (95 % CI {best.ms_per_sample_ci_low:.3f}-"
          f"{best.ms_per_sample_ci_high:.3f}): goal (within the best's CI) "
          f"{'met' if within else 'NOT met'}; "
          f"{'the same configuration' if final == best.ms_per_sample else 'a different one'}")
    print(f"ladder report: {out / 'report.md'}")


if __name__ == "__main__":
    main()
