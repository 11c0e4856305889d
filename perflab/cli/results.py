"""``perflab results``: list, show, compare and re-plot the results already saved
(:mod:`perflab.core.result_store` reads them; :func:`perflab.viz.plots.plot_results`
draws them)."""
from __future__ import annotations

import argparse
from pathlib import Path

from perflab.core.result_store import compare_results, list_results, load_results

__all__ = ["add_parser", "cmd_results"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab results [list|show|compare|plot] [PATHS] [--out PNG]``."""
    p = subparsers.add_parser("results", help="list, show, compare and re-plot saved results")
    p.add_argument("action", nargs="?", default="list",
                   choices=("list", "show", "compare", "plot"),
                   help="list (default), show FILE, compare FILES, plot FILES --out PNG")
    p.add_argument("paths", nargs="*", help="result files or folders (default for list: "
                   "the results folder)")
    p.add_argument("--out", help="plot: where to write the PNG (default: comparison.png)")
    p.set_defaults(fn=cmd_results)


def cmd_results(args: argparse.Namespace) -> int:
    """Run ``perflab results``; returns the exit status.

    Raises:
        ValueError: show/compare/plot without paths, or a file that is not a result.
        FileNotFoundError: a path does not exist.
    """
    from perflab.core.paths import default_results_dir

    paths = args.paths or None
    if args.action == "list":
        table = list_results(paths)
        if table.empty:
            print(f"no saved results in {', '.join(map(str, paths or [default_results_dir()]))}")
        else:
            print(table.drop(columns=["path"]).round(2).to_string())
            print(f"\n{len(table)} results; files: `perflab results show <path>`; newest: "
                  f"{table.path.iloc[-1]}")
        for path, why in table.attrs["skipped"].items():
            print(f"skipped {path}: {why}")
        return 0
    if not paths:
        raise ValueError(f"`perflab results {args.action}` needs result files or folders")
    if args.action == "show":
        for r in load_results(paths):
            print(f"{r.path}\n{r!r}\n{r.phase_table().round(2).to_string()}\n")
    elif args.action == "compare":
        print(compare_results(paths).round(3).to_string(index=False))
    else:
        from perflab.viz.plots import plot_results  # matplotlib: only when plotting

        out = Path(args.out or "comparison.png")
        plot_results(paths).savefig(out, dpi=100)
        print(f"wrote {out}")
    return 0
