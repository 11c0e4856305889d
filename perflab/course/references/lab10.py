"""Lab 10's references, grader-only: the unsharded tensor-parallel block's output and
gradients, the unsplit pipeline's loss and gradients, the stage split, the per-stage op
order torch's schedules run and the activations each keeps in flight (what the judges of
the hand-written TP and pipeline exercises compare with), and the seal that lets the
pipeline checks after the first judge the configs the first one drew."""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

import torch

from perflab.labs.lab10.models import mlp_block, pipeline_batch, pipeline_model, tp_tensors

__all__ = ["tp_reference", "pipeline_reference_loss", "pipeline_reference", "stage_blocks",
           "schedule_order", "stash_peak", "seal", "is_sealed", "judge_pipeline"]

#: This grading process's key for :func:`seal` (never leaves the grader: the sandbox has
#: no ``perflab.course.references``).
_SEAL_KEY = secrets.token_bytes(32)


def tp_reference(case: dict[str, int]) -> dict[str, Any]:
    """The unsharded block on one case: ``{"out", "x_grad", "fc1_weight_grad",
    "fc1_bias_grad", "fc2_weight_grad", "fc2_bias_grad"}`` as float32 tensors (full
    shapes: ``fc1.weight`` is ``(4d, d)``, ``fc2.weight`` ``(d, 4d)``), from
    ``y = block(x)`` and ``y.backward(dL/dy)`` (:func:`~perflab.labs.lab10.models.tp_tensors`)."""
    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors(case)
    x.requires_grad_(True)
    out = block(x)
    out.backward(grad_out)
    fc1, fc2 = block[0], block[2]
    return {"out": out.detach(), "x_grad": x.grad, "fc1_weight_grad": fc1.weight.grad,
            "fc1_bias_grad": fc1.bias.grad, "fc2_weight_grad": fc2.weight.grad,
            "fc2_bias_grad": fc2.bias.grad}


def pipeline_reference_loss(width: int, blocks: int, batch: int, seed: int) -> float:
    """Cross-entropy (mean over the batch) of the unsplit :func:`~perflab.labs.lab10.models.pipeline_model` on
    :func:`~perflab.labs.lab10.models.pipeline_batch`: what a pipelined step's loss must equal, since equal
    micro-batches' mean losses average to the batch's mean loss."""
    x, y = pipeline_batch(width, batch, seed)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(pipeline_model(width, blocks, seed)(x), y))


def pipeline_reference(width: int, blocks: int, batch: int, seed: int, m: int) -> dict[str, Any]:
    """The unsplit model's step on the batch cut into ``m`` equal micro-batches: each
    micro-batch's cross-entropy (its mean), backward of it over ``m``, gradients summed.

    That is what ``ScheduleGPipe`` and ``Schedule1F1B`` compute (``scale_grads=True``,
    torch's default: each micro-batch's loss backward, then the gradients divided by
    the micro-batch count; torch/distributed/pipelining/schedules.py), and the
    gradient of the batch's mean loss.

    Returns:
        ``{"loss": the mean of the micro-batches' losses (float), "grads": per block,
        ``[weight grad (width, width), bias grad (width,)]`` as nested lists}``.

    Raises:
        ValueError: ``batch`` is not a multiple of ``m``.
    """
    if m < 1 or batch % m:
        raise ValueError(f"batch {batch} must split into m={m} equal micro-batches")
    model = pipeline_model(width, blocks, seed)
    x, y = pipeline_batch(width, batch, seed)
    losses = []
    for xs, ys in zip(x.chunk(m), y.chunk(m)):
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        (loss / m).backward()
        losses.append(loss.item())
    return {"loss": sum(losses) / m,
            "grads": [[blk[0].weight.grad.tolist(), blk[0].bias.grad.tolist()] for blk in model]}


def stage_blocks(blocks: int, stages: int) -> list[range]:
    """The blocks each stage holds when ``blocks`` are split into ``stages`` contiguous
    stages as evenly as they go: the first ``blocks % stages`` stages one more (torchtitan's
    ``generate_llm_fqn_per_model_part``, torchtitan/distributed/pipeline_parallel.py;
    ``numpy.array_split``'s rule).

    Raises:
        ValueError: fewer blocks than stages (a stage would be empty).
    """
    if not 1 <= stages <= blocks:
        raise ValueError(f"{blocks} blocks cannot fill {stages} stages")
    base, extra = divmod(blocks, stages)
    out, start = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def schedule_order(schedule: str, stages: int, stage: int, m: int) -> list[str]:
    """The ops stage ``stage`` of ``stages`` runs, in order, for ``m`` micro-batches, as
    torch's schedules run them (``_step_microbatches`` in
    torch/distributed/pipelining/schedules.py, torch 2.13):

    * ``"gpipe"`` (``ScheduleGPipe``): ``F0 .. F(m-1)``, then ``B0 .. B(m-1)``;
    * ``"1f1b"`` (``Schedule1F1B``): ``w = min(m, p - stage)`` forwards, then backward
      and forward alternating (``B0 F(w) B1 F(w+1) ...``) until every forward ran, then
      the remaining backwards. Megatron-LM counts ``min(m, p - stage - 1)`` warm-up
      forwards and starts its steady phase with a forward
      (``forward_backward_pipelining_without_interleaving``; PipeDream-Flush, Narayanan
      et al. 2021, arXiv:2104.04473, §2.2): the same order.

    torch's ``Schedule1F1B.pipeline_order`` (the schedule as data, not what runs) lists
    the last stage as ``F1 B0 F2 B1 ... F(m) B(m-1)`` in torch 2.13: this is the order it
    executes, recorded on the ranks in the tests.

    Raises:
        ValueError: an unknown schedule or a stage outside ``0 .. stages-1``.
    """
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage}")
    if schedule == "gpipe":
        return [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    warmup = min(m, stages - stage)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(m - warmup):
        order += [f"B{i}", f"F{warmup + i}"]
    return order + [f"B{i}" for i in range(m - warmup, m)]


def stash_peak(schedule: str, stages: int, stage: int, m: int) -> int:
    """Micro-batches stage ``stage`` holds in flight at most (forward done, backward not):
    ``m`` with GPipe, ``min(m, p - stage)`` with 1F1B (Narayanan et al. 2021, §2.2)."""
    order = schedule_order(schedule, stages, stage, m)
    live = peak = 0
    for op in order:
        live += 1 if op[0] == "F" else -1
        peak = max(peak, live)
    return peak


def seal(value: Any) -> str:
    """An HMAC-SHA256 of ``value`` (JSON data) under this grading process's key: a
    check's case carries it into the sandbox, a later check's judge gets it back with
    the value and :func:`is_sealed` tells whether the value is the one drawn here."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hmac.new(_SEAL_KEY, text.encode(), hashlib.sha256).hexdigest()


def is_sealed(value: Any, tag: Any) -> bool:
    """Whether ``tag`` is :func:`seal` ``(value)`` (a constant-time comparison)."""
    return isinstance(tag, str) and hmac.compare_digest(seal(value), tag)


def _close(got: Any, want: list, atol: float = 1e-6, rtol: float = 1e-4) -> bool:
    try:
        g, w = torch.tensor(got, dtype=torch.float32), torch.tensor(want, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return False
    return g.shape == w.shape and bool(torch.allclose(g, w, atol=atol, rtol=rtol))


def judge_pipeline(schedule: str, configs: list[dict], records: Any) -> None:
    """Judge one schedule's records of the pipeline checks' shared launch
    (:func:`perflab.labs.lab10.ranks.pipeline_check_records`) on the configs drawn here.

    Every schedule, on every config: no error; the stages are the split
    :func:`stage_blocks` (``stage_layers``); the last stage's loss is the unsplit model's
    and the others return None; each stage's parameter gradients are the unsplit model's
    for its blocks (:func:`pipeline_reference`, what ``ScheduleGPipe`` computes);
    the op order is the schedule's (:func:`schedule_order`; for GPipe every forward, in
    order, before any backward). The student's own schedules (``"gpipe"``, ``"1f1b"``)
    also: the stash held :func:`stash_peak` entries at most and none at the end; stage s
    sent m activations of its micro-batches' shape to s + 1 and m gradients of that shape
    to s - 1, and nothing else; no collective and no torch pipelining ran in the step.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"`` (the student's) or ``"torch"`` (the config's
            ``"torch"`` schedule through their ``build_schedule``).
        configs: the configs (``{"stages", "m", "width", "blocks", "batch", "seed",
            "torch"}``).
        records: ``[config][rank]`` records.

    Raises:
        AssertionError: the first property that does not hold, with what was found.
    """
    assert isinstance(records, list) and len(records) == len(configs), (
        f"records of {len(configs)} runs expected, got {type(records).__name__}")
    for config, recs in zip(configs, records):
        p, m, width = config["stages"], config["m"], config["width"]
        kind = config["torch"] if schedule == "torch" else schedule
        where = (f"{'torch ' if schedule == 'torch' else ''}{kind}, p={p}, m={m}, "
                 f"{config['blocks']} blocks, width {width}, seed {config['seed']}")
        assert isinstance(recs, list) and len(recs) >= p and all(isinstance(r, dict) for r in recs), (
            f"{where}: records of {p} ranks expected")
        for q, rec in enumerate(recs):
            assert not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
        assert not any(r.get("idle") for r in recs[:p]) and all(r.get("idle") for r in recs[p:]), (
            f"{where}: a {p}-stage pipeline runs on ranks 0..{p - 1}")
        ref = pipeline_reference(width, config["blocks"], config["batch"], config["seed"], m)
        split = stage_blocks(config["blocks"], p)
        rows = config["batch"] // m
        for s, rec in enumerate(recs[:p]):
            assert rec.get("stages") == p and rec.get("stage_layers") == len(split[s]), (
                f"{where}: split_model gave {rec.get('stages')} stages, stage {s} holding "
                f"{rec.get('stage_layers')} blocks; {p} stages of {[len(r) for r in split]} "
                "blocks expected (as even as they go, the first ones one longer)")
            if schedule != "torch":
                assert rec.get("delegated") == [], (
                    f"{where}: stage {s} ran {rec.get('delegated')}: torch's pipelining schedule, "
                    "not one written over send/recv")
                assert rec.get("collectives") == [], (
                    f"{where}: stage {s} ran the collectives {rec.get('collectives')}: pass "
                    "activations and gradients with point-to-point sends and receives")
            losses = rec.get("losses") or [None]
            if s == p - 1:
                assert isinstance(losses[0], (int, float)) and abs(losses[0] - ref["loss"]) <= (
                    1e-5 * abs(ref["loss"]) + 1e-7), (
                    f"{where}: the last stage's loss is {losses[0]!r}, the unsplit model's "
                    f"{ref['loss']!r} (the mean of the micro-batches' losses)")
            else:
                assert losses[0] is None, f"{where}: stage {s} returned a loss ({losses[0]!r})"
            want = [g for b in split[s] for g in ref["grads"][b]]
            got = rec.get("grads")
            assert isinstance(got, list) and len(got) == len(want) and all(
                _close(g, w) for g, w in zip(got, want)), (
                f"{where}: stage {s}'s parameter gradients differ from the unsplit model's "
                "(and ScheduleGPipe's) on the same micro-batches")
            order = rec.get("order")
            if kind == "gpipe":
                ok = (isinstance(order, list) and order[:m] == [f"F{i}" for i in range(m)]
                      and sorted(order[m:]) == sorted(f"B{i}" for i in range(m)))
                assert ok, (f"{where}: stage {s} ran {order}; GPipe runs every forward (in "
                            "order) before any backward, each micro-batch once")
            else:
                assert order == schedule_order(kind, p, s, m), (
                    f"{where}: stage {s} ran {order}, Schedule1F1B runs "
                    f"{schedule_order(kind, p, s, m)}")
            if schedule == "torch":
                continue
            peak = stash_peak(kind, p, s, m)
            assert rec.get("stash_peak") == peak and rec.get("stash_left") == 0, (
                f"{where}: stage {s}'s stash held {rec.get('stash_peak')} micro-batches at most "
                f"and {rec.get('stash_left')} at the end; {peak} and 0 expected")
            sends = rec.get("sends")
            assert isinstance(sends, list), f"{where}: stage {s}: no record of its sends"
            shape = [rows, width]
            fwd = [sh for peer, sh in sends if peer == s + 1]
            bwd = [sh for peer, sh in sends if peer == s - 1]
            assert len(fwd) + len(bwd) == len(sends), (
                f"{where}: stage {s} sent to stages {sorted({peer for peer, _ in sends})}; only "
                "its neighbours take part")
            assert fwd == ([shape] * m if s < p - 1 else []), (
                f"{where}: stage {s} sent {len(fwd)} activation(s) forward ({fwd[:2]}...); "
                f"{m if s < p - 1 else 0} of shape {shape} expected")
            assert bwd == ([shape] * m if s > 0 else []), (
                f"{where}: stage {s} sent {len(bwd)} gradient(s) back to stage {s - 1}; "
                f"{m if s > 0 else 0} of shape {shape} expected")
