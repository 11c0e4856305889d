"""``perflab course``: course tooling. ``build`` writes labs/ (student notebooks) from
solutions/, ``record`` stores the solution notebooks' check outputs, ``grade`` grades
submissions (or one shard of them), ``merge`` joins the shards' score tables
(:mod:`perflab.course.command`, see docs/INSTRUCTORS.md), ``release`` writes what
students get (:mod:`perflab.course.release`)."""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "cmd_course", "cmd_course_record"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab course`` with its ``build``, ``record``, ``grade`` and
    ``merge`` subcommands."""
    p = subparsers.add_parser("course", help="course tooling")
    csub = p.add_subparsers(dest="course_command", required=True)
    _add_build(csub)
    _add_record(csub)
    _add_grade(csub)
    _add_merge(csub)
    _add_release(csub)


def _add_build(csub: argparse._SubParsersAction) -> None:
    b = csub.add_parser("build", help="write labs/ (student notebooks) from solutions/")
    b.add_argument("--solutions", default="solutions", type=Path)
    b.add_argument("--labs", default="labs", type=Path)
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if labs/ differs from a fresh build")
    b.set_defaults(fn=cmd_course)


def _add_record(csub: argparse._SubParsersAction) -> None:
    r = csub.add_parser("record", help="run solution notebooks; store their check "
                        "cells' outputs (nbval's reference) and clear all others")
    r.add_argument("notebooks", nargs="+", type=Path, help="solutions/NN_*.ipynb")
    r.add_argument("--cell-timeout", type=float, default=600.0,
                   help="per-cell timeout in seconds (default 600)")
    r.set_defaults(fn=cmd_course_record)


def _add_grade(csub: argparse._SubParsersAction) -> None:
    from perflab.course.command import add_grade_arguments, grade_command

    g = csub.add_parser(
        "grade", help="grade SUBMISSIONS/<student>/NN_*.ipynb into a score table",
        description="Put each submission's answers into the reference notebook, run it "
                    "under nbval in a bubblewrap sandbox, judge each check outside it, and "
                    "write scores.csv row by row, student feedback and instructor files "
                    "(docs/INSTRUCTORS.md).")
    add_grade_arguments(g)
    g.set_defaults(fn=grade_command)


def _add_merge(csub: argparse._SubParsersAction) -> None:
    from perflab.course.command import add_merge_arguments, merge_command

    m = csub.add_parser(
        "merge", help="join the score tables of `grade --shard K/N` runs into one",
        description="Join the score tables that `perflab course grade --shard K/N --seed S` "
                    "wrote on several machines into the table one machine would have "
                    "written, refusing overlapping, missing or unfinished slices and "
                    "shards graded with another seed or other columns "
                    "(docs/INSTRUCTORS.md).")
    add_merge_arguments(m)
    m.set_defaults(fn=merge_command)


def cmd_course(args: argparse.Namespace) -> int:
    """``perflab course build``: write labs/ from solutions/ (``--check``: compare only).

    Returns:
        0, or 1 with ``--check`` when labs/ is out of date.
    """
    from perflab.course.build import build_labs

    changed = build_labs(args.solutions, args.labs, check=args.check)
    if args.check:
        if changed:
            print("labs/ is out of date with solutions/ (run `perflab course build`):")
            for p in changed:
                print(f"  {p}")
            return 1
        print("labs/ is up to date with solutions/")
        return 0
    for p in changed:
        print(f"wrote {p}")
    if not changed:
        print("labs/ already up to date")
    return 0


def cmd_course_record(args: argparse.Namespace) -> int:
    """``perflab course record``: run each notebook and store its check cells' outputs;
    returns 0."""
    from perflab.course.build import record_check_outputs

    for nb in args.notebooks:
        outputs = record_check_outputs(nb, cell_timeout_s=args.cell_timeout)
        print(f"{nb}: recorded {len(outputs)} check outputs")
        for text in outputs:
            print("  " + (text.strip().replace("\n", "\n  ") or "(no output)"))
    return 0


def _add_release(csub: argparse._SubParsersAction) -> None:
    from perflab.course.release import add_release_arguments, release_command

    r = csub.add_parser("release", help="write the students' copy of the course to DEST",
                        description="labs/, perflab without the grader, the dataset's README, "
                                    "docs/STUDENTS.md, a README and pyproject.toml; refuses "
                                    "if any file would hold a line of a reference solution")
    add_release_arguments(r)
    r.set_defaults(fn=release_command)
