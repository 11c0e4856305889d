"""Lab 06's references, grader-only: the runs the graded data-parallel checks draw, what
the ranks of such a run must compute (the ranks' mean gradient in one process, fp32 and
as torch's ``fp16_compress_hook`` rounds it; DDP's bucket assignment by torch's own rule)
and the judges of the student's per-parameter allreduce, ``MyDDP`` and fp16 hook on them,
and the seal that lets the checks after the first judge the runs the first one drew.

A run is ``{"sizes", "bucket_cap_mb", "steps", "batch", "lr", "seed", "edges"}``:
:func:`perflab.labs.lab06.checks.compare_rank`'s arguments; the launch is 2 gloo ranks
(:data:`WORLD_SIZE`), rank r training on ``mlp_batches(sizes, batch, steps, r, seed)``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from perflab.labs.lab06.checks import edge_mlp
from perflab.models import mlp, mlp_batches
from perflab.course.references.sealing import is_sealed, seal  # re-exported

__all__ = ["WORLD_SIZE", "seal", "is_sealed", "draw_runs", "run_model", "mean_grads",
           "same_grads", "ddp_buckets", "assignment_cases", "torch_assignment",
           "judge_per_param", "judge_bucketed", "judge_fp16"]

#: Ranks of the graded launch.
WORLD_SIZE = 2


def run_model(sizes: Sequence[int], seed: int = 0, edges: bool = False) -> torch.nn.Sequential:
    """The run's model: :func:`perflab.models.mlp`, or :func:`edge_mlp` (a tied weight and a
    frozen bias: DDP's edge cases) with ``edges``."""
    return (edge_mlp if edges else mlp)(sizes, seed)


def _ready_bytes(sizes: Sequence[int], edges: bool) -> list[int]:
    """Bytes of the parameters that get a gradient, each once, in reverse order (the
    order backward makes them ready, the order DDP's buckets follow)."""
    params = [p for p in run_model(sizes, 0, edges).parameters() if p.requires_grad]
    return [p.numel() * p.element_size() for p in reversed(params)]


def draw_runs(rng) -> list[dict[str, Any]]:
    """The graded launch's runs, drawn at grade time (``rng``: ``random.Random``): three
    tiny MLPs on hidden seeded data, 2 or 3 SGD steps each.

    1. three Linear layers, the cap the bytes of its first 1-3 ready parameters exactly
       (a bucket that reaches its cap closes: ``>=``), so 2 or more buckets;
    2. four Linear layers, a cap drawn between the smallest parameter's bytes and all of
       them (1 to many buckets);
    3. the MLP with a tied weight and a frozen bias (``edges``), widths ``[a, h, h, h, c]``
       with ``h >= c + 3`` and the cap the bytes of its last layer and the shared layer's
       bias: the shared weight (over the cap) then joins a small bias's bucket and closes it.
    """
    def common() -> dict[str, Any]:
        return {"steps": rng.randint(2, 3), "batch": rng.randint(2, 6),
                "lr": rng.choice([0.05, 0.1, 0.2]), "seed": rng.randint(0, 9999)}

    runs = []
    sizes = [rng.randint(4, 16), rng.randint(4, 24), rng.randint(4, 24), rng.randint(2, 8)]
    ready = _ready_bytes(sizes, False)
    runs.append({"sizes": sizes, "bucket_cap_mb": sum(ready[:rng.randint(1, 3)]) / 2**20,
                 "edges": False, **common()})
    sizes = [rng.randint(4, 16)] + [rng.randint(4, 20) for _ in range(3)] + [rng.randint(2, 8)]
    ready = _ready_bytes(sizes, False)
    cap = 4 * rng.randint(min(ready) // 4, sum(ready) // 4)
    runs.append({"sizes": sizes, "bucket_cap_mb": cap / 2**20, "edges": False, **common()})
    c = rng.randint(2, 5)
    h = rng.randint(c + 3, 16)
    sizes = [rng.randint(4, 16), h, h, h, c]
    ready = _ready_bytes(sizes, True)   # b3, W3, b2 (then b1, the shared W, W0)
    runs.append({"sizes": sizes, "bucket_cap_mb": sum(ready[:3]) / 2**20, "edges": True,
                 **common()})
    return runs


def mean_grads(run: dict[str, Any], fp16: bool = False) -> tuple[list, list]:
    """Data parallelism in one process: each step's mean gradient of the :data:`WORLD_SIZE`
    ranks (fp32, or with ``fp16`` as torch's ``fp16_compress_hook`` makes it: each rank
    sends ``half(grad) / 2``, summed in fp16), SGD stepped on it.

    Returns:
        ``(mean, scale)``: per step, per parameter (``model.parameters()`` order; zeros
        for a frozen one) flat lists: the mean gradient, and ``(|rank 0's| + |rank 1's|)
        / 2`` (the scale of fp16's roundings).
    """
    model = run_model(run["sizes"], run["seed"], run["edges"])
    data = [mlp_batches(run["sizes"], run["batch"], run["steps"], rank, run["seed"])
            for rank in range(WORLD_SIZE)]
    opt = torch.optim.SGD(model.parameters(), lr=run["lr"])
    steps, scales = [], []
    for batches in zip(*data):
        per_rank = []
        for inputs, labels in batches:  # a frozen parameter: no gradient, zeros recorded
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            trained = [p for p in model.parameters() if p.requires_grad]
            grads = iter(torch.autograd.grad(loss, trained))
            per_rank.append([next(grads) if p.requires_grad else torch.zeros_like(p)
                             for p in model.parameters()])
        if fp16:
            mean = [(a.half().div_(2) + b.half().div_(2)).float() for a, b in zip(*per_rank)]
        else:
            mean = [(a + b) / 2 for a, b in zip(*per_rank)]
        for p, g in zip(model.parameters(), mean):
            p.grad = g if p.requires_grad else None
        steps.append([g.reshape(-1).tolist() for g in mean])
        scales.append([((a.abs() + b.abs()) / 2).reshape(-1).tolist() for a, b in zip(*per_rank)])
        opt.step()
    return steps, scales


def same_grads(got_steps: Any, want_steps: list, rank: int, rtol: float,
               scales: list | None = None) -> None:
    """Assert a rank's recorded gradients are ``want_steps`` within ``1e-6 + rtol x |want|``
    (or ``x scales``), step by step and parameter by parameter, naming the first that is
    not (and saying when it is the sum of the ranks: not divided by the world size)."""
    assert isinstance(got_steps, list) and len(got_steps) == len(want_steps), (
        f"rank {rank}: {len(got_steps) if isinstance(got_steps, list) else got_steps!r} steps "
        f"recorded, expected {len(want_steps)}")
    for step, (got, want) in enumerate(zip(got_steps, want_steps), start=1):
        assert isinstance(got, list) and len(got) == len(want), (
            f"rank {rank}, step {step}: {len(got) if isinstance(got, list) else got!r} "
            f"parameters, expected {len(want)}")
        for i, (a, b) in enumerate(zip(got, want)):
            a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
            tol = 1e-6 + rtol * np.abs(b if scales is None else np.asarray(scales[step - 1][i]))
            assert a.shape == b.shape and (np.abs(a - b) <= tol).all(), (
                f"rank {rank}, step {step}, parameter {i}: not the ranks' mean gradient" + (
                    " (the sum: not divided by the world size)" if a.shape == b.shape
                    and (np.abs(a - 2 * b) <= 2 * tol).all() else ""))


def ddp_buckets(sizes: Sequence[int], bucket_cap_mb: float, edges: bool = False) -> list[list[int]]:
    """DDP's buckets as DDP rebuilds them when ``bucket_cap_mb`` is given (torch's own
    ``_compute_bucket_assignment_by_size``, one cap): the parameters that get a gradient,
    each once, in reverse order; as lists of ``model.parameters()`` indices."""
    import torch.distributed as dist

    params = list(run_model(sizes, 0, edges).parameters())
    order = [i for i in range(len(params))[::-1] if params[i].requires_grad]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in order], [int(round(bucket_cap_mb * 2**20))], [], order)
    return [list(b) for b in buckets]


def assignment_cases(rng) -> list[dict[str, Any]]:
    """Hidden ``bucket_assignment`` cases: fp32 size lists (bytes), each with a parameter
    over the cap right after a small one, one with a bucket that reaches its cap exactly,
    four with a first-bucket cap: ``{"param_bytes", "cap", "first_cap"}``."""
    cases = []
    for k in range(8):
        cap = 16 * rng.randint(4, 128)
        sizes = [4 * rng.randint(1, cap // 2) for _ in range(rng.randint(6, 12))]
        if k == 1:  # a bucket that reaches its cap exactly
            sizes[:3] = [cap // 2, cap // 4, cap // 4]
        at = 0 if k % 2 == 0 else rng.randrange(3, len(sizes) - 1)
        sizes[at] = 4 * rng.randint(1, cap // 64)                    # small, ...
        sizes[at + 1] = cap + 4 * rng.randint(1, cap // 2)           # ... then over the cap
        if k == 3:  # a first bucket of one small parameter, closed by the first-bucket cap
            sizes[0] = 4 * rng.randint(1, cap // 16)
        first_cap = [None, None, cap // 4, sizes[0], 2 * cap, cap, None,
                     4 * rng.randint(1, cap // 8)][k]
        cases.append({"param_bytes": sizes, "cap": cap, "first_cap": first_cap})
    return cases


def torch_assignment(case: dict[str, Any]) -> list[list[int]]:
    """torch's own rule on an :func:`assignment_cases` case, as DDP calls it."""
    import torch.distributed as dist

    tensors = [torch.empty(n // 4) for n in case["param_bytes"]]
    limits = [case["cap"]] if case["first_cap"] is None else [case["first_cap"], case["cap"]]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        tensors, limits, [False] * len(tensors), list(range(len(tensors))))
    return [list(b) for b in buckets]


def _runs_records(runs: list, records: Any) -> list:
    """``records`` as ``[run][rank]`` with one entry per run and rank, or an assertion."""
    assert isinstance(records, list) and len(records) == len(runs), (
        f"records of {len(records) if isinstance(records, list) else records!r} runs, "
        f"{len(runs)} were drawn")
    for k, ranks in enumerate(records):
        assert isinstance(ranks, list) and len(ranks) == WORLD_SIZE, (
            f"run {k + 1}: records of {len(ranks) if isinstance(ranks, list) else ranks!r} "
            f"ranks, the launch runs {WORLD_SIZE}")
    return records


def _steps_of_calls(rec: dict, run: dict, rank: int) -> list:
    calls = rec.get("calls")
    assert isinstance(calls, list) and len(calls) == run["steps"], (
        f"rank {rank}: {len(calls) if isinstance(calls, list) else calls!r} steps of "
        f"allreduces, expected {run['steps']}")
    return calls


def judge_per_param(runs: list, records: Any) -> None:
    """Exercise 2 on every drawn run, both ranks: no error; after each step the ranks'
    mean gradient (fp32, rtol 1e-5); one allreduce per parameter that has a gradient."""
    for run, ranks in zip(runs, _runs_records(runs, records)):
        numels = sorted(p.numel() for p in run_model(run["sizes"], 0, run["edges"]).parameters()
                        if p.requires_grad)
        want, _ = mean_grads(run)
        for rank, rec in enumerate(ranks):
            where = f"{run}, rank {rank}"
            assert rec["error"] is None, f"{where}: allreduce_gradients raised {rec['error']}"
            same_grads(rec["grads"], want, rank, rtol=1e-5)
            for step, calls in enumerate(_steps_of_calls(rec, run, rank), start=1):
                sent = [c["numel"] for c in calls]
                assert sorted(sent) == numels, (
                    f"{where}, step {step}: allreduces of {sent} elements, one per parameter "
                    f"is {numels}")


def judge_bucketed(runs: list, records: Any) -> None:
    """Exercise 3's ``MyDDP`` on every drawn run, both ranks: no error, no DDP inside; its
    buckets are DDP's (:func:`ddp_buckets`); after each step the ranks' mean gradient
    (fp32, rtol 1e-5); each step one asynchronous allreduce per bucket, in bucket order,
    every one started while backward was still running."""
    for run, ranks in zip(runs, _runs_records(runs, records)):
        buckets = ddp_buckets(run["sizes"], run["bucket_cap_mb"], run["edges"])
        numels = [p.numel() for p in run_model(run["sizes"], 0, run["edges"]).parameters()]
        bucket_numels = [sum(numels[i] for i in b) for b in buckets]
        want, _ = mean_grads(run)
        for rank, rec in enumerate(ranks):
            where = f"{run}, rank {rank}"
            assert rec["error"] is None, f"{where}: MyDDP raised {rec['error']}"
            assert not rec["wraps_ddp"], f"{where}: MyDDP built or holds a DistributedDataParallel"
            assert rec["buckets"] == buckets, f"{where}: buckets {rec['buckets']}, DDP's are {buckets}"
            same_grads(rec["grads"], want, rank, rtol=1e-5)
            for step, calls in enumerate(_steps_of_calls(rec, run, rank), start=1):
                sent = [c["numel"] for c in calls]
                assert sent == bucket_numels, (
                    f"{where}, step {step}: allreduces of {sent} elements, one per bucket in "
                    f"order is {bucket_numels}")
                assert all(c["async_op"] for c in calls), f"{where}, step {step}: a blocking allreduce"
                assert all(c["in_backward"] for c in calls), (
                    f"{where}, step {step}: an allreduce started after backward")


def judge_fp16(runs: list, records: Any) -> None:
    """Exercise 4's ``my_fp16_hook`` under DDP on every drawn run, both ranks: no error,
    not torch's hook; each step float16 allreduces of all the gradients' elements, one per
    DDP bucket from step 2 (DDP sends one bucket in its first step, then rebuilds them);
    after each step torch's fp16 mean within a few fp16 roundings of the ranks'
    gradients (whatever the order of the cast, the division and the sum)."""
    for run, ranks in zip(runs, _runs_records(runs, records)):
        numels = [p.numel() if p.requires_grad else 0
                  for p in run_model(run["sizes"], 0, run["edges"]).parameters()]
        bucket_numels = [sum(numels[i] for i in b)
                         for b in ddp_buckets(run["sizes"], run["bucket_cap_mb"], run["edges"])]
        want, scales = mean_grads(run, fp16=True)
        for rank, rec in enumerate(ranks):
            where = f"{run}, rank {rank}"
            assert rec["error"] is None, f"{where}: my_fp16_hook raised {rec['error']}"
            assert not rec["delegates"], f"{where}: my_fp16_hook is or calls torch's fp16_compress_hook"
            for step, calls in enumerate(_steps_of_calls(rec, run, rank), start=1):
                sent = [c["numel"] for c in calls]
                assert sum(sent) == sum(numels), f"{where}, step {step}: allreduces of {sent} elements"
                assert all(c["dtype"] == "float16" and c["nbytes"] == 2 * c["numel"] for c in calls), (
                    f"{where}, step {step}: sent {[c['dtype'] for c in calls]}, not float16")
                if step > 1:
                    assert sent == bucket_numels, (
                        f"{where}, step {step}: allreduces of {sent} elements, DDP's buckets "
                        f"hold {bucket_numels}")
            same_grads(rec["grads"], want, rank, rtol=3e-3, scales=scales)
