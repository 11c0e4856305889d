"""Lab 01's checks on real wrong answers: each wrong student function below runs through
the check cell's own probe (as in grading), and the judge must fail it; the reference
solution passes. Delegating to perflab's helpers fails too."""
from __future__ import annotations

import pytest

from tests.labs.labcheck import Lab

LAB = Lab("01")


@pytest.fixture(scope="module")
def ns():
    return LAB.namespace()


def _verdict(ns, code: str, check: str):
    return LAB.verdict(ns, code, check)


WRONG_TIMERS = {
    "no sync after fn": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        sync(); t = clock(); fn(); out.append(clock() - t)
    return out''',
    "no sync before start": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t = clock(); fn(); sync(); out.append(clock() - t)
    return out''',
    "no warm-up": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    out = []
    for _ in range(repeats):
        sync(); t = clock(); fn(); sync(); out.append(clock() - t)
    return out''',
    "one sample": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    sync(); t = clock(); fn(); sync()
    return [clock() - t]''',
    "delegates to perflab.measure": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    return list(perflab.measure(fn, warmup=warmup, repeats=repeats).times_s)''',
}

WRONG_PHASES = {
    "all work in forward": '''
def my_timed_step(timer, batches, model, optimizer):
    with timer.phase("data"):
        pass
    with timer.phase("forward"):
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with timer.phase("backward"):
        pass
    with timer.phase("optimizer"):
        pass''',
    "backward inside forward": '''
def my_timed_step(timer, batches, model, optimizer):
    with timer.phase("data"):
        x, y = next(batches)
    with timer.phase("forward"):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    with timer.phase("backward"):
        pass
    with timer.phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad()''',
    "optimizer not timed": '''
def my_timed_step(timer, batches, model, optimizer):
    with timer.phase("data"):
        x, y = next(batches)
    with timer.phase("forward"):
        loss = F.cross_entropy(model(x), y)
    with timer.phase("backward"):
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()''',
}

_BODY = '''
            with record_function("data"):
                x, y = next(batches)
            with record_function("forward"):
                loss = F.cross_entropy(model(x), y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()'''
WRONG_SESSIONS = {
    "no schedule": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(wait + warmup + active):''' + _BODY + '''
            prof.step()
    prof.export_chrome_trace(trace_path)
    return prof''',
    "no prof.step()": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(wait + warmup + active):''' + _BODY + '''
    return prof''',
    "no data range": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(wait + warmup + active):
            x, y = next(batches)
            with record_function("forward"):
                loss = F.cross_entropy(model(x), y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            prof.step()
    return prof''',
    "wait and warmup ignored": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=0, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(wait + warmup + active):''' + _BODY + '''
            prof.step()
    return prof''',
    "delegates to perflab.profile": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    return perflab.profile(RunConfig.preset("tiny"), wait=wait, warmup=warmup, active=active,
                           progress=False)''',
}

WRONG_TOPS = {
    "total time, not self time": '''
def my_top_ops(prof, n=10):
    ops = [(e.key, e.cpu_time_total / 1e3) for e in prof.key_averages() if e.key.startswith("aten::")]
    return sorted(ops, key=lambda kv: kv[1], reverse=True)[:n]''',
    "microseconds": '''
def my_top_ops(prof, n=10):
    ops = [(e.key, e.self_cpu_time_total) for e in prof.key_averages() if e.key.startswith("aten::")]
    return sorted(ops, key=lambda kv: kv[1], reverse=True)[:n]''',
    "not only ATen ops": '''
def my_top_ops(prof, n=10):
    ops = [(e.key, e.cpu_time_total / 1e3) for e in prof.key_averages()]
    return sorted(ops, key=lambda kv: kv[1], reverse=True)[:n]''',
    "smallest first": '''
def my_top_ops(prof, n=10):
    ops = [(e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages() if e.key.startswith("aten::")]
    return sorted(ops, key=lambda kv: kv[1])[:n]''',
    "delegates to perflab.profile": '''
def my_top_ops(prof, n=10):
    top = perflab.profile(RunConfig.preset("tiny"), progress=False).top_ops
    return list(top[["name", "self_cpu_ms"]].itertuples(index=False, name=None))[:n]''',
}

WRONG_LOOPS = {
    "the given loop": "my_loop = loop_with_syncs",
    "per-step item on the loss": '''
def my_loop(model, optimizer, batches):
    total, correct, seen, steps = 0.0, None, 0, 0
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        total += loss.item()
        hits = (logits.argmax(1) == y).sum()
        correct = hits if correct is None else correct + hits
        seen += len(y); steps += 1
    return total / steps, correct.item() / seen''',
    "tensors, not floats": '''
def my_loop(model, optimizer, batches):
    total, correct, seen, steps = 0.0, 0, 0, 0
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        total = total + loss.detach(); correct = correct + (logits.argmax(1) == y).sum()
        seen += len(y); steps += 1
    return total / steps, correct / seen''',
    "last batch's accuracy": '''
def my_loop(model, optimizer, batches):
    total, steps = 0.0, 0
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        total = total + loss.detach(); steps += 1
        hits = (logits.argmax(1) == y).sum()
    return float(total) / steps, hits.item() / len(y)''',
}

_SLOWEST = '''
def my_slowest_line(dataset, n):
    lp = line_profiler.LineProfiler(type(dataset).__getitem__)
    for i in range(n):
        lp.runcall(dataset.__getitem__, i)
    stats = lp.get_stats()
    (entries,) = [e for (_, _, name), e in stats.timings.items() if name.endswith("__getitem__")]
    lineno, _, ticks = max(entries, key=lambda e: e[2])
    return lineno, ticks * stats.unit
'''
WRONG_PIPELINES = {
    "one sample too many": '''
def my_cprofile(dataset, n):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n + 1):
        dataset[i]
    prof.disable()
    return pstats.Stats(prof)''' + _SLOWEST,
    "returns the Profile": '''
def my_cprofile(dataset, n):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        dataset[i]
    prof.disable()
    return prof''' + _SLOWEST,
    "delegates to perflab.cprofile_loader": '''
def my_cprofile(dataset, n):
    return perflab.cprofile_loader(RunConfig.preset("tiny"), batches=1)''' + _SLOWEST,
    "most hits, not most time": '''
def my_cprofile(dataset, n):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        dataset[i]
    prof.disable()
    return pstats.Stats(prof)
def my_slowest_line(dataset, n):
    lp = line_profiler.LineProfiler(type(dataset).__getitem__)
    for i in range(n):
        lp.runcall(dataset.__getitem__, i)
    stats = lp.get_stats()
    (entries,) = [e for (_, _, name), e in stats.timings.items() if name.endswith("__getitem__")]
    lineno, _, ticks = entries[-1]
    return lineno, ticks * stats.unit''',
}

CASES = [("my_step_timer", "check_step_timer", WRONG_TIMERS),
         ("my_phase_timer", "check_phase_sum", WRONG_PHASES),
         ("my_profiler_session", "check_profiler_trace", WRONG_SESSIONS),
         ("my_top_ops", "check_top_ops", WRONG_TOPS),
         ("my_no_sync_loop", "check_no_hidden_sync", WRONG_LOOPS),
         ("my_pipeline_profile", "check_pipeline_profile", WRONG_PIPELINES)]

#: The checks whose wrong answers run here (tests/labs/test_grading_checks.py reads it).
CHECKS_TESTED = [c for _, c, _ in CASES]


@pytest.mark.parametrize("answer, check", [(a, c) for a, c, _ in CASES])
def test_reference_answer_passes(ns, answer, check):
    scope = dict(ns)
    if check == "check_no_hidden_sync":
        _define_given_loop(scope)
    v = _verdict(scope, LAB.solution(answer), check)
    assert v.passed, v.message


def _define_given_loop(scope: dict) -> None:
    src = next(c.source for c in LAB.nb.cells if c.cell_type == "code"
               and c.source.startswith("def loop_with_syncs"))
    LAB.run_code(scope, src)


@pytest.mark.parametrize("check, name, code", [
    (c, name, code) for _, c, wrongs in CASES for name, code in wrongs.items()],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 40 else "")
def test_wrong_answer_fails(ns, check, name, code):
    scope = dict(ns)
    if check == "check_no_hidden_sync":
        _define_given_loop(scope)
    v = _verdict(scope, code, check)
    assert not v.passed, f"{name!r} passed {check}"
    assert v.message


def test_every_lab01_check_has_wrong_answers():
    from perflab.course.answers import autograded
    assert set(autograded(LAB.nb)) == {c for _, c, _ in CASES}
