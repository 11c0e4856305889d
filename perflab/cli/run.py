"""``perflab run``: train one :class:`~perflab.core.config.RunConfig` and print its phase
breakdown, throughput and diagnosis.

One flag per RunConfig field (:func:`perflab.core.config_flags.add_config_flags`). With
``--world-size N`` (N >= 2) it runs N local data-parallel ranks through
:func:`perflab.experiment.run_ranks` and prints one row per rank with the same helper as
``python -m perflab.distributed`` (:func:`perflab.distributed.runs.print_rank_results`);
otherwise one process through :func:`perflab.experiment.run`.
"""
from __future__ import annotations

import argparse
import os
import sys

from perflab.core.config_flags import add_config_flags, config_from_args

__all__ = ["add_parser", "cmd_run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab run``: the RunConfig flags, ``--timeout-s`` (with the
    data-parallel flags), ``--no-save`` and ``--quiet``."""
    p = subparsers.add_parser(
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


def cmd_run(args: argparse.Namespace) -> int:
    """Run the config the flags describe and print what was measured.

    Returns:
        0, or 1 when a data-parallel rank failed or timed out (message on stderr).

    Raises:
        ValueError: a bad flag value (RunConfig's own message), ``--world-size N`` under
            torchrun, or ``--timeout-s`` for a one-process run.
    """
    config = config_from_args(args)
    if config.world_size > 1:  # the same path as `python -m perflab.distributed`
        if "RANK" in os.environ:
            raise ValueError("perflab run starts its own ranks; under torchrun use "
                             f"`torchrun ... -m perflab.distributed --world-size "
                             f"{config.world_size} ...`")
        timeout_s = 600.0 if args.timeout_s is None else args.timeout_s
        return _run_ranks(config, timeout_s=timeout_s, progress=not args.quiet,
                          save=not args.no_save)
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
    diagnosis = diagnose(result)
    if diagnosis.bottleneck == "compute" and result.config.amp == "off":
        # Only a compute-bound fp32 run needs the matmul rates (a few seconds) to know
        # whether mixed precision can help on this hardware.
        from perflab.analysis.roofline import measure_roofline
        diagnosis = diagnose(result, roofline=measure_roofline(result.env.get("device", "cpu")))
    print(diagnosis)
    if result.path:
        print(f"\nsaved: {result.path}")
    return 0


def _run_ranks(config, *, timeout_s: float, progress: bool, save: bool) -> int:
    """``config.world_size`` local ranks (:func:`perflab.experiment.run_ranks`), one row
    per rank printed; 1 (message on stderr) when a rank failed or timed out."""
    from perflab.distributed.launch import LaunchTimeoutError, RankFailedError
    from perflab.distributed.runs import print_rank_results
    from perflab.experiment import run_ranks

    try:
        results = run_ranks(config, timeout_s=timeout_s, progress=progress, save=save)
    except (RankFailedError, LaunchTimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_rank_results(config, results)
    return 0
