"""How well does perflab's planner predict published large training runs?

Re-fits each GPU preset's two parameters (matmul efficiency, elementwise HBM passes) on
its named calibration rows (``perflab.analysis.published_runs.CALIBRATION_ROWS``: the
first, middle and last row of the one table run on that GPU) and checks they are the
values the preset stores; then predicts every published row
(``perflab/recordings/published_runs.json``: Narayanan et al. 2021 Table 1, Korthikanti
et al. 2022 Table 5, the H100 table of Megatron-LM's README) and prints, per row, the
published and predicted metric, the throughput error and the layout evaluated (the
published one; for the H100 table the planner's best for the published tp, pp, dp), then
the median absolute error of the rows not used for calibration (goal: within 10 %).

docs/PLANNER.md holds this script's ``--markdown`` output.

Usage: python benchmarks/planner_validation.py [--markdown] [--no-refit]
"""
from __future__ import annotations

import argparse
import datetime
import statistics

from perflab.analysis.planner import gpu_preset
from perflab.analysis.published_runs import (
    CALIBRATION_ROWS, fit_efficiency, published_tables, validation_rows,
)

UNITS = {"hardware_tflops_per_gpu": "TFLOP/s/GPU (Eq. 3, with recompute)",
         "model_tflops_per_gpu": "TFLOP/s/GPU (model)", "step_s": "s per iteration"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--no-refit", action="store_true",
                        help="skip re-fitting the presets' parameters (a few seconds)")
    args = parser.parse_args()
    md = args.markdown
    today = datetime.date.today().isoformat()

    print(f"{'## ' if md else ''}Calibration ({today})\n")
    if md:
        print("| GPU preset | calibration rows | matmul efficiency | elementwise passes |"
              " re-fit |\n|---|---|---|---|---|")
    for name, rows in CALIBRATION_ROWS.items():
        g = gpu_preset(name)
        refit = "not run" if args.no_refit else str(fit_efficiency(name))
        stored = (g.matmul_efficiency, g.elementwise_passes)
        if md:
            print(f"| `{name}` | {', '.join(f'`{r}`' for r in rows)} | {stored[0]:g} | "
                  f"{stored[1]:g} | {refit} |")
        else:
            print(f"{name}: rows {', '.join(rows)}; stored (matmul efficiency, elementwise "
                  f"passes) = {stored}; re-fit = {refit}")
        if not args.no_refit and refit != str(stored):
            print(f"\nWARNING: the re-fit {refit} differs from the stored {stored}: update "
                  "perflab/analysis/planner.py's _FITTED")
    rows = validation_rows()
    tables = published_tables()
    print()
    for table, meta in tables.items():
        print(f"{'### ' if md else ''}{table}: {UNITS[meta['metric']]}\n")
        if md:
            print("| row | published | predicted | error | layout evaluated |\n"
                  "|---|---:|---:|---:|---|")
        for r in (r for r in rows if r["table"] == table):
            name = r["id"].split("/", 1)[1] + (" (calibration)" if r["calibration"] else "")
            if md:
                print(f"| {name} | {r['published']:g} | {r['predicted']:.4g} | "
                      f"{r['error']:+.1%} | `{r['layout']}` |")
            else:
                print(f"  {name:<32} published {r['published']:>8g}  predicted "
                      f"{r['predicted']:>8.4g}  error {r['error']:+6.1%}  {r['layout']}")
        held = [abs(r["error"]) for r in rows if r["table"] == table and not r["calibration"]]
        print(f"\n{'' if not md else '*'}median |error|, {len(held)} rows not used for "
              f"calibration: {statistics.median(held):.1%}{'' if not md else '*'}\n")
    held = [abs(r["error"]) for r in rows if not r["calibration"]]
    worst = max((r for r in rows if not r["calibration"]), key=lambda r: abs(r["error"]))
    print(f"{'**' if md else ''}all tables: median |error| of the {len(held)} rows not used "
          f"for calibration {statistics.median(held):.1%} (goal: within 10 %); largest "
          f"{worst['error']:+.1%} ({worst['id']}){'**' if md else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
