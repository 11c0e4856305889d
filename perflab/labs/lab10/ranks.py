"""Lab 10's rank bodies: the student's tensor- and pipeline-parallel code on every rank.

Each ``*_rank`` function is what every rank runs under
:func:`perflab.distributed.launch_fn` (module level, so spawned ranks import it). They
import the student's own files by module name (written next to the notebook with
``%%writefile``, as Labs 06 and 09 do): ``tp_student`` defines ``ShardedMLP`` (Megatron's
f/g by hand; Shoeybi et al. 2019, arXiv:1909.08053, §3), ``make_mesh``
(``init_device_mesh``), ``parallel_mlp`` (``parallelize_module``) and
``data_parallel_grads`` (the 2-D layout's gradient all-reduce); ``pp_student`` defines
``split_model``, ``BusyTimer``, ``build_schedule`` and ``pipeline_step``
(``torch.distributed.pipelining``).

:func:`hand_tp_on_ranks` and :func:`pipeline_on_ranks` start the ranks for a graded
check's hidden cases (and the panel); :func:`shard_compute_s` times one shard's compute in
the calling process.

A case that raises in the student's code is returned as ``{"error": "Type: message"}``
(the notebook and the judges show it), so one bad case does not hide the others.

Exercise 1 asks for Megatron's f and g written by hand: while the student's
``ShardedMLP`` is built and runs, the rank records every ``torch.distributed.all_reduce``
(:class:`HandTPTrace`: its bytes, and whether one of the student's own
``torch.autograd.Function`` s issued it) and whether torch's tensor parallelism ran
(:data:`HAND_TP_FORBIDDEN`, watched by :func:`perflab.labs.checking.watch_calls`): the
records say so even when the ranks were launched outside a graded call (the lab's own
launch), where no spy of the notebook's reaches them.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Callable, Sequence

import torch

from perflab.analysis.sharding import count_collectives
from perflab.core.timing import PerfCounterClock
from perflab.distributed import launch_fn
from perflab.labs.lab10.comm import count_functional_collectives
from perflab.labs.lab10.models import mlp_block, pipeline_batch, pipeline_model, tp_tensors

__all__ = ["import_student", "shard_compute_s", "tp_rank", "pp_rank", "lab10_rank",
           "hand_tp_on_ranks", "pipeline_on_ranks", "HandTPTrace", "HAND_TP_FORBIDDEN"]

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


def _code_of(fn: Any) -> Any:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    return getattr(fn, "__code__", None)


class HandTPTrace:
    """While open, on this rank (``sys.setprofile``, this thread; CPU autograd runs the
    backward in the calling thread): every ``torch.distributed.all_reduce`` however it is
    reached (an alias, ``distributed_c10d``'s own name), as ``[bytes, own]`` with ``own``
    True when a ``forward`` or ``backward`` of a ``torch.autograd.Function`` subclass
    defined in ``module`` is on the stack. A profile function already set (a
    :func:`~perflab.labs.checking.watch_calls` spy) keeps getting every event.

    Attributes:
        all_reduces: ``[[bytes, own], ...]`` in call order.
    """

    def __init__(self, module: Any) -> None:
        import torch.distributed as dist

        self.all_reduces: list[list] = []
        self._all_reduce = _code_of(dist.all_reduce)
        self._own = set()
        todo = list(torch.autograd.Function.__subclasses__())
        while todo:
            cls = todo.pop()
            todo.extend(cls.__subclasses__())
            if cls.__module__ == module.__name__:
                for method in ("forward", "backward"):
                    code = _code_of(cls.__dict__.get(method))
                    if code is not None:
                        self._own.add(code)
        self._outer: Any = None

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code is self._all_reduce:
                tensor = frame.f_locals.get("tensor")
                nbytes = tensor.numel() * tensor.element_size() if torch.is_tensor(tensor) else 0
                caller, own = frame.f_back, False
                while caller is not None and not own:
                    own, caller = caller.f_code in self._own, caller.f_back
                self.all_reduces.append([int(nbytes), own])
        if self._outer is not None:
            self._outer(frame, event, arg)

    def __enter__(self) -> "HandTPTrace":
        self._outer = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._outer)


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
    (``"delegated"``: the spy's labels)."""
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
            "fc1_weight_grad": _local(fc1.weight.grad), "fc2_weight_grad": _local(fc2.weight.grad),
            "fc2_bias_grad": _local(fc2.bias.grad),
            "tp_calls": dict(tp_comm.calls), "tp_bytes": dict(tp_comm.bytes),
            "dp_calls": dict(dp_comm.calls), "dp_bytes": dict(dp_comm.bytes)}


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
            dtensor: bool = True, two_d: bool = False) -> dict[str, Any]:
    """Rank body: the student's tensor-parallel MLP block on each case, by hand and (with
    ``dtensor``) with ``parallelize_module`` over a 1-D ``DeviceMesh`` of all ranks.

    Args:
        cases: ``{"d", "batch", "seq", "seed"}`` each: the block is :func:`mlp_block` ``(d,
            seed)``, the input and upstream gradient :func:`tp_tensors` ``(case)``.
        student_module: the student's file's module name.
        dtensor: also run ``student.parallel_mlp`` over ``student.make_mesh((world,))``
            (the student's ``init_device_mesh``).
        two_d: with 4 or more ranks (an even number), also the 2-D run: a
            ``make_mesh((2, world // 2), ("dp", "tp"))`` mesh, ``parallel_mlp`` over its
            "tp" dimension, ``student.data_parallel_grads`` over its "dp" group.

    Returns:
        ``{"hand": [per case], "dtensor": [per case], "two_d": [per case],
        "unwaited_collectives": functional collectives never awaited at the end (0; None
        where torch does not tell)}``; a case holds this rank's output, input gradient and
        LOCAL parameter gradients (lists), and the collectives counted in the forward and
        in the backward (calls and bytes by kind), or ``{"error": ...}``.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    student = import_student(student_module)
    out: dict[str, Any] = {"hand": [], "dtensor": [], "two_d": []}
    for case in cases:
        try:
            out["hand"].append(_hand_case(student, case, rank, world))
        except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
            out["hand"].append(_error(e))
        dist.barrier()
    if dtensor:
        out["dtensor"] = _on_student_mesh(student, cases, _dtensor_case, (world,))
    if two_d and world % 2 == 0 and world >= 4:
        out["two_d"] = _on_student_mesh(student, cases, _two_d_case, (2, world // 2),
                                        ("dp", "tp"))
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


def _pp_run(student: Any, run: dict[str, Any], rank: int, world: int,
            group: Any = None) -> dict[str, Any]:
    """One run on the pipeline's ``p = run["stages"]`` ranks (0 .. p-1): with ``p`` below
    the world size the student's ``build_schedule`` gets the sub-group ``group`` of those
    ranks (``PipelineStage(..., group=group)``), and the step's barriers are the group's."""
    import torch.distributed as dist

    stages_n = int(run.get("stages", world))
    model = pipeline_model(int(run["width"]), int(run["blocks"]), int(run["seed"]),
                           float(run.get("forward_s_per_row", 0.0)),
                           float(run.get("backward_s_per_row", 0.0)))
    stages = student.split_model(model, stages_n)
    stage_module = stages[rank]
    timer = student.BusyTimer(stage_module)
    x, y = pipeline_batch(int(run["width"]), int(run["batch"]), int(run["seed"]))
    clock = PerfCounterClock()
    losses, step_s, busy_s, peak = [], [], [], []
    extra = {} if group is None else {"group": group}
    sched = student.build_schedule(stage_module, rank, stages_n, int(run["m"]), run["schedule"],
                                   **extra)
    for _ in range(1 + int(run.get("repeats", 0))):   # the first step (shape inference): a warm-up
        timer.reset()
        dist.barrier(group=group)
        t0 = clock.now()
        loss = student.pipeline_step(sched, rank, stages_n, x, y)
        dist.barrier(group=group)   # the step ends when the LAST stage is done (it returns early)
        step_s.append(clock.now() - t0)
        busy_s.append(float(timer.busy_s))
        peak.append(int(timer.peak_in_flight))
        losses.append(None if loss is None else float(loss))
        stage_module.zero_grad(set_to_none=True)
    return {"losses": losses, "step_s": step_s[1:] or step_s, "busy_s": busy_s[1:] or busy_s,
            "peak_in_flight": peak[-1], "stage_layers": len(stage_module),
            "stages": len(stages)}


def pp_rank(runs: Sequence[dict[str, Any]], student_module: str = "pp_student"
            ) -> list[dict[str, Any]]:
    """Rank body: the student's pipeline (``split_model`` into ``p`` stages,
    ``build_schedule``, ``pipeline_step``) on each run, timed by the student's
    ``BusyTimer`` (busy seconds of this stage) and by the step's wall clock, from a
    barrier before the step to a barrier after it: the whole pipeline's step, the same on
    every stage (the last stage's ``step`` returns before the first stage's backward ends).

    A run's ``p`` is its ``"stages"`` (default: the world size). With ``p`` below the
    world size the run uses ranks 0 .. p-1 only, on a sub-group of them (made here with
    ``dist.new_group`` on every rank, once per p) that the student's ``build_schedule``
    receives as ``group=``; the other ranks wait at the barrier after the run and record
    ``{"idle": True}``. So one launch of 4 ranks runs 2- and 4-stage pipelines.

    Args:
        runs: ``{"schedule": "gpipe" | "1f1b", "m", "width", "blocks", "batch", "seed",
            "forward_s_per_row", "backward_s_per_row", "repeats"}`` each, optionally
            ``"stages"`` (:func:`~perflab.labs.lab10.models.pipeline_model`'s sizes and
            simulated work).

    Returns:
        Per run, this rank's ``{"losses" (per step: the loss on the last stage, None
        elsewhere), "step_s", "busy_s" (per timed step), "peak_in_flight",
        "stage_layers", "stages"}``, ``{"idle": True}`` on a rank outside the run's
        stages, or ``{"error": ...}``.

    Raises:
        ValueError: a run's ``stages`` is < 1 or above the world size (before any run).
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(run.get("stages", world)) for run in runs]
    if any(not 1 <= p <= world for p in sizes):
        raise ValueError(f"every run's stages must be in 1..{world} (the ranks), got {sizes}")
    groups = {p: dist.new_group(list(range(p))) for p in sorted(set(sizes)) if p < world}
    student = import_student(student_module)
    out = []
    for run, p in zip(runs, sizes):
        if rank >= p:
            out.append({"idle": True})
        else:
            try:
                out.append(_pp_run(student, run, rank, world, groups.get(p)))
            except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
                out.append(_error(e))
        dist.barrier()
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
                     world_size: int = 2, timeout_s: float = 300) -> list[list[dict[str, Any]]]:
    """Start ``world_size`` gloo ranks and run the student's ``ShardedMLP`` on ``cases``
    (:func:`tp_rank` without DTensor): what a graded check's sandbox side calls on the
    hidden cases. Returns ``[rank][case]`` records (``tp_rank``'s ``"hand"`` lists).

    Raises:
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    ranks = launch_fn(tp_rank, world_size, args=(list(cases), student_module, False),
                      device="cpu", timeout_s=timeout_s)
    return [r["hand"] for r in ranks]


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
