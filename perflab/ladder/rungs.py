"""The ladder's rungs: what each fix changes, where it applies, and the search's points.

A point of the search is a :class:`Variant`: the set of rungs that are on, the
:class:`RunConfig` they make from the baseline, and the settings RunConfig has no field
for (applied around the run by :func:`applied`):

================  ===================================================================
rung              what it changes
================  ===================================================================
data_loading      ``decoded_cache="memory"`` + ``device_prefetch=True`` (Lab 02)
amp               ``amp="bf16"`` on a CPU / Ampere+ GPU, ``"fp16"`` + GradScaler on an
                  older GPU (Lab 03)
channels_last     ``channels_last=True`` (NHWC memory format)
compile           ``compile="default"`` (``torch.compile``, inductor; Lab 05)
max_autotune      ``compile="max-autotune"`` (GPU only: autotuned Triton kernels)
cuda_graphs       ``compile="reduce-overhead"`` (GPU only: CUDA graphs replay the step)
cudnn_benchmark   ``torch.backends.cudnn.benchmark = True`` during the run (GPU only)
fused_optimizer   ``torch.optim.SGD(fused=True)`` (:func:`perflab.train.step.optimizer_options`)
threads           ``threads`` = half the intra-op threads (CPU only: less contention
                  with the loader and other programs on a shared machine)
larger_batch      ``checkpointing="per_stage"`` and the largest batch whose memory fits
                  in what the best config needs without checkpointing (Lab 04)
================  ===================================================================

``compile``, ``max_autotune`` and ``cuda_graphs`` are one knob (:data:`GROUPS`): at most
one is on. :data:`INTERACTING` rungs change the same kernels (dtype x memory format x
fusion), so the search also tries them together.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from perflab.core.config import TOKEN_MODELS, RunConfig
from perflab.analysis.max_batch import GIB, cpu_step_bytes, find_max_batch
from perflab.core.measurement import Measurement
from perflab.core.result import RunResult
from perflab.train.step import optimizer_options

__all__ = ["RUNGS", "GROUPS", "INTERACTING", "SIZES", "ROUNDS", "BUDGET_S", "Variant", "naive_config",
           "rung_config", "unavailable", "make_variant", "applied", "checkpointed_batch_size",
           "per_sample"]

#: The rungs, in the order the first pass climbs them.
RUNGS = ("data_loading", "amp", "channels_last", "compile", "max_autotune", "cuda_graphs",
         "cudnn_benchmark", "fused_optimizer", "threads", "larger_batch")
#: Rungs that set the same knob: at most one of each group is on.
GROUPS: dict[str, tuple[str, ...]] = {"compile": ("compile", "max_autotune", "cuda_graphs")}
#: Rungs whose effects interact (low-precision kernels want NHWC; a compiler fuses
#: differently per dtype and layout): the search tries them jointly too.
INTERACTING = ("amp", "channels_last", "compile", "max_autotune", "cuda_graphs")
#: Rungs that are settings around the run, not RunConfig fields.
_SETTINGS = {"cudnn_benchmark", "fused_optimizer"}
_GPU_ONLY = {
    "max_autotune": "GPU only: max-autotune tunes Triton kernels and CUDA graphs",
    "cuda_graphs": "GPU only: CUDA graphs (torch.compile mode='reduce-overhead')",
    "cudnn_benchmark": "GPU only: torch.backends.cudnn.benchmark picks cuDNN conv "
                       "algorithms",
}
#: Named sizes. "tiny": 32 px for CI; "quick": 64 px, minutes on 2 CPU cores; "full":
#: ImageNet-sized, for a GPU. warmup_steps >= 1 everywhere: torch.compile compiles in
#: the first step.
SIZES: dict[str, dict] = {
    "tiny": dict(image_size=32, batch_size=8, steps=4, warmup_steps=1),
    "quick": dict(image_size=64, batch_size=32, steps=6, warmup_steps=2),
    "full": dict(image_size=224, batch_size=128, steps=30, warmup_steps=5),
}
#: Interleaved rounds per comparison when ``climb(rounds=None)``: more, shorter rounds
#: spread a burst of load from other programs over both sides of a comparison.
ROUNDS = {"tiny": 2, "quick": 4, "full": 3}
#: ``perflab ladder``'s default wall-clock bound per size (seconds; None: no bound), so
#: the CLI finishes in the time a size promises on a 2-core CPU (tiny: CI, under 90 s;
#: quick: under 5 minutes). The margin covers start-up and a last trial that runs past
#: its estimate: with bounds of 80 s and 280 s, benchmarks/ladder_search.py measured
#: 89.5 s and 293.5 s on a loaded 2-core machine. The moves it skips are named in the
#: table and the report; ``--budget-s 0`` searches without a bound.
BUDGET_S: dict[str, float | None] = {"tiny": 70.0, "quick": 260.0, "full": None}
#: The larger_batch rung tries batches up to this multiple of the current one.
MAX_BATCH_FACTOR = 4


def check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")


def naive_config(size: str = "quick", **overrides) -> RunConfig:
    """The naive baseline at a named size: per-sample JPEG decode with no workers, fp32,
    NCHW, eager (RunConfig's defaults), with ``SIZES[size]`` and ``overrides`` applied.

    Raises:
        ValueError: unknown size, or a value RunConfig rejects.
    """
    check_size(size)
    return RunConfig(**{**SIZES[size], "label": "", **overrides})


def _amp_mode(config: RunConfig) -> str | None:
    dev = config.resolved_device()
    if dev.type == "mps":
        return None
    if dev.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def _half_threads() -> int:
    return max(1, torch.get_num_threads() // 2)


def unavailable(rung: str, config: RunConfig) -> str | None:
    """Why ``rung`` cannot be measured for ``config`` on this machine, or None.

    Raises:
        ValueError: unknown rung name.
    """
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; choose from {RUNGS}")
    dev = config.resolved_device().type
    if rung in _GPU_ONLY and dev != "cuda":
        return f"{_GPU_ONLY[rung]}; this run is on {dev}"
    if rung == "amp" and _amp_mode(config) is None:
        return f"no autocast mode on {dev}"
    if rung == "threads":
        if dev != "cpu":
            return f"CPU only: on {dev} the device computes; host threads only feed it"
        if torch.get_num_threads() < 2:
            return "one intra-op thread already"
    if rung == "larger_batch" and config.model == "tiny":
        return f"model={config.model!r} has no stages to checkpoint"
    if rung == "larger_batch" and config.model != "resnet18":
        return (f"model={config.model!r}: the checkpointed batch search "
                "(find_max_batch) measures image models only")
    if config.model in TOKEN_MODELS and rung in ("data_loading", "channels_last"):
        return (f"model={config.model!r} reads tokens from memory: no JPEG decode to "
                "cache and no image layout" if rung == "data_loading" else
                f"model={config.model!r} has no image tensors for an NHWC layout")
    return None


def rung_config(rung: str, best: RunConfig, *, batch_size: int | None = None
                ) -> RunConfig | str:
    """``best`` with ``rung``'s RunConfig change applied, or why it does not apply
    (already on, not supported here, or a setting outside RunConfig).

    Raises:
        ValueError: unknown rung name (naming the valid ones).
    """
    why = unavailable(rung, best)
    if why:
        return why
    if rung == "data_loading":
        if best.decoded_cache != "off" or best.compute_only:
            return "the decoded cache is already on"
        return best.replace(decoded_cache="memory", device_prefetch=True)
    if rung == "amp":
        return f"amp={best.amp!r} is already on" if best.amp != "off" \
            else best.replace(amp=_amp_mode(best))
    if rung == "channels_last":
        return "channels_last is already on" if best.channels_last \
            else best.replace(channels_last=True)
    if rung in GROUPS["compile"]:
        mode = {"compile": "default", "max_autotune": "max-autotune",
                "cuda_graphs": "reduce-overhead"}[rung]
        return f"compile={best.compile!r} is already on" if best.compile != "off" \
            else best.replace(compile=mode)
    if rung == "threads":
        return f"threads={best.threads} is already set" if best.threads is not None \
            else best.replace(threads=_half_threads())
    if rung in _SETTINGS:
        return f"{rung} is a setting around the run, not a RunConfig field"
    if best.checkpointing != "none":
        return "checkpointing is already on"
    return best.replace(checkpointing="per_stage",
                        batch_size=best.batch_size if batch_size is None else batch_size)


@dataclass(frozen=True)
class Variant:
    """One point of the search.

    Attributes:
        on: the rungs that are on, in :data:`RUNGS` order.
        config: the baseline with those rungs' RunConfig changes (label = :attr:`key`).
        settings: rung -> True for the rungs applied around the run (:func:`applied`).
    """

    on: tuple[str, ...]
    config: RunConfig
    settings: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """"baseline" or the rungs joined by "+", e.g. "data_loading+amp"."""
        return "+".join(self.on) or "baseline"


def make_variant(base: RunConfig, on: Iterable[str], *, big_batch: int | None = None
                 ) -> Variant | str:
    """The :class:`Variant` with ``on`` applied to ``base``, or why it cannot exist.

    Args:
        base: the baseline config.
        on: rung names (any order; two of one group is an error).
        big_batch: the larger_batch rung's batch size (None: keep the batch).

    Raises:
        ValueError: unknown rung, or two rungs of one group.
    """
    names = set(on)
    for group in GROUPS.values():
        if len(names & set(group)) > 1:
            raise ValueError(f"at most one of {group} can be on, got {sorted(names)}")
    order = tuple(r for r in RUNGS if r in names)
    unknown = names - set(RUNGS)
    if unknown:
        raise ValueError(f"unknown rung(s) {sorted(unknown)}; choose from {RUNGS}")
    config = base
    for rung in order:
        if rung in _SETTINGS:
            why = unavailable(rung, base)
            if why:
                return why
            continue
        new = rung_config(rung, config, batch_size=big_batch)
        if isinstance(new, str):
            return new
        config = new
    key = "+".join(order) or "baseline"
    return Variant(order, config.replace(label=key),
                   tuple(r for r in order if r in _SETTINGS))


@contextlib.contextmanager
def applied(settings: Iterable[str]) -> Iterator[None]:
    """Apply a variant's settings (not RunConfig fields) around a run, then restore:
    ``cudnn_benchmark`` sets ``torch.backends.cudnn.benchmark``; ``fused_optimizer``
    builds SGD with ``fused=True`` (:func:`perflab.train.step.optimizer_options`)."""
    settings = set(settings)
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = old or "cudnn_benchmark" in settings
    opts: dict[str, Any] = {"fused": True} if "fused_optimizer" in settings else {}
    try:
        with optimizer_options(**opts):
            yield
    finally:
        torch.backends.cudnn.benchmark = old


def checkpointed_batch_size(best: RunConfig, best_result: RunResult | None = None, *,
                            limit: int | None = None) -> tuple[int, str]:
    """The largest batch that fits, with per-stage checkpointing, in the memory ``best``
    needs without it (Chen et al. 2016; Lab 04), via
    :func:`perflab.analysis.max_batch.find_max_batch`.

    The budget: on CUDA the measured peak of ``best_result`` (allocated bytes); on a
    CPU the bytes :func:`perflab.analysis.max_batch.cpu_step_bytes` measures for ``best`` at its
    batch size (model state + saved activations). Batches of 16 or more are rounded down
    to a multiple of 8 (tensor-core friendly shapes).

    Returns:
        (batch_size, how it was found, in words).
    """
    limit = limit or MAX_BATCH_FACTOR * best.batch_size
    plain = best.replace(checkpointing="none", compile="off")
    if best.resolved_device().type == "cuda" and best_result is not None:
        budget = best_result.peak_memory.peak_bytes
    else:
        budget = sum(cpu_step_bytes(plain)(best.batch_size).values())
    found = find_max_batch(plain.replace(checkpointing="per_stage"),
                           budget_gib=budget / GIB, limit=limit)
    n = found.batch_size
    n = n // 8 * 8 if n >= 16 else n
    return n, (f"batch {n} with per-stage checkpointing fits the {budget / 2**20:,.0f} MiB "
               f"batch {best.batch_size} needs without it ({found.method}"
               + ("; search limit reached" if found.hit_limit else "") + ")")


def per_sample(m: Measurement, batch_size: int, label: str) -> Measurement:
    """Seconds per sample (each step time / batch_size), so different batches compare."""
    return Measurement(label=label, times_s=tuple(t / batch_size for t in m.times_s),
                       warmup_s=tuple(t / batch_size for t in m.warmup_s),
                       samples_per_step=1)
