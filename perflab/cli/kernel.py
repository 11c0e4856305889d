"""``perflab kernel install``: register this Python environment as a Jupyter kernel, so
the labs run with perflab from VS Code, an existing JupyterLab or nbclient."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "cmd_kernel_install"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab kernel`` and its ``install`` subcommand."""
    p = subparsers.add_parser("kernel", help="register this environment as a Jupyter kernel")
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


def cmd_kernel_install(args: argparse.Namespace) -> int:
    """Install the kernel spec (for this user, or ``--sys-prefix`` / ``--prefix``);
    returns 0."""
    from ipykernel.kernelspec import install

    prefix = sys.prefix if args.sys_prefix else args.prefix
    dest = install(user=prefix is None, kernel_name=args.name, display_name=args.display_name,
                   prefix=None if prefix is None else str(prefix))
    print(f"installed Jupyter kernel {args.name!r} ({args.display_name}, {sys.executable}) "
          f"in {dest}")
    print("choose it in JupyterLab, VS Code or any Jupyter on this machine to run the labs "
          "with this environment")
    return 0
