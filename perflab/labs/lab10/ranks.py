"""Lab 10's rank bodies: the student's tensor- and pipeline-parallel code on every rank.

Each ``*_rank`` function is what every rank runs under
:func:`perflab.distributed.launch_fn` (module level, so spawned ranks import it). They
import the student's own files by module name (written next to the notebook with
``%%writefile``, as Labs 06 and 09 do): ``tp_student`` defines ``ShardedMLP`` (Megatron's
f/g by hand; Shoeybi et al. 2019, arXiv:1909.08053, §3), ``make_mesh``
(``init_device_mesh``), ``parallel_mlp`` (``parallelize_module``) and
``data_parallel_grads`` (the 2-D layout's gradient all-reduce); ``pp_student`` defines
``split_model``, the hand-written schedules ``gpipe_step`` and ``one_f_one_b_step``
(point-to-point sends and receives; Huang et al. 2019, arXiv:1811.06965; Narayanan et al.
2021, arXiv:2104.04473, §2.2), and ``build_schedule`` and ``pipeline_step``
(``torch.distributed.pipelining``). What a pipeline rank records around them (op order,
busy time, stash, messages) is :mod:`perflab.labs.lab10.pipeline`.

:func:`hand_tp_on_ranks` starts the ranks for a graded check's hidden cases,
:func:`pipeline_on_ranks` for the lab's pipeline launch and its panel, and
:func:`pipeline_check_records` makes the ONE launch the pipeline checks share;
:func:`shard_compute_s` times one shard's compute in the calling process.

A case that raises in the student's code is returned as ``{"error": "Type: message"}``
(the notebook and the judges show it), so one bad case does not hide the others.

Exercise 1 asks for Megatron's f and g written by hand: while the student's
``ShardedMLP`` is built and runs, the rank records every ``torch.distributed.all_reduce``
(:class:`HandTPTrace`: its bytes, and whether one of the student's own
``torch.autograd.Function`` s issued it) and whether torch's tensor parallelism ran
(:data:`HAND_TP_FORBIDDEN`, watched by :func:`perflab.labs.checking.watch_calls`, also
while the student's file is imported): the records say so even when the ranks were
launched outside a graded call (the lab's own launch), where no spy of the notebook's
reaches them. That watch is the hand-written checks' whole guard: the same launch then
runs the student's torch answers (``parallel_mlp``, ``parallel_block``, the 2-D layout),
which use torch's tensor parallelism by design, so the graded call that starts it
forbids nothing.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, Callable, Sequence

import torch

from perflab.analysis.sharding import COLLECTIVE_MESSAGES, count_collectives, message_nbytes
from perflab.core.timing import PerfCounterClock
from perflab.distributed import launch_fn
from perflab.labs.lab10.comm import count_functional_collectives
from perflab.labs.lab10.models import mlp_block, pipeline_batch, pipeline_model, tp_tensors
from perflab.labs.lab10.pipeline import CallTrace, code_of

__all__ = ["import_student", "shard_compute_s", "tp_rank", "pp_rank", "lab10_rank",
           "hand_tp_on_ranks", "pipeline_on_ranks", "check_runs", "pipeline_check_records",
           "block_check_records", "BLOCK_MODES", "block_rank_seed", "TRACED_COLLECTIVES",
           "judged_by", "PIPELINE_CHECKS",
           "HandTPTrace", "HAND_TP_FORBIDDEN", "HAND_PP_FORBIDDEN", "PP_SCHEDULES",
           "PP_P2P_TIMEOUT_S"]

#: torch's tensor parallelism, which Exercise 1 (``ShardedMLP``) may not use: it is
#: Exercise 2's answer. Dotted paths (the last names a class's attribute).
HAND_TP_FORBIDDEN = ("torch.distributed.tensor.parallel.parallelize_module",
                     "torch.distributed.tensor.distribute_tensor",
                     "torch.distributed.tensor.distribute_module",
                     "torch.distributed.tensor.DTensor.from_local")


def _object_at(path: str) -> Any:
    """The object a dotted path names: a module attribute, or a class's attribute."""
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return getattr(_object_at(module), attr)


#: ``torch.distributed`` collectives :class:`HandTPTrace` records -> (kind, the argument
#: whose bytes are the message: nccl-tests' size, the full tensor): count_collectives'
#: table without broadcast.
TRACED_COLLECTIVES = {name: kind_arg for name, kind_arg in COLLECTIVE_MESSAGES.items()
                      if kind_arg[0] != "broadcast"}


class HandTPTrace(CallTrace):
    """While open, on this rank (``sys.setprofile``, this thread; CPU autograd runs the
    backward in the calling thread): every ``torch.distributed.all_reduce`` however it is
    reached (an alias, ``distributed_c10d``'s own name), as ``[bytes, own]`` with ``own``
    True when a ``forward`` or ``backward`` of a ``torch.autograd.Function`` subclass
    defined in ``module`` is on the stack; and every collective of
    :data:`TRACED_COLLECTIVES` (the all-reduce, the all-gathers and reduce-scatters,
    tensor and list forms) as ``[kind, message bytes, own]``, a collective that another
    one calls (``all_gather_into_tensor`` calls ``all_gather_single`` in torch 2.13)
    counted once. A profile function already set (a
    :func:`~perflab.labs.checking.watch_calls` spy) keeps getting every event.

    Attributes:
        all_reduces: ``[[bytes, own], ...]`` in call order.
        collectives: ``[[kind, bytes, own], ...]`` in call order (``kind`` one of
            ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``).
    """

    def __init__(self, module: Any) -> None:
        import torch.distributed as dist

        self.all_reduces: list[list] = []
        self.collectives: list[list] = []
        self._all_reduce = code_of(dist.all_reduce)
        self._traced = {}
        for name, (kind, arg) in TRACED_COLLECTIVES.items():
            code = code_of(getattr(dist, name, None))
            if code is not None:
                self._traced[code] = (kind, arg)
        self._own = set()
        todo = list(torch.autograd.Function.__subclasses__())
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            if cls.__module__ == module.__name__:
                for method in ("forward", "backward"):
                    code = code_of(cls.__dict__.get(method))
                    if code is not None:
                        self._own.add(code)

    def _on_call(self, frame: Any) -> None:
        traced = self._traced.get(frame.f_code)
        if traced is None:
            return
        kind, arg = traced
        nbytes = message_nbytes(frame.f_locals.get(arg))
        caller, own, nested = frame.f_back, False, False
        while caller is not None:
            own = own or caller.f_code in self._own
            nested = nested or caller.f_code in self._traced
            caller = caller.f_back
        if frame.f_code is self._all_reduce:
            self.all_reduces.append([nbytes, own])
        if not nested:
            self.collectives.append([kind, nbytes, own])


def import_student(module: str) -> Any:
    """Import the student's module ``module`` from the working folder (the notebook's;
    ranks inherit it from the launching kernel).

    Raises:
        ModuleNotFoundError: no ``<module>.py`` there (run the ``%%writefile`` cell).
    """
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module)


def _error(e: BaseException) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {e}"[:400]}


def _local(t: torch.Tensor | None) -> list | None:
    if t is None:
        return None
    return (t.to_local() if hasattr(t, "to_local") else t).detach().tolist()


def _hand_case(student: Any, case: dict[str, int], rank: int, world: int) -> dict[str, Any]:
    """The student's ``ShardedMLP`` on one case: its output, gradients and collectives
    (``count_collectives``), and what :class:`HandTPTrace` saw while it was built
    (``"build_all_reduces"``), ran forward (``"forward_all_reduces"``) and backward
    (``"backward_all_reduces"``), and which of :data:`HAND_TP_FORBIDDEN` ran
    (``"delegated"``: the spy's labels; :func:`tp_rank` adds those that ran while the
    student's file was imported)."""
    from perflab.labs.checking import watch_calls

    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors(case)
    x.requires_grad_(True)
    with watch_calls({name: _object_at(name) for name in HAND_TP_FORBIDDEN}) as delegated:
        with HandTPTrace(student) as built:
            mine = student.ShardedMLP(block, rank, world)
        with count_collectives() as fwd, HandTPTrace(student) as fwd_seen:
            out = mine(x)
        with count_collectives() as bwd, HandTPTrace(student) as bwd_seen:
            out.backward(grad_out)
    fc1, fc2 = mine.fc1, mine.fc2
    return {"out": _local(out), "x_grad": _local(x.grad),
            "fc1_weight_grad": _local(fc1.weight.grad), "fc1_bias_grad": _local(fc1.bias.grad),
            "fc2_weight_grad": _local(fc2.weight.grad), "fc2_bias_grad": _local(fc2.bias.grad),
            "forward_calls": dict(fwd.calls), "forward_bytes": dict(fwd.bytes),
            "backward_calls": dict(bwd.calls), "backward_bytes": dict(bwd.bytes),
            "build_all_reduces": built.all_reduces, "forward_all_reduces": fwd_seen.all_reduces,
            "backward_all_reduces": bwd_seen.all_reduces, "delegated": list(delegated)}


def _waited(out: Any) -> Any:
    """``out`` with DTensor's all-reduce awaited: ``parallelize_module``'s block returns an
    ``AsyncCollectiveTensor``, awaited when first read. The 2-D case never reads its
    output, so each rank ended holding one unawaited collective, and c10d printed "At the
    time of process termination, there are still 1 unwaited collective calls" when a
    spawned rank destroyed its process group."""
    wait = getattr(out, "wait", None)
    return wait() if callable(wait) else out


def _dtensor_case(student: Any, case: dict[str, int], mesh: Any) -> dict[str, Any]:
    """``student.parallel_mlp`` over the 1-D ``mesh`` of all ranks, counted."""
    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors(case)
    x.requires_grad_(True)
    mine = student.parallel_mlp(block, mesh)
    with count_functional_collectives() as fwd:
        out = mine(x)   # an AsyncCollectiveTensor: the all-reduce's result, awaited on use
    with count_functional_collectives() as bwd:
        out.backward(grad_out)
    fc1, fc2 = mine[0], mine[2]
    return {"out": _local(out), "x_grad": _local(x.grad),
            "fc1_weight_grad": _local(fc1.weight.grad), "fc1_bias_grad": _local(fc1.bias.grad),
            "fc2_weight_grad": _local(fc2.weight.grad), "fc2_bias_grad": _local(fc2.bias.grad),
            "weight_type": type(fc1.weight).__name__,
            "forward_calls": dict(fwd.calls), "forward_bytes": dict(fwd.bytes),
            "backward_calls": dict(bwd.calls), "backward_bytes": dict(bwd.bytes)}


def _two_d_case(student: Any, case: dict[str, int], mesh: Any) -> dict[str, Any]:
    """The block on a (dp, tp) mesh: tensor parallel over ``mesh["tp"]``, each dp replica
    on its own batch (``input_seed = seed + dp index``), then the student's gradient
    all-reduce over ``mesh["dp"]``; all collectives counted, by group."""
    dp_index, tp_index = (int(c) for c in mesh.get_coordinate())
    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors({**case, "input_seed": int(case["seed"]) + dp_index})
    x.requires_grad_(True)   # an activation, as inside a transformer: f's backward reduces it
    mine = student.parallel_mlp(block, mesh["tp"])
    with count_functional_collectives() as tp_comm, count_collectives() as dp_comm:
        out = mine(x)
        out.backward(grad_out)
        _waited(out)
        student.data_parallel_grads(mine, mesh["dp"].get_group())
    fc1, fc2 = mine[0], mine[2]
    return {"dp_index": dp_index, "tp_index": tp_index,
            "fc1_weight_grad": _local(fc1.weight.grad), "fc1_bias_grad": _local(fc1.bias.grad),
            "fc2_weight_grad": _local(fc2.weight.grad), "fc2_bias_grad": _local(fc2.bias.grad),
            "tp_calls": dict(tp_comm.calls), "tp_bytes": dict(tp_comm.bytes),
            "dp_calls": dict(dp_comm.calls), "dp_bytes": dict(dp_comm.bytes)}


def _sequence_shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s positions of ``t (B, S, d)``: ``t[:, rank·S/p:(rank+1)·S/p]``."""
    if t.shape[1] % world:
        raise ValueError(f"seq={t.shape[1]} does not split over {world} ranks: sequence "
                         "parallelism needs tp to divide the sequence length")
    size = t.shape[1] // world
    return t[:, rank * size:(rank + 1) * size].clone()


def _block_grads(module: Any) -> dict[str, list | None]:
    """The LOCAL gradient of every parameter of :data:`~perflab.labs.lab10.sp.BLOCK_PARAMS`."""
    from perflab.labs.lab10.sp import BLOCK_PARAMS, block_param

    return {name: _local(block_param(module, name).grad) for name in BLOCK_PARAMS}


#: The modes of the student's ``ShardedBlock`` a block case runs in -> its keyword arguments:
#: tensor parallel, sequence parallel (Exercise 7) and sequence parallel keeping only each
#: rank's shard of the column-parallel matmuls' input (Exercise 7's stretch).
BLOCK_MODES = {"tp": {"sequence_parallel": False},
               "sp": {"sequence_parallel": True},
               "sp_shard": {"sequence_parallel": True, "save_shards": True}}


def block_rank_seed(mode: str, case: dict[str, Any], rank: int) -> int:
    """The seed of rank ``rank``'s own (default) generator before its block of ``case``
    runs in ``mode``: different on every rank in ``"tp"`` (as a launch that seeds each
    rank apart leaves them: the dropout mask of a replicated activation must not depend on
    it, so the block needs one RNG state for the whole tensor-parallel group), the same on
    every rank in the sequence-parallel modes (as Megatron-LM seeds a tensor-parallel
    group: the mask of a sharded activation must differ on each rank all the same)."""
    base = int(case["seed"])
    return base + 1_000_003 * (rank + 1) if mode == "tp" else base


def _dropout_masks(modules: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Forward hooks recording which elements each dropout module kept (its output's
    nonzero entries, the last call's) -> ({name: mask as nested lists}, hook handles)."""
    masks: dict[str, Any] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: Any, args: Any, out: Any) -> None:
            local = out.to_local() if hasattr(out, "to_local") else out
            masks[name] = (local.detach() != 0).tolist()
        return record

    return masks, [m.register_forward_hook(hook(n)) for n, m in modules.items()]


def _block_case(student: Any, case: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The student's ``ShardedBlock`` on one case in each of :data:`BLOCK_MODES`: tensor
    parallel (``"tp"``: the whole sequence on every rank, Megatron's f and g), sequence
    parallel (``"sp"``: this rank's positions, :func:`_sequence_shard`) and sequence
    parallel saving only the shards (``"sp_shard"``: ``save_shards=True``). Each mode
    records its output, input gradient, local parameter gradients, the collectives
    :class:`HandTPTrace` saw in the forward and in the backward (``[kind, bytes, own]``),
    the activation bytes its LayerNorms and dropouts keep for the backward
    (``"saved_bytes"``) and those the whole block keeps (``"block_saved_bytes"``: each
    storage once, parameters left out; :class:`~perflab.labs.lab10.sp.SavedActivationBytes`),
    with dropout ``> 0`` the elements its ``drop1`` and ``drop2`` kept (``"masks"``), and
    which of :data:`HAND_TP_FORBIDDEN` ran. This rank's own generator is seeded
    :func:`block_rank_seed` before each mode. Case: ``{"d", "heads", "batch", "seq",
    "seed", "dropout"}`` (the block is :func:`~perflab.labs.lab10.models.transformer_block`)."""
    from perflab.labs.checking import watch_calls
    from perflab.labs.lab10.models import transformer_block
    from perflab.labs.lab10.sp import BLOCK_REGION, SavedActivationBytes

    out: dict[str, Any] = {}
    dropout = float(case.get("dropout", 0.0))
    for mode, kwargs in BLOCK_MODES.items():
        handles: list[Any] = []
        try:
            block = transformer_block(int(case["d"]), int(case["heads"]), int(case["seed"]), dropout)
            x, grad_out = tp_tensors(case)
            if mode != "tp":
                x, grad_out = _sequence_shard(x, rank, world), _sequence_shard(grad_out, rank, world)
            x.requires_grad_(True)
            torch.manual_seed(block_rank_seed(mode, case, rank))
            with watch_calls({n: _object_at(n) for n in HAND_TP_FORBIDDEN}) as delegated:
                mine = student.ShardedBlock(block, rank, world, **kwargs)
                region = [getattr(mine, name) for name in BLOCK_REGION]
                masks, handles = _dropout_masks({n: getattr(mine, n) for n in ("drop1", "drop2")}
                                                if dropout else {})
                with HandTPTrace(student) as fwd, SavedActivationBytes(
                        region, params=list(mine.parameters())) as saved:
                    y = mine(x)
                with HandTPTrace(student) as bwd:
                    y.backward(grad_out)
            out[mode] = {"out": _local(y), "x_grad": _local(x.grad), "grads": _block_grads(mine),
                         "forward": fwd.collectives, "backward": bwd.collectives,
                         "saved_bytes": saved.nbytes, "saved_shapes": saved.shapes,
                         "block_saved_bytes": saved.total_nbytes, "masks": masks,
                         "delegated": list(delegated)}
        except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
            out[mode] = _error(e)
        finally:
            for h in handles:
                h.remove()
    return out


def _dtensor_block_case(student: Any, case: dict[str, Any], mesh: Any) -> dict[str, Any]:
    """``student.parallel_block`` (``parallelize_module`` with sequence parallelism) over
    the 1-D ``mesh``, fed this rank's positions of the input: its output shard, input
    gradient shard and functional collectives (:class:`count_functional_collectives`)."""
    from perflab.labs.lab10.models import transformer_block

    rank, world = mesh.get_local_rank(), mesh.size()
    block = transformer_block(int(case["d"]), int(case["heads"]), int(case["seed"]),
                              float(case.get("dropout", 0.0)))
    x, grad_out = tp_tensors(case)
    x, grad_out = _sequence_shard(x, rank, world), _sequence_shard(grad_out, rank, world)
    x.requires_grad_(True)
    mine = student.parallel_block(block, mesh)
    with count_functional_collectives() as fwd:
        y = _waited(mine(x))
        y = y.to_local() if hasattr(y, "to_local") else y
    with count_functional_collectives() as bwd:
        y.backward(grad_out)
    return {"out": _local(y), "x_grad": _local(x.grad),
            "weight_type": type(block.attn.wq.weight).__name__,
            "norm_weight_type": type(block.ln1.weight).__name__,
            "forward": [list(e) for e in fwd.log], "backward": [list(e) for e in bwd.log]}


def shard_compute_s(student: Any, case: dict[str, int], rank: int, world_size: int,
                    steps: int) -> list[float]:
    """Seconds per forward+backward of rank ``rank``'s shard of the student's
    ``ShardedMLP`` WITHOUT its collectives (the same matmuls, GELU and bias), in this
    process, on one thread as each rank of :func:`perflab.distributed.launch_fn` runs:
    the compute a tensor-parallel step does between its all-reduces. Runs without ranks
    (building a ``ShardedMLP`` only slices the block); ``steps`` timed after one warm-up.

    Raises:
        ValueError: ``steps < 1``.
    """
    import torch.nn.functional as F

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    block = mlp_block(int(case["d"]), int(case["seed"]))
    x, grad_out = tp_tensors(case)
    x.requires_grad_(True)
    mine = student.ShardedMLP(block, rank, world_size)
    clock = PerfCounterClock()
    times = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as each rank runs (launch_fn's threads_per_rank=1)
    try:
        for i in range(steps + 1):   # the first is a warm-up
            t0 = clock.now()
            h = F.gelu(mine.fc1(x))
            (F.linear(h, mine.fc2.weight) + mine.fc2.bias).backward(grad_out)
            if i:
                times.append(clock.now() - t0)
    finally:
        torch.set_num_threads(threads)
    return times


def tp_rank(cases: Sequence[dict[str, int]], student_module: str = "tp_student",
            dtensor: bool = True, two_d: bool = False,
            block_cases: Sequence[dict[str, Any]] = (),
            two_d_cases: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Rank body: the student's tensor-parallel MLP block on each case, by hand and (with
    ``dtensor``) with ``parallelize_module`` over a 1-D ``DeviceMesh`` of all ranks; then
    their transformer block on each of ``block_cases``, tensor and sequence parallel by
    hand (and with ``dtensor``, sequence parallel by ``parallelize_module``).

    Args:
        cases: ``{"d", "batch", "seq", "seed"}`` each: the block is :func:`mlp_block` ``(d,
            seed)``, the input and upstream gradient :func:`tp_tensors` ``(case)``.
        student_module: the student's file's module name.
        dtensor: also run ``student.parallel_mlp`` over ``student.make_mesh((world,))``
            (the student's ``init_device_mesh``).
        two_d: with 4 or more ranks (an even number), also the 2-D run: a
            ``make_mesh((2, world // 2), ("dp", "tp"))`` mesh, ``parallel_mlp`` over its
            "tp" dimension, ``student.data_parallel_grads`` over its "dp" group.
        block_cases: ``{"d", "heads", "batch", "seq", "seed", "dropout"}`` each (tp divides
            heads and seq): the student's ``ShardedBlock`` (:func:`_block_case`) and, with
            ``dtensor``, their ``parallel_block`` (:func:`_dtensor_block_case`).
        two_d_cases: ``{"d", "batch", "seq", "seed", "mesh": [dp, tp]}`` each (dp·tp the
            world size, tp dividing 4d): the 2-D layout of ``two_d`` on each case's own
            mesh (``make_mesh((dp, tp), ("dp", "tp"))``, one per shape), recorded after
            ``two_d``'s in ``"two_d"``: how 2 ranks run it as (2, 1) and (1, 2).

    Raises:
        ValueError: a 2-D case's mesh is not two sizes whose product is the world size
            (before any case runs).

    Returns:
        ``{"hand": [per case], "dtensor": [per case], "two_d": [per case, then per 2-D
        case], "block": [per block case], "dtensor_block": [per block case],
        "unwaited_collectives": functional collectives never awaited at the end (0; None
        where torch does not tell)}``; a case
        holds this rank's output, input gradient and LOCAL parameter gradients (lists), and
        the collectives counted in the forward and in the backward (calls and bytes by
        kind), or ``{"error": ...}``.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = [tuple(int(n) for n in c["mesh"]) for c in two_d_cases]
    if any(len(s) != 2 or min(s) < 1 or s[0] * s[1] != world for s in shapes):
        raise ValueError(f"every 2-D case's mesh must be [dp, tp] with dp * tp = {world} "
                         f"(the ranks), got {[list(s) for s in shapes]}")
    from perflab.labs.checking import watch_calls

    with watch_calls({n: _object_at(n) for n in HAND_TP_FORBIDDEN}) as at_import:
        student = import_student(student_module)   # its top level runs here: watched too
    out: dict[str, Any] = {"hand": [], "dtensor": [], "two_d": [], "block": [],
                           "dtensor_block": []}
    for case in cases:
        try:
            out["hand"].append(_hand_case(student, case, rank, world))
        except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
            out["hand"].append(_error(e))
        dist.barrier()
    for case in block_cases:
        out["block"].append(_block_case(student, case, rank, world))
        dist.barrier()
    hand_records = out["hand"] + [r[m] for r in out["block"] for m in BLOCK_MODES if m in r]
    for rec in hand_records:   # what ran at import counts against every hand-written case
        if "delegated" in rec:
            rec["delegated"] += [n for n in at_import if n not in rec["delegated"]]
    if dtensor and block_cases:
        out["dtensor_block"] = _on_student_mesh(student, block_cases, _dtensor_block_case, (world,))
    if dtensor:
        out["dtensor"] = _on_student_mesh(student, cases, _dtensor_case, (world,))
    if two_d and world % 2 == 0 and world >= 4:
        out["two_d"] = _on_student_mesh(student, cases, _two_d_case, (2, world // 2),
                                        ("dp", "tp"))
    by_shape: dict[tuple, list[int]] = {}   # one mesh of the student's per shape
    for i, shape in enumerate(shapes):
        by_shape.setdefault(shape, []).append(i)
    two_d_records: list[Any] = [None] * len(shapes)
    for shape, at in by_shape.items():
        done = _on_student_mesh(student, [two_d_cases[i] for i in at], _two_d_case, shape,
                                ("dp", "tp"))
        for i, rec in zip(at, done):
            two_d_records[i] = rec
    out["two_d"] += two_d_records
    try:   # DTensor's functional collectives never awaited (c10d warns of them at exit)
        from torch._C._distributed_c10d import _get_work_registry_size
        out["unwaited_collectives"] = int(_get_work_registry_size())
    except ImportError:
        out["unwaited_collectives"] = None
    return out


def _on_student_mesh(student: Any, cases: Sequence[dict], case_fn: Callable, *mesh_args
                     ) -> list[dict]:
    """``case_fn(student, case, mesh)`` for every case on the mesh the student's
    ``make_mesh(*mesh_args)`` builds; an error of the student's code (the mesh, or a case)
    is recorded for that case, not raised, and the ranks meet at a barrier after each."""
    import torch.distributed as dist
    try:
        mesh, failed = student.make_mesh(*mesh_args), None
    except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
        mesh, failed = None, _error(e)
    results = []
    for case in cases:
        try:
            results.append(case_fn(student, case, mesh) if mesh is not None else failed)
        except Exception as e:  # noqa: BLE001 - the student's code
            results.append(_error(e))
        dist.barrier()
    return results


#: torch's pipelining runtime, which the hand-written schedules (Exercises 9 and 10) may not
#: run: it is Exercise 11's answer. Dotted paths (the last names a class's attribute).
HAND_PP_FORBIDDEN = ("torch.distributed.pipelining.stage._PipelineStageBase.forward_one_chunk",
                     "torch.distributed.pipelining.stage._PipelineStageBase.backward_one_chunk",
                     "torch.distributed.pipelining.schedules.PipelineScheduleSingle.step",
                     "torch.distributed.pipelining.schedules.PipelineScheduleMulti.step")
#: The schedules a run may name: the student's own over send/recv, and torch's through the
#: student's ``build_schedule`` (its ``schedule`` argument is the part after ``torch_``).
PP_SCHEDULES = {"gpipe": "gpipe_step", "1f1b": "one_f_one_b_step",
                "torch_gpipe": "build_schedule", "torch_1f1b": "build_schedule",
                "torch_interleaved": "build_interleaved_schedule"}
#: Seconds a pipeline's send or receive may wait for its peer before it fails (the process
#: group's timeout): a schedule that deadlocks (each of two stages waiting for the other
#: to receive) fails its run instead of stopping the launch.
PP_P2P_TIMEOUT_S = 30.0


def _simulated(model: torch.nn.Module, on: bool, saved: list | None = None) -> list:
    """Switch the model's :class:`~perflab.labs.lab10.models.SimulatedWork` off (saving
    its times) or back on (from ``saved``)."""
    from perflab.labs.lab10.models import SimulatedWork

    works = [mod for mod in model.modules() if isinstance(mod, SimulatedWork)]
    if not on:
        saved = [(w.forward_s_per_row, w.backward_s_per_row) for w in works]
        for w in works:
            w.forward_s_per_row = w.backward_s_per_row = 0.0
        return saved
    for w, (f, b) in zip(works, saved or []):
        w.forward_s_per_row, w.backward_s_per_row = f, b
    return []


def _pp_run(student: Any, run: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """One run on the pipeline's ``p = run["stages"]`` ranks (0 .. p-1, ``group``): the
    model split by the student's ``split_model``, this rank's stage run by the schedule
    ``run["schedule"]`` (:data:`PP_SCHEDULES`).

    ``"torch_interleaved"`` splits the model into ``p·v`` stages (``v = run["virtual"]``,
    the virtual stages per rank) and hands them all to the student's
    ``build_interleaved_schedule``; this rank's stages are ``r, r + p, ..., r + (v-1)·p``
    (Narayanan et al. 2021, arXiv:2104.04473, §2.2.2: the looped placement), so it is
    those stages' ops, busy time and gradients the rank records.

    Step 0 is *recorded*: the simulated compute off, every op, the stash, the
    point-to-point messages and the gradients kept (torch's schedules run one step before
    it, unrecorded: their first step infers the shapes with a forward that has no
    backward). Steps 1 .. ``repeats`` are *timed*: the simulated compute on, the
    busy seconds (:class:`~perflab.labs.lab10.pipeline.StageProbe`) and the step's wall
    clock between two barriers of the group."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from perflab.labs.checking import watch_calls
    from perflab.labs.lab10.pipeline import P2PTrace, Stash, StageProbe, in_flight_peak

    schedule, p, m = run["schedule"], int(run["stages"]), int(run["m"])
    v = int(run.get("virtual", 1))
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {sorted(PP_SCHEDULES)}")
    if (v > 1) != (schedule == "torch_interleaved") or v < 1:
        raise ValueError(f"virtual={v}: torch_interleaved needs virtual >= 2 stages per rank, "
                         "the other schedules one (leave it out)")
    model = pipeline_model(int(run["width"]), int(run["blocks"]), int(run["seed"]),
                           float(run.get("forward_s_per_row", 0.0)),
                           float(run.get("backward_s_per_row", 0.0)))
    stages = student.split_model(model, p * v)
    mine = list(stages[rank::p])   # v = 1: [stages[rank]]
    stage_module = mine[0]
    x, y = pipeline_batch(int(run["width"]), int(run["batch"]), int(run["seed"]))
    if x.shape[0] % m:
        raise ValueError(f"batch {x.shape[0]} does not split into m={m} equal micro-batches")
    microbatches, targets = list(x.chunk(m)), list(y.chunk(m))
    order: list[str] = []   # one list: an interleaved rank's stages' ops in the order they ran
    probes = [StageProbe(mod, order=order, label=f"S{rank + k * p}:" if v > 1 else "")
              for k, mod in enumerate(mine)]
    clock = PerfCounterClock()
    hand = not schedule.startswith("torch_")
    if hand:
        sched = None
    elif v > 1:
        sched = student.build_interleaved_schedule(list(stages), rank, p, m, group=group)
    else:
        sched = student.build_schedule(stage_module, rank, p, m, schedule[len("torch_"):],
                                       group=group)
    out: dict[str, Any] = {"schedule": schedule, "stages": len(stages) // v, "virtual": v,
                           "stage_layers": len(stage_module) if v == 1 else [len(s) for s in mine],
                           "losses": [], "step_s": [], "busy_s": []}
    saved = _simulated(model, on=False)
    if not hand:   # its first step infers shapes (a forward of stage 0 with no backward)
        student.pipeline_step(sched, rank, p, x, y)
    for step in range(1 + int(run.get("repeats", 0))):
        if step == 1:
            _simulated(model, on=True, saved=saved)
        stash = Stash() if hand else None
        for probe in probes:   # each reset empties the one order list they share
            probe.reset(stash)
        for mod in mine:
            mod.zero_grad(set_to_none=True)
        dist.barrier(group=group)
        t0 = clock.now()
        for probe in probes:
            probe.recording = True
        try:
            with contextlib.ExitStack() as watched:
                if hand and step == 0:   # the spy first: P2PTrace chains to it
                    delegated = watched.enter_context(
                        watch_calls({n: _object_at(n) for n in HAND_PP_FORBIDDEN}))
                if step == 0:   # never on a timed step: a profile hook slows every call
                    trace = watched.enter_context(P2PTrace(group))
                if hand:
                    loss = getattr(student, PP_SCHEDULES[schedule])(
                        stage_module, microbatches, targets, F.cross_entropy, group, stash)
                else:
                    loss = student.pipeline_step(sched, rank, p, x, y)
        finally:
            for probe in probes:
                probe.recording = False
        dist.barrier(group=group)   # the step ends when the LAST stage is done
        out["step_s"].append(clock.now() - t0)
        out["busy_s"].append(float(sum(probe.busy_s for probe in probes)))
        out["losses"].append(None if loss is None else float(loss))
        if step == 0:
            out.update(order=list(order), in_flight_peak=in_flight_peak(order),
                       grads=[None if q.grad is None else q.grad.tolist()
                              for mod in mine for q in mod.parameters()],
                       sends=trace.sends, recvs=trace.recvs, collectives=trace.collectives)
            if hand:
                out.update(stash_peak=stash.peak, stash_left=len(stash),
                           delegated=list(delegated))
    if len(out["step_s"]) > 1:   # the recorded step (no simulated compute) is not timed
        out["step_s"], out["busy_s"] = out["step_s"][1:], out["busy_s"][1:]
    out["peak_in_flight"] = out["stash_peak"] if hand else out["in_flight_peak"]
    return out


def pp_rank(runs: Sequence[dict[str, Any]], student_module: str = "pp_student",
            p2p_timeout_s: float = PP_P2P_TIMEOUT_S) -> list[dict[str, Any]]:
    """Rank body: the student's pipeline on each run. A run's ``"schedule"`` is one of
    :data:`PP_SCHEDULES`: ``"gpipe"`` and ``"1f1b"`` call the student's hand-written
    ``gpipe_step`` / ``one_f_one_b_step`` ``(stage_module, microbatches, targets,
    loss_fn, group, stash)``, ``"torch_gpipe"`` and ``"torch_1f1b"`` their
    ``build_schedule`` and ``pipeline_step`` (torch's ``ScheduleGPipe`` /
    ``Schedule1F1B``), ``"torch_interleaved"`` their ``build_interleaved_schedule``
    (torch's ``ScheduleInterleaved1F1B`` over ``"virtual"`` stages per rank) and
    ``pipeline_step``. Every run splits the model with the student's ``split_model``
    (into ``p·virtual`` stages for the interleaved schedule).

    A run's p is its ``"stages"`` (default: the world size) and it runs on ranks
    0 .. p-1, over a process group of those ranks made here (``dist.new_group`` on every
    rank) whose sends and receives time out after ``p2p_timeout_s``; the other ranks
    record ``{"idle": True}``. So one launch of 4 ranks runs 2- and 4-stage pipelines.
    After each run the ranks agree (an all-reduce) whether it failed anywhere; a failed
    run's group is replaced (no message of it reaches the next run) and its schedule is
    not run again in this launch (its later runs record why): a schedule that deadlocks
    costs one timeout, not one per run.

    Args:
        runs: ``{"schedule", "m", "width", "blocks", "batch", "seed"}`` each, optionally
            ``"stages"``, ``"virtual"`` (stages per rank, >= 2, for
            ``"torch_interleaved"`` only), ``"repeats"`` (timed steps after the recorded
            one, default 0),
            ``"forward_s_per_row"``, ``"backward_s_per_row"``
            (:func:`~perflab.labs.lab10.models.pipeline_model`'s sizes and simulated work).
        student_module: the student's file's module name.
        p2p_timeout_s: the pipeline groups' timeout, seconds (> 0).

    Returns:
        Per run, this rank's record (:func:`_pp_run`): ``"schedule", "stages"`` (p),
        ``"virtual"`` (v), ``"stage_layers"`` (blocks in the stage; a list, one per
        stage, for an interleaved rank), ``"losses"`` (per step: the last stage's loss,
        None elsewhere), ``"step_s", "busy_s"`` (per timed step; the recorded step's
        when none), ``"order"`` (``["F0", "B0", ...]``; ``"S2:F0"`` names the stage on
        an interleaved rank), ``"in_flight_peak"`` (from the order), ``"grads"`` (the
        rank's parameter gradients after the recorded step, lists, its stages in
        order), ``"sends", "recvs"`` (the recorded step's point-to-point messages,
        ``[peer stage, shape]``), ``"collectives"``, ``"peak_in_flight"`` (the stash's
        peak for a hand-written schedule, the order's for torch's) and, for a
        hand-written schedule, ``"stash_peak", "stash_left", "delegated"``
        (:data:`HAND_PP_FORBIDDEN` that ran);
        ``{"idle": True}`` on a rank outside the run's stages, or ``{"error": ...}``.

    Raises:
        ValueError: a run's ``stages`` is < 1 or above the world size, or a timeout not
            > 0 (before any run).
    """
    import datetime

    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(run.get("stages", world)) for run in runs]
    if any(not 1 <= p <= world for p in sizes):
        raise ValueError(f"every run's stages must be in 1..{world} (the ranks), got {sizes}")
    if not p2p_timeout_s > 0:
        raise ValueError(f"p2p_timeout_s must be > 0 seconds, got {p2p_timeout_s!r}")
    timeout = datetime.timedelta(seconds=p2p_timeout_s)
    student = import_student(student_module)
    groups: dict[int, Any] = {}
    failed: dict[str, int] = {}   # schedule -> the run it failed on
    out = []
    for k, (run, p) in enumerate(zip(runs, sizes)):
        if p not in groups:   # every rank, in the same order: new_group is collective
            groups[p] = dist.new_group(list(range(p)), timeout=timeout)
        status = 0
        if rank >= p:
            out.append({"idle": True})
        elif run["schedule"] in failed:
            out.append({"error": f"not run: {run['schedule']} failed on run {failed[run['schedule']]} "
                                 "of this launch (see that run's error)"})
        else:
            try:
                out.append(_pp_run(student, {**run, "stages": p}, rank, groups[p]))
            except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
                out.append(_error(e))
                status = 1
        flag = torch.tensor([status], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)   # the default group: every rank
        if flag.item() and run["schedule"] not in failed:
            failed[run["schedule"]] = k
            del groups[p]   # its messages may still be in flight: the next run gets a new one
    return out


def lab10_rank(tasks: Sequence[tuple[str, tuple, dict]]) -> list[Any]:
    """Several experiments in one launch (starting ranks costs seconds): ``tasks`` is a
    list of ``(name, args, kwargs)``, name "tp" (:func:`tp_rank`) or "pp"
    (:func:`pp_rank`); returns their results in order.

    Raises:
        ValueError: an unknown task name.
    """
    bodies = {"tp": tp_rank, "pp": pp_rank}
    out = []
    for name, args, kwargs in tasks:
        if name not in bodies:
            raise ValueError(f"unknown task {name!r}; use 'tp' or 'pp'")
        out.append(bodies[name](*args, **kwargs))
    return out


def hand_tp_on_ranks(cases: Sequence[dict[str, int]], student_module: str = "tp_student",
                     world_size: int = 2, timeout_s: float = 300,
                     blocks: dict[str, Any] | None = None,
                     torch_tp: dict[str, Any] | None = None) -> list[list[dict[str, Any]]]:
    """Start ``world_size`` gloo ranks and run the student's ``ShardedMLP`` on ``cases``
    (:func:`tp_rank` without DTensor): what a graded check's sandbox side calls on the
    hidden cases. Returns ``[rank][case]`` records (``tp_rank``'s ``"hand"`` lists).

    With ``blocks`` (``{"cases": [block case, ...], "seal": the grader's seal of them}``)
    the same launch also runs the student's ``ShardedBlock`` on those cases (in each of
    :data:`BLOCK_MODES`, :func:`_block_case`) and keeps their records in this process,
    replacing any earlier ones, for the block checks after it
    (:func:`block_check_records`): one launch for every hand-written TP check.

    With ``torch_tp`` (``{"dtensor_seal": the grader's seal of {"dtensor": cases},
    "two_d": [2-D case, ...], "two_d_seal": its seal of {"two_d": those cases}}``) the
    same launch also runs the student's torch answers on grader-drawn inputs, kept the
    same way for the checks of Exercises 2, 4 and 8: their ``parallel_mlp`` on ``cases``
    (mode ``"dtensor"``), their ``parallel_block`` on the block cases (``"dtensor_block"``,
    sealed with the blocks) and their ``data_parallel_grads`` in the 2-D layout on each
    2-D case's own ``[dp, tp]`` mesh (``"two_d"``; :func:`tp_rank`'s ``two_d_cases``).

    Raises:
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    block_cases = list(blocks["cases"]) if blocks is not None else []
    two_d_cases = list(torch_tp.get("two_d", [])) if torch_tp is not None else []
    if blocks is not None or torch_tp is not None:   # always a fresh launch (never an
        _BLOCK_LAUNCH.clear()                          # older file's records)
    ranks = launch_fn(tp_rank, world_size, args=(list(cases), student_module, torch_tp is not None,
                                                 False, block_cases, two_d_cases),
                      device="cpu", timeout_s=timeout_s)
    if blocks is not None:
        _BLOCK_LAUNCH.update(cases=block_cases, seal=blocks.get("seal"),
                             ranks=[r["block"] for r in ranks])
    if torch_tp is not None:
        parts = {"dtensor": {"cases": list(cases), "seal": torch_tp.get("dtensor_seal"),
                             "ranks": [r["dtensor"] for r in ranks]},
                 "two_d": {"cases": two_d_cases, "seal": torch_tp.get("two_d_seal"),
                           "ranks": [r["two_d"] for r in ranks]}}
        if blocks is not None:
            parts["dtensor_block"] = {"cases": block_cases, "seal": blocks.get("seal"),
                                      "ranks": [r["dtensor_block"] for r in ranks]}
        _BLOCK_LAUNCH["parts"] = parts
    return [r["hand"] for r in ranks]


#: The TP checks' shared launch in this process (the notebook's kernel): the block cases
#: the first TP check drew, their seal, every rank's block records, and (``"parts"``)
#: the records of the student's torch answers by mode, each with its cases and seal.
_BLOCK_LAUNCH: dict[str, Any] = {}
#: What a block check's judge reads of a mode's record.
_BLOCK_KEYS = ("out", "x_grad", "grads", "forward", "backward", "saved_bytes",
               "block_saved_bytes", "masks", "delegated", "error")
#: What the judges of the student's torch answers read of a record, by mode.
_TORCH_KEYS = {
    "dtensor": ("out", "x_grad", "fc1_weight_grad", "fc1_bias_grad", "fc2_weight_grad",
                "fc2_bias_grad", "weight_type", "forward_calls", "forward_bytes",
                "backward_calls", "backward_bytes", "error"),
    "dtensor_block": ("out", "x_grad", "weight_type", "norm_weight_type", "forward",
                      "backward", "error"),
    "two_d": ("dp_index", "tp_index", "fc1_weight_grad", "fc1_bias_grad", "fc2_weight_grad",
              "fc2_bias_grad", "tp_bytes", "dp_bytes", "error"),
}


def block_check_records(mode: str) -> dict[str, Any]:
    """The records of the student's ``ShardedBlock`` in one mode (``"tp"``, ``"sp"`` or
    ``"sp_shard"``: :data:`BLOCK_MODES`) from the launch that :func:`hand_tp_on_ranks`
    made with ``blocks`` in this process (the TP check's): ``{"cases", "seal", "records":
    [case][rank] record}`` (the judges' keys only), the cases and seal as the first check
    passed them (the grader's judge verifies the seal: the cases are the ones it drew).

    The same for the student's torch answers that launch ran with ``torch_tp``: mode
    ``"dtensor"`` (``parallel_mlp``), ``"dtensor_block"`` (``parallel_block``) or
    ``"two_d"`` (``data_parallel_grads`` in the 2-D layout), each with its own cases and
    seal.

    Raises:
        ValueError: an unknown mode.
        RuntimeError: no such launch was made in this process.
    """
    modes = (*BLOCK_MODES, *_TORCH_KEYS)
    if mode not in modes:
        raise ValueError(f"mode must be one of {', '.join(map(repr, modes))}, got {mode!r}")
    part = _BLOCK_LAUNCH.get("parts", {}).get(mode) if mode in _TORCH_KEYS else (
        _BLOCK_LAUNCH if "ranks" in _BLOCK_LAUNCH else None)
    if part is None:
        raise RuntimeError("no graded tensor-parallel launch ran in this kernel: the check "
                           "of Exercise 1 starts it; run that check first")
    if mode in _TORCH_KEYS:
        keys, pick = _TORCH_KEYS[mode], (lambda rec: rec)
    else:
        keys, pick = _BLOCK_KEYS, (lambda rec: rec[mode])
    records = [[{key: pick(rec)[key] for key in keys if key in pick(rec)}
                for rec in (r[k] for r in part["ranks"])]
               for k in range(len(part["cases"]))]
    return {"cases": part["cases"], "seal": part["seal"], "records": records}


def pipeline_on_ranks(runs: Sequence[dict[str, Any]], student_module: str = "pp_student",
                      world_size: int = 2, timeout_s: float = 300) -> list[list[dict[str, Any]]]:
    """Start ``world_size`` gloo ranks and run the student's pipeline on ``runs``
    (:func:`pp_rank`; a run's ``"stages"`` may be fewer than ``world_size``): what a
    graded check's sandbox side calls on the hidden runs, what the lab's launch of 2- and
    4-stage runs and its panel measure with. Returns ``[rank][run]`` records.

    Raises:
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    return launch_fn(pp_rank, world_size, args=(list(runs), student_module), device="cpu",
                     timeout_s=timeout_s)


#: The pipeline checks' shared launch in this process (the notebook's kernel): the
#: configs the first graded check drew, their seal, and every rank's records.
_CHECK_LAUNCH: dict[str, Any] = {}
#: What a check's judge reads of a run's record (no timings: they move with the load).
_CHECK_KEYS = ("schedule", "stages", "virtual", "stage_layers", "losses", "order", "grads",
               "in_flight_peak", "stash_peak", "stash_left", "sends", "collectives",
               "delegated", "error", "idle")


#: The pipeline checks that read the shared launch, and the schedules each judges.
PIPELINE_CHECKS = ("gpipe", "1f1b", "torch", "interleaved")


def judged_by(config: dict[str, Any], check: str) -> bool:
    """Whether the pipeline check ``check`` (:data:`PIPELINE_CHECKS`) judges ``config``:
    a config whose ``"torch"`` is ``"interleaved"`` is run by torch's
    ``ScheduleInterleaved1F1B`` only (``check`` "interleaved"); every other config by the
    student's two schedules and torch's ``config["torch"]`` (the other three checks).

    Raises:
        ValueError: an unknown check.
    """
    if check not in PIPELINE_CHECKS:
        raise ValueError(f"check must be one of {PIPELINE_CHECKS}, got {check!r}")
    return (config.get("torch") == "interleaved") == (check == "interleaved")


def check_runs(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of the pipeline checks' shared launch: every config (``{"stages", "m",
    "width", "blocks", "batch", "seed", "torch"}``) run by the student's ``gpipe_step``,
    their ``one_f_one_b_step`` and torch's schedule ``config["torch"]`` (``"gpipe"`` or
    ``"1f1b"``) through their ``build_schedule``, in that order; a config whose
    ``"torch"`` is ``"interleaved"`` (with ``"virtual"`` stages per rank) by their
    ``build_interleaved_schedule`` only. The recorded step only."""
    runs = []
    for c in configs:
        kinds = (("torch_interleaved",) if c.get("torch") == "interleaved"
                 else ("gpipe", "1f1b", f"torch_{c['torch']}"))
        runs += [{**c, "schedule": s, "repeats": 0} for s in kinds]
    return runs


def pipeline_check_records(case: dict[str, Any] | None, schedule: str,
                           student_module: str = "pp_student", world_size: int = 4,
                           timeout_s: float = 300) -> dict[str, Any]:
    """The records of one schedule on the graded pipeline configs, from ONE launch that
    the pipeline checks share (starting 4 ranks costs seconds): what their
    ``student_answer`` returns.

    The first check passes its ``case`` (``{"configs", "seal"}``, drawn and sealed by the
    grader): the call starts ``world_size`` gloo ranks running :func:`check_runs` of the
    configs and keeps their records in this process, replacing any earlier ones. The
    checks after it pass ``case`` None and read those records, with the configs and the
    seal that came with them (the grader's judge verifies the seal: the configs are the
    ones it drew).

    Args:
        case: the first check's case, or None (the launch already made here).
        schedule: ``"gpipe"``, ``"1f1b"``, ``"torch"`` (the config's torch schedule) or
            ``"interleaved"`` (:data:`PIPELINE_CHECKS`; the configs it judges:
            :func:`judged_by`).

    Returns:
        ``{"configs", "seal", "records": [config][rank] record}`` (:func:`pp_rank`'s
        records, the judges' keys only; ``records`` holds the configs ``schedule``
        judges, in order; ``configs`` all of them).

    Raises:
        ValueError: an unknown schedule.
        RuntimeError: ``case`` is None and no launch was made in this process.
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    import warnings

    if schedule not in PIPELINE_CHECKS:
        raise ValueError(f"schedule must be one of {PIPELINE_CHECKS}, got {schedule!r}")
    if case is not None:   # the first check: always a fresh launch (never an older file's records)
        _CHECK_LAUNCH.clear()
        runs = check_runs(case["configs"])
        with warnings.catch_warnings():   # 4 ranks on fewer cores: no timing is read here
            warnings.filterwarnings("ignore", message=".*oversubscribed", category=RuntimeWarning)
            ranks = pipeline_on_ranks(runs, student_module, world_size, timeout_s)
        _CHECK_LAUNCH.update(configs=case["configs"], seal=case.get("seal"), ranks=ranks)
    if not _CHECK_LAUNCH:
        raise RuntimeError("no graded pipeline launch ran in this kernel: the check of "
                           "Exercise 9 starts it; run that check first")
    records, k = [], 0   # k: the config's first run in check_runs' list
    for config in _CHECK_LAUNCH["configs"]:
        interleaved = config.get("torch") == "interleaved"
        if judged_by(config, schedule):
            column = 0 if interleaved else ("gpipe", "1f1b", "torch").index(schedule)
            records.append([{key: rec[key] for key in _CHECK_KEYS if key in rec}
                            for rec in (r[k + column] for r in _CHECK_LAUNCH["ranks"])])
        k += 1 if interleaved else 3
    return {"configs": _CHECK_LAUNCH["configs"], "seal": _CHECK_LAUNCH["seal"],
            "records": records}
