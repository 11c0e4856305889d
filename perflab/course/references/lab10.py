"""Lab 10's references, grader-only: the unsharded tensor-parallel block's output and
gradients, the unsharded transformer block's (with the activation bytes its LayerNorms
and dropouts keep) and the judges of its tensor- and sequence-parallel splits, the
unsplit pipeline's loss and gradients, the stage split, the per-stage op order torch's
schedules run and the activations each keeps in flight (what the judges of
the hand-written TP and pipeline exercises compare with), the judges of the student's
torch tensor parallelism (``parallel_mlp``, ``parallel_block``, the 2-D layout's
``data_parallel_grads``) on the shared TP launch, and the seal that lets the checks after
the first of a shared launch judge the cases the first one drew."""
from __future__ import annotations

import json
from typing import Any

import torch

from perflab.labs.lab10.models import mlp_block, pipeline_batch, pipeline_model, tp_tensors
from perflab.course.references.sealing import is_sealed, seal  # re-exported

__all__ = ["tp_reference", "pipeline_reference_loss", "pipeline_reference", "stage_blocks",
           "schedule_order", "stash_peak", "seal", "is_sealed", "judge_pipeline",
           "block_reference", "judge_block", "judge_dtensor_block", "seal_torch_tp",
           "judge_dtensor_mlp", "judge_two_d", "judge_torch_tp"]


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

    ``"interleaved"`` (torch's ``ScheduleInterleaved1F1B`` through the student's
    ``build_interleaved_schedule``): the model split into ``p·v`` stages, rank s holding
    stages ``s, s + p, ...`` (Narayanan et al. 2021, §2.2.2), and the loss and each
    rank's gradients (its stages in order) the unsplit model's.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"`` (the student's), ``"torch"`` (the config's
            ``"torch"`` schedule through their ``build_schedule``) or ``"interleaved"``.
        configs: all the configs drawn (``{"stages", "m", "width", "blocks", "batch",
            "seed", "torch"}``, and ``"virtual"`` where ``"torch"`` is
            ``"interleaved"``); the schedule judges those
            :func:`~perflab.labs.lab10.ranks.judged_by` gives it.
        records: ``[config][rank]`` records of those configs, in order.

    Raises:
        AssertionError: the first property that does not hold, with what was found.
    """
    from perflab.labs.lab10.ranks import judged_by

    configs = [c for c in configs if judged_by(c, schedule)]
    assert isinstance(records, list) and len(records) == len(configs), (
        f"records of {len(configs)} runs expected, got {type(records).__name__}")
    for config, recs in zip(configs, records):
        p, m, width = config["stages"], config["m"], config["width"]
        v = int(config.get("virtual", 1)) if schedule == "interleaved" else 1
        kind = config["torch"] if schedule == "torch" else schedule
        where = (f"{'torch ' if schedule in ('torch', 'interleaved') else ''}{kind}, p={p}, "
                 + (f"v={v}, " if v > 1 else "") + f"m={m}, "
                 f"{config['blocks']} blocks, width {width}, seed {config['seed']}")
        assert isinstance(recs, list) and len(recs) >= p and all(isinstance(r, dict) for r in recs), (
            f"{where}: records of {p} ranks expected")
        for q, rec in enumerate(recs):
            assert not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
        assert not any(r.get("idle") for r in recs[:p]) and all(r.get("idle") for r in recs[p:]), (
            f"{where}: a {p}-stage pipeline runs on ranks 0..{p - 1}")
        ref = pipeline_reference(width, config["blocks"], config["batch"], config["seed"], m)
        split = stage_blocks(config["blocks"], p * v)
        rows = config["batch"] // m
        for s, rec in enumerate(recs[:p]):
            mine = range(s, p * v, p)   # the looped placement: stages s, s + p, ...
            if v > 1:
                assert rec.get("stages") == p and rec.get("virtual") == v and rec.get(
                    "stage_layers") == [len(split[c]) for c in mine], (
                    f"{where}: split_model gave rank {s} stages of {rec.get('stage_layers')} "
                    f"blocks ({rec.get('stages')} ranks x {rec.get('virtual')}); {p * v} stages "
                    f"of {[len(r) for r in split]} blocks expected, rank {s} holding stages "
                    f"{list(mine)}")
            else:
                assert rec.get("stages") == p and rec.get("stage_layers") == len(split[s]), (
                    f"{where}: split_model gave {rec.get('stages')} stages, stage {s} holding "
                    f"{rec.get('stage_layers')} blocks; {p} stages of {[len(r) for r in split]} "
                    "blocks expected (as even as they go, the first ones one longer)")
            if schedule not in ("torch", "interleaved"):
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
            want = [g for c in mine for b in split[c] for g in ref["grads"][b]]
            got = rec.get("grads")
            assert isinstance(got, list) and len(got) == len(want) and all(
                _close(g, w) for g, w in zip(got, want)), (
                f"{where}: rank {s}'s parameter gradients differ from the unsplit model's "
                "(and ScheduleGPipe's) on the same micro-batches")
            if schedule == "interleaved":
                continue   # torch's own op order and messages: the loss and gradients suffice
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


# -- the transformer block: tensor and sequence parallel (issue 35 item 4) ----------------------
def block_reference(case: dict[str, Any], masks: dict[str, Any] | None = None) -> dict[str, Any]:
    """The unsharded :func:`~perflab.labs.lab10.models.transformer_block` on one case
    ``{"d", "heads", "batch", "seq", "seed", "dropout"}``: ``y = block(x)``,
    ``y.backward(dL/dy)`` (:func:`~perflab.labs.lab10.models.tp_tensors`).

    Args:
        case: the block case.
        masks: with dropout ``> 0``, ``{"drop1", "drop2"}``: the elements each dropout keeps,
            ``(B, S, d)`` bools; the output and gradients are then the block's with those
            masks (a dropout's output ``input · mask / (1 − p)``, as ``nn.Dropout``
            computes it). Without them a dropout case's output is one draw of this
            process's generator: its bytes, not its values, are the reference.

    Returns:
        ``{"out", "x_grad"}`` (float32 tensors ``(B, S, d)``), ``"grads"`` (the full
        gradient of every parameter of :data:`~perflab.labs.lab10.sp.BLOCK_PARAMS`, by
        name), ``"saved_bytes"``: the activation bytes its LayerNorms and dropouts keep
        for the backward, and ``"block_saved_bytes"``: those the whole block keeps, each
        storage once, parameters left out (:class:`~perflab.labs.lab10.sp.SavedActivationBytes`,
        ints).
    """
    from perflab.labs.lab10.models import transformer_block
    from perflab.labs.lab10.sp import BLOCK_PARAMS, BLOCK_REGION, SavedActivationBytes, block_param

    def run(with_masks: bool) -> tuple[Any, Any, Any, SavedActivationBytes]:
        block = transformer_block(int(case["d"]), int(case["heads"]), int(case["seed"]),
                                  float(case.get("dropout", 0.0)))
        handles = []
        if with_masks:
            for name in ("drop1", "drop2"):
                keep = torch.as_tensor(masks[name], dtype=torch.bool)
                handles.append(getattr(block, name).register_forward_hook(
                    lambda m, args, out, keep=keep: args[0] * keep / (1 - m.p)))
        x, grad_out = tp_tensors(case)
        x.requires_grad_(True)
        with SavedActivationBytes([getattr(block, n) for n in BLOCK_REGION],
                                  params=list(block.parameters())) as saved:
            out = block(x)
        out.backward(grad_out)
        for h in handles:
            h.remove()
        return block, out, x, saved

    def result(with_masks: bool) -> dict[str, Any]:
        block, out, x, saved = run(with_masks)
        return {"out": out.detach(), "x_grad": x.grad, "saved_bytes": saved.nbytes,
                "block_saved_bytes": saved.total_nbytes,
                "grads": {name: block_param(block, name).grad for name in BLOCK_PARAMS}}

    key = json.dumps({k: case[k] for k in ("d", "heads", "batch", "seq", "seed", "dropout")},
                     sort_keys=True)
    if key not in _BLOCK_REFERENCES:   # the judges of every mode read the same case's
        if len(_BLOCK_REFERENCES) >= 32:
            _BLOCK_REFERENCES.clear()
        _BLOCK_REFERENCES[key] = result(False)
    ref = _BLOCK_REFERENCES[key]
    if masks is None or float(case.get("dropout", 0.0)) == 0:
        return ref
    return {**result(True), "saved_bytes": ref["saved_bytes"],
            "block_saved_bytes": ref["block_saved_bytes"]}


#: :func:`block_reference`'s runs without masks, by case (read, never changed, by the judges).
_BLOCK_REFERENCES: dict[str, dict[str, Any]] = {}


def _shard(full: torch.Tensor, how: str, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of a full gradient split ``how`` (BLOCK_PARAMS' convention)."""
    if how == "whole":
        return full
    dim = 0 if how == "rows" else 1
    return full.chunk(world, dim=dim)[rank]


def _tensor(value: Any) -> torch.Tensor | None:
    try:
        return torch.tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return None


def _same(value: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    t = value if torch.is_tensor(value) else _tensor(value)
    return t is not None and t.shape == want.shape and bool(torch.allclose(t, want, atol=atol, rtol=rtol))


#: The block modes :func:`judge_block` judges -> (what the records are called, the
#: collectives each pass issues: kinds, sorted).
_BLOCK_MODE_COLLECTIVES = {
    "tp": ("tensor-parallel", {"forward": ["all_reduce"] * 2, "backward": ["all_reduce"] * 2}),
    "sp": ("sequence-parallel", {"forward": ["all_gather"] * 2 + ["reduce_scatter"] * 2,
                                 "backward": ["all_gather"] * 2 + ["reduce_scatter"] * 2}),
    "sp_shard": ("shard-saving sequence-parallel",
                 {"forward": ["all_gather"] * 2 + ["reduce_scatter"] * 2,
                  "backward": ["all_gather"] * 4 + ["reduce_scatter"] * 2}),
}


def _masks(where: str, recs: list[dict], mode: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The dropout masks of a dropout case's records, checked: in ``"tp"`` every rank's
    mask the same (``shape``, a replicated activation), returned as rank 0's; in the
    sequence-parallel modes no two ranks' the same (each ``shape`` with ``S/world``
    positions), returned concatenated along the sequence."""
    world = len(recs)
    got: dict[str, list[torch.Tensor]] = {}
    for name in ("drop1", "drop2"):
        got[name] = []
        for q, rec in enumerate(recs):
            m = (rec.get("masks") or {}).get(name)
            t = None
            try:
                t = torch.as_tensor(m, dtype=torch.bool)
            except (TypeError, ValueError, RuntimeError):
                pass
            want = shape if mode == "tp" else (shape[0], shape[1] // world, *shape[2:])
            assert t is not None and tuple(t.shape) == want, (
                f"{where}, rank {q}: no record of what {name} kept (its module was not called "
                f"once on a {list(want)} activation?)")
            got[name].append(t)
    if mode == "tp":
        for q in range(1, world):
            same = all(torch.equal(got[n][q], got[n][0]) for n in got)
            assert same, (
                f"{where}: rank {q} drew other dropout masks than rank 0 on the replicated "
                "activation (the ranks' replicas of the block diverge): every rank of the "
                "tensor-parallel group needs one RNG state for it (Megatron-LM's default "
                "generator, seeded the same on the group), whatever each rank's own generator holds")
        return {n: ts[0] for n, ts in got.items()}
    for q in range(world):
        for r in range(q):
            same = all(torch.equal(got[n][q], got[n][r]) for n in got)
            assert not same, (
                f"{where}: ranks {r} and {q} drew the same dropout masks on their own positions "
                "(every shard repeats one pattern): a sharded activation needs a different RNG "
                "state on each rank (Megatron-LM's tracker: seed + 2718 + tp_rank)")
    return {n: torch.cat(ts, dim=1) for n, ts in got.items()}


def judge_block(mode: str, cases: list[dict], records: Any, world: int = 2) -> None:
    """Judge the student's ``ShardedBlock`` in ``mode`` on the block cases drawn here,
    from ``[case][rank]`` records (:func:`perflab.labs.lab10.ranks.block_check_records`).

    Every case: no error and no torch tensor parallelism ran (``delegated``); with dropout
    ``> 0`` the dropout masks the ranks recorded (``"masks"``) are one mask on every rank
    in ``"tp"`` (a replicated activation; the ranks' own generators were seeded apart) and
    a different one on every rank in the sequence-parallel modes (their positions; the
    generators seeded alike: :func:`perflab.labs.lab10.ranks.block_rank_seed`); the output
    and ``dL/dx`` are the unsharded block's (:func:`block_reference`, with those masks; in
    the sequence-parallel modes rank r's positions ``r·S/p … (r+1)·S/p``) and every
    parameter gradient is its shard of the unsharded one (heads' rows, their columns of
    ``wo``; a whole parameter's gradient: on every rank in ``"tp"``, summed over the ranks
    in the sequence-parallel modes, where each rank saw only its positions).

    ``"tp"``: the forward and the backward each issue exactly two all-reduces of the
    block's activation (``B·S·d·4`` bytes), from the student's own autograd Functions.
    ``"sp"``: no all-reduce; the forward and the backward each issue two all-gathers and
    two reduce-scatters of that size (the full tensor: nccl-tests' message size), from
    the student's own Functions, so the bytes on the wire
    (:func:`~perflab.labs.lab10.comm.wire_bytes`) equal tensor parallelism's four
    all-reduces; and the LayerNorms' and dropouts' saved activation bytes per rank are
    the unsharded block's over ``world`` (Korthikanti et al. 2022, §4.2.2), where ``"tp"``
    keeps all of them on every rank. ``"sp_shard"`` (``save_shards=True``): as ``"sp"``,
    the backward with two more all-gathers (the column-parallel matmuls' input gathered
    again), so two all-gathers more on the wire, and the bytes the whole block keeps per
    rank (``"block_saved_bytes"``) the unsharded block's over ``world``: all its
    activations divided by tp.

    Raises:
        ValueError: an unknown mode.
        AssertionError: the first property that does not hold, with what was found.
    """
    from perflab.labs.lab10.comm import wire_bytes
    from perflab.labs.lab10.sp import BLOCK_PARAMS

    if mode not in _BLOCK_MODE_COLLECTIVES:
        raise ValueError(f"mode must be one of {tuple(_BLOCK_MODE_COLLECTIVES)}, got {mode!r}")
    assert isinstance(records, list) and len(records) == len(cases), (
        f"records of {len(cases)} block cases expected, got {type(records).__name__}")
    what, collectives = _BLOCK_MODE_COLLECTIVES[mode]
    for case, recs in zip(cases, records):
        where = (f"{what} block, d={case['d']}, heads={case['heads']}, (batch, seq) = "
                 f"({case['batch']}, {case['seq']}), dropout {case['dropout']}, seed {case['seed']}")
        assert isinstance(recs, list) and len(recs) == world and all(isinstance(r, dict) for r in recs), (
            f"{where}: records of {world} ranks expected")
        for q, rec in enumerate(recs):
            assert not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
            assert rec.get("delegated") == [], (
                f"{where}, rank {q}: ShardedBlock ran {rec.get('delegated')}: torch's tensor "
                "parallelism, not the student's own Functions")
        shape = (int(case["batch"]), int(case["seq"]), int(case["d"]))
        masks = _masks(where, recs, mode, shape) if case["dropout"] else None
        ref = block_reference(case, masks)
        n = 4 * case["batch"] * case["seq"] * case["d"]
        s = case["seq"] // world
        for q, rec in enumerate(recs):
            pos = slice(None) if mode == "tp" else slice(q * s, (q + 1) * s)
            part = "" if mode == "tp" else f" (its positions {q * s}..{(q + 1) * s - 1})"
            assert _same(rec.get("out"), ref["out"][:, pos]), (
                f"{where}, rank {q}: the output{part} differs from the unsharded block's"
                + (" with the dropout masks the ranks drew" if masks else ""))
            assert _same(rec.get("x_grad"), ref["x_grad"][:, pos]), (
                f"{where}, rank {q}: dL/dx{part} differs from the unsharded block's")
        for name, how in BLOCK_PARAMS.items():
            grads = [(rec.get("grads") or {}).get(name) for rec in recs]
            if how == "whole" and mode != "tp":
                ts = [_tensor(g) for g in grads]
                ok = all(t is not None and t.shape == ref["grads"][name].shape for t in ts) and _same(
                    sum(ts), ref["grads"][name])
                assert ok, (f"{where}: {name}'s gradient summed over the ranks (each from its "
                            "own positions) differs from the unsharded block's")
                continue
            for q, g in enumerate(grads):
                assert _same(g, _shard(ref["grads"][name], how, q, world)), (
                    f"{where}, rank {q}: {name}'s gradient differs from its shard of the "
                    "unsharded block's" + (" (rank r holds heads r·h/p … (r+1)·h/p: whole heads)"
                                           if name.startswith("attn") else ""))
        for q, rec in enumerate(recs):
            fwd, bwd = rec.get("forward"), rec.get("backward")
            for phase, seen in (("forward", fwd), ("backward", bwd)):
                assert isinstance(seen, list) and all(isinstance(c, list) and len(c) == 3 for c in seen), (
                    f"{where}, rank {q}: no record of the {phase}'s collectives")
                if mode == "tp":
                    assert seen == [["all_reduce", n, True]] * 2, (
                        f"{where}, rank {q}: the {phase} issued {seen} ([kind, bytes, from the "
                        f"student's own autograd.Function]); two all-reduces of {n} bytes (g after "
                        "attention and after the MLP in the forward, f before each in the backward) expected")
                    continue
                kinds = sorted(c[0] for c in seen)
                assert "all_reduce" not in kinds, (
                    f"{where}, rank {q}: the {phase} issued an all-reduce ({seen}): sequence "
                    "parallelism replaces every all-reduce of activations by a reduce-scatter "
                    "and an all-gather")
                want = collectives[phase]
                assert kinds == want and all(c[1] == n and c[2] is True for c in seen), (
                    f"{where}, rank {q}: the {phase} issued {seen} ([kind, bytes, from the "
                    f"student's own autograd.Function]); {want.count('all_gather')} all-gathers and "
                    f"{want.count('reduce_scatter')} reduce-scatters of the full activation ({n} bytes) "
                    "expected" + (" (Exercise 7's, and in the backward one more all-gather where each "
                                  "gather ran: one for q, k and v, one for the MLP)"
                                  if mode == "sp_shard" else ""))
            if mode != "tp":
                wire = sum(wire_bytes(c[0], c[1], world) for c in fwd + bwd)
                want_wire = 4 * wire_bytes("all_reduce", n, world) + (
                    2 * wire_bytes("all_gather", n, world) if mode == "sp_shard" else 0)
                assert abs(wire - want_wire) <= 1e-9 * want_wire, (
                    f"{where}, rank {q}: {wire:g} bytes on the wire per step; tensor parallelism's "
                    f"four all-reduces move {4 * wire_bytes('all_reduce', n, world):g}"
                    + (", and the two all-gathers again in the backward "
                       f"{2 * wire_bytes('all_gather', n, world):g} more" if mode == "sp_shard" else ""))
            want = ref["saved_bytes"] if mode == "tp" else ref["saved_bytes"] / world
            assert rec.get("saved_bytes") == want, (
                f"{where}, rank {q}: the LayerNorms and dropouts kept {rec.get('saved_bytes')} bytes "
                f"of activations for the backward; {want:g} expected (the unsharded block's "
                f"{ref['saved_bytes']}" + ("" if mode == "tp" else f" over tp = {world}") + ")")
            if mode == "sp_shard":
                want = ref["block_saved_bytes"] / world
                assert rec.get("block_saved_bytes") == want, (
                    f"{where}, rank {q}: the block kept {rec.get('block_saved_bytes')} bytes of "
                    f"activations for the backward; {want:g} expected: the unsharded block's "
                    f"{ref['block_saved_bytes']} over tp = {world} (save only this rank's shard "
                    "of the column-parallel matmuls' input, and the parameters, for the backward)")


def judge_dtensor_block(cases: list[dict], records: Any) -> None:
    """Judge the student's ``parallel_block`` (``parallelize_module`` with
    ``SequenceParallel`` on the norms) on the lab's block cases, from ``[case][rank]``
    records of the lab's launch: each rank holds DTensor weights (the norms' too:
    ``SequenceParallel`` replicates them as DTensors); with ``dropout == 0`` its output and
    ``dL/dx`` are the unsharded block's on its positions; the forward issues two
    all-gathers and two reduce-scatters of the full activation and no all-reduce, and so
    does the backward (the norms' and biases' gradients stay ``Partial`` DTensors, reduced
    when read).

    Raises:
        AssertionError: the first property that does not hold.
    """
    assert isinstance(records, list) and len(records) == len(cases), "records of every block case"
    for case, recs in zip(cases, records):
        world = len(recs)
        where = f"parallel_block, d={case['d']}, heads={case['heads']}, seq={case['seq']}, {world} ranks"
        ref = block_reference(case)
        n = 4 * case["batch"] * case["seq"] * case["d"]
        s = case["seq"] // world
        for q, rec in enumerate(recs):
            assert isinstance(rec, dict) and not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
            assert rec.get("weight_type") == "DTensor" == rec.get("norm_weight_type"), (
                f"{where}, rank {q}: attn.wq's weight is a {rec.get('weight_type')} and ln1's a "
                f"{rec.get('norm_weight_type')}: ColwiseParallel on the projections and "
                "SequenceParallel on the norms make DTensors of both")
            if case["dropout"] == 0:
                pos = slice(q * s, (q + 1) * s)
                assert _same(rec.get("out"), ref["out"][:, pos]) and _same(rec.get("x_grad"), ref["x_grad"][:, pos]), (
                    f"{where}, rank {q}: the output or dL/dx on its positions differs from the unsharded block's")
            for phase in ("forward", "backward"):
                seen = rec.get(phase) or []
                assert sorted(map(tuple, seen)) == [("all_gather", n)] * 2 + [("reduce_scatter", n)] * 2, (
                    f"{where}, rank {q}: the {phase} issued {seen}; two all-gathers and two "
                    f"reduce-scatters of {n} bytes and no all-reduce expected (Shard(1) between the blocks)")


# -- the student's torch tensor parallelism, in check_tp_hand's launch (issue 43) ---------------
#: The parts of the shared TP launch that run the student's torch answers
#: (:func:`perflab.labs.lab10.ranks.hand_tp_on_ranks`' ``torch_tp``).
_TORCH_MODES = ("dtensor", "dtensor_block", "two_d")


def seal_torch_tp(cases: list[dict], two_d: list[dict]) -> dict[str, Any]:
    """``hand_tp_on_ranks``' ``torch_tp`` for the MLP ``cases`` and the 2-D cases
    ``two_d`` drawn here: ``{"dtensor_seal": seal({"dtensor": cases}), "two_d": two_d,
    "two_d_seal": seal({"two_d": two_d})}`` (each seal names its part, so one part's
    cases cannot stand in for another's)."""
    return {"dtensor_seal": seal({"dtensor": cases}), "two_d": two_d,
            "two_d_seal": seal({"two_d": two_d})}


def judge_dtensor_mlp(cases: list[dict], records: Any, world: int = 2) -> None:
    """Judge the student's ``parallel_mlp`` (``ColwiseParallel`` on ``"0"``,
    ``RowwiseParallel`` on ``"2"``) over the 1-D mesh of ``world`` ranks, from
    ``[case][rank]`` records: layer 0's weight is a DTensor; every rank's output and
    ``dL/dx`` are the unsharded block's (:func:`tp_reference`); the local gradients are
    the unsharded ones' shards (``W1``'s and ``b1``'s rows, ``W2``'s columns, rank by
    rank; ``b2``'s whole); the forward and the backward each issue one all-reduce of the
    block's output (``B·S·d·4`` bytes) and nothing else.

    Raises:
        AssertionError: the first property that does not hold.
    """
    assert isinstance(records, list) and len(records) == len(cases), (
        f"records of {len(cases)} cases expected, got {type(records).__name__}")
    for case, recs in zip(cases, records):
        where = (f"parallel_mlp, d={case['d']}, (batch, seq) = ({case['batch']}, "
                 f"{case['seq']}), seed {case['seed']}, {world} ranks")
        assert isinstance(recs, list) and len(recs) == world and all(isinstance(r, dict) for r in recs), (
            f"{where}: records of {world} ranks expected")
        ref = tp_reference(case)
        n = 4 * case["batch"] * case["seq"] * case["d"]
        for q, rec in enumerate(recs):
            assert not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
            assert rec.get("weight_type") == "DTensor", (
                f"{where}, rank {q}: layer 0's weight is a {rec.get('weight_type')}, not a "
                "DTensor: did parallelize_module run with ColwiseParallel on '0'?")
            for key, what in (("out", "the output"), ("x_grad", "dL/dx")):
                assert _same(rec.get(key), ref[key]), (
                    f"{where}, rank {q}: {what} differs from the unsharded block's")
            assert _same(rec.get("fc2_bias_grad"), ref["fc2_bias_grad"]), (
                f"{where}, rank {q}: b2's gradient differs from the unsharded block's")
            for phase in ("forward", "backward"):
                calls, sent = rec.get(f"{phase}_calls"), rec.get(f"{phase}_bytes")
                assert calls == {"all_reduce": 1} and isinstance(sent, dict) and sent.get(
                    "all_reduce") == n, (
                    f"{where}, rank {q}: the {phase} issued {calls} ({sent} bytes); "
                    f"Colwise then Rowwise is one all-reduce of {n} bytes each way")
        for key, dim in (("fc1_weight_grad", 0), ("fc1_bias_grad", 0), ("fc2_weight_grad", 1)):
            parts = [_tensor(rec.get(key)) for rec in recs]
            ok = all(t is not None and t.dim() == ref[key].dim() for t in parts)
            assert ok and _same(torch.cat(parts, dim=dim), ref[key]), (
                f"{where}: {key[:3]}'s {'weight' if 'weight' in key else 'bias'} gradient, "
                f"rank 0's {'rows' if dim == 0 else 'columns'} then rank 1's, differs from "
                "the unsharded block's")


def judge_two_d(cases: list[dict], records: Any, world: int = 2) -> None:
    """Judge the student's 2-D layout (``parallel_mlp`` over the mesh's ``"tp"``
    dimension, each dp replica on its own batch, then ``data_parallel_grads`` over its
    ``"dp"`` group) on the 2-D cases drawn here, each ``{"d", "batch", "seq", "seed",
    "mesh": [dp, tp]}``, from ``[case][rank]`` records: rank q sits at ``(q // tp,
    q % tp)``; its local gradients of ``W1``, ``b1`` (its tp shard's rows), ``W2`` (its
    columns) and ``b2`` are the average over the dp replicas (replica r's input seeded
    ``seed + r``) of the unsharded block's; with dp > 1 the student's all-reduces over
    the dp group move ``4·((8d² + 4d)/tp + d)`` bytes (every local gradient once), with
    tp > 1 the tp group's move ``2·B·S·d·4`` (f and g).

    Raises:
        AssertionError: the first property that does not hold.
    """
    assert isinstance(records, list) and len(records) == len(cases), (
        f"records of {len(cases)} 2-D cases expected, got {type(records).__name__}")
    for case, recs in zip(cases, records):
        dp, tp = (int(v) for v in case["mesh"])
        d = case["d"]
        where = (f"2-D layout (dp, tp) = ({dp}, {tp}), d={d}, (batch, seq) = "
                 f"({case['batch']}, {case['seq']}), seed {case['seed']}")
        assert isinstance(recs, list) and len(recs) == world and all(isinstance(r, dict) for r in recs), (
            f"{where}: records of {world} ranks expected")
        refs = [tp_reference({**case, "input_seed": case["seed"] + r}) for r in range(dp)]
        mean = {key: sum(ref[key] for ref in refs) / dp for key in (
            "fc1_weight_grad", "fc1_bias_grad", "fc2_weight_grad", "fc2_bias_grad")}
        h = 4 * d // tp
        for q, rec in enumerate(recs):
            assert not rec.get("error"), f"{where}, rank {q}: {rec.get('error')}"
            t = q % tp
            assert [rec.get("dp_index"), rec.get("tp_index")] == [q // tp, t], (
                f"{where}, rank {q}: at mesh coordinate ({rec.get('dp_index')}, "
                f"{rec.get('tp_index')}), ({q // tp}, {t}) expected")
            for key, shard in (("fc1_weight_grad", mean["fc1_weight_grad"][t * h:(t + 1) * h]),
                               ("fc1_bias_grad", mean["fc1_bias_grad"][t * h:(t + 1) * h]),
                               ("fc2_weight_grad", mean["fc2_weight_grad"][:, t * h:(t + 1) * h]),
                               ("fc2_bias_grad", mean["fc2_bias_grad"])):
                assert _same(rec.get(key), shard), (
                    f"{where}, rank {q}: {key} is not the average over the {dp} dp "
                    "replica(s) of its shard of the unsharded gradient"
                    + (" (all-reduced over the dp group, then divided by its size?)" if dp > 1
                       else " (with one replica, averaging changes nothing: is the all-reduce "
                            "over the dp group only?)"))
            sent = {kind: (rec.get(kind) or {}).get("all_reduce", 0) for kind in ("dp_bytes", "tp_bytes")}
            if dp > 1:
                want = 4 * ((8 * d * d + 4 * d) // tp + d)
                assert sent["dp_bytes"] == want, (
                    f"{where}, rank {q}: the all-reduces over the dp group moved {sent['dp_bytes']} "
                    f"bytes; every local gradient once is {want}")
            if tp > 1:
                want = 2 * 4 * case["batch"] * case["seq"] * d
                assert sent["tp_bytes"] == want, (
                    f"{where}, rank {q}: the tp group's all-reduces moved {sent['tp_bytes']} bytes; "
                    f"f and g move {want}")


def judge_torch_tp(mode: str, got: Any, world: int = 2) -> None:
    """Judge one part of the shared TP launch's torch answers
    (:func:`perflab.labs.lab10.ranks.block_check_records` in ``mode``): the cases carry
    the seal drawn here (:func:`seal_torch_tp`; ``"dtensor_block"``: the blocks' own
    :func:`seal`), then :func:`judge_dtensor_mlp`, :func:`judge_two_d` or
    :func:`judge_dtensor_block` on ``world`` ranks' records.

    Raises:
        ValueError: an unknown mode.
        AssertionError: the seal does not hold (the cases are not the ones drawn here), or
            the judge's first property that does not hold.
    """
    if mode not in _TORCH_MODES:
        raise ValueError(f"mode must be one of {_TORCH_MODES}, got {mode!r}")
    assert isinstance(got, dict) and isinstance(got.get("cases"), list), (
        f"the {mode} records could not be read (tampered?)")
    cases = got["cases"]
    sealed = cases if mode == "dtensor_block" else {mode: cases}
    assert cases and is_sealed(sealed, got.get("seal")), (
        f"the {mode} cases are not the ones the grader drew for the check of Exercise 1 "
        "(tampered?)")
    records = got.get("records")
    if mode == "dtensor":
        judge_dtensor_mlp(cases, records, world)
    elif mode == "two_d":
        judge_two_d(cases, records, world)
    else:
        assert isinstance(records, list) and all(
            isinstance(r, list) and len(r) == world for r in records), (
            f"records of {world} ranks for every block case expected")
        judge_dtensor_block(cases, records)
