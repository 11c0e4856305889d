"""``perflab doctor``: this machine's environment, its measured roofline, and what each
lab can show on it."""
from __future__ import annotations

import argparse

__all__ = ["add_parser", "cmd_doctor"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab doctor``."""
    p = subparsers.add_parser("doctor", help="environment, and what each lab can show here")
    p.set_defaults(fn=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the environment, measure the roofline, list each lab's status; returns 0."""
    from perflab.analysis.roofline import measure_roofline
    from perflab.core.env import env_summary
    from perflab.labs.catalog import lab_capabilities

    print("perflab doctor\n")
    print(env_summary())
    print("\nMeasuring this machine's roofline (a few seconds) ...")
    roof = measure_roofline()
    print(roof)
    for dtype in ("bf16", "fp16"):
        print(f"  {roof.explain(dtype)}")
    print("\nWhat each lab can show on this machine:")
    for row in lab_capabilities(roofline=roof):
        print(f"  {row['lab']:<28} {row['status']:<10} {row['note']}")
    return 0
