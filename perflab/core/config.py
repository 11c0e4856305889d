"""``RunConfig``: every knob a lab turns, validated before any work starts.

One frozen, keyword-only dataclass (after torchtitan's job config and nanoGPT's
``GPTConfig``). Variants are made with :func:`dataclasses.replace` or
:meth:`RunConfig.preset`; every invalid value raises ``ValueError`` naming the field and
the fix. Later labs add fields here (amp, channels_last, checkpointing, compile,
world_size, ...), each with a default that means "off".
"""
from __future__ import annotations

import contextvars
import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from perflab.core.config_checks import COMM_HOOKS, MAX_WORLD_SIZE, check_distributed  # noqa: F401
from perflab.core.devices import DEVICES, check_device_support, resolve_device
from perflab.core.simulated import SimulatedLink, Straggler

__all__ = ["RunConfig", "PRESETS", "MODELS", "CACHE_MODES", "COMM_HOOKS"]

MODELS = ("resnet18", "gpt-tiny", "tiny")
#: Models that read token sequences, not images.
TOKEN_MODELS = ("gpt-tiny",)
#: Longest sequence of a token model (perflab.models.GPT_TINY's max_seq_len).
MAX_SEQ_LEN = 256
AMP_MODES = ("off", "bf16", "fp16")
CACHE_MODES = ("off", "memory", "mmap")
#: Largest simulated per-file storage latency accepted (ms): beyond it a run crawls.
MAX_STORAGE_LATENCY_MS = 1000.0
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune",
                 "max-autotune-no-cudagraphs")
#: Upper bounds: beyond them a value is almost surely a typo (``batch_size=32000``) that
#: would start allocating gigabytes before failing; each error names the bound.
MAX_IMAGE_SIZE = 1024
MAX_BATCH_SIZE = 4096
MAX_STEPS = 100_000
MAX_WORKERS = 64
MAX_THREADS = 1024
MAX_LR = 100.0


#: True while :meth:`RunConfig.from_dict` rebuilds a saved config (no machine checks).
_RESTORING: contextvars.ContextVar[bool] = contextvars.ContextVar("_RESTORING", default=False)

def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _real(v: Any) -> bool:
    """A finite int or float, not a bool (``True`` is an int in Python)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One experiment. Every field has a default; ``None`` means "off / library default"."""

    label: str = ""
    """Name shown in tables and plots; empty -> derived from the fields that differ from
    the defaults (see :meth:`display_label`)."""

    device: str = "auto"
    """"auto" (CUDA, then MPS, then CPU), "cpu", "cuda", "cuda:N" or "mps"."""

    model: Literal["resnet18", "gpt-tiny", "tiny"] = "resnet18"
    """"resnet18" (torchvision-compatible ImageNet ResNet-18), "gpt-tiny" (a small GPT on
    byte tokens, :data:`perflab.models.GPT_TINY`) or "tiny" (tests)."""

    dataset: str | None = None
    """Path to an ImageFolder root containing ``train/`` (and ``val/``) with one folder
    per class. None -> the embedded photo-patches set, built on first use (for
    "gpt-tiny": perflab's own docstrings as bytes, :mod:`perflab.data.tokens`)."""

    seq_len: int = 128
    """Tokens per sample of a token model ("gpt-tiny"), 2..256; unused by image models."""

    image_size: int = 64
    """Training crop side in pixels (RandomResizedCrop output), >= 16."""

    batch_size: int = 32
    """Samples per step, >= 2 (BatchNorm needs more than one value per channel)."""

    steps: int = 20
    """Measured steps (>= 2), after the warm-up steps."""

    warmup_steps: int = 3
    """Steps run first and excluded from statistics (>= 0; 0 = keep all)."""

    lr: float = 0.05
    """SGD learning rate (momentum 0.9), > 0."""

    num_workers: int = 0
    """DataLoader worker processes; 0 = load in the main process (off)."""

    pin_memory: bool = False
    """Page-locked host batches for faster, asynchronous host-to-GPU copies (CUDA only)."""

    persistent_workers: bool = False
    """Keep workers alive between epochs (needs num_workers > 0)."""

    prefetch_factor: int | None = None
    """Batches each worker loads ahead (needs num_workers > 0); None = PyTorch's default (2)."""

    threads: int | None = None
    """Intra-op CPU threads (``torch.set_num_threads``) during the run; None = leave as is."""

    seed: int = 0
    """Seeds model init, shuffling and augmentation."""

    amp: Literal["off", "bf16", "fp16"] = "off"
    """Mixed precision with ``torch.autocast``: "bf16", or "fp16" with
    ``torch.amp.GradScaler`` (CUDA only); "off" = fp32."""

    channels_last: bool = False
    """NHWC memory format for the model and its inputs (``torch.channels_last``)."""

    checkpointing: str | int = "none"
    """Activation checkpointing (``use_reentrant=False``): "none", "per_stage" (the stem
    and each ResNet layer group) or an int N of segments (``checkpoint_sequential``)."""

    compile: Literal["off", "default", "reduce-overhead", "max-autotune",
                     "max-autotune-no-cudagraphs"] = "off"
    """``torch.compile`` mode; "off" = eager."""

    storage_latency_ms: float = 0.0
    """SIMULATED slow storage: milliseconds slept before every image file read (a network
    disk's latency, sleeping, not burning CPU), 0..1000; 0 = off (the local disk as is).
    Shown as "simulated storage +N ms/file" in labels."""

    decoded_cache: Literal["off", "memory", "mmap"] = "off"
    """Decode every training image once into a uint8 (N, 3, S, S) cache (S =
    :func:`perflab.data.cache.stored_size`) and apply the augmentations batched in torch on
    the device: "memory" (a process-wide array), "mmap" (a memory-mapped file under the
    data root, reused across runs), or "off" (decode each sample every epoch)."""

    device_prefetch: bool = False
    """Copy the next batch to the device on a side CUDA stream while the model works
    (:class:`perflab.data.prefetch.DevicePrefetcher`); on a CPU a plain pass-through."""

    compute_only: bool = False
    """The compute-only bound: load one batch, keep it on the device and reuse it every
    step (no loading at all). Throughput / this bound = input-pipeline efficiency."""

    # -- data-parallel training (Labs 06-07; run with perflab.distributed.launch) --------
    world_size: int = 1
    """Data-parallel ranks (processes). Each rank trains on its own ``batch_size``
    samples per step (global batch = world_size x batch_size). > 1 wraps the model in
    ``DistributedDataParallel`` and needs :func:`perflab.distributed.launch` (or torchrun)."""

    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MiB (``DistributedDataParallel(bucket_cap_mb=...)``;
    25 is PyTorch's default)."""

    gradient_as_bucket_view: bool = False
    """Let ``.grad`` tensors be views into DDP's buckets (saves one gradient copy)."""

    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    """A DDP communication hook from ``torch.distributed.algorithms.ddp_comm_hooks``:
    "fp16"/"bf16" compress gradients before the allreduce, "powersgd" sends a low-rank
    approximation; "none" = DDP's plain allreduce."""

    accumulation_steps: int = 1
    """Micro-batches (of ``batch_size`` each) per optimizer step (gradient accumulation,
    one process or DDP); under DDP all but the last run inside ``model.no_sync()``, so
    gradients are allreduced once per step."""

    link: SimulatedLink | None = None
    """SIMULATED interconnect for the DDP allreduce (:class:`perflab.core.simulated.SimulatedLink`,
    e.g. ``SimulatedLink.preset("1gbe")``); None = the real backend as is. Shown as
    "simulated link ..." in labels."""

    straggler: Straggler | None = None
    """A delay injected on one rank (:class:`perflab.core.simulated.Straggler`); None = off.
    Shown as "straggler rank ..." in labels."""

    # ------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        need = _need

        def whole(name: str, lo: int, hi: int | None, why: str = "") -> None:
            v = getattr(self, name)
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo
            ok = ok and (hi is None or v <= hi)
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi:,}"
            need(ok, f"{name} must be an int {rng}{why}, got {v!r}")

        need(isinstance(self.label, str),
             f"label must be a string (it names files and plots), got {self.label!r}")
        need(isinstance(self.device, str) and self.device.split(":")[0] in DEVICES,
             f"device must be one of {DEVICES} (or 'cuda:N'), got {self.device!r}")
        need(isinstance(self.model, str) and self.model in MODELS,
             f"model must be one of {MODELS}, got {self.model!r}")
        whole("image_size", 16, MAX_IMAGE_SIZE, " pixels")
        whole("batch_size", 2, MAX_BATCH_SIZE, " (BatchNorm needs more than one sample "
              "per step; larger batches: use accumulation_steps)")
        whole("steps", 2, MAX_STEPS, " (statistics need two samples)")
        whole("warmup_steps", 0, MAX_STEPS)
        need(_real(self.lr) and 0 < self.lr <= MAX_LR,
             f"lr must be a finite number in (0, {MAX_LR:g}], got {self.lr!r}")
        whole("num_workers", 0, MAX_WORKERS, " (0 loads in the main process)")
        need(isinstance(self.pin_memory, bool),
             f"pin_memory must be True or False, got {self.pin_memory!r}")
        need(isinstance(self.persistent_workers, bool),
             f"persistent_workers must be True or False, got {self.persistent_workers!r}")
        need(not (self.persistent_workers and self.num_workers == 0),
             "persistent_workers=True needs num_workers > 0; set num_workers >= 1 "
             "or persistent_workers=False")
        need(self.prefetch_factor is None or self.num_workers > 0,
             "prefetch_factor needs num_workers > 0; set num_workers >= 1 "
             "or prefetch_factor=None")
        if self.prefetch_factor is not None:
            whole("prefetch_factor", 1, 64, " or None")
        if self.threads is not None:
            whole("threads", 1, MAX_THREADS, " or None")
        whole("seed", 0, 2**32 - 1, " (numpy's seed range)")
        need(isinstance(self.amp, str) and self.amp in AMP_MODES, f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        need(isinstance(self.compile, str) and self.compile in COMPILE_MODES,
             f"compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        need(_real(self.storage_latency_ms)
             and 0 <= self.storage_latency_ms <= MAX_STORAGE_LATENCY_MS,
             f"storage_latency_ms must be a number of milliseconds in 0..."
             f"{MAX_STORAGE_LATENCY_MS:g} (0 = off), got {self.storage_latency_ms!r}")
        need(isinstance(self.decoded_cache, str) and self.decoded_cache in CACHE_MODES,
             f"decoded_cache must be one of {CACHE_MODES}, got {self.decoded_cache!r}")
        need(isinstance(self.channels_last, bool),
             f"channels_last must be True or False, got {self.channels_last!r}")
        need(isinstance(self.device_prefetch, bool),
             f"device_prefetch must be True or False, got {self.device_prefetch!r}")
        need(isinstance(self.compute_only, bool),
             f"compute_only must be True or False, got {self.compute_only!r}")
        check_distributed(self, need)
        self._check_model(need)
        ckpt = self.checkpointing
        need((isinstance(ckpt, str) and ckpt in ("none", "per_stage"))
             or (isinstance(ckpt, int) and not isinstance(ckpt, bool) and ckpt >= 1),
             f"checkpointing must be 'none', 'per_stage' or an int >= 1 (segments), "
             f"got {ckpt!r}")
        need(ckpt == "none" or self.model != "tiny",
             f"checkpointing={ckpt!r} needs model='resnet18' or 'gpt-tiny' (the tiny model "
             "has no stages)")
        stages = 4 if self.model in TOKEN_MODELS else 5
        need(not (isinstance(ckpt, int) and ckpt > stages),
             f"checkpointing={ckpt} segments, but {self.model} has {stages} stages; use "
             f"1..{stages}")
        need(self.dataset is None or isinstance(self.dataset, (str, os.PathLike)),
             f"dataset must be None or a folder path (str), got {self.dataset!r}")
        if not _RESTORING.get():
            self.check_machine()

    def _check_model(self, need: Any) -> None:
        """A token model's fields: seq_len in range, no image-only knob, a text dataset."""
        sl = self.seq_len
        need(isinstance(sl, int) and not isinstance(sl, bool) and 2 <= sl <= MAX_SEQ_LEN,
             f"seq_len must be an int in 2..{MAX_SEQ_LEN} tokens, got {sl!r}")
        if self.model in TOKEN_MODELS:
            image_only = [name for name, on in (
                ("channels_last", self.channels_last),
                ("decoded_cache", self.decoded_cache != "off"),
                ("storage_latency_ms", self.storage_latency_ms != 0),
                ("dataset", self.dataset is not None)) if on]
            need(not image_only, f"{', '.join(image_only)}: for image models only; "
                 f"model={self.model!r} trains on the built-in byte corpus: leave them at "
                 "their defaults")

    def check_machine(self) -> None:
        """What this machine must have to run the config: the named device, what it
        supports (pin_memory, amp, CUDA-graph compile modes) and the dataset folder.

        Run at construction and when a run starts (:func:`perflab.experiment.run`), not
        when a saved result's config is read back: a GPU box's result loads here.

        Raises:
            ValueError: naming the field and what to use on this machine instead.
        """
        if self.dataset is not None:
            _need(Path(self.dataset).expanduser().is_dir(),
                  f"dataset={self.dataset!r} is not a directory; pass an ImageFolder "
                  "root, or dataset=None for the embedded set (`perflab data`)")
        needs_device = (self.pin_memory or self.amp != "off"
                        or self.compile in ("reduce-overhead", "max-autotune"))
        if needs_device or self.device != "auto":
            dev = resolve_device(self.device)  # raises when the named device is missing
            check_device_support(self, dev)

    # ------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "RunConfig":
        """A named preset (``"tiny"``, ``"quick"`` or ``"full"``) with field overrides.

        Raises:
            ValueError: unknown preset name or unknown field in ``overrides``.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown RunConfig field(s) {sorted(unknown)}; "
                             f"valid fields: {[f.name for f in dataclasses.fields(cls)]}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> "RunConfig":
        """``dataclasses.replace`` with validation (a new, checked config)."""
        return dataclasses.replace(self, **changes)

    def resolved_device(self) -> torch.device:
        """The concrete device this config runs on."""
        return resolve_device(self.device)

    @property
    def samples_per_step(self) -> int:
        """Samples one rank trains on per optimizer step:
        ``batch_size x accumulation_steps`` (the global batch is ``world_size`` times it)."""
        return self.batch_size * self.accumulation_steps

    def changed_fields(self) -> dict[str, Any]:
        """Fields whose value differs from the class default (label excluded)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "label" and getattr(self, f.name) != f.default}

    def display_label(self) -> str:
        """``label`` if set, else a short description like ``"bs=64 workers=2"``.

        Injected conditions always show unless a custom label names them: simulated
        storage latency as ``"simulated storage +N ms/file"``, a simulated link as
        ``"simulated link 1gbe: alpha=..., beta=..."``, a straggler as ``"straggler rank
        1 +50 ms before_forward"``; the compute-only bound as ``"compute-only bound"``.
        None of them can be mistaken for the real thing.
        """
        # (text, words that show a custom label already names it)
        faults = [(text, words) for text, words in (
            (f"simulated storage +{self.storage_latency_ms:g} ms/file"
             if self.storage_latency_ms else "", ("storage", "disk")),
            (self.link.describe() if self.link else "", ("link",)),
            (self.straggler.describe() if self.straggler else "", ("straggler",))) if text]
        latency = ", ".join(text for text, _ in faults)
        if self.label:
            missing = [text for text, words in faults
                       if not any(w in self.label.lower() for w in words)]
            return f"{self.label} ({', '.join(missing)})" if missing else self.label
        short = {"batch_size": "bs", "num_workers": "workers", "image_size": "px",
                 "decoded_cache": "cache",
                 "world_size": "ranks", "bucket_cap_mb": "bucket_mb"}
        parts = ["compute-only bound" if k == "compute_only" else f"{short.get(k, k)}={v}"
                 for k, v in self.changed_fields().items()
                 if k not in ("steps", "warmup_steps", "dataset", "device",
                              "storage_latency_ms", "link", "straggler")]
        return " ".join(parts + [latency] if latency else parts) or "default"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        """Restore from :meth:`to_dict` (unknown fields ignored), validated but not against
        this machine (:meth:`check_machine`): a ``device="cuda"`` config reads back on a
        CPU. Raises ValueError for a value no machine could run."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if isinstance(kw.get("link"), dict):
            kw["link"] = SimulatedLink(**kw["link"])
        if isinstance(kw.get("straggler"), dict):
            kw["straggler"] = Straggler(**kw["straggler"])
        token = _RESTORING.set(True)
        try:
            return cls(**kw)
        finally:
            _RESTORING.reset(token)


#: Named presets. ``tiny``: a smoke test in seconds (browser tests, CI). ``quick``: a
#: measured run in <= 30 s on a 2-core CPU. ``full``: ImageNet-sized crops for a GPU.
PRESETS: dict[str, dict[str, Any]] = {
    # tiny: a smoke-test size (browser tests, CI's wheel smoke run): seconds, not minutes.
    "tiny": dict(image_size=32, batch_size=8, steps=4, warmup_steps=1),
    "quick": dict(image_size=64, batch_size=32, steps=20, warmup_steps=3),
    "full": dict(image_size=224, batch_size=128, steps=50, warmup_steps=10, num_workers=8,
                 persistent_workers=True),
}
