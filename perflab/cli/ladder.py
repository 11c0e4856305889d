"""``perflab ladder``: the optimization ladder, a measured search from a naive baseline for
the fastest config (:func:`perflab.ladder.search.climb`), with a report written as it goes;
``--resume DIR`` finishes an interrupted climb."""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "cmd_ladder", "LADDER_COLUMNS"]

#: Columns ``perflab ladder`` prints (the full table is in the report's table.csv).
LADDER_COLUMNS = ["rung", "move", "status", "batch_size", "step_time_ms", "samples_per_s",
                  "samples_per_s_ci_low", "samples_per_s_ci_high", "speedup", "p_value",
                  "cumulative_speedup", "mfu_pct", "peak_mem_gib"]

_DESCRIPTION = (
    "Search from a naive baseline over data loading, AMP, channels_last, torch.compile (and "
    "max-autotune, CUDA graphs, cudnn.benchmark on a GPU), a fused optimizer, the thread "
    "count (CPU) and a larger checkpointed batch: a first greedy pass, then interacting "
    "rungs together, dropped rungs re-tried and kept ones re-checked; each move measured in "
    "interleaved rounds against the best so far and kept only when a Mann-Whitney test says "
    "it is faster. Writes results/ladder/<time>/report.md with plots and every RunResult as "
    "JSON the moment it is measured; Ctrl-C keeps them, --resume DIR finishes the climb.")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab ladder``: the search's flags and the RunConfig overrides."""
    p = subparsers.add_parser(
        "ladder", help="the optimization ladder: a measured search for the fastest config",
        description=_DESCRIPTION)
    p.add_argument("--size", default="quick", help="tiny (CI), quick (64 px) or full")
    p.add_argument("--rungs", default=None, help="comma-separated rungs in order "
                   "(default: every rung, in the order of perflab.ladder.rungs.RUNGS; "
                   "those that do not apply here are listed as skipped)")
    p.add_argument("--skip", default="", help="comma-separated rungs to leave out")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved A/B rounds per rung (default: tiny 2, quick 4, full 3)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (0.05)")
    p.add_argument("--out", default=None, type=Path,
                   help="output folder, checked writable before the first run (default: "
                        "results/ladder/<UTC time>)")
    p.add_argument("--resume", default=None, type=Path, metavar="DIR",
                   help="finish an interrupted ladder in DIR (its --out) from its saved "
                        "runs and rebuild report.md / table.csv; other flags are ignored")
    p.add_argument("--greedy", action="store_true",
                   help="the first pass only: each rung once, in order (no search)")
    p.add_argument("--max-trials", type=int, default=None,
                   help="stop the search after this many comparisons (default: no limit)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock bound of the search in seconds: a move estimated to "
                        "pass it (its compile included) is not measured and is listed as "
                        "skipped; default: the size's (tiny 70, quick 260, full none); "
                        "0: no bound")
    for flag, kind in (("model", str), ("dataset", str), ("device", str),
                       ("image-size", int), ("batch-size", int), ("steps", int),
                       ("warmup-steps", int)):
        p.add_argument(f"--{flag}", type=kind, default=None,
                       help=f"override the size's RunConfig.{flag.replace('-', '_')}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_ladder)


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def cmd_ladder(args: argparse.Namespace) -> int:
    """Climb (or resume) the ladder, write its report and print its table and verdicts.

    Returns:
        0, or 130 when interrupted (the climb printed what was saved and how to resume).
    """
    try:
        ladder = _climb(args)
    except KeyboardInterrupt:  # climb printed what was saved and how to resume
        return 130
    report = ladder.write_report()
    _print_ladder(ladder)
    print(f"report: {report}")
    return 0


def _climb(args: argparse.Namespace):
    """The finished ladder: resumed from ``--resume``, else climbed from the flags."""
    from perflab.ladder.rungs import BUDGET_S, RUNGS, naive_config
    from perflab.ladder.search import climb, resume_climb

    if args.resume is not None:
        print(f"resuming the ladder in {args.resume} with the arguments it was started "
              "with (its ladder.json); saved trials are replayed, not measured again")
        return resume_climb(args.resume, progress=not args.quiet)
    overrides = {k: getattr(args, k) for k in (
        "model", "dataset", "device", "image_size", "batch_size", "steps",
        "warmup_steps") if getattr(args, k) is not None}
    config = naive_config(args.size, **overrides)  # bad values: before any work
    rungs = _names(args.rungs) if args.rungs else list(RUNGS)
    if args.budget_s is not None and args.budget_s < 0:
        raise ValueError(f"--budget-s must be seconds >= 0 (0: no bound), got {args.budget_s:g}")
    budget_s = BUDGET_S.get(args.size) if args.budget_s is None else (args.budget_s or None)
    return climb(config, size=args.size, rungs=rungs, skip=_names(args.skip),
                 rounds=args.rounds, alpha=args.alpha, progress=not args.quiet,
                 out_dir=args.out, search=not args.greedy, max_trials=args.max_trials,
                 budget_s=budget_s)


def _print_ladder(ladder) -> None:
    """The ladder's table (:data:`LADDER_COLUMNS`), each verdict, and the summary lines."""
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(ladder.table[LADDER_COLUMNS].round(3).to_string(index=False))
    print()
    for verdict in ladder.table.verdict[1:]:
        print(f"  {verdict}")
    rows = set(ladder.table.rung)
    for move, why in ladder.skipped.items():  # moves with no row: over the budget, hopeless
        if move not in rows:
            print(f"  {move} skipped: {why}")
    print(f"\ncumulative speedup {ladder.cumulative_speedup:.2f}x per sample; kept: "
          f"{', '.join(ladder.kept) or 'none'}; best config: "
          f"{ladder.best_config.display_label()}"
          + (f" with {', '.join(ladder.best_settings)}" if ladder.best_settings else ""))
    print(f"search: {ladder.trials} comparisons; the greedy first pass kept "
          f"{'+'.join(ladder.greedy_on) or 'nothing'}, the search ends at "
          f"{'+'.join(ladder.best_on) or 'nothing'}")
