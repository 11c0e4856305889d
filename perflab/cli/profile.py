"""``perflab profile``: a ``torch.profiler`` trace of one process, its top ops and a
diagnosis (:func:`perflab.analysis.profiling.profile`); takes the RunConfig flags but not
the data-parallel ones."""
from __future__ import annotations

import argparse

from perflab.core.config_flags import add_config_flags, config_from_args

__all__ = ["add_parser", "cmd_profile"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab profile``: the one-process RunConfig flags, ``--active``,
    ``--tensorboard`` (refused with the replacement views) and ``--quiet``."""
    p = subparsers.add_parser("profile", help="torch.profiler trace, top ops, diagnosis",
                              description="Profile one process (the data-parallel flags "
                                          "are not taken: `perflab run --world-size N` "
                                          "measures DDP runs).")
    add_config_flags(p, distributed=False)
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--tensorboard", action="store_true",
                   help="refused, with where each view went: the TensorBoard profiler "
                        "plugin is gone; open the trace in Perfetto")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile the config the flags describe and print the summary; returns 0."""
    from perflab.analysis.profiling import profile

    if args.tensorboard:  # before any work
        from perflab.analysis.profiling import TENSORBOARD_GONE
        raise ValueError(f"--tensorboard: {TENSORBOARD_GONE}")
    config = config_from_args(args)
    summary = profile(config, active=args.active, progress=not args.quiet)
    print(summary)
    return 0
