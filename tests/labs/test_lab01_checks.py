"""Lab 01's graded checks on real wrong answers: each check runs as grading runs it (the
student's function on hidden cases drawn from a seed, in this process as in the kernel;
the judge apart, on the answers as JSON). The reference solution passes at several
seeds, an honest variant written differently passes, every wrong answer below fails on
a hidden case (written-for-the-examples ones included), and delegating to perflab's
helper fails naming it."""
from __future__ import annotations

import pytest

from tests.labs.labcheck import REFERENCE_SEEDS, Lab

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
    "the example's samples": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    for _ in range(warmup + repeats):
        sync(); fn(); sync()
    return [0.0051] * repeats''',
    "one sample repeated": '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    sync(); t = clock(); fn(); sync(); first = clock() - t
    for _ in range(repeats - 1):
        sync(); fn(); sync()
    return [first] * repeats''',
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
    "optimizer step inside backward": '''
def my_timed_step(timer, batches, model, optimizer):
    with timer.phase("data"):
        x, y = next(batches)
    with timer.phase("forward"):
        loss = F.cross_entropy(model(x), y)
    with timer.phase("backward"):
        loss.backward()
        optimizer.step()
    with timer.phase("optimizer"):
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
    "the example's schedule (1, 1, 2)": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(wait + warmup + active):''' + _BODY + '''
            prof.step()
    return prof''',
    "returns the trace path": '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for _ in range(wait + warmup + active):''' + _BODY + '''
            prof.step()
    return trace_path''',
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
    "always three rows": '''
def my_top_ops(prof, n=10):
    ops = [(e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages() if e.key.startswith("aten::")]
    return sorted(ops, key=lambda kv: kv[1], reverse=True)[:3]''',
    "ranked by calls": '''
def my_top_ops(prof, n=10):
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    return [(e.key, e.self_cpu_time_total / 1e3) for e in sorted(ops, key=lambda e: -e.count)][:n]''',
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
    "the loss of the last step": '''
def my_loop(model, optimizer, batches):
    correct, seen = None, 0
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        hits = (logits.argmax(1) == y).sum()
        correct = hits if correct is None else correct + hits
        seen += len(y)
    return loss.item(), correct.item() / seen''',
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
    "delegates to perflab's cprofile_loader": '''
def my_cprofile(dataset, n):
    from perflab.analysis.profiling import cprofile_loader
    return cprofile_loader(RunConfig.preset("tiny"), batches=1)''' + _SLOWEST,
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
    "the example's line": '''
def my_cprofile(dataset, n):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        dataset[i]
    prof.disable()
    return pstats.Stats(prof)
def my_slowest_line(dataset, n):
    for i in range(n):
        dataset[i]
    return type(dataset).__getitem__.__code__.co_firstlineno + 2, 0.003 * n''',
    "milliseconds, not seconds": '''
def my_cprofile(dataset, n):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        dataset[i]
    prof.disable()
    return pstats.Stats(prof)''' + _SLOWEST.replace("ticks * stats.unit", "ticks * stats.unit / 1e3"),
}

_IDLE = LAB.solution("my_stream_idle")
WRONG_IDLE = {
    # the gaps between kernels of different streams, not per stream
    "one timeline for all streams": _IDLE.replace(
        'for stream, k in events[events.kernel & (events.stream >= 0)].groupby("stream"):',
        'for stream, k in [(s, events[events.kernel & (events.stream >= 0)]) for s in sorted(set(events.stream[events.kernel & (events.stream >= 0)]))]:'),
    # the kernel's own start instead of its launch: every gap looks like a host wait
    "host wait from the kernel's start": _IDLE.replace(
        "host = (k.correlation.map(launch_ts) > prev_end).iloc[1:]", "host = (k.ts > prev_end).iloc[1:]"),
    # HTA's default threshold whatever delay_us says
    "always 30 us": _IDLE.replace("short = gap < delay_us", "short = gap < 30.0"),
    # busy as the span from the first kernel to the last
    "busy is the span": _IDLE.replace('"busy_us": float((k.end - k.ts).sum())',
                                      '"busy_us": float(k.end.max() - k.ts.min())'),
    "delegates to perflab's idle_time_breakdown": """
def my_stream_idle(events, delay_us=30.0):
    from perflab.analysis.trace import RankTrace
    from perflab.analysis.trace_analysis import idle_time_breakdown
    ev = events.assign(step=False)
    rt = RankTrace(rank=0, events=ev, on_gpu=True, trace={}, path=None)
    long = idle_time_breakdown({0: rt}, by_stream=True, consecutive_kernel_delay_us=delay_us)
    wide = long.pivot_table(index="stream", columns="idle_category", values="idle_us", aggfunc="sum").fillna(0.0)
    k = events[events.kernel & (events.stream >= 0)]
    out = pd.DataFrame({"kernels": k.groupby("stream").size(), "busy_us": (k.end - k.ts).groupby(k.stream).sum()})
    for c in ("host_wait", "kernel_wait", "other"):
        out[c + "_us"] = wide[c] if c in wide else 0.0
    return out.fillna(0.0)""",
}

#: One honest answer per exercise, written differently from the reference: it passes.
HONEST = {
    "my_step_timer": ("one clock read per boundary", '''
def my_time_step(fn, *, warmup=3, repeats=10, sync=lambda: None, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    sync()
    marks = [clock()]
    for _ in range(repeats):
        fn()
        sync()
        marks.append(clock())
    return [b - a for a, b in zip(marks, marks[1:])]'''),
    "my_phase_timer": ("logits first, zero_grad by default", '''
def my_timed_step(timer, batches, model, optimizer):
    with timer.phase("data"):
        batch = next(batches)
    with timer.phase("forward"):
        logits = model(batch[0])
        loss = torch.nn.functional.cross_entropy(logits, batch[1])
    with timer.phase("backward"):
        loss.backward()
    with timer.phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad()'''),
    "my_profiler_session": ("start/stop and a named handler, CPU only", '''
def my_profile_steps(model, optimizer, batches, trace_path, *, wait=1, warmup=1, active=3):
    def handler(p):
        p.export_chrome_trace(trace_path)
    plan = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    prof = torch.profiler.profile(activities=[ProfilerActivity.CPU], schedule=plan,
                                  on_trace_ready=handler)
    prof.start()
    for _ in range(wait + warmup + active):
        with record_function("data"):
            x, y = next(batches)
        with record_function("forward"):
            out = model(x)
            loss = F.cross_entropy(out, y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        prof.step()
    prof.stop()
    return prof'''),
    "my_top_ops": ("heapq.nlargest", '''
def my_top_ops(prof, n=10):
    import heapq
    rows = {e.key: e.self_cpu_time_total for e in prof.key_averages() if e.key[:6] == "aten::"}
    return [(k, us * 1e-3) for k, us in heapq.nlargest(n, rows.items(), key=lambda kv: kv[1])]'''),
    "my_no_sync_loop": ("one sync: both totals stacked", '''
def my_loop(model, optimizer, batches):
    losses, hits, seen = [], [], 0
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        hits.append((logits.argmax(dim=1) == y).sum())
        seen += len(y)
    mean_loss, correct = torch.stack([torch.stack(losses).mean(),
                                      torch.stack(hits).sum().float()]).tolist()
    return float(mean_loss), correct / seen'''),
    "my_pipeline_profile": ("context managers", '''
def my_cprofile(dataset, n):
    with cProfile.Profile() as prof:
        for i in range(n):
            dataset[i]
    return pstats.Stats(prof)

def my_slowest_line(dataset, n):
    lp = line_profiler.LineProfiler()
    lp.add_function(type(dataset).__getitem__)
    with lp:
        for i in range(n):
            dataset[i]
    stats = lp.get_stats()
    rows = [r for (_, _, fn), entries in stats.timings.items() if fn.endswith("__getitem__")
            for r in entries]
    best = max(rows, key=lambda r: r[2])
    return best[0], best[2] * stats.unit'''),
    "my_stream_idle": ("plain Python over the rows", '''
def my_stream_idle(events, delay_us=30.0):
    launches = {}
    for r in events.itertuples():
        if not r.on_device and r.correlation != -1:
            launches[r.correlation] = r.ts
    streams = {}
    for r in sorted(events.itertuples(), key=lambda r: r.ts):
        if r.kernel and r.stream >= 0:
            streams.setdefault(r.stream, []).append(r)
    table = []
    for s in sorted(streams):
        ks = streams[s]
        acc = {"stream": s, "kernels": len(ks), "busy_us": sum(k.end - k.ts for k in ks),
               "host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0}
        for before, k in zip(ks, ks[1:]):
            gap = k.ts - before.end
            if launches.get(k.correlation, float("-inf")) > before.end:
                acc["host_wait_us"] += gap
            elif gap < delay_us:
                acc["kernel_wait_us"] += gap
            else:
                acc["other_us"] += gap
        table.append(acc)
    return pd.DataFrame(table).set_index("stream")'''),
}

CASES = [("my_step_timer", "check_step_timer", WRONG_TIMERS),
         ("my_phase_timer", "check_phase_sum", WRONG_PHASES),
         ("my_profiler_session", "check_profiler_trace", WRONG_SESSIONS),
         ("my_top_ops", "check_top_ops", WRONG_TOPS),
         ("my_no_sync_loop", "check_no_hidden_sync", WRONG_LOOPS),
         ("my_pipeline_profile", "check_pipeline_profile", WRONG_PIPELINES),
         ("my_stream_idle", "check_stream_idle", WRONG_IDLE)]

#: The checks whose wrong answers run here (tests/labs/test_grading_checks.py reads it).
CHECKS_TESTED = [c for _, c, _ in CASES]


def _scope(ns: dict, check: str) -> dict:
    scope = dict(ns)
    if check == "check_no_hidden_sync":
        _define_given_loop(scope)   # the self-check compares with it; "the given loop" uses it
    return scope


@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
@pytest.mark.parametrize("answer, check", [(a, c) for a, c, _ in CASES])
def test_reference_answer_passes(ns, answer, check, seed):
    scope = _scope(ns, check)
    LAB.run_code(scope, LAB.solution(answer))
    v = LAB.judge(scope, check, seed=seed)
    assert v.passed, v.message


@pytest.mark.parametrize("answer, check", [(a, c) for a, c, _ in CASES])
def test_honest_variant_passes(ns, answer, check):
    name, code = HONEST[answer]
    scope = _scope(ns, check)
    LAB.run_code(scope, code)
    v = LAB.judge(scope, check, seed=7)
    assert v.passed, (name, v.message)


def _define_given_loop(scope: dict) -> None:
    src = next(c.source for c in LAB.nb.cells if c.cell_type == "code"
               and c.source.startswith("def loop_with_syncs"))
    LAB.run_code(scope, src)


@pytest.mark.parametrize("check, name, code", [
    (c, name, code) for _, c, wrongs in CASES for name, code in wrongs.items()],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 40 else "")
def test_wrong_answer_fails(ns, check, name, code):
    v = _verdict(_scope(ns, check), code, check)
    assert not v.passed, f"{name!r} passed {check}"
    if name.startswith("delegates to"):
        assert "the graded call ran perflab" in v.message, v.message
    else:
        assert v.message.startswith("hidden case"), v.message


def test_every_lab01_check_has_wrong_answers():
    from perflab.course.answers import autograded
    assert set(autograded(LAB.nb)) == {c for _, c, _ in CASES}
    assert set(HONEST) == {a for a, _, _ in CASES}


# -- the NVTX section (GPU-only): its CUDA branch run here on a stand-in ---------------------------
def _nvtx_cell() -> str:
    return next(c.source for c in LAB.nb.cells if c.cell_type == "code" and "NvtxPhases" in c.source)


def test_nvtx_section_is_skipped_with_the_measured_reason_on_a_cpu(ns, monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    scope = dict(ns)
    LAB.run_code(scope, _nvtx_cell())
    out = capsys.readouterr().out
    assert scope["nvtx_skipped"].startswith("torch.cuda.is_available() is False")
    assert f"torch.version.cuda = {torch.version.cuda}" in out and scope["nvtx_ranges"] == []
    assert "nsys profile --trace=cuda,nvtx" in out


def test_nvtx_section_brackets_the_students_step_and_phases(ns, monkeypatch, capsys):
    """On a GPU the cell pushes a range per step and per phase of the student's own
    my_timed_step, balanced, inside emit_nvtx() and cudaProfilerStart/Stop: checked here
    with recording stand-ins for torch.cuda's nvtx/profiler calls on a CPU training."""
    import contextlib

    import torch
    from perflab.train.workloads import tiny_training

    log = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in GPU")
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda m: log.append(("push", m)) or 0)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: log.append(("pop",)) or 0)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: log.append(("start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: log.append(("stop",)))

    @contextlib.contextmanager
    def fake_emit_nvtx():
        log.append(("emit on",))
        yield
        log.append(("emit off",))
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", fake_emit_nvtx)
    parts = tiny_training(batches=4)
    scope = dict(ns)
    LAB.run_code(scope, LAB.solution("my_phase_timer"))
    scope["build_training"] = lambda cfg: (list(zip(parts.x, parts.y)), parts.model,
                                           parts.optimizer, torch.device("cpu"))
    LAB.run_code(scope, _nvtx_cell())
    assert scope["nvtx_skipped"] is None
    assert log[0] == ("start",) and log[1] == ("emit on",) and log[-2:] == [("emit off",), ("stop",)]
    depth, pushed = 0, []
    for event in log:
        if event[0] == "push":
            depth += 1
            pushed.append((event[1], depth))
        elif event[0] == "pop":
            depth -= 1
            assert depth >= 0, "a range popped that was never pushed"
    assert depth == 0, "ranges left open"
    phases = ["perflab:data", "perflab:forward", "perflab:backward", "perflab:optimizer"]
    for i in range(3):
        assert pushed[5 * i] == (f"step {i}", 1)
        assert pushed[5 * i + 1: 5 * i + 5] == [(p, 2) for p in phases]
    assert len(scope["nvtx_ranges"]) == 15 and "15 NVTX ranges" in capsys.readouterr().out


# -- the written answer ---------------------------------------------------------------------------
def test_written_answer_is_a_rubric_with_a_model_answer():
    cell = next(c for c in LAB.nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_sync_gap")
    points = cell.metadata["nbgrader"]["points"]
    answer = cell.source.split("### BEGIN SOLUTION", 1)[1]
    assert answer.strip().startswith(f"**Rubric ({points} points).**")
    assert "**A model answer, for the grader's reference** (true on any machine" in answer
    assert "on a cpu" in answer.lower() and "gpu" in answer.lower()
