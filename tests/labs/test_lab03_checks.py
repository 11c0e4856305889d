"""Lab 03's check cells: each judge passes right facts and fails wrong ones, and real wrong
answers — typical mistakes and answers that only delegate to perflab — fail their check
when the lab's own cells run with them (in this process, at the tiny preset: the cells
that grading runs, answers put in, each check's probe run, its judge run on the facts).
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import assert_judge_decides
from perflab.course.answers import SKIP_TAG
from perflab.course.checks import run_judge, split_check

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "03_mixed_precision.ipynb"

_STEPS = [{"detached_fp32": True, "mine": 2.3, "ref": 2.3}] * 2
_SEEN = {"seen": ["torch.bfloat16"], "want": "torch.bfloat16", "weights_differ": [],
         "delegated": False}
_TRACE = [["aten._to_copy", "bfloat16"], ["aten.convolution", "bfloat16"],
          ["aten.addmm", "bfloat16"], ["aten._to_copy", "float32"],
          ["aten._log_softmax", "float32"], ["aten.nll_loss_forward", "float32"]]
_FP16_TRACE = [[op, "float16" if d == "bfloat16" else d] for op, d in _TRACE]
_OK = {"shapes_ok": True, "fp32": True, "zeros": 0, "total": 257, "rel_err": 0.005}
_UNDER = {"shapes_ok": True, "fp32": True, "zeros": 243, "total": 257, "rel_err": 0.93}
_SCALING = {"1": _UNDER, "65536": _OK, "1024": _OK}
_SAVED = {"8 fp32": [28036, 28036], "8 bf16": [15892, 15892],
          "16 fp32": [110980, 110980], "16 bf16": [57364, 57364]}

#: (lab, grade_id) -> (right facts, [(wrong facts, the failure is a hidden test)])
FACTS = {
    ("03", "check_amp_step"): (
        {"amp_steps": _STEPS, "amp_seen": _SEEN},
        [({"amp_steps": _STEPS, "amp_seen": {**_SEEN, "seen": ["torch.float32"]}}, False),
         ({"amp_steps": [{"detached_fp32": True, "mine": 2.1, "ref": 2.3}], "amp_seen": _SEEN}, False),
         ({"amp_steps": _STEPS, "amp_seen": {**_SEEN, "delegated": True}}, False),
         ({"amp_steps": _STEPS, "amp_seen": {**_SEEN, "weights_differ": ["fc.bias"]}}, False)]),
    ("03", "check_dispatch_trace"): (
        {"trace_got": {"bf16": _TRACE, "fp16": _FP16_TRACE}},
        [({"trace_got": {"bf16": [[op, "float32"] for op, _ in _TRACE], "fp16": _FP16_TRACE}}, False),
         ({"trace_got": {"bf16": [r for r in _TRACE if r[0] != "aten._to_copy"],
                         "fp16": _FP16_TRACE}}, False),
         ({"trace_got": {"bf16": [["aten._to_copy", "float32"], *_TRACE[1:3],  # input dtypes
                                  ["aten._to_copy", "bfloat16"], *_TRACE[4:]],
                         "fp16": _FP16_TRACE}}, False),
         ({"trace_got": {"bf16": _TRACE, "fp16": _TRACE}}, True)]),
    ("03", "check_fp32_kind"): ({"facts": {"mine": "loss", "kept": ["aten._log_softmax"]}},
                                [({"facts": {"mine": "normalization",
                                             "kept": ["aten._log_softmax"]}}, False),
                                 ({"facts": {"mine": "softmax",
                                             "kept": ["aten._log_softmax"]}}, False)]),
    ("03", "check_loss_scaling"): (
        {"scaling": _SCALING},
        [({"scaling": {**_SCALING, "65536": _UNDER}}, False),                  # divided in fp16
         ({"scaling": {**_SCALING, "1": _OK}}, False),                         # fp32 model
         ({"scaling": {**_SCALING, "65536": {**_OK, "rel_err": 65535.0}}}, False),  # no unscale
         ({"scaling": {**_SCALING, "65536": {"shapes_ok": False}}}, False),
         ({"scaling": {**_SCALING, "1024": _UNDER}}, True)]),
    ("03", "check_saved_bytes"): (
        {"saved_got": _SAVED, "saved_delegated": []},
        [({"saved_got": {**_SAVED, "8 fp32": [36388, 28036]}, "saved_delegated": []}, False),
         ({"saved_got": _SAVED, "saved_delegated": ["saved_activation_bytes"]}, False),
         ({"saved_got": {**_SAVED, "8 bf16": [None, 15892]}, "saved_delegated": []}, False),
         ({"saved_got": {**_SAVED, "16 bf16": [57460, 57364]}, "saved_delegated": []}, True)]),
}


@pytest.mark.parametrize("key", sorted(FACTS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_judge_passes_right_facts_and_fails_wrong_ones(key):
    assert_judge_decides(check_source(LAB, key[1]), *FACTS[key], name=key[1])


# --- running the lab's cells with real answers ----------------------------------------

def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def check_source(path: Path, gid: str) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return next(c.source for c in nb.cells if _nbg(c).get("grade_id") == gid)


def _facts(check, ns: dict) -> dict:
    """The probe's facts as they would travel to the judge (see checks.probe_source)."""
    facts = {n: ns[n] for n in check.names if n in ns}
    return json.loads(json.dumps(
        facts, default=lambda o: o.tolist() if hasattr(o, "tolist") else
        sorted(o) if isinstance(o, (set, frozenset)) else repr(o)[:500]))


def run_lab(path: Path, answers: dict[str, str], upto: str, monkeypatch,
            preset: str = "tiny", all_checks: bool = False) -> dict[str, object]:
    """Run a lab's graded path in this process: every code cell not tagged grading-skip,
    in order, up to and including check ``upto``; ``answers`` replace solution cells by
    grade_id, check cells run as probe then judge (only ``upto`` unless ``all_checks``). Returns ``check grade_id -> JudgeResult``
    (a probe that raises is a failed check, as in grading)."""
    from perflab.course.checks import JudgeResult

    monkeypatch.setenv("PERFLAB_PRESET", preset)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(path), as_version=4)
    ns: dict = {"__name__": "__lab__", "display": lambda *a, **k: None}
    verdicts: dict[str, object] = {}
    for cell in nb.cells:
        meta = _nbg(cell)
        if cell.cell_type != "code" or (SKIP_TAG in cell.metadata.get("tags", [])
                                        and not meta.get("solution") and not meta.get("grade")):
            continue
        gid = meta.get("grade_id")
        if meta.get("solution") and gid in answers:
            exec(compile(answers[gid], f"<answer {gid}>", "exec"), ns)  # noqa: S102
        elif meta.get("grade") and gid:
            if gid != upto and not all_checks:
                continue  # another check's probe: only its verdict would come of it
            check = split_check(cell.source)
            try:
                exec(compile(check.probe, f"<probe {gid}>", "exec"), ns)  # noqa: S102
            except Exception as e:  # noqa: BLE001 - a probe that raises fails its check
                verdicts[gid] = JudgeResult(False, f"{type(e).__name__}: {e}")
            else:
                verdicts[gid] = run_judge(check, _facts(check, ns), name=gid)
        else:
            exec(compile(cell.source, "<cell>", "exec"), ns)  # noqa: S102
        if gid == upto:
            return verdicts
    raise AssertionError(f"no check {upto!r} in {path.name}")


_DELEGATE_STEP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype):
    from perflab import train_step
    amp = "bf16" if dtype == torch.bfloat16 else "fp16"
    return train_step(model, x, y, optimizer, amp=amp, scaler=scaler)
'''
_NO_AUTOCAST_STEP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype):
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_INPUT_DTYPE_TRACE = '''
class DtypeTrace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ins = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if ins:
            self.records.append((str(func.overloadpacket), ins[0].dtype))
        return func(*args, **(kwargs or {}))


def trace_autocast(model, x, y, dtype):
    with torch.autocast(x.device.type, dtype=dtype), DtypeTrace() as trace:
        F.cross_entropy(model(x), y)
    return trace.records
'''
_NO_AUTOCAST_TRACE = '''
class DtypeTrace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            self.records.append((str(func.overloadpacket), out.dtype))
        return out


def trace_autocast(model, x, y, dtype):
    with DtypeTrace() as trace:
        F.cross_entropy(model(x), y)
    return trace.records
'''
_DIVIDE_IN_FP16 = '''
def fp16_grads(model, x, y, scale):
    model.zero_grad(set_to_none=True)
    (F.mse_loss(model(x).float(), y) * scale).backward()
    return [(p.grad / scale).float() for p in model.parameters()]
'''
_FP32_MODEL = '''
def fp16_grads(model, x, y, scale):
    model = model.float()
    model.zero_grad(set_to_none=True)
    (F.mse_loss(model(x.float()), y) * scale).backward()
    return [p.grad.float() / scale for p in model.parameters()]
'''
_NO_UNSCALE = '''
def fp16_grads(model, x, y, scale):
    model.zero_grad(set_to_none=True)
    (F.mse_loss(model(x).float(), y) * scale).backward()
    return [p.grad.float() for p in model.parameters()]
'''
_EVERY_SAVE = '''
def saved_bytes(model, x, y, dtype=None):
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    total = [0]

    def pack(t):
        if t.untyped_storage().data_ptr() not in state:
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(x), y)
    return total[0]
'''
_WITH_PARAMS = '''
def saved_bytes(model, x, y, dtype=None):
    sizes = {}

    def pack(t):
        sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(x), y)
    return sum(sizes.values())
'''
_DELEGATE_SAVED = '''
def saved_bytes(model, x, y, dtype=None):
    import perflab
    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        return perflab.saved_activation_bytes(model, x, y).nbytes
'''

#: (answer grade_id, wrong answer, the check it must fail)
WRONG = {
    "step delegates to perflab.train_step": ("my_amp_step", _DELEGATE_STEP, "check_amp_step"),
    "step without autocast": ("my_amp_step", _NO_AUTOCAST_STEP, "check_amp_step"),
    "trace records input dtypes": ("dtype_trace", _INPUT_DTYPE_TRACE, "check_dispatch_trace"),
    "trace without autocast": ("dtype_trace", _NO_AUTOCAST_TRACE, "check_dispatch_trace"),
    "fp32 kind: normalization": ("my_fp32_kind", 'my_fp32_kind = "normalization"',
                                 "check_fp32_kind"),
    "unscale in fp16": ("fp16_grads", _DIVIDE_IN_FP16, "check_loss_scaling"),
    "model run in fp32": ("fp16_grads", _FP32_MODEL, "check_loss_scaling"),
    "no unscale": ("fp16_grads", _NO_UNSCALE, "check_loss_scaling"),
    "every save counted": ("saved_bytes", _EVERY_SAVE, "check_saved_bytes"),
    "parameters counted": ("saved_bytes", _WITH_PARAMS, "check_saved_bytes"),
    "saved bytes delegates to perflab": ("saved_bytes", _DELEGATE_SAVED, "check_saved_bytes"),
}


@slow
def test_reference_answers_pass_every_check(monkeypatch):
    verdicts = run_lab(LAB, {}, "check_saved_bytes", monkeypatch, all_checks=True)
    assert set(verdicts) == {k[1] for k in FACTS}
    assert all(v.passed for v in verdicts.values()), {
        g: v.message for g, v in verdicts.items() if not v.passed}


@slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_its_check(name, monkeypatch):
    gid, source, check = WRONG[name]
    verdict = run_lab(LAB, {gid: source}, check, monkeypatch)[check]
    assert not verdict.passed, f"{name!r} passed {check}"
    assert verdict.message
