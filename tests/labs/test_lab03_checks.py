"""Lab 03's graded checks on real answers: each runs as grading runs it (the student's code
on hidden cases drawn in the grader, here in this process standing in for the kernel, the
answers as JSON, the judge apart: tests/labs/labcheck.py). The reference solutions pass at
several seeds, an honest answer written differently passes, and typical mistakes, answers
written for the examples only and answers that only delegate to perflab fail. The lab's
own cells also run top to bottom with the reference answers at the tiny preset, each
check graded as in grading (its self-check does not run there).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from tests.labs.labcheck import REFERENCE_SEEDS, Lab, graded_verdict
from perflab.course.answers import SKIP_TAG
from perflab.course.checks import split_check

ROOT = Path(__file__).resolve().parents[2]
LAB_PATH = ROOT / "solutions" / "03_mixed_precision.ipynb"
LAB = Lab("03")

#: The checks graded on hidden cases, each tried below on real wrong answers.
GRADED_TESTED = ("check_amp_step", "check_dispatch_trace", "check_fp32_kind",
                 "check_loss_scaling", "check_saved_bytes")


# --- running the lab's cells with real answers ----------------------------------------

def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def check_source(path: Path, gid: str) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return next(c.source for c in nb.cells if _nbg(c).get("grade_id") == gid)


def run_lab(path: Path, answers: dict[str, str], upto: str | None, monkeypatch,
            preset: str = "tiny", all_checks: bool = False, ns: dict | None = None
            ) -> dict[str, object]:
    """Run a lab's graded path in this process: every code cell not tagged grading-skip,
    in order, up to and including check ``upto`` (None: to the end); ``answers`` replace
    solution cells by grade_id. Check cells run as grading runs them: ``student_answer``
    on cases drawn at seed 0, judged apart (the self-check does not run). Only ``upto``
    runs, or every check with ``all_checks``, or none when ``upto`` is None. ``ns``
    (filled in place) is the namespace. Returns ``check grade_id -> JudgeResult``."""
    monkeypatch.setenv("PERFLAB_PRESET", preset)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(path), as_version=4)
    ns = {} if ns is None else ns
    ns.update({"__name__": "__lab__", "display": lambda *a, **k: None})
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
                continue  # another check: only its verdict would come of it
            check = split_check(cell.source)
            assert check.graded is not None, f"{gid} is not graded on hidden cases"
            verdicts[gid] = graded_verdict(check, ns, gid)
        else:
            exec(compile(cell.source, "<cell>", "exec"), ns)  # noqa: S102
        if upto is not None and gid == upto:
            return verdicts
    if upto is not None:
        raise AssertionError(f"no check {upto!r} in {path.name}")
    return verdicts


@pytest.fixture(scope="module")
def lab_ns():
    """The namespace after the lab's graded path ran with the reference answers (no
    check), at the tiny preset."""
    ns: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        run_lab(LAB_PATH, {}, None, mp, ns=ns)
        yield ns


def _verdict(lab_ns, check: str, code: str | None = None, seed=0):
    scope = dict(lab_ns)
    if code is not None:
        LAB.run_code(scope, code)
    return LAB.judge(scope, check, seed=seed)


@slow
def test_reference_answers_pass_every_check(monkeypatch):
    verdicts = run_lab(LAB_PATH, {}, "check_saved_bytes", monkeypatch, all_checks=True)
    assert set(verdicts) == set(GRADED_TESTED)
    assert all(v.passed for v in verdicts.values()), {
        g: v.message for g, v in verdicts.items() if not v.passed}


@slow
@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
@pytest.mark.parametrize("check", GRADED_TESTED)
def test_reference_passes_at_any_seed(lab_ns, check, seed):
    verdict = _verdict(lab_ns, check, seed=seed)
    assert verdict.passed, verdict.message


def test_every_check_is_graded_on_hidden_cases():
    checks = {g for g in LAB.cells if g and g.startswith("check_")}
    assert checks == set(GRADED_TESTED)
    assert all(split_check(LAB.cells[g]).graded is not None for g in checks)
    assert split_check(LAB.cells["check_amp_step"]).graded.forbid == ("train_step",)
    assert split_check(LAB.cells["check_saved_bytes"]).graded.forbid == ("saved_activation_bytes",)


def test_gradscaler_works_on_the_cpu_in_fp16():
    """The fp16 cases grade the scaler on the CPU: torch.amp.GradScaler("cpu") is enabled
    and skips a step whose fp16 gradients overflow (PyTorch >= 2.3)."""
    import torch
    from torch import nn

    layer = nn.Linear(4, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    assert scaler.is_enabled()
    before = layer.weight.detach().clone()
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(torch.ones(3, 4))
    assert out.dtype == torch.float16
    scaler.scale(out.float().sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 39 and torch.equal(layer.weight, before)


# --- honest answers written differently ---------------------------------------------------

_STEP_ZERO_FIRST = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    optimizer.zero_grad()
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm:
        scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.float().detach()
'''
_TRACE_PYTREE = '''
from torch.utils._pytree import tree_leaves

class DtypeTrace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.dtype.is_floating_point:
                self.records.append((str(func.overloadpacket), leaf.dtype))
                break
        return out


def trace_autocast(model, x, y, dtype):
    trace = DtypeTrace()
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        with trace:
            loss = F.cross_entropy(model(x), y)
    return list(trace.records)
'''
_GRADS_AUTOGRAD = '''
def fp16_grads(model, x, y, scale):
    model.zero_grad(set_to_none=True)
    params = list(model.parameters())
    loss = F.mse_loss(model(x).float(), y)
    grads = torch.autograd.grad(loss * scale, params)
    return [g.to(torch.float32).div(scale) for g in grads]
'''
_SAVED_POP_PARAMS = '''
def saved_bytes(model, x, y, dtype=None):
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    ctx = (torch.autocast(x.device.type, dtype=dtype) if dtype is not None
           else torch.autocast(x.device.type, enabled=False))
    with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    for t in list(model.parameters()) + list(model.buffers()):
        seen.pop(t.untyped_storage().data_ptr(), None)
    return int(sum(seen.values()))
'''
_KINDS_BY_NAME = '''
def my_fp32_kinds(trace):
    kinds = []
    for op, dtype in trace:
        if str(dtype) != "torch.float32":
            continue
        for kind, words in [("loss", ("softmax", "nll_loss")), ("convolution", ("convolution",)),
                            ("activation", ("relu", "gelu", "silu")),
                            ("normalization", ("batch_norm", "layer_norm", "group_norm"))]:
            if kind not in kinds and any(w in op for w in words):
                kinds.append(kind)
    return kinds
'''
#: check -> an honest answer written differently from the reference
HONEST = {"check_amp_step": _STEP_ZERO_FIRST,
          "check_dispatch_trace": _TRACE_PYTREE,
          "check_fp32_kind": _KINDS_BY_NAME,
          "check_loss_scaling": _GRADS_AUTOGRAD,
          "check_saved_bytes": _SAVED_POP_PARAMS}


@slow
@pytest.mark.parametrize("check", GRADED_TESTED)
def test_honest_variant_passes(lab_ns, check):
    verdict = _verdict(lab_ns, check, HONEST[check], seed=7)
    assert verdict.passed, verdict.message


# --- wrong answers ------------------------------------------------------------------------

_DELEGATE_STEP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    from perflab import train_step
    amp = "bf16" if dtype == torch.bfloat16 else "fp16"
    return train_step(model, x, y, optimizer, amp=amp, scaler=scaler)
'''
_NO_AUTOCAST_STEP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_STEP_NOT_THROUGH_SCALER = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_SCALER_IGNORED = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_CLIP_BEFORE_UNSCALE = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_CLIP_SCALED = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:  # clips the scaled gradients: scaler.step unscales after
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_NO_CLIP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_CLIP_BY_VALUE = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_NO_SCALER_UPDATE = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
'''
_NO_ZERO_GRAD = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().float()
'''
_ALWAYS_BF16_STEP = '''
def my_amp_step(model, x, y, optimizer, scaler, dtype, max_norm=None):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
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
_TRACE_TENSORS_ONLY = '''
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
    with torch.autocast(x.device.type, dtype=dtype), DtypeTrace() as trace:
        F.cross_entropy(model(x), y)
    return trace.records
'''
_TRACE_LAST_OUTPUT = '''
class DtypeTrace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.records = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        floats = [t for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if floats:
            self.records.append((str(func.overloadpacket), floats[-1].dtype))
        return out


def trace_autocast(model, x, y, dtype):
    with torch.autocast(x.device.type, dtype=dtype), DtypeTrace() as trace:
        F.cross_entropy(model(x), y)
    return trace.records
'''
_TRACE_ALWAYS_BF16 = '''
def trace_autocast(model, x, y, dtype):
    with torch.autocast(x.device.type, dtype=torch.bfloat16), DtypeTrace() as trace:
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
_SCALE_IGNORED = '''
def fp16_grads(model, x, y, scale):
    model.zero_grad(set_to_none=True)
    (F.mse_loss(model(x).float(), y) * 2 ** 16).backward()
    return [p.grad.float() / 2 ** 16 for p in model.parameters()]
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
_SAVED_NO_AUTOCAST = '''
def saved_bytes(model, x, y, dtype=None):
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    sizes = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in state:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    return sum(sizes.values()) // (2 if dtype is not None else 1)
'''
_SAVED_EXAMPLES_ONLY = '''
def saved_bytes(model, x, y, dtype=None):
    return 28036 if dtype is None else 15892
'''
_DELEGATE_SAVED = '''
def saved_bytes(model, x, y, dtype=None):
    import perflab
    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        return perflab.saved_activation_bytes(model, x, y).nbytes
'''

_FP32_WORDS = '''
WORDS = {"convolution": ("convolution",), "normalization": ("batch_norm", "layer_norm", "group_norm"),
         "activation": ("relu", "gelu", "silu"), "loss": ("softmax", "nll_loss")}
def kind_of(op):
    return next((k for k, ws in WORDS.items() if any(w in op for w in ws)), None)
'''
_FP32_ALWAYS_LOSS = 'def my_fp32_kinds(trace):\n    return ["loss"]\n'
_FP32_ANY_DTYPE = _FP32_WORDS + '''
def my_fp32_kinds(trace):
    return sorted({kind_of(op) for op, dtype in trace} - {None})
'''
_FP32_NOT_BF16 = _FP32_WORDS + '''
def my_fp32_kinds(trace):
    return sorted({kind_of(op) for op, dtype in trace if dtype != torch.bfloat16} - {None})
'''
_FP32_FIRST_ONLY = _FP32_WORDS + '''
def my_fp32_kinds(trace):
    kinds = [kind_of(op) for op, dtype in trace if dtype == torch.float32 and kind_of(op)]
    return kinds[:1]
'''
_FP32_LAST_OP = _FP32_WORDS + '''
def my_fp32_kinds(trace):
    return [kind_of(trace[-1][0])] if trace[-1][1] == torch.float32 else []
'''

#: name -> (the check it must fail, the wrong answer)
WRONG = {
    "step without autocast": ("check_amp_step", _NO_AUTOCAST_STEP),
    "step: optimizer.step() instead of scaler.step": ("check_amp_step", _STEP_NOT_THROUGH_SCALER),
    "step: no scaler.update()": ("check_amp_step", _NO_SCALER_UPDATE),
    "step: ignores the scaler (backward, optimizer.step)": ("check_amp_step", _SCALER_IGNORED),
    "step: clips before scaler.unscale_": ("check_amp_step", _CLIP_BEFORE_UNSCALE),
    "step: clips the scaled gradients (no unscale_)": ("check_amp_step", _CLIP_SCALED),
    "step: ignores max_norm": ("check_amp_step", _NO_CLIP),
    "step: clips by value, not by norm": ("check_amp_step", _CLIP_BY_VALUE),
    "step: no zero_grad": ("check_amp_step", _NO_ZERO_GRAD),
    "step: always bf16 (the bf16 example only)": ("check_amp_step", _ALWAYS_BF16_STEP),
    "trace records input dtypes": ("check_dispatch_trace", _INPUT_DTYPE_TRACE),
    "trace without autocast": ("check_dispatch_trace", _NO_AUTOCAST_TRACE),
    "trace skips ops returning tuples": ("check_dispatch_trace", _TRACE_TENSORS_ONLY),
    "trace records the last float output": ("check_dispatch_trace", _TRACE_LAST_OUTPUT),
    "trace always in bf16 (the example only)": ("check_dispatch_trace", _TRACE_ALWAYS_BF16),
    # the old exercise's answer (issue 43): one word about this lab's model, "loss", passed
    # whatever the student's code did; now the function meets traces where more stayed
    "fp32 kinds: always the loss": ("check_fp32_kind", _FP32_ALWAYS_LOSS),
    "fp32 kinds: every kind in the trace": ("check_fp32_kind", _FP32_ANY_DTYPE),
    "fp32 kinds: not bf16 (the example only)": ("check_fp32_kind", _FP32_NOT_BF16),
    "fp32 kinds: the first one only": ("check_fp32_kind", _FP32_FIRST_ONLY),
    "fp32 kinds: the last op's only": ("check_fp32_kind", _FP32_LAST_OP),
    "unscale in fp16": ("check_loss_scaling", _DIVIDE_IN_FP16),
    "model run in fp32": ("check_loss_scaling", _FP32_MODEL),
    "no unscale": ("check_loss_scaling", _NO_UNSCALE),
    "scale ignored, always 2**16 (the example's)": ("check_loss_scaling", _SCALE_IGNORED),
    "every save counted": ("check_saved_bytes", _EVERY_SAVE),
    "parameters counted": ("check_saved_bytes", _WITH_PARAMS),
    "16 bits as half of fp32": ("check_saved_bytes", _SAVED_NO_AUTOCAST),
    "saved bytes: the examples only": ("check_saved_bytes", _SAVED_EXAMPLES_ONLY),
}
#: name -> (the check, an answer that only calls the perflab function it names)
DELEGATING = {
    "step delegates to perflab.train_step": ("check_amp_step", _DELEGATE_STEP, "train_step"),
    "saved bytes delegates to perflab": ("check_saved_bytes", _DELEGATE_SAVED,
                                         "saved_activation_bytes"),
}


@slow
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_answer_fails_its_check(lab_ns, name, seed):
    check, source = WRONG[name]
    verdict = _verdict(lab_ns, check, source, seed=seed)
    assert not verdict.passed, f"{name!r} passed {check}"
    assert verdict.message.startswith("hidden case"), verdict.message


@slow
@pytest.mark.parametrize("name", sorted(DELEGATING))
def test_delegating_answer_fails_naming_the_function(lab_ns, name):
    check, source, function = DELEGATING[name]
    verdict = _verdict(lab_ns, check, source)
    assert not verdict.passed and function in verdict.message, verdict.message


@slow
def test_wrong_answer_fails_when_the_lab_runs(monkeypatch):
    """A wrong answer put in the lab's own answer cell fails its check on the graded
    path, as in grading."""
    verdict = run_lab(LAB_PATH, {"fp16_grads": _DIVIDE_IN_FP16}, "check_loss_scaling",
                      monkeypatch)["check_loss_scaling"]
    assert not verdict.passed and verdict.message.startswith("hidden case"), verdict.message


# --- what the text says (issue 26) --------------------------------------------------------

def _markdown(start: str) -> str:
    nb = nbformat.read(str(LAB_PATH), as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "markdown"
                and c.source.startswith(start))


def test_fp16_rounds_to_zero_only_at_half_the_smallest_subnormal():
    """Section 4's text: |x| <= 2**-25 rounds to 0 in fp16, (2**-25, 2**-24) rounds up to
    2**-24 (round to nearest, ties to even)."""
    import torch

    tiny = 2.0 ** -24
    x = torch.tensor([0.25, 0.5, 0.5001, 0.75, 0.999, 1.0]) * tiny
    assert (x.half().float() / tiny).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    text = _markdown("## 4. fp16 gradients underflow")
    assert "at most 2**-25" in text and "rounds *up* to 2**-24" in text
    assert "smaller than that becomes exactly 0" not in text


def test_going_further_states_no_master_weights_and_tensor_cores_run_any_shape():
    text = _markdown("## 11. Going further")
    assert "master weights" not in text.replace('"master weights"', "")
    assert "any shape" in text and "need matrix dimensions" not in text


def test_the_prediction_is_recorded_and_later_cells_run_without_it():
    nb = nbformat.read(str(LAB_PATH), as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if _nbg(c).get("grade_id") == "predict_amp_ratio")
    assert 'predictions.record("amp_ratio", my_predicted_ratio' in nb.cells[at].source
    later = [c.source for c in nb.cells[at + 1:] if c.cell_type == "code"]
    assert not any("my_predicted_ratio" in s for s in later)
    assert sum('predictions.beside("amp_ratio"' in s for s in later) == 2


def test_the_written_answer_is_a_rubric_true_on_any_machine():
    nb = nbformat.read(str(LAB_PATH), as_version=4)
    (answer,) = [c.source for c in nb.cells if _nbg(c).get("grade_id") == "explain_amp_ratio"]
    assert answer.startswith("**Rubric (2 points).**") and "No credit" in answer
    assert "many times slower" not in answer and "On a GPU" in answer


@pytest.mark.parametrize("seed", [0, 1, 2, "grade:ada"])
def test_amp_step_cases_inject_infs_and_clip_in_fp16(seed):
    """Every draw grades GradScaler in fp16 on the CPU: steps with an inf (skipped, the
    scale backing off by the case's factor) beside finite ones, and a case that clips."""
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions

    cases_fn, _ = graded_functions(split_check(LAB.cells["check_amp_step"]).graded,
                                   "check_amp_step")
    cases = draw_cases(cases_fn, seed)
    fp16 = [c for c in cases if c["amp"] == "fp16"]
    assert len(fp16) >= 3 and all(c["inf_steps"] and len(c["inf_steps"]) < c["steps"]
                                  for c in fp16)
    assert any(c["max_norm"] is not None for c in fp16)
    assert any(c["max_norm"] is None for c in fp16)


def _fp32_verdict(code: str, seed=0):
    """check_fp32_kind on ``code`` alone: the exercise is a function of its trace, so it
    needs nothing of the lab's run (issue 43)."""
    import torch

    scope = {"__name__": "__main__", "torch": torch}
    LAB.run_code(scope, code)
    return LAB.judge(scope, "check_fp32_kind", seed=seed)


@pytest.mark.parametrize("seed", [0, 1, "grade:ada"])
def test_fp32_kinds_are_graded_on_fresh_traces_of_drawn_networks(seed):
    """The graded cases are dispatch traces the grader records itself, of networks it
    draws, in bf16 and in fp16: one where only the loss stays in fp32 and others where
    more does (a normalization or activation before the first convolution, a block run
    with autocast disabled). The graded call reads nothing of the notebook's run; the
    reference passes and the old exercise's constant answer, "loss", fails."""
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions

    graded = split_check(LAB.cells["check_fp32_kind"]).graded
    for name in ("resnet_trace", "MODE", "config"):
        assert name not in graded.answer_source, name
    cases_fn, _ = graded_functions(graded, "check_fp32_kind")
    cases = draw_cases(cases_fn, seed)
    words = {"convolution": ("convolution",),
             "normalization": ("batch_norm", "layer_norm", "group_norm"),
             "activation": ("relu", "gelu", "silu"), "loss": ("softmax", "nll_loss")}
    kinds = [sorted(k for k, ws in words.items()
                    if any(w in op for op, d in case if d == "float32" for w in ws))
             for case in cases]
    assert ["loss"] in kinds and any(len(k) > 1 for k in kinds), kinds
    assert {d for case in cases for _, d in case} >= {"bfloat16", "float16", "float32"}
    verdict = _fp32_verdict(LAB.solution("my_fp32_kind"), seed)
    assert verdict.passed, verdict.message
    assert _fp32_verdict(_KINDS_BY_NAME, seed).passed
    wrong = _fp32_verdict(_FP32_ALWAYS_LOSS, seed)
    assert not wrong.passed and wrong.message.startswith("hidden case"), wrong.message
