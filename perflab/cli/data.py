"""``perflab data``: build (or check) the embedded photo-patches dataset the labs train
on (:func:`perflab.data.dataset.build_dataset`)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["add_parser", "cmd_data"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab data`` and its flags."""
    p = subparsers.add_parser("data", help="build the embedded photo-patches dataset")
    p.add_argument("--root", default=None, help="data root (default: data/ or $PERFLAB_DATA)")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_data)


def cmd_data(args: argparse.Namespace) -> int:
    """Build the dataset under ``--root`` and print where it is; returns 0."""
    from perflab.core.paths import EMBEDDED_NAME, default_data_root
    from perflab.data.dataset import build_dataset

    start = time.monotonic()
    manifest = build_dataset(args.root, force=args.force, progress=not args.quiet)
    took = time.monotonic() - start
    path = Path(args.root).expanduser() if args.root else default_data_root()
    print(f"embedded dataset ready: {path / EMBEDDED_NAME} ({took:.0f} s on this machine"
          f"{'; already built' if took < 1 else ''})")
    print(f"  {len(manifest['classes'])} classes, images per split {manifest['num_images']}, "
          f"fingerprint {manifest['sha256'][:16]}")
    return 0
