"""Input pipeline: an ImageFolder dataset, ImageNet-style transforms and the DataLoader.

The transforms are implemented on PIL + torch rather than imported from torchvision:
torchvision cannot be imported next to the CPU-only torch build used here, and one
implementation everywhere keeps measurements comparable between machines. They follow
torchvision's algorithms (RandomResizedCrop, horizontal flip, ToTensor, Normalize) and
draw randomness from torch's RNG, so DataLoader's per-worker seeding applies.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from perflab.core.config import TOKEN_MODELS, RunConfig
from perflab.core.paths import EMBEDDED_NAME
from perflab.data.augment import fallback_crop_size
from perflab.data.dataset import ensure_dataset

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "IMAGE_EXTENSIONS", "random_resized_crop",
           "center_crop_resize", "to_tensor", "normalize", "TrainTransform",
           "EvalTransform", "ImageFolderDataset", "make_loader", "infinite_batches"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def random_resized_crop(img: Image.Image, size: int, *,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3),
                        generator: torch.Generator | None = None) -> Image.Image:
    """Crop a random area and aspect ratio of ``img``, resize it to ``size x size`` pixels.

    The Inception-style augmentation (Szegedy et al. 2015, "Going deeper with
    convolutions"), with torchvision's ``RandomResizedCrop`` algorithm
    (https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomResizedCrop.html):
    up to 10 tries to draw an area fraction from ``scale`` and a log-uniform aspect ratio
    (w/h) from ``ratio`` that fit; else a centre crop with the ratio clamped to ``ratio``.
    Bilinear resampling with antialiasing (PIL). Randomness: torch's global RNG, or
    ``generator`` when given.
    """
    width, height = img.size
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1],
                                                     generator=generator).item()
        aspect = math.exp(torch.empty(1).uniform_(log_lo, log_hi, generator=generator).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            break
    else:  # fallback: centre crop, aspect ratio clamped into [ratio[0], ratio[1]]
        w, h = fallback_crop_size(width, height, ratio)
        top, left = (height - h) // 2, (width - w) // 2
    crop = img.crop((left, top, left + w, top + h))
    return crop.resize((size, size), Image.Resampling.BILINEAR)


def center_crop_resize(img: Image.Image, size: int) -> Image.Image:
    """Eval preprocessing: resize the short side to ``round(size * 256 / 224)`` pixels
    (bilinear), then take the central ``size x size`` crop."""
    width, height = img.size
    short = round(size * 256 / 224)
    if width <= height:
        new_w, new_h = short, max(short, round(height * short / width))
    else:
        new_w, new_h = max(short, round(width * short / height)), short
    img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = int(round((new_w - size) / 2)), int(round((new_h - size) / 2))
    return img.crop((left, top, left + size, top + size))


def to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image (W x H) -> float32 tensor ``(3, H, W)`` with values in [0, 1]."""
    arr = np.array(img.convert("RGB"), dtype=np.uint8)  # (H, W, 3), a writable copy
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255)  # (3, H, W)


def normalize(t: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """``(t - mean) / std`` per channel for ``(3, H, W)`` or ``(B, 3, H, W)``; new tensor."""
    m = torch.as_tensor(mean, dtype=t.dtype, device=t.device).view(-1, 1, 1)  # (3, 1, 1)
    s = torch.as_tensor(std, dtype=t.dtype, device=t.device).view(-1, 1, 1)
    return (t - m) / s


class TrainTransform:
    """PIL image -> normalised float32 ``(3, size, size)``: RandomResizedCrop, horizontal
    flip with p=0.5, to_tensor, ImageNet normalisation."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        img = random_resized_crop(img, self.size, generator=generator)
        if torch.rand(1, generator=generator).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return normalize(to_tensor(img))  # (3, size, size)

    def __repr__(self) -> str:
        return f"TrainTransform(size={self.size})"


class EvalTransform:
    """PIL image -> normalised float32 ``(3, size, size)``: resize + centre crop
    (:func:`center_crop_resize`), to_tensor, ImageNet normalisation. Deterministic."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return normalize(to_tensor(center_crop_resize(img, self.size)))  # (3, size, size)

    def __repr__(self) -> str:
        return f"EvalTransform(size={self.size})"


def _fix_hint(root: Path) -> str:
    if root.name == EMBEDDED_NAME:
        return "run `perflab data` to build the embedded set"
    return ("pass an ImageFolder root containing train/<class>/ (and val/<class>/) "
            "folders of .jpg/.png images")


def _check_image(path: str) -> str | None:
    """Why the file is not a readable image, or None. Cheap: header only, plus the JPEG
    end-of-image marker (FF D9) to catch truncated files."""
    try:
        with open(path, "rb") as f:
            with Image.open(f) as im:
                fmt = im.format
            if fmt == "JPEG":
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 32))
                if not f.read().rstrip(b"\0\r\n ").endswith(b"\xff\xd9"):
                    return "JPEG has no end-of-image marker (truncated file)"
    except OSError as e:  # includes PIL.UnidentifiedImageError
        return str(e) or type(e).__name__
    return None


#: path -> (bytes, mtime_ns) of files that passed _check_image in this process.
_VALID: dict[str, tuple[int, int]] = {}


def _checked(path: str) -> str | None:
    """:func:`_check_image`, remembered per process for files unchanged since (same size
    and modification time): a kernel that runs many experiments validates once."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    if _VALID.get(path) == stamp:
        return None
    why = _check_image(path)
    if why is None:
        _VALID[path] = stamp
    return why


class ImageFolderDataset(torch.utils.data.Dataset):
    """``root/split/<class>/*.{jpg,jpeg,png}`` as ``(image, label)`` samples.

    Classes are the sorted sub-folder names (hidden ones, like ``.ipynb_checkpoints``,
    skipped); labels are their indices. ``ds[i]`` -> (float32 tensor
    ``(3, image_size, image_size)``, int label), via :class:`TrainTransform` when
    ``train`` else :class:`EvalTransform`. All checks run here, before training starts;
    ``validate`` opens every file's header (about 0.2 ms per file; files unchanged
    since they last passed in this process are not opened again).
    ``storage_latency_s`` > 0 SIMULATES slow storage: every image read first sleeps that
    many seconds (releasing the CPU, like waiting on a network disk); validation does not.

    Raises:
        FileNotFoundError: ``root`` or ``root/split`` does not exist.
        ValueError: no class folders, a class folder without images, or (``validate``)
            an unreadable or truncated image. Messages name the path and the fix.
    """

    def __init__(self, root: str | os.PathLike[str], split: str = "train", *,
                 image_size: int = 64, train: bool = True, validate: bool = True,
                 storage_latency_s: float = 0.0) -> None:
        self.root = Path(root).expanduser()
        self.split = split
        folder = self.root / split
        if not self.root.is_dir():
            raise FileNotFoundError(f"dataset root {self.root} does not exist; "
                                    f"{_fix_hint(self.root)}")
        if not folder.is_dir():
            raise FileNotFoundError(f"split folder {folder} does not exist; "
                                    f"{_fix_hint(self.root)}")
        self.classes = sorted(d.name for d in folder.iterdir()
                              if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise ValueError(f"{folder} has no class folders; {_fix_hint(self.root)}")
        self.samples: list[tuple[str, int]] = []
        for label, cls in enumerate(self.classes):
            files = sorted(str(f) for f in (folder / cls).iterdir()
                           if f.suffix.lower() in IMAGE_EXTENSIONS
                           and not f.name.startswith(".") and f.is_file())
            if not files:
                raise ValueError(f"class folder {folder / cls} has no images "
                                 f"({'/'.join(IMAGE_EXTENSIONS)}); add images or remove "
                                 "the folder")
            self.samples += [(f, label) for f in files]
        if validate:
            bad = [(p, why) for p, _ in self.samples if (why := _checked(p))]
            if bad:
                listed = "; ".join(f"{p}: {why}" for p, why in bad[:5])
                raise ValueError(f"{len(bad)} unreadable image(s) in {folder}: {listed}"
                                 f"{' ...' if len(bad) > 5 else ''}. Delete or replace "
                                 "them (or pass validate=False to skip this check)")
        self.image_size = image_size
        self.storage_latency_s = float(storage_latency_s)
        self.transform = TrainTransform(image_size) if train else EvalTransform(image_size)

    def open_image(self, i: int) -> Image.Image:
        """Open sample ``i``'s file (header read, pixels not yet decoded), after the
        simulated storage latency, if any. Use as a context manager."""
        if self.storage_latency_s:
            time.sleep(self.storage_latency_s)  # simulated storage: waits, burns no CPU
        return Image.open(self.samples[i][0])

    def read_image(self, i: int) -> Image.Image:
        """Sample ``i`` decoded to an RGB PIL image (after :meth:`open_image`).

        Raises:
            ValueError: the file cannot be decoded (the message names it).
        """
        try:
            with self.open_image(i) as im:
                return im.convert("RGB")  # decodes here
        except OSError as e:
            raise ValueError(f"cannot decode image {self.samples[i][0]}: {e}; delete or "
                             "replace it") from e

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.read_image(i)), self.samples[i][1]  # (3, S, S), int

    def __repr__(self) -> str:
        return (f"ImageFolderDataset(root={str(self.root)!r}, split={self.split!r}, "
                f"samples={len(self)}, classes={len(self.classes)}, "
                f"transform={self.transform!r}"
                + (f", simulated storage latency {self.storage_latency_s * 1e3:g} ms/file"
                   if self.storage_latency_s else "") + ")")


def make_loader(config: RunConfig, *, split: str = "train") -> torch.utils.data.DataLoader:
    """DataLoader over ``config.dataset`` (None -> the embedded set, built if missing);
    for a token model ("gpt-tiny") over the byte corpus of :mod:`perflab.data.tokens`,
    batches (int64 ``(B, T)`` tokens, int64 ``(B, T)`` next tokens), T = ``seq_len``.

    Batches: (float32 ``(B, 3, S, S)``, int64 ``(B,)``) with B = ``config.batch_size``,
    S = ``config.image_size``; ``drop_last=True`` so every step has the same shape.
    ``train`` split: augmented and shuffled by a ``torch.Generator`` seeded with
    ``config.seed``. Worker seeding: at every epoch DataLoader draws a ``base_seed``
    from that generator and seeds torch, ``random`` and NumPy in worker ``i`` with
    ``base_seed + i`` (NumPy via a SeedSequence-style hash, PyTorch >= 1.9), so
    augmentations differ per worker and per epoch (persistent workers keep their
    streams going) and repeat exactly for the same ``config.seed`` and worker count;
    no ``worker_init_fn`` is needed. With num_workers=0, augmentation draws from torch's
    global RNG (seeded by :func:`perflab.train.step.build_training`). Other splits: eval
    transform, fixed order. ``storage_latency_ms``
    adds the simulated per-file read latency.

    With ``config.decoded_cache`` != "off" (train split), batches are the cached
    decoded but *not yet augmented* images instead: (uint8 ``(B, 3, S', S')``, int64
    ``(B,)``) with S' = :func:`perflab.data.cache.stored_size` (``image_size`` x 1.25); the
    augmentation runs batched on the device (:class:`perflab.data.prefetch.BatchStream`
    applies it). The cache is built on first use (see :func:`perflab.data.cache.get_cache`).

    Raises:
        FileNotFoundError, ValueError: see :class:`ImageFolderDataset`.
        ValueError: the split has fewer samples than batch_size, or its classes differ
            from ``train/``'s (labels would not match).
    """
    train = split == "train"
    if config.model in TOKEN_MODELS:
        return _token_loader(config, split)
    root = Path(config.dataset).expanduser() if config.dataset else ensure_dataset()
    dataset = ImageFolderDataset(root, split, image_size=config.image_size, train=train,
                                 storage_latency_s=config.storage_latency_ms / 1e3)
    if not train and (root / "train").is_dir():
        train_classes = sorted(d.name for d in (root / "train").iterdir()
                               if d.is_dir() and not d.name.startswith("."))
        if train_classes != dataset.classes:
            raise ValueError(f"{root / split} has classes {dataset.classes} but "
                             f"{root / 'train'} has {train_classes}; give both splits "
                             "the same class folders")
    if len(dataset) < config.batch_size:
        raise ValueError(f"{root / split} has {len(dataset)} samples, fewer than "
                         f"batch_size={config.batch_size} (drop_last=True would yield no "
                         "batch); lower batch_size or add images")
    generator = torch.Generator().manual_seed(config.seed)
    kwargs = _worker_kwargs(config)
    if train and config.decoded_cache != "off":
        from perflab.data.cache import cached_batches  # the cache imports this module

        batches = cached_batches(dataset, config.image_size, config.decoded_cache)
        # batch_size=None: the sampler yields whole index batches; one gather per batch.
        sampler = torch.utils.data.BatchSampler(
            torch.utils.data.RandomSampler(batches, generator=generator),
            config.batch_size, drop_last=True)
        return torch.utils.data.DataLoader(batches, batch_size=None, sampler=sampler,
                                           **kwargs)
    return torch.utils.data.DataLoader(
        dataset, batch_size=config.batch_size, shuffle=train, generator=generator,
        drop_last=True, **kwargs)


def _token_loader(config: RunConfig, split: str) -> torch.utils.data.DataLoader:
    """A token model's loader: :class:`perflab.data.tokens.TokenDataset` windows of
    ``config.seq_len`` tokens, batches (int64 ``(B, T)``, int64 ``(B, T)``), shuffled
    by a generator seeded with ``config.seed`` on the train split, ``drop_last``."""
    from perflab.data.tokens import TokenDataset

    dataset = TokenDataset(config.seq_len, split)
    if len(dataset) < config.batch_size:
        raise ValueError(f"the {split} split of the byte corpus has {len(dataset)} windows "
                         f"of seq_len={config.seq_len}, fewer than batch_size="
                         f"{config.batch_size}; lower batch_size or seq_len")
    return torch.utils.data.DataLoader(
        dataset, batch_size=config.batch_size, shuffle=split == "train",
        generator=torch.Generator().manual_seed(config.seed), drop_last=True,
        **_worker_kwargs(config))


def _worker_kwargs(config: RunConfig) -> dict[str, Any]:
    """DataLoader's worker options from ``config`` (prefetch_factor only when set)."""
    kwargs: dict[str, Any] = dict(num_workers=config.num_workers, pin_memory=config.pin_memory,
                                  persistent_workers=config.persistent_workers)
    if config.prefetch_factor is not None:
        kwargs["prefetch_factor"] = config.prefetch_factor
    return kwargs


def infinite_batches(loader: torch.utils.data.DataLoader) -> Iterator[Any]:
    """Yield ``loader``'s batches forever, starting a new epoch whenever one ends.

    A measurement's warm-up + measured steps may exceed one epoch (the quick preset's
    small dataset, or a large batch), and a run must not stop or special-case the epoch
    boundary. Raises ValueError if an epoch yields no batch (it would loop forever).
    """
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yielded no batch in a whole epoch; check that "
                             "the dataset has at least batch_size samples")

