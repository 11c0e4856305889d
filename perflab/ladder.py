"""The optimization ladder (Lab 08, ``perflab ladder``): each fix in turn, kept if it helps.

Starting from a naive baseline (per-sample JPEG decode in the main process, fp32, NCHW,
eager), :func:`climb` tries one rung at a time against the best configuration so far:

==============  =====================================================================
rung            what it changes (a :class:`RunConfig` built from the best so far)
==============  =====================================================================
data_loading    ``decoded_cache="memory"`` + ``device_prefetch=True`` (Lab 02)
amp             ``amp="bf16"`` on a CPU / Ampere+ GPU, ``"fp16"`` + GradScaler on an
                older GPU (Lab 03)
channels_last   ``channels_last=True`` (NHWC memory format)
compile         ``compile="default"`` (``torch.compile``, inductor; Lab 05)
larger_batch    ``checkpointing="per_stage"`` and the largest batch whose memory fits in
                what the best config needs without checkpointing (Lab 04,
                :func:`perflab.max_batch.find_max_batch`)
==============  =====================================================================

Each rung is measured with :func:`perflab.train.run_interleaved` (A B A B rounds of the
best-so-far and the candidate, so drift hits both) and compared per sample (seconds per
sample, so a larger batch compares fairly) with :func:`perflab.measurement.compare`
(two-sided Mann-Whitney U, bootstrap CI of the speedup). A rung is kept only when the
candidate is significantly faster (p < alpha and speedup > 1); otherwise the ladder says
it did not help here, and by how much. Every RunResult is saved as JSON the moment it is
measured, so an interrupted climb loses nothing.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from perflab.config import RunConfig
from perflab.ladder_report import Ladder, Rung
from perflab.max_batch import GIB, cpu_step_bytes, find_max_batch
from perflab.measurement import Measurement, compare
from perflab.result import RunResult, default_results_dir

__all__ = ["RUNGS", "SIZES", "ROUNDS", "naive_config", "rung_config", "checkpointed_batch_size",
           "per_sample", "climb", "validate_climb"]

#: The rungs, in the order they are climbed.
RUNGS = ("data_loading", "amp", "channels_last", "compile", "larger_batch")
#: Named sizes. "tiny": 32 px for CI (about a minute with the compile cache warm);
#: "quick": 64 px, under 10 minutes on 2 CPU cores; "full": ImageNet-sized, for a GPU.
#: warmup_steps >= 1 everywhere: torch.compile compiles in the first step.
SIZES: dict[str, dict] = {
    "tiny": dict(image_size=32, batch_size=8, steps=4, warmup_steps=1),
    "quick": dict(image_size=64, batch_size=32, steps=6, warmup_steps=2),
    "full": dict(image_size=224, batch_size=128, steps=30, warmup_steps=5),
}
#: Interleaved rounds per rung when ``climb(rounds=None)``: more, shorter rounds spread
#: a burst of load from other programs over both sides of a comparison.
ROUNDS = {"tiny": 2, "quick": 4, "full": 3}
#: The larger_batch rung tries batches up to this multiple of the current one.
MAX_BATCH_FACTOR = 4

RunFn = Callable[..., list[RunResult]]


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")


def naive_config(size: str = "quick", **overrides) -> RunConfig:
    """The naive baseline at a named size: per-sample JPEG decode with no workers, fp32,
    NCHW, eager (RunConfig's defaults), with ``SIZES[size]`` and ``overrides`` applied.

    Raises:
        ValueError: unknown size, or a value RunConfig rejects.
    """
    _check_size(size)
    return RunConfig(**{**SIZES[size], "label": "", **overrides})


def _amp_mode(config: RunConfig) -> str | None:
    """bf16 on a CPU or a bf16-capable GPU, fp16 (+GradScaler) on an older GPU, None on
    MPS (perflab runs no bf16 autocast there)."""
    dev = config.resolved_device()
    if dev.type == "mps":
        return None
    if dev.type == "cuda":
        import torch
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def rung_config(rung: str, best: RunConfig, *, batch_size: int | None = None
                ) -> RunConfig | str:
    """The candidate config of ``rung``: ``best`` with that rung's fix applied, or a
    string saying why the rung does not apply (already on, not supported here).

    Args:
        rung: one of :data:`RUNGS`.
        best: the best config so far.
        batch_size: for ``larger_batch``: the batch size to use (see
            :func:`checkpointed_batch_size`); None keeps ``best.batch_size``.

    Raises:
        ValueError: unknown rung name (naming the valid ones).
    """
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; choose from {RUNGS}")
    if rung == "data_loading":
        if best.decoded_cache != "off" or best.compute_only:
            return "the decoded cache is already on"
        return best.replace(decoded_cache="memory", device_prefetch=True)
    if rung == "amp":
        mode = _amp_mode(best)
        if best.amp != "off":
            return f"amp={best.amp!r} is already on"
        return f"no autocast mode on {best.resolved_device().type}" if mode is None \
            else best.replace(amp=mode)
    if rung == "channels_last":
        return "channels_last is already on" if best.channels_last \
            else best.replace(channels_last=True)
    if rung == "compile":
        return f"compile={best.compile!r} is already on" if best.compile != "off" \
            else best.replace(compile="default")
    if best.model != "resnet18":
        return f"model={best.model!r} has no stages to checkpoint"
    if best.checkpointing != "none":
        return "checkpointing is already on"
    return best.replace(checkpointing="per_stage",
                        batch_size=best.batch_size if batch_size is None else batch_size)


def checkpointed_batch_size(best: RunConfig, best_result: RunResult | None = None, *,
                            limit: int | None = None) -> tuple[int, str]:
    """The largest batch that fits, with per-stage checkpointing, in the memory ``best``
    needs without it (Chen et al. 2016; Lab 04), via
    :func:`perflab.max_batch.find_max_batch`.

    The budget: on CUDA the measured peak of ``best_result`` (allocated bytes); on a
    CPU the bytes :func:`perflab.max_batch.cpu_step_bytes` measures for ``best`` at its
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


def validate_climb(rungs: Sequence[str], skip: Sequence[str], rounds: int, alpha: float) -> None:
    """Refuse a climb's arguments before any run: unknown rung names, a string instead
    of a list, ``rounds`` < 1, ``alpha`` outside (0, 1).

    Raises:
        ValueError: naming the argument and the fix.
    """
    for name, names in (("rungs", rungs), ("skip", skip)):
        if isinstance(names, str):
            raise ValueError(f"{name} must be a list of rung names, got the string "
                             f"{names!r}; write {name}=[{names!r}]")
        bad = [r for r in names if r not in RUNGS]
        if bad:
            raise ValueError(f"unknown rung(s) {bad} in {name}; choose from {RUNGS}")
    if len(set(rungs)) != len(rungs):
        raise ValueError(f"rungs lists a rung twice: {list(rungs)}; name each once")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1 (interleaved A/B rounds), got {rounds!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), e.g. 0.05, got {alpha!r}")


def climb(config: RunConfig | None = None, *, size: str = "quick",
          rungs: Sequence[str] = RUNGS, skip: Sequence[str] = (), rounds: int | None = None,
          alpha: float = 0.05, progress: bool = True, out_dir: str | Path | None = None,
          save: bool = True, run_fn: RunFn | None = None) -> Ladder:
    """Climb the ladder from ``config`` (default ``naive_config(size)``).

    Args:
        config: the baseline; None -> ``naive_config(size)``.
        size: a key of :data:`SIZES` (used when ``config`` is None).
        rungs: the rungs to try, in order (names from :data:`RUNGS`, any order).
        skip: rungs to leave out (listed as skipped in the table).
        rounds: interleaved A/B rounds per rung (>= 1; each round is a full run);
            None -> ``ROUNDS[size]``.
        alpha: significance level of the keep decision, in (0, 1).
        progress: a tqdm bar over the rungs (and each run's step bar).
        out_dir: folder for the RunResult JSONs (``runs/``) and the report; None ->
            ``<results>/ladder/<UTC timestamp>``.
        save: write each rung's RunResults as soon as they are measured.
        run_fn: ``run_fn(configs, rounds=..., progress=...) -> [RunResult, ...]``;
            default :func:`perflab.train.run_interleaved` (tests pass a fake).

    Returns:
        A :class:`Ladder` (its ``write_report()`` writes report.md and the plots).

    Raises:
        ValueError: unknown rung or size, rounds < 1, alpha outside (0, 1), or a
            config RunConfig rejects -- all before any measurement.
    """
    _check_size(size)
    rounds = ROUNDS[size] if rounds is None else rounds
    validate_climb(rungs, skip, rounds, alpha)
    if config is None:
        config = naive_config(size)
    elif not isinstance(config, RunConfig):
        raise ValueError(f"config must be a RunConfig or None, got {type(config).__name__}")
    if run_fn is None:
        from perflab.train import run_interleaved as run_fn
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out_dir) if out_dir else default_results_dir() / "ladder" / stamp
    best = config.replace(label="baseline")
    best_result: RunResult | None = None
    done: list[Rung] = []
    skipped: dict[str, str] = {r: "skipped on request" for r in rungs if r in skip}
    todo = [r for r in rungs if r not in skip]
    bar = tqdm(todo, desc="ladder", unit="rung", disable=not progress)
    baseline: RunResult | None = None
    for name in bar:
        bar.set_postfix_str(name)
        batch, how = None, ""
        if name == "larger_batch" and best.model == "resnet18" and best.checkpointing == "none":
            batch, how = checkpointed_batch_size(best, best_result)
            if batch <= best.batch_size:
                skipped[name] = f"checkpointing frees no room for a larger batch: {how}"
                continue
        cand = rung_config(name, best, batch_size=batch)
        if isinstance(cand, str):
            skipped[name] = cand
            continue
        cand = cand.replace(label=f"{len(done) + 1} +{name}")
        inc, new = run_fn([best, cand], rounds=rounds, progress=progress)
        if save:
            inc, new = inc.save(out / "runs"), new.save(out / "runs")
        baseline = baseline or inc
        cmp = compare(per_sample(inc.step, best.batch_size, best.display_label()),
                      per_sample(new.step, cand.batch_size, cand.display_label()),
                      alpha=alpha)
        kept = cmp.significant and cmp.speedup > 1
        change = ", ".join(f"{k}={v!r}" for k, v in cand.to_dict().items()
                           if k != "label" and v != getattr(best, k))
        note = how if name == "larger_batch" else ""
        done.append(Rung(name, change, inc, new, cmp, kept, note))
        if kept:
            best, best_result = cand, new
        else:
            best_result = inc
    bar.close()
    best = best.replace(label="")  # display_label() then names every kept fix
    return Ladder(baseline=baseline, rungs=done, best_config=best,
                  skipped=skipped, out_dir=out if save else None, order=list(rungs))
