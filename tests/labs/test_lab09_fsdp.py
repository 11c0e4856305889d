"""Lab 09's FSDP by hand (Exercise 2c, ``check_my_fsdp``), graded as grading grades it:
the student's ``MyFSDP`` trained on 2 gloo ranks by :func:`perflab.labs.lab09.fsdp.my_fsdp_rank`,
judged against one process of plain AdamW and FSDP2's collectives.

The reference solution passes (at two seeds) and so does an honest variant written
differently (closures, torch 2.13's ``*_single`` names, a list of pending gathers,
mixed precision cast its own way);
wrong ``MyFSDP`` code fails on a hidden case: one that never frees (its peak), one that
gathers every block at once (its peak), one that all-reduces the gradients instead of
reduce-scattering them (its collectives), one that forgets the 1/world_size mean (its
parameters), one that all-gathers fp32 and casts afterwards under mixed precision (its
bytes), one that ignores ``reshard_after_forward`` or ``prefetch`` (its collectives,
its order), one that pads each parameter's rows as FSDP2 does instead of each block once
(its shards and bytes, on the hidden models' widths that 2 ranks do not divide), and one
that wraps torch's ``fully_shard`` (seen on the ranks). The count the judge expects is
FSDP2's, measured here on the same models; the bytes are the flat layout's, FSDP2's own
only where the world size divides every width (measured here on the exercise's example,
``mlp([6, 5, 7, 3])``, issue 44)."""
from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from tests.conftest import slow
from tests.labs.labcheck import Lab, hidden_configs, launch_tasks
from perflab.course.checks import split_check
from perflab.distributed import launch_fn
from perflab.labs.lab09 import tasks_rank

NB = Lab("09")
SIZES = [32] * 9
SETTINGS = [(True, True, None), (True, False, None), (False, True, None),
            (True, True, "bfloat16")]   # the notebook's FSDP_BY_HAND
_names = itertools.count()


def _reference_file() -> str:
    return NB.solution("zero1_file").split("\n", 1)[1]   # the %%writefile line dropped


def _fsdp_source() -> str:
    src = _reference_file()
    return src[src.index("class MyFSDP"):src.index("def my_fully_shard")]


def _configs():
    return [{"sizes": SIZES, "batch": 8, "steps": 6, "seed": 0, "lr": 1e-2, "weight_decay": 0.01,
             "reshard_after_forward": r, "prefetch": p, "param_dtype": d} for r, p, d in SETTINGS]


def _ns(launched, variant: str) -> dict:
    """The notebook's names after its launch: ``small2`` (DDP and FSDP2) and
    ``fsdp_by_hand`` from ``variant``'s file ("reference" or "honest"), the records of the
    lab's launch of that file in the shared launch."""
    student = importlib.import_module(launched.modules[variant])
    (sharding, by_hand), per_rank = launched.tasks[(variant, "lab")], launched.answer((variant, "lab"))
    assert sharding[0] == "sharding" and by_hand[0] == "my_fsdp"
    return {"__name__": "__main__", "small2": [r[0] for r in per_rank],
            "fsdp_by_hand": [r[1] for r in per_rank],
            "zero1_student": student, "torch": torch, "STEPS": 6, "WORLD_SIZE": 2,
            "SIZES": SIZES, "FSDP_BY_HAND": _configs()}


#: The seeds each file's hidden launch (check_my_fsdp's graded call) is run at: those
#: its tests judge.
HIDDEN_SEEDS = {"reference": [0, "grade:ada"], "honest": [1]}
#: The exercise's example of widths 2 ranks do not divide (Exercise 2c's text)
ODD = [6, 5, 7, 3]


def _hidden_configs(seed) -> list[dict]:
    return hidden_configs(NB, "check_my_fsdp", seed)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """ONE real 2-rank launch (each costs seconds) of every MyFSDP file here, each its own
    module: the notebook's launch of the reference and of the honest variant, their hidden
    launches (HIDDEN_SEEDS) and each WRONG variant's hidden launch at WRONG_SEED. Each task
    is what a separate launch ran (the same rank function, arguments and student module),
    so each test still judges real records of its own file: the lab's in its namespace, and
    its check's own launch_fn call answered with the hidden tasks' records
    (_judge_launched checks the call asks for exactly those tasks)."""
    folder = tmp_path_factory.mktemp("fsdp")
    sources = {"reference": _reference_file(),
               "honest": _reference_file().replace(_fsdp_source(), _HONEST),
               **{name: _reference_file().replace(_fsdp_source(), make()) for name, make in WRONG.items()}}
    modules, tasks = {}, {}
    for variant, text in sources.items():
        modules[variant] = f"fsdp_l{next(_names)}"
        (folder / f"{modules[variant]}.py").write_text(text)
        if variant in HIDDEN_SEEDS:   # the notebook's launch
            tasks[(variant, "lab")] = [("sharding", (["ddp", "fsdp2"], SIZES, 8, 6, None), {}),
                                       ("my_fsdp", (_configs(), modules[variant]), {})]
        for seed in HIDDEN_SEEDS.get(variant, [WRONG_SEED]):   # as check_my_fsdp builds them
            tasks[(variant, seed)] = [("my_fsdp", (_hidden_configs(seed), modules[variant]), {})]
    # the exercise's example: the reference's MyFSDP and torch's FSDP2 on widths 2 does not divide
    example = {"sizes": ODD, "batch": 2, "steps": 2, "seed": 0, "lr": 1e-2, "weight_decay": 0.01,
               "reshard_after_forward": True, "prefetch": True, "param_dtype": None}
    tasks[("odd",)] = [("my_fsdp", ([example], modules["reference"]), {}),
                       ("sharding", (["fsdp2"], ODD, 2, 2, None), {})]
    yield from launch_tasks(folder, modules, tasks, tasks_rank)


def _judge_launched(monkeypatch, launched, ns: dict, variant: str, seed):
    """check_my_fsdp at ``seed`` on ``ns``, its hidden launch answered from the records of
    ``variant``'s tasks at that seed: the call must ask for exactly those tasks, once."""
    import perflab.distributed

    want, answered = launched.tasks[(variant, seed)], []

    def fake_launch(fn, world_size, *, args=(), **kwargs):
        assert fn is tasks_rank and world_size == 2 and kwargs.get("timeout_s"), (fn, world_size)
        assert args == (want,), args
        answered.append(variant)
        return launched.answer((variant, seed))

    monkeypatch.setattr(perflab.distributed, "launch_fn", fake_launch)
    verdict = NB.judge(ns, "check_my_fsdp", seed=seed)
    # answered after the asserts above: an assert there (an error answer) fails here
    assert answered == [variant], (answered, verdict)
    return verdict


@pytest.fixture(scope="module")
def reference_ns(launched):
    return _ns(launched, "reference")


@slow
@pytest.mark.parametrize("seed", [0, "grade:ada"])
def test_reference_passes(seed, reference_ns, launched, monkeypatch):
    NB.run_code(dict(reference_ns), split_check(NB.cells["check_my_fsdp"]).probe)   # visible
    verdict = _judge_launched(monkeypatch, launched, dict(reference_ns), "reference", seed)
    assert verdict.passed, verdict.message


@slow
def test_expected_collectives_are_fsdp2s(reference_ns):
    """The judge's count (2 all-gathers and 1 reduce-scatter of each block per step when
    resharding, 1 and 1 when not; each block's padded fp32 bytes) is FSDP2's, measured."""
    for rank in reference_ns["small2"]:
        fsdp2 = rank["fsdp2"]
        blocks, per_block = len(SIZES) - 1, 4 * (32 * 32 + 32)
        assert fsdp2["comm_calls_per_step"] == {"all_gather": 2 * blocks, "reduce_scatter": blocks}
        assert fsdp2["comm_per_step"]["all_gather"] == 2 * blocks * per_block
        assert fsdp2["comm_per_step"]["reduce_scatter"] == blocks * per_block
    for runs in reference_ns["fsdp_by_hand"]:
        for (reshard, prefetch, dtype), r in zip(SETTINGS, runs):
            size = per_block // (2 if dtype else 1)   # gathered in bfloat16: half the bytes
            assert r["peak_unsharded_bytes"] == (
                (2 if prefetch else 1) * size if reshard else blocks * size), r
            assert r["bytes"]["all_gather"] == (2 if reshard else 1) * blocks * size, r


_HONEST = '''
class MyFSDP:
    def __init__(self, blocks, reshard_after_forward=True, prefetch=True, param_dtype=None):
        self.blocks = list(blocks)
        self.reshard, self.prefetch = reshard_after_forward, prefetch
        self.low = param_dtype
        ws, rank = dist.get_world_size(), dist.get_rank()
        self.ws = ws
        self.shards, self.bufs, self.inflight = [], [], []
        self.counts = {}
        for i, block in enumerate(self.blocks):
            ps = list(block.parameters())
            total = sum(p.numel() for p in ps)
            per = (total + ws - 1) // ws
            buf = torch.zeros(per * ws)
            torch.cat([p.detach().reshape(-1) for p in ps], out=buf[:total])
            self.shards.append(torch.nn.Parameter(buf.narrow(0, rank * per, per).clone()))
            if param_dtype is not None:
                buf = buf.to(param_dtype)
            at = 0
            for p in ps:
                p.data = buf[at:at + p.numel()].view(p.shape)
                at += p.numel()
            self.bufs.append(buf)
            buf.untyped_storage().resize_(0)
            self._hooks(i, block, ps)

    def _hooks(self, i, block, ps):
        def pre(module, args):
            self.unshard(i)
            if self.prefetch and i + 1 < len(self.blocks):
                self.start(i + 1)
            if self.low is not None:
                return (args[0].to(self.low),) + tuple(args[1:])

        def post(module, args, out):
            if self.reshard:
                self.bufs[i].untyped_storage().resize_(0)

            def before_backward(grad):
                self.unshard(i)
                if self.prefetch and i >= 1:
                    self.start(i - 1)
            out.register_hook(before_backward)

        def grad_done(p):
            self.counts[i] = self.counts.get(i, 0) + 1
            if self.counts[i] != len(ps):
                return
            self.counts[i] = 0
            with torch.no_grad():
                flat = torch.zeros(self.bufs[i].numel(), dtype=torch.float32)
                torch.cat([q.grad.reshape(-1) for q in ps], out=flat[:sum(q.numel() for q in ps)])
                for q in ps:
                    q.grad = None
                out = torch.empty(self.shards[i].numel())
                dist.reduce_scatter_single(out, flat)
                g = out.div_(self.ws)
                s = self.shards[i]
                s.grad = g if s.grad is None else s.grad.add_(g)
                self.bufs[i].untyped_storage().resize_(0)

        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)
        for p in ps:
            p.register_post_accumulate_grad_hook(grad_done)

    def start(self, i):
        st = self.bufs[i].untyped_storage()
        if st.nbytes() or any(j == i for j, _ in self.inflight):
            return
        st.resize_(self.bufs[i].numel() * self.bufs[i].element_size())
        with torch.no_grad():
            src = self.shards[i].detach().to(self.bufs[i].dtype)
            work = dist.all_gather_single(self.bufs[i], src, async_op=True)
        self.inflight.append((i, work))

    def unshard(self, i):
        self.start(i)
        for j, work in list(self.inflight):
            if j == i:
                work.wait()
                self.inflight.remove((j, work))

'''

_REF = None


def _per_parameter_padding() -> str:
    """The reference's MyFSDP with FSDP2's layout inside each block's buffer: every
    parameter's rows padded to a multiple of the world size (its own slot), not the block
    padded once at its end. On widths the world size divides it is the reference itself."""
    slot = "(-(-p.shape[0] // self.world_size) * self.world_size * (p[0].numel()))"
    src = _wrong("            numel = sum(p.numel() for p in params)\n",
                 f"            numel = sum({slot} for p in params)\n")
    for old, new in (
            ("            flat[:numel] = torch.cat([p.detach().flatten() for p in params])",
             "            flat[:numel] = torch.cat([torch.nn.functional.pad(p.detach().flatten(), "
             f"(0, {slot} - p.numel())) for p in params])"),
            ("                offset += p.numel()\n", f"                offset += {slot}\n"),
            ("        flat[:sum(q.numel() for q in params)] = torch.cat([q.grad.flatten() for q in params])",
             "        flat[:] = torch.cat([torch.nn.functional.pad(p.grad.flatten(), "
             f"(0, {slot} - p.numel())) for p in params])")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return src


def _wrong(old: str, new: str) -> str:
    src = _fsdp_source()
    assert old in src, old
    return src.replace(old, new)


WRONG = {
    # the storage is never resized to 0: every block stays unsharded (and is never re-gathered)
    "never frees": lambda: _wrong("self.full[i].untyped_storage().resize_(0)", "pass"),
    # block 0's pre-forward gathers every block: the whole model unsharded at once
    "gathers every block at once": lambda: _wrong(
        "        self._gather(i)\n        if self.prefetch and i + 1 < len(self.blocks):",
        "        for j in range(len(self.blocks)):\n            self._gather(j)\n"
        "        if self.prefetch and i + 1 < len(self.blocks):"),
    # DDP's all-reduce of the block, then its own slice: no reduce-scatter, twice the bytes
    "all-reduces instead of reduce-scattering": lambda: _wrong(
        "dist.reduce_scatter_tensor(mine, flat)",
        "dist.all_reduce(flat); mine.copy_(flat.chunk(self.world_size)[self.rank])"),
    "forgets the mean": lambda: _wrong("mine /= self.world_size", "pass"),
    # all-gathers the fp32 shard and casts the gathered block: twice the bytes on the wire
    "casts after the all-gather": lambda: _wrong(
        "            shard = self.shards[i].detach().to(full.dtype)   # cast BEFORE the collective\n"
        "            self.pending[i] = dist.all_gather_into_tensor(full, shard, async_op=True)",
        "            wide = self.shards[i].new_empty(full.numel())   # fp32 on the wire\n"
        "            self.pending[i] = dist.all_gather_into_tensor(wide, self.shards[i].detach(),\n"
        "                                                          async_op=True)\n"
        "            self.pending[i].wait()\n"
        "            full.copy_(wide)"),
    # frees after forward whatever reshard_after_forward says
    "ignores reshard_after_forward": lambda: _wrong(
        "        if self.reshard_after_forward:\n            self._free(i)",
        "        self._free(i)"),
    # never issues the next block's all-gather early
    "ignores prefetch": lambda: _wrong("if self.prefetch and i + 1 < len(self.blocks):",
                                       "if False:"),
    # FSDP2's layout (each parameter's rows padded) in place of the one asked for (each block
    # padded once): the same as the reference on even widths, not on the hidden odd ones
    "pads each parameter as FSDP2": _per_parameter_padding,
    # torch's FSDP2 on each block, its parameters handed over as the "shards"
    "wraps fully_shard": lambda: '''
class MyFSDP:
    def __init__(self, blocks, reshard_after_forward=True, prefetch=True, param_dtype=None):
        from torch.distributed.fsdp import fully_shard
        self.blocks = list(blocks)
        for b in self.blocks:
            fully_shard(b, reshard_after_forward=reshard_after_forward)
        self.shards = [p for b in self.blocks for p in b.parameters()]

''',
}


@slow
def test_honest_variant_passes(launched, monkeypatch):
    ns = _ns(launched, "honest")
    NB.run_code(dict(ns), split_check(NB.cells["check_my_fsdp"]).probe)
    verdict = _judge_launched(monkeypatch, launched, ns, "honest", 1)
    assert verdict.passed, verdict.message


WRONG_SEED = 2
#: what the judge finds first in each wrong answer (any of these)
WHY = {"never frees": ("unsharded at once", "differ from unsharded AdamW"),   # stale blocks
       "gathers every block at once": ("unsharded at once", "by phase"),
       "all-reduces instead of reduce-scattering": ("collectives per step",),
       "forgets the mean": ("differ from unsharded AdamW",),
       "casts after the all-gather": ("B of all_gather per step",),
       "ignores reshard_after_forward": ("collectives per step",),
       "ignores prefetch": ("issued before each block's forward", "by phase"),
       "pads each parameter as FSDP2": ("not one equal chunk", "B of all_gather per step"),
       "wraps fully_shard": ("torch's sharding",)}


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_fsdp_fails(name, monkeypatch, reference_ns, launched):
    # the notebook's own launch is the reference's; the graded call's launch is this wrong
    # file's hidden launch in the shared one, handed to the check's student_answer in place
    # of a new launch
    import types

    ns = dict(reference_ns, zero1_student=types.SimpleNamespace(__name__=launched.modules[name]))
    verdict = _judge_launched(monkeypatch, launched, ns, name, WRONG_SEED)
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict
    assert any(why in verdict.message for why in WHY[name]), verdict.message   # not a crash
    if name == "wraps fully_shard":
        assert "fully_shard" in verdict.message, verdict.message


def test_solution_writes_the_mechanism_itself():
    """The reference's MyFSDP calls the collectives and frees storage itself."""
    src = _fsdp_source()
    for needle in ("dist.all_gather_into_tensor(", "dist.reduce_scatter_tensor(", "async_op=True",
                   "untyped_storage().resize_(0)", "register_post_accumulate_grad_hook(",
                   "register_forward_pre_hook(", "output.register_hook("):
        assert needle in src, needle
    assert "fully_shard(" not in src


def test_hidden_models_have_widths_two_ranks_do_not_divide():
    """Issue 44: the flat layout and FSDP2's differ only where the world size does not
    divide a width; every hidden model has a block of odd size (padded once in the
    student's buffer), at every seed these tests grade."""
    for seed in [*{s for seeds in HIDDEN_SEEDS.values() for s in seeds}, WRONG_SEED]:
        for cfg in _hidden_configs(seed):
            s = cfg["sizes"]
            assert any((a * b + b) % 2 for a, b in zip(s, s[1:])), (seed, s)


@slow
def test_the_texts_example_is_measured_by_hand_and_by_fsdp2(launched):
    """Exercise 2c's example, mlp([6, 5, 7, 3]) on 2 ranks: the reference's MyFSDP moves
    the flat layout's bytes the text states (and the judge expects), FSDP2 the bytes of
    its per-parameter row padding, also stated; both counted on the ranks."""
    text = next(c.source for c in NB.nb.cells if c.cell_type == "markdown"
                and "**Exercise 2c — `MyFSDP(" in c.source)
    per_rank = launched.answer(("odd",))
    flat = [2 * -(-(a * b + b) // 2) for a, b in zip(ODD, ODD[1:])]      # each block padded once
    rows = [(a + 1) * 2 * -(-b // 2) for a, b in zip(ODD, ODD[1:])]      # each parameter's rows
    assert (sum(flat), sum(rows)) == (102, 122)
    for rank, (mine, torchs) in enumerate(per_rank):
        (mine,) = mine
        assert mine["bytes"] == {"all_gather": 2 * 4 * sum(flat), "reduce_scatter": 4 * sum(flat)}, (rank, mine)
        assert mine["peak_unsharded_bytes"] == 4 * (flat[0] + flat[1]), (rank, mine)
        seen = torchs["fsdp2"]["comm_per_step"]
        assert (seen["all_gather"], seen["reduce_scatter"]) == (2 * 4 * sum(rows), 4 * sum(rows)), seen
    for figure in (f"`2 · 4 · (36 + 42 + 24) = {2 * 4 * sum(flat)}`", f"`4 · 102 = {4 * sum(flat)}`",
                   f"`4 · (36 + 42) = {4 * (flat[0] + flat[1])}`",
                   f"`(6 + 1) · 6 + (5 + 1) · 8 + (7 + 1) · 4 = {sum(rows)}`",
                   f"`2 · 4 · 122 = {2 * 4 * sum(rows)}`", f"`4 · 122 = {4 * sum(rows)}`"):
        assert figure in text, figure
