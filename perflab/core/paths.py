"""Where perflab's files live: the source checkout, the results folder, the datasets.

Every default is overridable by an environment variable (``PERFLAB_RESULTS``,
``PERFLAB_DATA``), so a course can put results and data wherever its machines need them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["source_checkout_root", "default_results_dir", "default_data_root",
           "EMBEDDED_NAME", "dataset_fingerprint", "read_manifest"]

#: The embedded dataset's folder name under :func:`default_data_root`
#: (built by :func:`perflab.data.dataset.build_dataset`).
EMBEDDED_NAME = "photo-patches"


def default_data_root() -> Path:
    """Where datasets live: ``$PERFLAB_DATA``; else ``<repo>/data`` in a source checkout;
    else ``~/.cache/perflab/data``."""
    env = os.environ.get("PERFLAB_DATA")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[2]
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file() and 'name = "perflab"' in pyproject.read_text(errors="replace"):
        return repo / "data"
    return Path.home() / ".cache" / "perflab" / "data"


def dataset_fingerprint(path: str | os.PathLike[str]) -> str | None:
    """First 16 hex characters of the dataset's SHA-256 (from ``path/manifest.json``);
    None when there is no readable manifest (e.g. your own ImageFolder)."""
    manifest = read_manifest(Path(path).expanduser())
    sha = manifest.get("sha256") if isinstance(manifest, dict) else None
    return sha[:16] if isinstance(sha, str) else None


def source_checkout_root() -> Path | None:
    """The project folder when perflab is imported from a source checkout, else None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def default_results_dir() -> Path:
    """``$PERFLAB_RESULTS``, else ``<checkout>/results``, else ``./results``."""
    if os.environ.get("PERFLAB_RESULTS"):
        return Path(os.environ["PERFLAB_RESULTS"])
    root = source_checkout_root()
    return (root if root else Path.cwd()) / "results"


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The parsed ``path/manifest.json`` of a dataset folder; None when it is missing or
    not JSON."""
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
