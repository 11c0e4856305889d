"""The ``perflab`` command: doctor, data, run, profile, ladder, course.

``perflab run`` has one flag per :class:`RunConfig` field, generated from the dataclass,
so the CLI and the config cannot drift apart; bad values give RunConfig's own errors.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

__all__ = ["main", "build_parser"]


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "off") else int(text)


def _parse_str_or_int(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    from perflab.config import PRESETS, RunConfig

    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="start from a named preset (default: quick)")
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS,
                    "help": f"RunConfig.{f.name} (default {f.default!r})"}
        if hint is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif hint is int:
            p.add_argument(flag, type=int, **kw)
        elif hint is float:
            p.add_argument(flag, type=float, **kw)
        elif hint == (int | None) or hint == typing.Optional[int]:
            p.add_argument(flag, type=_parse_optional_int, metavar="INT|none", **kw)
        elif hint == (str | int):
            p.add_argument(flag, type=_parse_str_or_int, metavar="NAME|INT", **kw)
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal \
                else None
            p.add_argument(flag, choices=choices, **kw)


def _config_from(args: argparse.Namespace):
    from perflab.config import RunConfig

    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig.preset(args.preset, **{k: v for k, v in vars(args).items() if k in names})


def cmd_doctor(args: argparse.Namespace) -> int:
    from perflab.env import env_summary, lab_capabilities

    print("perflab doctor\n")
    print(env_summary())
    print("\nWhat each lab can show on this machine:")
    for row in lab_capabilities():
        print(f"  {row['lab']:<28} {row['status']:<10} {row['note']}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from perflab.dataset import EMBEDDED_NAME, build_dataset, default_data_root

    manifest = build_dataset(args.root, force=args.force, progress=not args.quiet)
    path = Path(args.root).expanduser() if args.root else default_data_root()
    print(f"embedded dataset ready: {path / EMBEDDED_NAME}")
    print(f"  {len(manifest['classes'])} classes, images per split {manifest['num_images']}, "
          f"fingerprint {manifest['sha256'][:16]}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from perflab.diagnosis import diagnose
    from perflab.train import run

    config = _config_from(args)
    result = run(config, progress=not args.quiet, save=not args.no_save)
    print(result)
    print()
    print(result.phase_table().round(2).to_string())
    print()
    print(diagnose(result))
    if result.path:
        print(f"\nsaved: {result.path}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from perflab.profiling import profile

    config = _config_from(args)
    summary = profile(config, active=args.active, tensorboard=args.tensorboard,
                      progress=not args.quiet)
    print(summary)
    return 0


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


#: Columns ``perflab ladder`` prints (the full table is in the report's table.csv).
LADDER_COLUMNS = ["rung", "status", "batch_size", "step_time_ms", "samples_per_s",
                  "samples_per_s_ci_low", "samples_per_s_ci_high", "speedup", "p_value",
                  "cumulative_speedup", "mfu_pct", "peak_mem_gib"]


def cmd_ladder(args: argparse.Namespace) -> int:
    import pandas as pd

    from perflab.ladder import RUNGS, climb, naive_config

    overrides = {k: getattr(args, k) for k in ("model", "dataset", "device", "image_size",
                                               "batch_size", "steps", "warmup_steps")
                 if getattr(args, k) is not None}
    config = naive_config(args.size, **overrides)  # bad size / values: before any work
    rungs = _names(args.rungs) if args.rungs else list(RUNGS)
    ladder = climb(config, size=args.size, rungs=rungs, skip=_names(args.skip),
                   rounds=args.rounds, alpha=args.alpha, progress=not args.quiet,
                   out_dir=args.out)
    report = ladder.write_report()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(ladder.table[LADDER_COLUMNS].round(3).to_string(index=False))
    print()
    for verdict in ladder.table.verdict[1:]:
        print(f"  {verdict}")
    print(f"\ncumulative speedup {ladder.cumulative_speedup:.2f}x per sample; kept: "
          f"{', '.join(ladder.kept) or 'none'}; best config: "
          f"{ladder.best_config.display_label()}")
    print(f"report: {report}")
    return 0


def cmd_course(args: argparse.Namespace) -> int:
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


def _memory_gib(text: str) -> float | None:
    return None if text.lower() in ("none", "off", "0") else float(text)


def cmd_course_record(args: argparse.Namespace) -> int:
    from perflab.course.build import record_check_outputs

    for nb in args.notebooks:
        outputs = record_check_outputs(nb, cell_timeout_s=args.cell_timeout)
        print(f"{nb}: recorded {len(outputs)} check outputs")
        for text in outputs:
            print("  " + (text.strip().replace("\n", "\n  ") or "(no output)"))
    return 0


def _lab_numbers(text: str) -> list[str]:
    try:
        return [f"{int(x):02d}" for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lab numbers like 01,02; got {text!r}")


def cmd_course_grade(args: argparse.Namespace) -> int:
    from perflab.course.grading import Limits, grade_submissions
    from perflab.course.report import write_feedback, write_scores_csv

    sanitize = args.sanitize_with
    if sanitize is None:  # the file the instructor's nbval run of solutions/ uses
        shipped = args.reference.resolve().parent / "tests" / "nbval_sanitize.cfg"
        sanitize = shipped if shipped.is_file() else None
    limits = Limits(cell_timeout_s=args.cell_timeout, wall_timeout_s=args.wall_timeout,
                    memory_gib=args.memory_gib)
    grades = grade_submissions(args.submissions, args.reference, limits=limits,
                               sanitize=sanitize, labs=args.labs, progress=print)
    out = write_scores_csv(grades, args.out)
    feedback = args.feedback or out.parent / "feedback"
    write_feedback(grades, feedback)
    errors = sum(1 for g in grades if g.error)
    print(f"\nwrote {out} ({len({g.student for g in grades})} students) and feedback in "
          f"{feedback}/" + (f"; {errors} notebook(s) could not be graded" if errors else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perflab", description="Measured labs for making PyTorch training fast.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="environment, and what each lab can show here")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("data", help="build the embedded photo-patches dataset")
    p.add_argument("--root", default=None, help="data root (default: data/ or $PERFLAB_DATA)")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_data)

    p = sub.add_parser("run", help="train, print the phase breakdown, save JSON")
    _add_config_flags(p)
    p.add_argument("--no-save", action="store_true", help="do not write results/*.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("profile", help="torch.profiler trace, top ops, diagnosis")
    _add_config_flags(p)
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser(
        "ladder", help="the optimization ladder: each fix in turn, kept if it helps",
        description="Climb from a naive baseline through data loading, AMP, channels_last,"
                    " torch.compile and a larger checkpointed batch; each rung measured in"
                    " interleaved rounds against the best so far and kept only when a "
                    "Mann-Whitney test says it is faster. Writes results/ladder/<time>/"
                    "report.md with plots and every RunResult as JSON.")
    p.add_argument("--size", default="quick", help="tiny (CI), quick (64 px) or full")
    p.add_argument("--rungs", default=None, help="comma-separated rungs in order "
                   "(default: data_loading,amp,channels_last,compile,larger_batch)")
    p.add_argument("--skip", default="", help="comma-separated rungs to leave out")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved A/B rounds per rung (default: tiny 2, quick 4, full 3)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (0.05)")
    p.add_argument("--out", default=None, type=Path,
                   help="output folder (default: results/ladder/<UTC time>)")
    for flag, kind in (("model", str), ("dataset", str), ("device", str),
                       ("image-size", int), ("batch-size", int), ("steps", int),
                       ("warmup-steps", int)):
        p.add_argument(f"--{flag}", type=kind, default=None,
                       help=f"override the size's RunConfig.{flag.replace('-', '_')}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_ladder)

    p = sub.add_parser("course", help="course tooling")
    csub = p.add_subparsers(dest="course_command", required=True)
    b = csub.add_parser("build", help="write labs/ (student notebooks) from solutions/")
    b.add_argument("--solutions", default="solutions", type=Path)
    b.add_argument("--labs", default="labs", type=Path)
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if labs/ differs from a fresh build")
    b.set_defaults(fn=cmd_course)
    r = csub.add_parser("record", help="run solution notebooks; store their check "
                        "cells' outputs (nbval's reference) and clear all others")
    r.add_argument("notebooks", nargs="+", type=Path, help="solutions/NN_*.ipynb")
    r.add_argument("--cell-timeout", type=float, default=600.0,
                   help="per-cell timeout in seconds (default 600)")
    r.set_defaults(fn=cmd_course_record)
    g = csub.add_parser(
        "grade", help="grade SUBMISSIONS/<student>/NN_*.ipynb into a score table",
        description="Restore the reference check cells into each submitted notebook, run it "
                    "under nbval in a subprocess with time and memory limits, and write "
                    "scores.csv and per-student Markdown feedback.")
    g.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    g.add_argument("--reference", default="solutions", type=Path,
                   help="folder of reference notebooks NN_*.ipynb (default: solutions)")
    g.add_argument("--out", default="scores.csv", type=Path, help="score table (CSV)")
    g.add_argument("--feedback", default=None, type=Path,
                   help="folder for <student>.md feedback (default: 'feedback' beside --out)")
    g.add_argument("--labs", default=None, type=_lab_numbers, metavar="NN[,NN...]",
                   help="comma-separated lab numbers to grade (default: all submitted)")
    g.add_argument("--cell-timeout", type=float, default=600.0,
                   help="per-cell timeout in seconds (default 600)")
    g.add_argument("--wall-timeout", type=float, default=1800.0,
                   help="wall-clock limit per notebook in seconds (default 1800)")
    g.add_argument("--memory-gib", type=_memory_gib, default=8.0, metavar="GIB|none",
                   help="address-space limit per process in GiB (default 8; 'none' on a GPU)")
    g.add_argument("--sanitize-with", default=None, type=Path,
                   help="nbval sanitize file (default: tests/nbval_sanitize.cfg beside "
                        "the reference folder, if present)")
    g.set_defaults(fn=cmd_course_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"perflab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
