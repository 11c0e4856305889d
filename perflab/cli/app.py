"""The top of the ``perflab`` command: the top parser, ``--version``, and :func:`main`.

Each command lives in a module of its own under :mod:`perflab.cli` (as accelerate's
``commands/`` do) whose ``add_parser(subparsers)`` registers its sub-parser and flags and
sets its handler (``fn``) with ``set_defaults``; :func:`build_parser` only makes the top
parser and calls them in :data:`COMMANDS` order, and :func:`main` runs the chosen handler,
turning the errors a user can fix into a message and an exit status. (Named ``app``, not
``main``: :mod:`perflab.cli` re-exports the function :func:`main`, which would hide a
module of that name.)
"""
from __future__ import annotations

import argparse
import platform
import sys

from perflab.cli import (course, data, doctor, kernel, labs, ladder, plan, profile,
                         results, run)
from perflab.core.storage import StorageError

__all__ = ["main", "build_parser", "COMMANDS", "perflab_version", "version_text"]

#: The command modules, in the order ``perflab --help`` lists them; each has
#: ``add_parser(subparsers)``.
COMMANDS = (doctor, data, run, profile, ladder, plan, results, labs, kernel, course)


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


def build_parser() -> argparse.ArgumentParser:
    """The ``perflab`` parser: one subcommand per :data:`COMMANDS` module, ``fn`` set to
    what runs it."""
    parser = argparse.ArgumentParser(
        prog="perflab", description="Measured labs for making PyTorch training fast.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print perflab's, torch's and Python's versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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
