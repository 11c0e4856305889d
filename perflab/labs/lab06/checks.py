"""Lab 06's rank bodies: a student's data-parallel wrapper beside DistributedDataParallel.

* :func:`record_allreduces`: every ``torch.distributed.all_reduce`` a block makes (size,
  dtype, ``async_op``, whether autograd's backward was running), optionally completed no
  earlier than a :class:`~perflab.core.simulated.SimulatedLink` would deliver it;
* :func:`bucket_recorder_hook`: a DDP communication hook that records DDP's own buckets
  (``GradBucket.index()``, ``GradBucket.parameters()``) and then allreduces exactly as
  torch's default ``allreduce_hook`` does;
* :func:`compare_rank`: train the same seeded MLP with the student's per-parameter
  allreduce, the student's bucketed wrapper, DDP with the student's fp16 hook and plain
  DDP; return the facts Lab 06's self-checks show (and, the student's variants only,
  what its graded launch records);
* :func:`edge_mlp`: that MLP with DDP's edge cases (CS336 assignment 2): a weight shared
  by two layers and a frozen bias;
* :func:`graded_records`: the ONE launch the graded checks of Exercises 2, 3 and 4 share
  (:func:`graded_rank` on the runs the grader drew: the student's variants only), and
  what each check reads of it.

Why our own spy: the student's wrapper calls ``dist.all_reduce`` directly (DDP's own
reducer does not go through Python), so patching that one function sees exactly the
student's collectives; torch has no public "collective log" for gloo.
"""
from __future__ import annotations

import importlib
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

from perflab.core.simulated import LinkModel, SimulatedLink
from perflab.distributed import launch_fn
from perflab.labs.checking import watch_calls
from perflab.models import mlp, mlp_batches

__all__ = ["record_allreduces", "bucket_recorder_hook", "compare_rank", "edge_mlp", "grads_of",
           "graded_rank", "graded_records", "GRADED_VARIANTS", "GRAD_ATOL", "GRAD_RTOL"]

#: Tolerances of the gradient comparison with DDP (fp32; DDP divides by world_size before
#: the allreduce, a wrapper may divide after: the two agree to rounding).
GRAD_ATOL, GRAD_RTOL = 1e-6, 1e-5


class _LinkWork:
    """A ``dist.Work`` stand-in whose ``wait()`` returns no earlier than the modelled link."""

    def __init__(self, work: Any, done_s: float, clock: Any):
        self._work, self._done_s, self._clock = work, done_s, clock

    def wait(self, timeout: Any = None) -> bool:
        self._work.wait()
        left = self._done_s - self._clock.now()
        if left > 0:
            threading.Event().wait(left)  # sleep: the "wire" is busy, no CPU burned
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed() and self._clock.now() >= self._done_s

    def get_future(self) -> Any:
        return self._work.get_future()  # real completion only (DDP hooks use the link hook)


@contextmanager
def record_allreduces(link: SimulatedLink | None = None, *, barriers: bool = False
                      ) -> Iterator[list[dict[str, Any]]]:
    """Record every ``torch.distributed.all_reduce`` call made inside the block (and, with
    ``barriers``, every ``dist.barrier``, as ``{"barrier": True}`` in the same list, so
    their order is kept).

    Each all-reduce record: ``{"numel", "dtype", "nbytes", "async_op", "in_backward"}``
    (``in_backward``: autograd's engine was running a backward pass, read with
    ``torch._C._current_graph_task_id() != -1``). With ``link``, each call is booked on a
    :class:`~perflab.core.simulated.LinkModel` shared by the block's calls and completes no earlier
    than the model says (a synchronous call returns then; an async one's ``wait()``
    does); records then also hold ``"duration_s"`` (the link's time for that message).
    The original function is restored on exit, also when the block raises.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = c10d.all_reduce
    model = LinkModel(link, world_size=dist.get_world_size()) if link is not None else None
    calls: list[dict[str, Any]] = []

    def spy(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        rec = {"numel": tensor.numel(), "dtype": str(tensor.dtype).replace("torch.", ""),
               "nbytes": tensor.numel() * tensor.element_size(), "async_op": bool(async_op),
               "in_backward": torch._C._current_graph_task_id() != -1}
        calls.append(rec)
        work = real(tensor, op=op, group=group, async_op=async_op)
        if model is None:
            return work
        rec["duration_s"] = model.duration_s(rec["nbytes"])
        _, done = model.schedule(rec["nbytes"])
        linked = _LinkWork(work if async_op else _Done(), done, model.clock)
        if async_op:
            return linked
        linked.wait()
        return None

    real_barrier = c10d.barrier

    def barrier_spy(*args, **kwargs):
        calls.append({"barrier": True})
        return real_barrier(*args, **kwargs)

    dist.all_reduce = c10d.all_reduce = spy
    if barriers:
        dist.barrier = c10d.barrier = barrier_spy
    try:
        yield calls
    finally:
        dist.all_reduce = c10d.all_reduce = real
        dist.barrier = c10d.barrier = real_barrier


class _Done:
    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def bucket_recorder_hook(state: list, bucket):  # no annotations: DDP inspects them
    """DDP comm hook: append ``(bucket.index(), [parameter data_ptr, ...])`` to ``state``
    (a list), then allreduce the bucket as torch's ``default_hooks.allreduce_hook`` does
    (divide by world size, ``all_reduce(async_op=True)``). ``(list, dist.GradBucket) ->
    torch.futures.Future[Tensor]``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.append((bucket.index(), [p.data_ptr() for p in bucket.parameters()]))
    return default_hooks.allreduce_hook(None, bucket)


def edge_mlp(sizes: Sequence[int], seed: int = 0) -> torch.nn.Sequential:
    """:func:`perflab.models.mlp` with two of DDP's edge cases: the third Linear's weight
    IS the second's (tied: ``model.parameters()`` lists it once, and autograd sums both
    uses into one ``.grad``), and the first Linear's bias is frozen (``requires_grad=False``:
    no gradient, so DDP leaves it out of every bucket).

    Input ``(B, sizes[0])`` float32, logits ``(B, sizes[-1])``.

    Raises:
        ValueError: fewer than three Linear layers, or ``sizes[1] != sizes[2] != sizes[3]``
            (the tied layers must be square and alike), as well as :func:`mlp`'s errors.
    """
    if len(sizes) < 4 or not sizes[1] == sizes[2] == sizes[3]:
        raise ValueError(f"edge_mlp ties Linear 2's weight to Linear 1's: give >= 4 sizes with "
                         f"sizes[1] == sizes[2] == sizes[3], got {list(sizes)!r}")
    model = mlp(sizes, seed)
    model[4].weight = model[2].weight      # Sequential: Linear, ReLU, Linear, ReLU, Linear, ...
    model[0].bias.requires_grad_(False)
    return model


def grads_of(model: torch.nn.Module) -> list[list[float]]:
    """Every parameter's ``.grad`` flattened to a list (zeros where None), in
    ``model.parameters()`` order."""
    return [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).tolist()
            for p in model.parameters()]


def _train(model, step_fn, data, lr) -> tuple[list, list, list[float]]:
    """SGD on ``data`` with ``step_fn(x, y) -> loss`` doing forward, backward and the
    gradient sync; returns (grads after each step, final params, losses)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads, losses = [], []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        losses.append(float(step_fn(x, y).detach()))
        grads.append(grads_of(model))
        opt.step()
    return grads, [p.detach().reshape(-1).tolist() for p in model.parameters()], losses


def compare_rank(student_module: str, sizes: Sequence[int], bucket_cap_mb: float,
                 steps: int = 3, batch: int = 4, lr: float = 0.1, seed: int = 0,
                 edges: bool = False, *, with_ddp: bool = True) -> dict[str, Any]:
    """Rank body of Lab 06's checks: the student's code and DDP on the same seeded MLP.

    Imports ``student_module`` (the file the lab writes with ``%%writefile``) and trains
    ``perflab.models.mlp(sizes, seed)`` for ``steps`` SGD steps on this rank's
    ``perflab.models.mlp_batches`` with: ``allreduce_gradients(model)`` after backward
    ("per_param"), ``MyDDP(model, bucket_cap_mb=...)`` with ``finish_gradient_sync()``
    after backward ("bucketed"), DDP with ``register_comm_hook(None, my_fp16_hook)``
    ("fp16"), torch's ``fp16_compress_hook`` ("torch_fp16") and plain DDP with
    ``bucket_cap_mb`` ("ddp", its buckets recorded by :func:`bucket_recorder_hook`).
    With ``edges=True`` the model is :func:`edge_mlp` (a tied weight, a frozen bias).
    With ``with_ddp=False`` only the student's three variants run (the graded launch:
    the grader computes DDP's gradients and buckets on its side); ``"torch_fp16"`` and
    ``"ddp"`` are then absent and ``"ddp_buckets"`` is empty.

    Returns:
        ``{variant: {"grads": [[...] per parameter] per step, "params", "losses",
        "calls": [[all_reduce records] per step]}}``, plus ``"ddp_buckets"``: DDP's
        buckets at the last step as lists of parameter indices (launch order),
        ``"student_buckets"``: ``MyDDP.buckets`` the same way, ``"wraps_ddp"``: whether
        the student's wrapper built or holds a DistributedDataParallel,
        ``"fp16_delegates"``: whether ``my_fp16_hook`` is or calls torch's
        ``fp16_compress_hook``, ``"numels"``: elements per parameter,
        ``"requires_grad"``: per parameter, ``"errors"``:
        ``{variant: "Type: message"}`` for each variant whose student code raised (its
        lists are then empty; both ranks raise alike, so the launch goes on).
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    student = importlib.import_module(student_module)
    build = edge_mlp if edges else mlp
    data = mlp_batches(sizes, batch, steps, dist.get_rank(), seed)
    loss_fn = torch.nn.functional.cross_entropy
    out: dict[str, Any] = {"errors": {}, "wraps_ddp": False, "fp16_delegates": False,
                           "student_buckets": []}

    def run(name, model, step_fn):
        """Train one variant; a student's exception is recorded (the other exercises are
        still checked: partial credit), as ``out["errors"][name]``."""
        calls_per_step = []

        def step(x, y):
            with record_allreduces() as calls:
                loss = step_fn(x, y)
            calls_per_step.append(calls)
            return loss
        try:
            grads, params, losses = _train(model, step, data, lr)
        except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
            out["errors"][name] = f"{type(e).__name__}: {e}"
            grads, params, losses = [], [], []
        out[name] = {"grads": grads, "params": params, "losses": losses,
                     "calls": calls_per_step}

    model = build(sizes, seed)

    def per_param(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        student.allreduce_gradients(model)
        return loss
    run("per_param", model, per_param)

    built = []
    real_init = DDP.__init__

    def counting_init(self, *a, **k):
        built.append(1)
        real_init(self, *a, **k)
    DDP.__init__ = counting_init  # counted while MyDDP is built and trained
    inner, wrapper = build(sizes, seed), None
    try:
        wrapper = student.MyDDP(inner, bucket_cap_mb=bucket_cap_mb)
    except Exception as e:  # noqa: BLE001 - the student's code: reported, not raised
        out["errors"]["bucketed"] = f"{type(e).__name__}: {e}"
        out["bucketed"] = {"grads": [], "params": [], "losses": [], "calls": []}
    try:
        if wrapper is not None:
            def bucketed(x, y):
                loss = loss_fn(wrapper(x), y)
                loss.backward()
                wrapper.finish_gradient_sync()
                return loss
            run("bucketed", inner, bucketed)
            index = {p.data_ptr(): i for i, p in enumerate(inner.parameters())}
            out["student_buckets"] = [[index.get(p.data_ptr(), -1) for p in b]
                                      for b in getattr(wrapper, "buckets", [])]
    finally:
        DDP.__init__ = real_init
    out["wraps_ddp"] = bool(built) or any(isinstance(m, DDP) for m in
                                          getattr(wrapper, "modules", lambda: [])())
    out["numels"] = [p.numel() for p in inner.parameters()]
    out["requires_grad"] = [p.requires_grad for p in inner.parameters()]

    torch_hook = default_hooks.fp16_compress_hook
    hooks = (("fp16", student.my_fp16_hook), ("torch_fp16", torch_hook))
    for name, hook in hooks if with_ddp else hooks[:1]:
        ddp = DDP(build(sizes, seed), bucket_cap_mb=bucket_cap_mb)
        ddp.register_comm_hook(None, hook)
        if name == "fp16":  # torch's hook reached while the student's runs, however named
            # DDP calls a CPU model's comm hooks in backward, on this thread
            with watch_calls({"fp16_compress_hook": torch_hook}) as delegated:
                run(name, ddp.module, _ddp_step(ddp, loss_fn))
        else:
            run(name, ddp.module, _ddp_step(ddp, loss_fn))
    out["fp16_delegates"] = student.my_fp16_hook is torch_hook or bool(delegated)
    if not with_ddp:
        out["ddp_buckets"], out["ddp_bucket_index"] = [], []
        return out

    ddp = DDP(build(sizes, seed), bucket_cap_mb=bucket_cap_mb)
    seen: list = []
    ddp.register_comm_hook(seen, bucket_recorder_hook)
    marks = []

    def ddp_step(x, y):
        marks.append(len(seen))
        return _ddp_step(ddp, loss_fn)(x, y)
    run("ddp", ddp.module, ddp_step)
    index = {p.data_ptr(): i for i, p in enumerate(ddp.module.parameters())}
    last = seen[marks[-1]:]  # the hook runs as DDP launches each bucket, in launch order
    out["ddp_bucket_index"] = [i for i, _ in last]
    out["ddp_buckets"] = [[index[ptr] for ptr in ptrs] for _, ptrs in last]
    return out


def _ddp_step(ddp, loss_fn):
    def step(x, y):
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP's reducer has waited for every bucket when this returns
        return loss
    return step


#: The student's variants of :func:`compare_rank` the graded checks judge: Exercise 2's
#: ``allreduce_gradients``, Exercise 3's ``MyDDP``, Exercise 4's ``my_fp16_hook``.
GRADED_VARIANTS = ("per_param", "bucketed", "fp16")
#: What a graded check's judge reads of a variant's records (an all-reduce record: its
#: size, dtype, bytes, ``async_op`` and whether backward was running).
_CALL_KEYS = ("numel", "dtype", "nbytes", "async_op", "in_backward")
#: The graded checks' shared launch in this process: the runs the first graded check
#: drew, their seal, and every rank's records (``[rank][run]``).
_GRADED_LAUNCH: dict[str, Any] = {}


def graded_rank(student_module: str, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank body of the graded launch: :func:`compare_rank` of ``student_module`` on each
    run (``{"sizes", "bucket_cap_mb", "steps", "batch", "lr", "seed", "edges"}``, as the
    grader drew it), the student's variants only (``with_ddp=False``)."""
    return [compare_rank(student_module, r["sizes"], r["bucket_cap_mb"], r["steps"], r["batch"],
                         r["lr"], r["seed"], r["edges"], with_ddp=False) for r in runs]


def _variant_record(rec: dict[str, Any], variant: str) -> dict[str, Any]:
    """A judge's view of one rank's :func:`compare_rank` result for ``variant``."""
    mine = rec.get(variant, {})
    out = {"grads": mine.get("grads", []),
           "calls": [[{k: c.get(k) for k in _CALL_KEYS} for c in step]
                     for step in mine.get("calls", [])],
           "error": rec["errors"].get(variant)}
    if variant == "bucketed":
        out.update(buckets=rec["student_buckets"], wraps_ddp=rec["wraps_ddp"])
    elif variant == "fp16":
        out["delegates"] = rec["fp16_delegates"]
    return out


def graded_records(case: dict[str, Any] | None, variant: str,
                   student_module: str = "ddp_student", world_size: int = 2,
                   timeout_s: float = 300) -> dict[str, Any]:
    """The records of one variant of the student's file on the graded runs, from ONE
    launch that Lab 06's graded checks share (starting 2 ranks costs seconds): what their
    ``student_answer`` returns.

    The first graded check (Exercise 2's) passes its ``case`` (``{"runs", "seal"}``, drawn
    and sealed by the grader): the call starts ``world_size`` gloo ranks running
    :func:`graded_rank` on the runs and keeps their records in this process, replacing
    any earlier ones. The checks after it pass ``case`` None and read those records, with
    the runs and the seal that came with them (the grader's judge verifies the seal: the
    runs are the ones it drew).

    Args:
        case: the first check's case, or None (the launch already made here).
        variant: one of :data:`GRADED_VARIANTS`.

    Returns:
        ``{"runs", "seal", "records": [run][rank] record}``; a record is ``{"grads": [step]
        [parameter] flat list, "calls": [step][all_reduce record], "error": "Type: message"
        or None}``, plus ``"buckets"`` (``MyDDP.buckets`` as parameter indices) and
        ``"wraps_ddp"`` for ``"bucketed"``, ``"delegates"`` (torch's fp16 hook ran) for
        ``"fp16"``.

    Raises:
        ValueError: an unknown variant.
        RuntimeError: ``case`` is None and no graded launch was made in this process.
        perflab.distributed.RankFailedError, LaunchTimeoutError: as ``launch_fn``.
    """
    if variant not in GRADED_VARIANTS:
        raise ValueError(f"variant must be one of {GRADED_VARIANTS}, got {variant!r}")
    if case is not None:   # the first check: always a fresh launch (never an older file's records)
        _GRADED_LAUNCH.clear()
        ranks = launch_fn(graded_rank, world_size, args=(student_module, list(case["runs"])),
                          device="cpu", timeout_s=timeout_s)
        _GRADED_LAUNCH.update(runs=case["runs"], seal=case.get("seal"), ranks=ranks)
    if not _GRADED_LAUNCH:
        raise RuntimeError("no graded data-parallel launch ran in this process: the check of "
                           "Exercise 2 (check_per_param) starts it; run that check first")
    ranks = _GRADED_LAUNCH["ranks"]
    records = [[_variant_record(r[k], variant) for r in ranks]
               for k in range(len(_GRADED_LAUNCH["runs"]))]
    return {"runs": _GRADED_LAUNCH["runs"], "seal": _GRADED_LAUNCH["seal"], "records": records}
