"""A decoded-image cache and the augmentation that runs batched on the device.

Decoding a JPEG costs far more than training needs from it at a small crop size. The
fix the fastest training scripts use (airbench keeps CIFAR-10 decoded on the GPU; DALI
and FFCV decode once into a compact format) is: decode every image **once** into a
uint8 array ``(N, 3, S, S)`` at a stored side ``S`` a little larger than the crop
(:func:`stored_size`, 1.25 x), then run the random augmentation on whole batches with
tensor ops on the device (:func:`perflab.data.augment.random_resized_crop_batch`,
re-exported here). A loader then only
gathers rows of the array; the host never decodes again.

Two homes for the array (``RunConfig.decoded_cache``):

* ``"memory"``: a process-wide NumPy array, built on first use and kept for later runs;
* ``"mmap"``: a ``.npy`` file under ``<data root>/decoded-cache/`` opened with
  ``np.load(mmap_mode="r")``, so it is built once per dataset and size and shared by
  processes and kernel restarts (the OS page cache keeps it in RAM).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset
from PIL import Image

from perflab.core.paths import default_data_root
from perflab.core.storage import FileLock, require_free_bytes, write_atomic
from perflab.core.timing import Stopwatch


__all__ = ["STORED_SCALE", "stored_size", "decode_stored", "DecodedCache", "get_cache",
           "CachedBatches", "cached_batches", "cache_dir"]

#: Stored side / crop side. Larger keeps more detail for small random crops but costs
#: memory quadratically; 1.25 also bounds the batched resize's downscale (no antialias).
STORED_SCALE = 1.25
FORMAT_VERSION = 1
_MEMORY: "OrderedDict[str, DecodedCache]" = OrderedDict()  # process-wide "memory" caches
_MEMORY_KEEP = 2


def stored_size(image_size: int) -> int:
    """Side ``S`` in pixels of the cached images for crops of ``image_size`` pixels."""
    return int(round(image_size * STORED_SCALE))


def decode_stored(img: Image.Image, size: int) -> np.ndarray:
    """One image as the cache stores it: uint8 ``(3, size, size)``.

    The centre square (side = the short side) is resized to ``size x size`` (bilinear,
    antialiased, in one ``Image.resize`` with a box). For JPEGs, ``Image.draft`` first lets libjpeg decode
    at 1/2, 1/4 or 1/8 scale (DCT scaling) when the result is still >= ``size``: the
    same picture for ~2x less decode time. ``img`` must be freshly opened (not loaded).
    """
    img.draft("RGB", (size, size))  # no-op for non-JPEGs; never goes below (size, size)
    img = img.convert("RGB")
    w, h = img.size
    short = min(w, h)
    box = ((w - short) / 2, (h - short) / 2, (w + short) / 2, (h + short) / 2)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy()  # (3, S, S)


def cache_dir() -> Path:
    """Where ``"mmap"`` caches live: ``<default_data_root()>/decoded-cache``."""
    return default_data_root() / "decoded-cache"


def _key(dataset: Dataset, size: int) -> str:
    """Content key: format, size, and every file's path, byte size and mtime."""
    h = hashlib.sha256(f"v{FORMAT_VERSION} size={size} root={dataset.root.resolve()} "
                       f"split={dataset.split}".encode())
    for path, label in dataset.samples:
        st = os.stat(path)
        h.update(f"{path}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class DecodedCache:
    """Decoded training images and their labels.

    Attributes:
        images: uint8 ``(N, 3, S, S)`` (a NumPy array, or a read-only memmap).
        labels: int64 ``(N,)`` class indices.
        classes: class names (index = label).
        size: S, the stored side in pixels.
        mode: "memory" or "mmap".
        path: the ``.npy`` file of an ``"mmap"`` cache, else None.
        build_s: seconds spent decoding and writing it in this call; 0.0 when it was
            already in memory or on disk.
    """

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    size: int
    mode: str
    path: str | None
    build_s: float

    @property
    def nbytes(self) -> int:
        """Bytes of the image array."""
        return int(self.images.nbytes)

    def __repr__(self) -> str:
        where = f"file {self.path}" if self.path else "in memory"
        built = f"built in {self.build_s:.1f} s" if self.build_s else "reused"
        return (f"DecodedCache({len(self.labels)} images, uint8 (N, 3, {self.size}, "
                f"{self.size}), {self.nbytes / 2**20:.0f} MiB {where}, {built})")


def _decode_all(dataset: Dataset, size: int, out: np.ndarray,
                threads: int | None) -> None:
    """Fill ``out[i]`` with sample i, reading files on a thread pool. PIL's decoder and
    resize release the GIL, and so does the simulated storage sleep, so threads overlap
    file waits (and decode on several cores) without extra processes."""
    def one(i: int) -> None:
        try:
            with dataset.open_image(i) as im:  # sleeps first if storage is simulated slow
                out[i] = decode_stored(im, size)
        except OSError as e:
            raise ValueError(f"cannot decode image {dataset.samples[i][0]}: {e}; "
                             "delete or replace it") from e

    n_threads = threads or (16 if dataset.storage_latency_s else os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        list(pool.map(one, range(len(dataset.samples))))


def get_cache(dataset: Dataset, size: int,
              mode: Literal["memory", "mmap"] = "memory", *,
              threads: int | None = None) -> DecodedCache:
    """The decoded cache of ``dataset`` at stored side ``size``, built if missing.

    "memory" caches are kept per process (the two most recent); "mmap" caches are
    ``.npy`` files under :func:`cache_dir`, named by a key over every file's path, size
    and modification time, written to a temporary name and renamed, so a half-written
    cache is never used. Building reads every file once (with the dataset's simulated
    storage latency, if any), ``threads`` at a time (default: 16 with simulated latency,
    else the CPU count).

    Raises:
        ValueError: unknown ``mode``, ``size`` < 1, or an image that cannot be decoded.
    """
    if mode not in ("memory", "mmap"):
        raise ValueError(f"mode must be 'memory' or 'mmap', got {mode!r}")
    if size < 1:
        raise ValueError(f"size must be >= 1 pixel, got {size}")
    key = f"{_key(dataset, size)}-{mode}"
    if key in _MEMORY:
        _MEMORY.move_to_end(key)
        return _reused(_MEMORY[key])
    n = len(dataset.samples)
    labels = np.array([label for _, label in dataset.samples], dtype=np.int64)
    classes = tuple(dataset.classes)
    sw = Stopwatch().start()
    if mode == "memory":
        images = np.empty((n, 3, size, size), dtype=np.uint8)
        _decode_all(dataset, size, images, threads)
        cache = DecodedCache(images, labels, classes, size, mode, None, sw.elapsed_s)
    else:
        folder = cache_dir()
        path = folder / f"{dataset.root.name}-{dataset.split}-{size}px-{key}.npy"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            # One builder per cache file; a second waits, then finds it built.
            with FileLock(path.with_name(f".{path.name}.lock")):
                build_s = 0.0
                if not path.is_file():
                    _build_mmap(dataset, path, (n, 3, size, size), threads, classes)
                    build_s = sw.elapsed_s
        else:
            build_s = 0.0
        images = np.load(path, mmap_mode="r")
        if images.shape != (n, 3, size, size):  # cannot happen with a matching key
            raise ValueError(f"{path} has shape {images.shape}, expected "
                             f"{(n, 3, size, size)}; delete it to rebuild")
        cache = DecodedCache(images, labels, classes, size, mode, str(path), build_s)
    _MEMORY[key] = cache
    while len(_MEMORY) > _MEMORY_KEEP:
        _MEMORY.popitem(last=False)
    return cache


def _build_mmap(dataset: Dataset, path: Path, shape: tuple[int, int, int, int],
                threads: int | None, classes: tuple[str, ...]) -> None:
    """Decode into a temp ``.npy`` beside ``path``, then rename it into place.

    The file's blocks are reserved first (``posix_fallocate``): a full disk then fails
    here with a clear ``ValueError`` instead of killing the process with SIGBUS when a
    page of the memory map cannot be written back.
    """
    nbytes = int(np.prod(shape))
    require_free_bytes(path.parent, nbytes, what="the decoded cache (decoded_cache='mmap')",
                       field="PERFLAB_DATA, or use decoded_cache='memory'")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        if hasattr(os, "posix_fallocate"):
            fd = os.open(tmp, os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
            except OSError as e:
                raise ValueError(f"cannot reserve {nbytes / 2**20:,.0f} MiB for the decoded "
                                 f"cache in {path.parent} ({e.strerror}): free disk space "
                                 "or use decoded_cache='memory'") from e
            finally:
                os.close(fd)
        _decode_all(dataset, shape[-1], arr, threads)
        arr.flush()
        del arr
        os.replace(tmp, path)
        write_atomic(path.with_suffix(".json"), json.dumps(
            {"root": str(dataset.root), "split": dataset.split, "size": shape[-1],
             "images": shape[0], "classes": list(classes)}, indent=1))
    finally:
        tmp.unlink(missing_ok=True)


def _reused(cache: DecodedCache) -> DecodedCache:
    return DecodedCache(cache.images, cache.labels, cache.classes, cache.size, cache.mode,
                        cache.path, 0.0)


class CachedBatches(torch.utils.data.Dataset):
    """A :class:`DecodedCache` indexed by *lists* of sample indices (one gather per batch).

    ``ds[[i, j, ...]]`` -> (uint8 ``(B, 3, S, S)``, int64 ``(B,)``) CPU tensors. Use with
    ``DataLoader(ds, batch_size=None, sampler=BatchSampler(...))``. A memmap is reopened
    lazily in each process (worker processes do not pickle the array).
    """

    def __init__(self, cache: DecodedCache) -> None:
        self.cache = cache
        self.classes = list(cache.classes)
        self.size = cache.size
        self._images: np.ndarray | None = cache.images

    def __len__(self) -> int:
        return len(self.cache.labels)

    def __getitem__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self._images is None:
            self._images = np.load(self.cache.path, mmap_mode="r")
        idx = np.asarray(indices, dtype=np.int64)
        return (torch.from_numpy(np.ascontiguousarray(self._images[idx])),  # (B,3,S,S) u8
                torch.from_numpy(self.cache.labels[idx]))                    # (B,) int64

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.cache.path is not None:  # a memmap: reopen in the other process
            state["_images"] = None
            state["cache"] = DecodedCache(np.empty((0, 3, 1, 1), np.uint8),
                                          self.cache.labels, self.cache.classes,
                                          self.cache.size, self.cache.mode,
                                          self.cache.path, self.cache.build_s)
        return state

    def __repr__(self) -> str:
        return f"CachedBatches({self.cache!r})"


def cached_batches(dataset: Dataset, image_size: int,
                   mode: Literal["memory", "mmap"]) -> CachedBatches:
    """:class:`CachedBatches` over ``dataset``'s cache for crops of ``image_size``."""
    return CachedBatches(get_cache(dataset, stored_size(image_size), mode))
