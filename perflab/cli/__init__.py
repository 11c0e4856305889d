"""The ``perflab`` command (also ``python -m perflab``): doctor, data, run, profile,
ladder, labs, kernel, course.

``perflab run`` has one flag per :class:`RunConfig` field, generated from the dataclass,
so the CLI and the config cannot drift apart; bad values give RunConfig's own errors.
With ``--world-size N`` (N >= 2) it runs N local data-parallel ranks exactly as
``python -m perflab.distributed`` does, which shares these flags
(:func:`add_config_flags`, :func:`config_from_args`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import typing
from pathlib import Path

from perflab.core.result_store import add_cli as add_results_cli   # light: no torch at import
from perflab.core.storage import StorageError

__all__ = ["main", "build_parser", "add_config_flags", "config_from_args", "parse_straggler",
           "run_ranks", "summary_table", "perflab_version", "version_text", "DDP_FIELDS"]

#: RunConfig fields that only data-parallel runs (world_size >= 2) use. ``perflab run``
#: shows them as a group of their own; ``perflab profile`` (one process) leaves them out.
DDP_FIELDS = ("world_size", "bucket_cap_mb", "gradient_as_bucket_view", "comm_hook",
              "link", "straggler")


def perflab_version() -> str:
    """perflab's version: ``perflab.__version__`` (pyproject reads it from there too),
    else the installed distribution's metadata."""
    import perflab

    version = getattr(perflab, "__version__", None)
    if version:
        return version
    import importlib.metadata

    return importlib.metadata.version("perflab")


def version_text() -> str:
    """``"perflab 0.1.0 (torch 2.13.0+cpu, Python 3.11.7)"``: what ``--version`` prints."""
    import torch

    return (f"perflab {perflab_version()} (torch {torch.__version__}, "
            f"Python {platform.python_version()})")


class _VersionAction(argparse.Action):
    """``--version``: imports torch only when asked (argparse's own takes a fixed string)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "off") else int(text)


def _parse_str_or_int(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def parse_straggler(text: str):
    """``"RANK:DELAY_S[:WHERE]"`` -> :class:`perflab.analysis.stragglers.Straggler`.

    Raises:
        ValueError: not of that form (the message shows an example).
    """
    from perflab.core.simulated import Straggler

    parts = text.split(":")
    try:
        rank, delay = int(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], e.g. "
                         f"1:0.05:before_forward; got {text!r}") from None
    if len(parts) > 3:
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], got {text!r}")
    return Straggler(rank=rank, delay_s=delay, where=parts[2] if len(parts) == 3
                     else "before_forward")


def add_config_flags(parser: argparse.ArgumentParser, *, distributed: bool = True):
    """Add ``--preset`` and one flag per :class:`RunConfig` field to ``parser``.

    Flags are the field names with dashes (``--batch-size``); a flag not given keeps the
    preset's value. Booleans get ``--x/--no-x``, ``Literal`` fields their choices,
    ``int | None`` fields accept ``none``. ``--link`` takes a simulated-link preset name
    and ``--straggler`` takes ``RANK:DELAY_S[:WHERE]``; :func:`config_from_args` turns
    them into objects.

    Args:
        parser: the parser (or subparser) to extend.
        distributed: also add the data-parallel fields (:data:`DDP_FIELDS`), as a group
            of their own; False leaves them out (a command that runs one process).

    Returns:
        The data-parallel argument group (for more DDP-only flags), or None.
    """
    from perflab.core.config import PRESETS, RunConfig
    from perflab.core.simulated import LINK_PRESETS

    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                        help="start from a named preset (default: quick)")
    ddp = parser.add_argument_group(
        "data-parallel (DDP) flags", "used with --world-size N >= 2: N local ranks (gloo "
        "on CPU, NCCL on GPUs), one result per rank") if distributed else None
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in DDP_FIELDS and ddp is None:
            continue
        group = ddp if f.name in DDP_FIELDS else parser
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS,
                    "help": f"RunConfig.{f.name} (default {f.default!r})"}
        if f.name == "link":
            kw["help"] = (f"simulated interconnect: {', '.join(sorted(LINK_PRESETS))} or "
                          "none (default none)")
            group.add_argument(flag, metavar="PRESET|none", **kw)
        elif f.name == "straggler":
            kw["help"] = ("delay one rank every step, e.g. 1:0.05:before_forward (WHERE: "
                          "before_forward, before_backward or data; default none)")
            group.add_argument(flag, metavar="RANK:DELAY_S[:WHERE]", **kw)
        elif hint is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif hint is int:
            group.add_argument(flag, type=int, **kw)
        elif hint is float:
            group.add_argument(flag, type=float, **kw)
        elif hint == (int | None) or hint == typing.Optional[int]:
            group.add_argument(flag, type=_parse_optional_int, metavar="INT|none", **kw)
        elif hint == (str | int):
            group.add_argument(flag, type=_parse_str_or_int, metavar="NAME|INT", **kw)
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal \
                else None
            group.add_argument(flag, choices=choices, **kw)
    return ddp


def config_from_args(args: argparse.Namespace):
    """The :class:`RunConfig` for parsed :func:`add_config_flags` flags: the preset with
    every flag given applied; ``--link``/``--straggler`` text made into objects.

    Raises:
        ValueError: RunConfig's own validation, an unknown link preset, or a straggler
            not of the form ``RANK:DELAY_S[:WHERE]`` (each message names the fix).
    """
    from perflab.core.config import RunConfig
    from perflab.core.simulated import SimulatedLink

    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if isinstance(values.get("link"), str):
        text = values["link"]
        values["link"] = None if text in ("none", "off") else SimulatedLink.preset(text)
    if isinstance(values.get("straggler"), str):
        text = values["straggler"]
        values["straggler"] = None if text in ("none", "off") else parse_straggler(text)
    return RunConfig.preset(args.preset, **values)


def cmd_doctor(args: argparse.Namespace) -> int:
    from perflab.core.env import env_summary
    from perflab.labs.catalog import lab_capabilities
    from perflab.analysis.roofline import measure_roofline

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


def cmd_data(args: argparse.Namespace) -> int:
    from perflab.core.paths import EMBEDDED_NAME, default_data_root
    from perflab.data.dataset import build_dataset

    manifest = build_dataset(args.root, force=args.force, progress=not args.quiet)
    path = Path(args.root).expanduser() if args.root else default_data_root()
    print(f"embedded dataset ready: {path / EMBEDDED_NAME}")
    print(f"  {len(manifest['classes'])} classes, images per split {manifest['num_images']}, "
          f"fingerprint {manifest['sha256'][:16]}")
    return 0


def summary_table(results):
    """One row per rank: step, compute, comm medians (ms), samples/s, delay (ms)."""
    import pandas as pd

    rows = [{"rank": r.rank, "step_ms": r.step.median * 1e3,
             "compute_ms": r.phases["compute"].median * 1e3,
             "comm_ms": r.phases["comm"].median * 1e3,
             "samples_per_s": r.samples_per_s,
             "delay_ms": r.extra["delay_s"] * 1e3} for r in results]
    return pd.DataFrame(rows).set_index("rank").round(2)


def run_ranks(config, *, timeout_s: float = 600.0, progress: bool = True,
              save: bool = True) -> int:
    """Start ``config.world_size`` local ranks (:func:`perflab.distributed.launch`) and
    print one row per rank: what ``perflab run --world-size N`` and
    ``python -m perflab.distributed`` (outside torchrun) do.

    Returns:
        The exit status: 0, or 1 when a rank failed or timed out (message on stderr).
    """
    from perflab.distributed import launch
    from perflab.distributed.launch import LaunchTimeoutError, RankFailedError

    try:
        results = launch(config, timeout_s=timeout_s, progress=progress, save=save)
    except (RankFailedError, LaunchTimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{config.display_label()}: {config.world_size} ranks, backend "
          f"{results[0].extra.get('backend', '?')}")
    print(summary_table(results).to_string())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.world_size > 1:  # the same path as `python -m perflab.distributed`
        if "RANK" in os.environ:
            raise ValueError("perflab run starts its own ranks; under torchrun use "
                             f"`torchrun ... -m perflab.distributed --world-size "
                             f"{config.world_size} ...`")
        return run_ranks(config, timeout_s=600.0 if args.timeout_s is None else args.timeout_s,
                         progress=not args.quiet, save=not args.no_save)
    if args.timeout_s is not None:
        raise ValueError("--timeout-s applies to data-parallel runs only; add --world-size N "
                         "(N >= 2) or leave it out")
    from perflab.analysis.diagnosis import diagnose
    from perflab.experiment import run

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
    from perflab.analysis.profiling import profile

    config = config_from_args(args)
    summary = profile(config, active=args.active, tensorboard=args.tensorboard,
                      progress=not args.quiet)
    print(summary)
    return 0


def cmd_labs(args: argparse.Namespace) -> int:
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


def cmd_kernel_install(args: argparse.Namespace) -> int:
    from ipykernel.kernelspec import install

    prefix = sys.prefix if args.sys_prefix else args.prefix
    dest = install(user=prefix is None, kernel_name=args.name, display_name=args.display_name,
                   prefix=None if prefix is None else str(prefix))
    print(f"installed Jupyter kernel {args.name!r} ({args.display_name}, {sys.executable}) "
          f"in {dest}")
    print("choose it in JupyterLab, VS Code or any Jupyter on this machine to run the labs "
          "with this environment")
    return 0


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


#: Columns ``perflab ladder`` prints (the full table is in the report's table.csv).
LADDER_COLUMNS = ["rung", "move", "status", "batch_size", "step_time_ms", "samples_per_s",
                  "samples_per_s_ci_low", "samples_per_s_ci_high", "speedup", "p_value",
                  "cumulative_speedup", "mfu_pct", "peak_mem_gib"]


def cmd_ladder(args: argparse.Namespace) -> int:
    import pandas as pd

    from perflab.ladder.search import climb, resume_climb
    from perflab.ladder.rungs import RUNGS, naive_config

    try:
        if args.resume is not None:
            print(f"resuming the ladder in {args.resume} with the arguments it was started "
                  "with (its ladder.json); saved trials are replayed, not measured again")
            ladder = resume_climb(args.resume, progress=not args.quiet)
        else:
            overrides = {k: getattr(args, k) for k in (
                "model", "dataset", "device", "image_size", "batch_size", "steps",
                "warmup_steps") if getattr(args, k) is not None}
            config = naive_config(args.size, **overrides)  # bad values: before any work
            rungs = _names(args.rungs) if args.rungs else list(RUNGS)
            ladder = climb(config, size=args.size, rungs=rungs, skip=_names(args.skip),
                           rounds=args.rounds, alpha=args.alpha, progress=not args.quiet,
                           out_dir=args.out, search=not args.greedy,
                           max_trials=args.max_trials)
    except KeyboardInterrupt:  # climb printed what was saved and how to resume
        return 130
    report = ladder.write_report()
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(ladder.table[LADDER_COLUMNS].round(3).to_string(index=False))
    print()
    for verdict in ladder.table.verdict[1:]:
        print(f"  {verdict}")
    print(f"\ncumulative speedup {ladder.cumulative_speedup:.2f}x per sample; kept: "
          f"{', '.join(ladder.kept) or 'none'}; best config: "
          f"{ladder.best_config.display_label()}"
          + (f" with {', '.join(ladder.best_settings)}" if ladder.best_settings else ""))
    print(f"search: {ladder.trials} comparisons; the greedy first pass kept "
          f"{'+'.join(ladder.greedy_on) or 'nothing'}, the search ends at "
          f"{'+'.join(ladder.best_on) or 'nothing'}")
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


def cmd_course_record(args: argparse.Namespace) -> int:
    from perflab.course.build import record_check_outputs

    for nb in args.notebooks:
        outputs = record_check_outputs(nb, cell_timeout_s=args.cell_timeout)
        print(f"{nb}: recorded {len(outputs)} check outputs")
        for text in outputs:
            print("  " + (text.strip().replace("\n", "\n  ") or "(no output)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``perflab`` parser: one subcommand each, ``fn`` set to what runs it."""
    from perflab.course.command import add_grade_arguments, grade_command

    parser = argparse.ArgumentParser(
        prog="perflab", description="Measured labs for making PyTorch training fast.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print perflab's, torch's and Python's versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="environment, and what each lab can show here")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("data", help="build the embedded photo-patches dataset")
    p.add_argument("--root", default=None, help="data root (default: data/ or $PERFLAB_DATA)")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_data)

    p = sub.add_parser(
        "run", help="train, print the phase breakdown, save JSON",
        description="Train one RunConfig and print its phase breakdown, throughput and "
                    "diagnosis. With --world-size N (N >= 2) it runs N local data-parallel "
                    "ranks, exactly as `python -m perflab.distributed` does, and prints one "
                    "row per rank.")
    add_config_flags(p).add_argument(
        "--timeout-s", type=float, default=None,
        help="stop ranks still running after this many seconds (default 600)")
    p.add_argument("--no-save", action="store_true", help="do not write results/*.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("profile", help="torch.profiler trace, top ops, diagnosis",
                       description="Profile one process (the data-parallel flags are not "
                                   "taken: `perflab run --world-size N` measures DDP runs).")
    add_config_flags(p, distributed=False)
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser(
        "ladder", help="the optimization ladder: a measured search for the fastest config",
        description="Search from a naive baseline over data loading, AMP, channels_last,"
                    " torch.compile (and max-autotune, CUDA graphs, cudnn.benchmark on a "
                    "GPU), a fused optimizer, the thread count (CPU) and a larger "
                    "checkpointed batch: a first greedy pass, then interacting rungs "
                    "together, dropped rungs re-tried and kept ones re-checked; each move "
                    "measured in interleaved rounds against the best so far and kept only "
                    "when a Mann-Whitney test says it is faster. Writes results/ladder/"
                    "<time>/report.md with plots and every RunResult as JSON the moment it "
                    "is measured; Ctrl-C keeps them, --resume DIR finishes the climb.")
    p.add_argument("--size", default="quick", help="tiny (CI), quick (64 px) or full")
    p.add_argument("--rungs", default=None, help="comma-separated rungs in order "
                   "(default: data_loading,amp,channels_last,compile,larger_batch)")
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
    for flag, kind in (("model", str), ("dataset", str), ("device", str),
                       ("image-size", int), ("batch-size", int), ("steps", int),
                       ("warmup-steps", int)):
        p.add_argument(f"--{flag}", type=kind, default=None,
                       help=f"override the size's RunConfig.{flag.replace('-', '_')}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_ladder)

    add_results_cli(sub)

    p = sub.add_parser("labs", help="the lab map: each lab's question and its last "
                       "measured run time")
    p.set_defaults(fn=cmd_labs)

    p = sub.add_parser("kernel", help="register this environment as a Jupyter kernel")
    ksub = p.add_subparsers(dest="kernel_command", required=True)
    k = ksub.add_parser(
        "install", help="install the 'perflab' kernel (for VS Code or another Jupyter)",
        description="Register this Python environment as a Jupyter kernel, so the labs run "
                    "with perflab from VS Code, an existing JupyterLab or nbclient. "
                    "Default: for this user (~/.local/share/jupyter/kernels).")
    k.add_argument("--name", default="perflab", help="kernel name (default perflab)")
    k.add_argument("--display-name", default="Python (perflab)",
                   help="name shown in kernel pickers (default 'Python (perflab)')")
    where = k.add_mutually_exclusive_group()
    where.add_argument("--sys-prefix", action="store_true",
                       help="install into this environment only (sys.prefix), not for the user")
    where.add_argument("--prefix", type=Path, default=None,
                       help="install into PREFIX/share/jupyter/kernels")
    k.set_defaults(fn=cmd_kernel_install)

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
        description="Put each submission's answers into the reference notebook, run it "
                    "under nbval in a bubblewrap sandbox, judge each check outside it, and "
                    "write scores.csv row by row, student feedback and instructor files "
                    "(docs/INSTRUCTORS.md).")
    add_grade_arguments(g)
    g.set_defaults(fn=grade_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status
    (2 for a bad value, with the message on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"perflab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StorageError as e:
        print(f"perflab {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Everything measured before Ctrl-C was saved as it was measured; say where.
        from perflab.core.paths import default_results_dir

        print(f"\nperflab {args.command}: interrupted; results measured so far are in "
              f"{default_results_dir()} (list them with `perflab results`)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
