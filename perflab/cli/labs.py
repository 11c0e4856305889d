"""``perflab labs``: the lab map, each lab's question and its last measured run time
(:func:`perflab.labs.catalog.lab_map`)."""
from __future__ import annotations

import argparse

__all__ = ["add_parser", "cmd_labs"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab labs``."""
    p = subparsers.add_parser("labs", help="the lab map: each lab's question and its last "
                              "measured run time")
    p.set_defaults(fn=cmd_labs)


def cmd_labs(args: argparse.Namespace) -> int:
    """Print one row per lab (number, title, nbval time, question); returns 0."""
    from perflab.labs.catalog import lab_map, lab_times_path

    table = lab_map(start_here=True)
    width = max(len(t) for t in table.title)
    timew = max(len(t) for t in table.nbval_time)
    print(f"{'lab':<4}{'title':<{width + 2}}{'nbval time':<{timew + 2}}question")
    for row in table.itertuples():
        print(f"{row.lab:<4}{row.title:<{width + 2}}{row.nbval_time:<{timew + 2}}"
              f"{row.question}")
    where = lab_times_path()
    if table.nbval_s.isna().all():
        print(f"\nnbval time: not measured yet on this machine (run `make check-solutions`; "
              f"the times are saved in {where})")
    else:
        print(f"\nnbval time: the solution notebook run top to bottom under nbval by the "
              f"last test run ({where})")
    return 0
