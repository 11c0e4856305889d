"""Dataset, transforms and loader: shapes, dtypes, determinism and every raise."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from perflab.core.config import RunConfig
from perflab.data.loader import (
    IMAGENET_MEAN, IMAGENET_STD, EvalTransform, ImageFolderDataset, TrainTransform,
    center_crop_resize, infinite_batches, make_loader, normalize, random_resized_crop,
    to_tensor,
)
from perflab.core.paths import EMBEDDED_NAME
from perflab.data.dataset import build_dataset


@pytest.fixture(scope="module")
def patches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedded set: 10 classes x (3 train + 1 val) JPEGs."""
    root = tmp_path_factory.mktemp("data")
    build_dataset(root, train_per_class=3, val_per_class=1, processes=1, progress=False)
    return root / EMBEDDED_NAME


def photo(w: int = 40, h: int = 30, seed: int = 0) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    arr = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g)
    return Image.fromarray(arr.numpy(), "RGB")


def folder(tmp_path: Path, classes: dict[str, int]) -> Path:
    """An ImageFolder ``tmp_path/ds/train/<class>/`` with n JPEGs per class."""
    for cls, n in classes.items():
        (tmp_path / "ds" / "train" / cls).mkdir(parents=True)
        for i in range(n):
            photo(seed=i).save(tmp_path / "ds" / "train" / cls / f"{i}.JPG", "JPEG")
    return tmp_path / "ds"


# --- transforms -------------------------------------------------------------------------
def test_to_tensor_and_normalize():
    t = to_tensor(photo(40, 30))
    assert t.shape == (3, 30, 40) and t.dtype == torch.float32
    assert 0.0 <= t.min() and t.max() <= 1.0
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1).expand(3, 4, 5)
    assert torch.allclose(normalize(mean), torch.zeros(3, 4, 5), atol=1e-6)
    one = torch.ones(2, 3, 4, 4)  # batched input broadcasts too
    expected = (1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert torch.allclose(normalize(one)[1, :, 2, 2], expected)


def test_random_resized_crop_size_and_determinism():
    img = photo(60, 45)
    outs = [random_resized_crop(img, 24, generator=torch.Generator().manual_seed(7))
            for _ in range(2)]
    assert outs[0].size == (24, 24)
    assert outs[0].tobytes() == outs[1].tobytes()
    other = [random_resized_crop(img, 24, generator=torch.Generator().manual_seed(s))
             for s in range(8)]
    assert len({o.tobytes() for o in other}) > 1


def test_random_resized_crop_fallback_is_a_centre_crop():
    img = photo(400, 50)  # ratio 8: no crop with scale >= 0.9 and ratio <= 4/3 fits
    out = random_resized_crop(img, 16, scale=(0.9, 1.0),
                              generator=torch.Generator().manual_seed(0))
    # w = round(50 * 4/3) = 67, left = (400 - 67) // 2 = 166
    expected = img.crop((166, 0, 233, 50)).resize((16, 16), Image.Resampling.BILINEAR)
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("w, h", [(80, 50), (50, 80), (20, 20)])
def test_center_crop_resize(w, h):
    assert center_crop_resize(photo(w, h), 32).size == (32, 32)


def test_train_and_eval_transforms():
    img = photo(50, 40)
    g = torch.Generator().manual_seed(3)
    t = TrainTransform(32)(img, generator=g)
    assert t.shape == (3, 32, 32) and t.dtype == torch.float32
    e = EvalTransform(32)
    assert e(img).shape == (3, 32, 32) and torch.equal(e(img), e(img))
    assert repr(e) == "EvalTransform(size=32)" and repr(TrainTransform(8)) == \
        "TrainTransform(size=8)"


# --- ImageFolderDataset ---------------------------------------------------------------
def test_dataset_samples_and_items(patches):
    ds = ImageFolderDataset(patches, "train", image_size=32)
    assert len(ds) == 30 and len(ds.classes) == 10
    assert ds.samples[0][1] == 0 and ds.samples[-1][1] == 9
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)
    val = ImageFolderDataset(patches, "val", image_size=32, train=False)
    assert torch.equal(val[3][0], val[3][0])


def test_missing_root_of_embedded_set_says_perflab_data(tmp_path):
    root = tmp_path / EMBEDDED_NAME
    with pytest.raises(FileNotFoundError, match=re.escape(str(root)) + ".*perflab data"):
        ImageFolderDataset(root)


def test_missing_root_of_own_set_says_imagefolder(tmp_path):
    root = tmp_path / "mine"
    with pytest.raises(FileNotFoundError, match=re.escape(str(root)) + ".*train/<class>/"):
        ImageFolderDataset(root)


def test_missing_split(tmp_path):
    root = folder(tmp_path, {"a": 1})
    with pytest.raises(FileNotFoundError, match=re.escape(str(root / "val"))):
        ImageFolderDataset(root, "val")


def test_no_class_folders(tmp_path):
    (tmp_path / "ds" / "train" / ".ipynb_checkpoints").mkdir(parents=True)  # hidden: skipped
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "ds" / "train"))
                       + " has no class folders"):
        ImageFolderDataset(tmp_path / "ds")


def test_class_without_images(tmp_path):
    root = folder(tmp_path, {"a": 2, "b": 0})
    (root / "train" / "b" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=re.escape(str(root / "train" / "b")) + " has no images"):
        ImageFolderDataset(root)


def test_garbage_jpg(tmp_path):
    root = folder(tmp_path, {"a": 2})
    bad = root / "train" / "a" / "bad.jpg"
    bad.write_bytes(b"this is not a JPEG")
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        ImageFolderDataset(root)


def test_truncated_jpg_fails_validation_and_decoding(tmp_path):
    root = folder(tmp_path, {"a": 2})
    good = root / "train" / "a" / "0.JPG"
    bad = root / "train" / "a" / "cut.jpg"
    bad.write_bytes(good.read_bytes()[:-200])
    with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*truncated"):
        ImageFolderDataset(root)
    ds = ImageFolderDataset(root, validate=False)
    i = [p for p, _ in ds.samples].index(str(bad))
    with pytest.raises(ValueError, match="cannot decode image " + re.escape(str(bad))):
        ds[i]


# --- loader ---------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_make_loader_batches(patches, workers):
    cfg = RunConfig(dataset=str(patches), image_size=32, batch_size=4, num_workers=workers)
    x, y = next(iter(make_loader(cfg)))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (4,) and y.dtype == torch.int64
    val = make_loader(cfg, split="val")
    assert len(val) == 10 // 4  # drop_last
    assert not val.dataset.transform.__class__.__name__.startswith("Train")


def test_shuffle_is_seeded(patches):
    cfg = RunConfig(dataset=str(patches), image_size=16, batch_size=6)
    first = [torch.cat([y for _, y in make_loader(cfg)]) for _ in range(2)]
    assert torch.equal(first[0], first[1])
    other = torch.cat([y for _, y in make_loader(cfg.replace(seed=1))])
    assert not torch.equal(first[0], other)


def test_fewer_samples_than_batch_size_raises(patches):
    cfg = RunConfig(dataset=str(patches), batch_size=11)
    with pytest.raises(ValueError, match=re.escape(str(patches / "val")) + " has 10 samples"):
        make_loader(cfg, split="val")


def test_val_classes_must_match_train(tmp_path):
    root = folder(tmp_path, {"a": 2, "b": 2})
    (root / "val" / "a").mkdir(parents=True)
    photo().save(root / "val" / "a" / "0.png")
    photo().save(root / "val" / "a" / "1.png")
    cfg = RunConfig(dataset=str(root), batch_size=2)
    with pytest.raises(ValueError, match="same class folders"):
        make_loader(cfg, split="val")


def test_infinite_batches_crosses_epochs(patches):
    loader = make_loader(RunConfig(dataset=str(patches), image_size=16, batch_size=8))
    assert len(loader) == 3
    batches = infinite_batches(loader)
    assert all(next(batches)[0].shape == (8, 3, 16, 16) for _ in range(7))


def test_infinite_batches_refuses_an_empty_loader():
    with pytest.raises(ValueError, match="no batch"):
        next(infinite_batches(torch.utils.data.DataLoader([])))


def test_simulated_storage_latency_sleeps_per_file(patches):
    from perflab.core.timing import Stopwatch

    ds = ImageFolderDataset(patches, "train", image_size=16, storage_latency_s=0.02)
    assert "simulated storage latency 20 ms/file" in repr(ds)
    with Stopwatch() as sw:
        ds[0]
    assert sw.elapsed_s >= 0.02
    cfg = RunConfig(dataset=str(patches), image_size=16, batch_size=2, storage_latency_ms=3)
    assert make_loader(cfg).dataset.storage_latency_s == pytest.approx(0.003)


def test_validation_is_remembered_until_a_file_changes(tmp_path):
    root = folder(tmp_path, {"a": 2})
    ImageFolderDataset(root)  # passes and is remembered
    path = root / "train" / "a" / "0.JPG"
    path.write_bytes(path.read_bytes()[:-200])  # changed size: checked again
    with pytest.raises(ValueError, match="truncated"):
        ImageFolderDataset(root)


def test_cached_loader(patches, tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLAB_DATA", str(tmp_path))
    cfg = RunConfig(dataset=str(patches), image_size=16, batch_size=4, num_workers=1)
    cached = make_loader(cfg.replace(decoded_cache="memory"))
    x, y = next(iter(cached))
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 20, 20) and y.shape == (4,)
    val = make_loader(cfg.replace(decoded_cache="memory"), split="val")  # no cache for eval
    assert val.dataset.__class__.__name__ == "ImageFolderDataset"


# -- the byte corpus of gpt-tiny -----------------------------------------------------------
def test_token_dataset_is_next_byte_prediction_over_perflab_docs():
    from perflab.data.tokens import TRAIN_FRACTION, TokenDataset, corpus, fingerprint
    text = corpus()
    assert len(text) > 100_000 and text.decode("utf-8").startswith("perflab")
    assert len(fingerprint()) == 16
    train, val = TokenDataset(64, "train"), TokenDataset(64, "val")
    x, y = train[3]
    assert x.shape == y.shape == (64,) and x.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])                         # y is x shifted by one
    assert bytes(x.tolist()) == text[3 * 64: 4 * 64]
    assert len(train) == (int(len(text) * TRAIN_FRACTION) - 1) // 64
    assert bytes(val[0][0].tolist()) == text[int(len(text) * TRAIN_FRACTION):][:64]
    assert len(train.classes) == 256
    with pytest.raises(ValueError, match="seq_len"):
        TokenDataset(1)
    with pytest.raises(ValueError, match="split"):
        TokenDataset(8, "test")
    with pytest.raises(IndexError):
        train[len(train)]


def test_gpt_loader_and_config_rules():
    from perflab import RunConfig
    from perflab.data.loader import make_loader
    c = RunConfig(model="gpt-tiny", batch_size=4, seq_len=32)
    x, y = next(iter(make_loader(c)))
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    for bad, msg in ((dict(channels_last=True), "channels_last: for image models only"),
                     (dict(decoded_cache="memory"), "decoded_cache"),
                     (dict(seq_len=300), "seq_len must be an int in 2..256"),
                     (dict(checkpointing=5), "gpt-tiny has 4 stages")):
        with pytest.raises(ValueError, match=msg):
            RunConfig(model="gpt-tiny", **bad)


def test_gpt_run_reports_tokens_per_s():
    from perflab import RunConfig, run
    r = run(RunConfig(model="gpt-tiny", batch_size=2, seq_len=16, steps=2, warmup_steps=0),
            progress=False, save=False)
    assert r.tokens_per_s == pytest.approx(r.samples_per_s * 16)
    assert "tokens/s" in repr(r) and len(r.losses) == 2
    assert r.losses[0] == pytest.approx(5.545, abs=0.15)     # ln(256): random weights
