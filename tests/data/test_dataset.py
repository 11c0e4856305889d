"""The embedded photo-patches builder: determinism, layout, manifest, skip and rebuild."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from perflab.data import dataset
from perflab.data.dataset import CLASSES, build_dataset, ensure_dataset
from perflab.core.paths import EMBEDDED_NAME, dataset_fingerprint, default_data_root

SMALL = dict(train_per_class=3, val_per_class=1, progress=False)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("data")
    return root, build_dataset(root, processes=1, **SMALL)


def jpegs(path: Path) -> list[Path]:
    return sorted(path.rglob("*.jpg"))


def test_same_bytes_for_any_process_count(small, tmp_path):
    _, manifest = small
    again = build_dataset(tmp_path, processes=2, **SMALL)
    assert again["sha256"] == manifest["sha256"]
    assert len(manifest["sha256"]) == 64


def leftovers(root):
    """Entries of ``root`` other than the dataset link, the one version folder it points
    at, and the builders' lock file."""
    link = root / EMBEDDED_NAME
    keep = {EMBEDDED_NAME, f".{EMBEDDED_NAME}.lock"}
    if link.is_symlink():
        keep.add(os.readlink(link))
    return sorted(p.name for p in root.iterdir() if p.name not in keep)


def test_seed_changes_the_images(small, tmp_path):
    assert build_dataset(tmp_path, seed=1, **SMALL)["sha256"] != small[1]["sha256"]


def test_layout_and_counts(small):
    root, manifest = small
    path = root / EMBEDDED_NAME
    assert len(CLASSES) == 10 and list(CLASSES) == sorted(CLASSES)
    for split, n in (("train", 3), ("val", 1)):
        assert sorted(d.name for d in (path / split).iterdir()) == list(CLASSES)
        for cls in CLASSES:
            names = sorted(f.name for f in (path / split / cls).iterdir())
            assert names == [f"{cls}_{i:05d}.jpg" for i in range(n)]
    assert manifest["counts"]["train"] == dict.fromkeys(CLASSES, 3)
    assert manifest["num_images"] == {"train": 30, "val": 10}
    assert leftovers(root) == []  # no temp dirs left


def test_manifest_fields(small):
    root, manifest = small
    on_disk = json.loads((root / EMBEDDED_NAME / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["params"]["seed"] == 0 and manifest["params"]["quality"] == 90
    assert (manifest["params"]["min_side"], manifest["params"]["max_side"]) == (224, 256)
    assert set(manifest["versions"]) == {"scikit-image", "Pillow", "numpy"}
    assert set(manifest["sources"]) == set(CLASSES)
    assert manifest["sources"]["motorcycle_left"]["function"] == \
        "skimage.data.stereo_motorcycle()[0]"
    assert manifest["sources"]["chelsea"]["shape"] == [300, 451, 3]
    assert manifest["sources"]["grass"]["shape"] == [512, 512, 3]  # grey -> RGB
    assert all(s["provenance"] for s in manifest["sources"].values())
    assert manifest["total_bytes"] == sum(f.stat().st_size for f in jpegs(root))


def test_images_are_rgb_squares_with_sides_in_range(tmp_path):
    build_dataset(tmp_path, min_side=20, max_side=24, **SMALL)
    sides = set()
    for f in jpegs(tmp_path):
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert im.width == im.height and 20 <= im.width <= 24
            sides.add(im.width)
    assert len(sides) > 1  # drawn, not fixed


def test_skips_when_present_and_rebuilds_when_forced_or_incomplete(tmp_path):
    first = build_dataset(tmp_path, **SMALL)
    f = tmp_path / EMBEDDED_NAME / "train" / "brick" / "brick_00000.jpg"
    inode = f.stat().st_ino
    assert build_dataset(tmp_path, **SMALL) == first
    assert f.stat().st_ino == inode  # not rewritten
    assert build_dataset(tmp_path, force=True, **SMALL)["sha256"] == first["sha256"]
    assert f.stat().st_ino != inode  # rewritten
    f.unlink()
    assert build_dataset(tmp_path, **SMALL)["sha256"] == first["sha256"]
    assert f.is_file()
    assert leftovers(tmp_path) == []


def test_interrupted_build_leaves_no_set(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset, "_fingerprint", boom)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(tmp_path, **SMALL)
    assert leftovers(tmp_path) == [] and not (tmp_path / EMBEDDED_NAME).exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(train_per_class=0), "train_per_class >= 1"),
    (dict(min_side=30, max_side=20), "min_side <= max_side"),
    (dict(quality=0), "quality"),
])
def test_bad_parameters_raise(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_dataset(tmp_path, **{**SMALL, **kwargs})


def test_ensure_dataset_and_fingerprint(small, tmp_path, monkeypatch):
    root, manifest = small
    assert dataset_fingerprint(root / EMBEDDED_NAME) == manifest["sha256"][:16]
    assert dataset_fingerprint(tmp_path) is None
    (tmp_path / "manifest.json").write_text("{not json")
    assert dataset_fingerprint(tmp_path) is None
    # ensure_dataset builds the default-size set when missing; stubbed here (~13 s).
    calls = []
    monkeypatch.setattr(dataset, "build_dataset", lambda r, **kw: calls.append((r, kw)))
    assert ensure_dataset(tmp_path, progress=False) == tmp_path / EMBEDDED_NAME
    assert calls == [(tmp_path, {"progress": False})]


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLAB_DATA", str(tmp_path))
    assert default_data_root() == tmp_path
    monkeypatch.delenv("PERFLAB_DATA")
    repo = Path(dataset.__file__).resolve().parents[2]
    expected = repo / "data" if (repo / "pyproject.toml").is_file() else \
        Path.home() / ".cache" / "perflab" / "data"
    assert default_data_root() == expected
