"""Lab 02's library: decoded cache, batched augmentation, prefetcher, worker seeding,
loader sweep and tuner, pipeline efficiency."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import requires_cuda
from perflab.data.augment import crop_boxes, random_resized_crop_batch, resized_crop_batch
from perflab.data.cache import cache_dir, decode_stored, get_cache, stored_size
from perflab.core.config import RunConfig
from perflab.data.loader import ImageFolderDataset, make_loader
from perflab.analysis.loader_tuning import default_worker_counts, sweep_loader, tune_loader
from perflab.data.prefetch import BatchStream, DevicePrefetcher, pipeline_efficiency
from tests.synthetic import synthetic_result

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def normalised(u8: torch.Tensor) -> torch.Tensor:
    return (u8.float() / 255 - MEAN) / STD


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """mmap caches go to a temporary data root."""
    monkeypatch.setenv("PERFLAB_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


# --- prefetcher -------------------------------------------------------------------------
def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, 3, 4, 4), float(i)), torch.tensor([i, i])) for i in range(n)]


@pytest.mark.parametrize("side_stream", [True, False])
def test_prefetcher_keeps_order_on_cpu(side_stream):
    pf = DevicePrefetcher(batches(5), "cpu", side_stream=side_stream,
                          prepare=lambda x, y: (x + 0.5, y))
    assert not pf.overlaps  # nothing to overlap on a CPU: a pass-through
    got = [(float(x[0, 0, 0, 0]), int(y[0])) for x, y in pf]
    assert got == [(i + 0.5, i) for i in range(5)]
    with pytest.raises(StopIteration):
        next(pf)


@requires_cuda
def test_prefetcher_keeps_order_on_cuda():
    host = [(x.pin_memory(), y.pin_memory()) for x, y in batches(6)]
    pf = DevicePrefetcher(host, "cuda", non_blocking=True, prepare=lambda x, y: (x * 2, y))
    assert pf.overlaps
    out = []
    for x, y in pf:
        assert x.is_cuda and y.is_cuda
        out.append((x * 1).sum().item() / x.numel())  # compute on the current stream
    assert out == [2.0 * i for i in range(6)]


# --- decoded cache ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["memory", "mmap"])
def test_cache_equals_decoded_images(tiny_dataset, data_root, mode):
    ds = ImageFolderDataset(tiny_dataset, "train", image_size=16)
    cache = get_cache(ds, 20, mode)
    assert cache.images.shape == (len(ds), 3, 20, 20) and cache.images.dtype == np.uint8
    assert cache.build_s > 0 and list(cache.labels) == [label for _, label in ds.samples]
    for i in (0, len(ds) // 2, len(ds) - 1):
        with Image.open(ds.samples[i][0]) as im:
            assert np.array_equal(cache.images[i], decode_stored(im, 20))
    again = get_cache(ds, 20, mode)
    assert again.build_s == 0.0 and np.array_equal(again.images, cache.images)
    if mode == "mmap":
        assert cache.path and cache.path.startswith(str(cache_dir()))
        assert cache_dir().is_relative_to(data_root) and list(cache_dir().glob("*.npy"))
        assert not list(cache_dir().glob(".*tmp"))  # written atomically


def test_decode_stored_is_the_image_resized():
    arr = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    img = Image.fromarray(arr)
    out = decode_stored(img, 30)  # centre 30x30 square at its own size: unchanged
    assert out.shape == (3, 30, 30) and np.array_equal(out, arr[:, 5:35].transpose(2, 0, 1))
    assert stored_size(64) == 80 and stored_size(224) == 280


def test_cache_rejects_bad_arguments(tiny_dataset):
    ds = ImageFolderDataset(tiny_dataset, "train", image_size=16)
    with pytest.raises(ValueError, match="mode must be 'memory' or 'mmap'"):
        get_cache(ds, 20, "disk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size must be >= 1"):
        get_cache(ds, 0)


def test_cached_loader_yields_uint8_batches(tiny_dataset, data_root):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4,
                    decoded_cache="mmap", num_workers=1)
    x, y = next(iter(make_loader(cfg)))  # a worker reopens the memmap
    assert x.shape == (4, 3, 20, 20) and x.dtype == torch.uint8 and y.dtype == torch.int64


# --- batched augmentation -----------------------------------------------------------------
def test_full_box_is_the_identity():
    img = torch.randint(0, 256, (3, 3, 12, 12), dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, 12, 12]] * 3)
    out = resized_crop_batch(img, boxes, 12)
    assert out.dtype == torch.float32 and out.shape == (3, 3, 12, 12)
    assert torch.allclose(out, normalised(img), atol=1e-4)


def test_box_and_flip_select_the_right_pixels():
    img = torch.randint(0, 256, (2, 3, 20, 16), dtype=torch.uint8)
    boxes = torch.tensor([[3, 5, 8, 8], [10, 0, 8, 8]])  # (top, left, h, w), no resize
    out = resized_crop_batch(img, boxes, 8, flip=torch.tensor([False, True]))
    assert torch.allclose(out[0], normalised(img[0:1, :, 3:11, 5:13])[0], atol=1e-4)
    assert torch.allclose(out[1], normalised(img[1:2, :, 10:18, 0:8]).flip(-1)[0], atol=1e-4)


def test_crop_boxes_fit_and_repeat_with_the_seed():
    b1 = crop_boxes(64, 30, 40, generator=torch.Generator().manual_seed(0))
    b2 = crop_boxes(64, 30, 40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(b1, b2) and b1.dtype == torch.int64
    top, left, h, w = b1.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= 30).all() and (left + w <= 40).all()
    assert len({tuple(b) for b in b1.tolist()}) > 32  # random boxes
    # no try fits (ratio 8 image, scale >= 0.9): centre crop with the ratio clamped
    fb = crop_boxes(4, 50, 400, scale=(0.9, 1.0), generator=torch.Generator().manual_seed(0))
    assert fb.tolist() == [[0, 166, 50, 67]] * 4


def test_random_resized_crop_batch_shapes():
    img = torch.randint(0, 256, (5, 3, 20, 20), dtype=torch.uint8)
    out = random_resized_crop_batch(img, 16, generator=torch.Generator().manual_seed(1))
    assert out.shape == (5, 3, 16, 16) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


# --- worker seeding -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def same_photo(tmp_path_factory) -> str:
    """An ImageFolder whose 8 images are one photo: equal crops mean a repeated RNG."""
    root = tmp_path_factory.mktemp("same")
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 48, 3), np.uint8))
    for cls in ("a", "b"):
        (root / "train" / cls).mkdir(parents=True)
        for i in range(4):
            img.save(root / "train" / cls / f"{i}.png")
    return str(root)


def epochs(cfg: RunConfig, n: int = 2) -> list[torch.Tensor]:
    loader = make_loader(cfg)
    return [torch.cat([x for x, _ in loader]) for _ in range(n)]


@pytest.mark.parametrize("persistent", [False, True])
def test_augmentations_differ_per_worker_and_epoch_and_repeat(same_photo, persistent):
    cfg = RunConfig(model="tiny", dataset=same_photo, image_size=16, batch_size=2,
                    num_workers=2, persistent_workers=persistent)
    first = epochs(cfg)
    crops = torch.cat(first).flatten(1)  # 16 crops of one photo, 2 epochs x 2 workers
    assert len({tuple(c.tolist()) for c in crops}) == 16
    again = epochs(cfg)  # same seed, same workers: the same augmentations
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = epochs(cfg.replace(seed=1), n=1)[0]
    assert not torch.equal(first[0], other)


# --- batch stream ---------------------------------------------------------------------------
def test_compute_only_reuses_one_batch(tiny_dataset):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4,
                    compute_only=True)
    with BatchStream(make_loader(cfg), cfg, "cpu") as stream:
        a, b = next(stream), next(stream)
    assert a[0] is b[0] and a[1] is b[1]


def test_cached_stream_augments_to_float(tiny_dataset, data_root):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4,
                    decoded_cache="memory", channels_last=True)
    with BatchStream(make_loader(cfg), cfg, "cpu") as stream:
        xs = [next(stream)[0] for _ in range(3)]
    assert all(x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 for x in xs)
    assert xs[0].is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(xs[0], xs[1])


# --- efficiency, sweep and tuner ------------------------------------------------------------
def test_pipeline_efficiency_decides_by_test():
    base = RunConfig(model="tiny")
    bound = synthetic_result(base.replace(compute_only=True), {"data": 0.1, "forward": 100},
                             n=20)
    close = synthetic_result(base, {"data": 1.0, "forward": 100}, n=20)
    far = synthetic_result(base.replace(num_workers=1), {"data": 30.0, "forward": 100}, n=20)
    e = pipeline_efficiency(close, bound)
    assert e.efficiency == pytest.approx(100.1 / 101, rel=1e-3)
    assert e.exceeds_target and e.reaches_target and not e.falls_short
    assert e.ci95[0] <= e.efficiency <= e.ci95[1]
    assert "significantly above 95% of the compute-only bound" in e.verdict
    f = pipeline_efficiency(far, bound)
    assert f.falls_short and not f.reaches_target and "falls significantly short" in f.verdict
    # at exactly the target, neither test decides: the benefit of the doubt
    level = synthetic_result(base, {"data": 0.1 / 0.99, "forward": 100 / 0.99}, n=20)
    t = pipeline_efficiency(level, bound, target=0.99)
    assert t.reaches_target and not t.exceeds_target and "not significantly different" \
        in t.verdict


def test_pipeline_efficiency_raises():
    base = RunConfig(model="tiny")
    r = synthetic_result(base, {"forward": 1.0})
    with pytest.raises(ValueError, match="not a compute-only run"):
        pipeline_efficiency(r, r)
    other = synthetic_result(base.replace(compute_only=True, batch_size=8), {"forward": 1.0})
    with pytest.raises(ValueError, match=r"differ in \['batch_size'\]"):
        pipeline_efficiency(r, other)
    with pytest.raises(ValueError, match="target and alpha must be in"):
        pipeline_efficiency(r, synthetic_result(base.replace(compute_only=True),
                                                {"forward": 1.0}), target=1.5)


def test_default_worker_counts():
    assert default_worker_counts(2) == [0, 1, 2]
    assert default_worker_counts(16) == [0, 1, 2, 4, 8, 16]
    assert default_worker_counts(12) == [0, 1, 2, 4, 8, 12]


def test_sweep_table_columns(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4,
                    steps=2, warmup_steps=0)
    sweep = sweep_loader(cfg, num_workers=[0, 1], persistent_workers=[False, True],
                         progress=False)
    t = sweep.table
    assert list(t.columns) == [
        "label", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
        "samples_per_s", "samples_per_s_ci_low", "samples_per_s_ci_high", "step_ms",
        "data_wait_pct", "efficiency_pct", "efficiency_ci_low_pct",
        "efficiency_ci_high_pct", "worker_startup_s", "first_batch_s", "noisy"]
    # 0 workers cannot persist: three distinct settings, not four
    assert t[["num_workers", "persistent_workers"]].values.tolist() == [
        [0, False], [1, False], [1, True]]
    assert sweep.bound.config.compute_only and (t["first_batch_s"] > 0).all()
    assert (t["efficiency_pct"] > 0).all() and len(sweep.results) == 3
    assert sweep.best["samples_per_s"] == t["samples_per_s"].max()
    fig = sweep.plot()
    assert len(fig.axes) == 2 and "<table" in sweep._repr_html_()


def test_sweep_rejects_empty_axis_and_cuda_only_settings(tiny_dataset, monkeypatch):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4)
    with pytest.raises(ValueError, match="num_workers: empty list"):
        sweep_loader(cfg, num_workers=[])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="pin_memory=True needs a CUDA device"):
        sweep_loader(cfg, pin_memory=[True])


def test_tune_loader_measures_and_chooses(tiny_dataset, results_dir):
    cfg = RunConfig(model="tiny", dataset=tiny_dataset, image_size=16, batch_size=4)
    tuned = tune_loader(cfg, budget_s=0.01, steps=2, warmup_steps=0)
    assert len(tuned.table) == 1  # the budget allows the first candidate only
    assert tuned.settings["num_workers"] == 0 and tuned.table["chosen"].tolist() == [True]
    assert tuned.config.num_workers == 0 and "samples/s" in tuned.reason
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        tune_loader(cfg, budget_s=0)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        tune_loader(cfg, steps=1)
