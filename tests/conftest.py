"""Shared pytest fixtures and markers (CPU-first; hardware tests skip and say why)."""
from __future__ import annotations

import pytest
import torch

_no_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                              reason="needs a CUDA device; this machine has none")


def requires_cuda(obj):
    """Mark a test (function or class) ``cuda``, which ``make gpu-check`` selects
    (``pytest -m cuda``), and skip it, with the reason, where no CUDA device is."""
    return pytest.mark.cuda(_no_cuda(obj))
slow = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A small embedded-style ImageFolder (2 train / 1 val images per class) for fast runs."""
    from perflab.data.dataset import build_dataset

    root = tmp_path_factory.mktemp("data")
    build_dataset(root, train_per_class=4, val_per_class=1, progress=False)
    return str(root / "photo-patches")


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """Send saved RunResults to a temporary folder."""
    monkeypatch.setenv("PERFLAB_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"
