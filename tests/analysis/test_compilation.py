"""Lab 05's pieces: break-even arithmetic, graph breaks and recompiles, generated kernels,
and the compile cache's fresh-process runs (compiles only tiny functions)."""
from __future__ import annotations

import math
import subprocess

import pytest
import torch

from perflab import RunConfig
from perflab.analysis.compilation import (
    CompileTiming, KernelSummary, break_even_steps, compile_overhead_s, count_compiles,
    describe_break_even, generated_code, graph_breaks, kernel_summary, op_time_share,
    time_compile,
)
from perflab.analysis.compile_cache import (
    CacheLookups, cache_lookups, inductor_cache_dir, run_in_fresh_process, timing_from_runs,
)
from perflab.core.measurement import Measurement
from perflab.train.workloads import pointwise_chain, pointwise_inputs
from tests.synthetic import synthetic_result


def test_break_even_arithmetic():
    assert break_even_steps(10.0, 0.2, 0.1) == pytest.approx(100.0)
    assert break_even_steps(0.0, 0.2, 0.1) == 0.0
    assert break_even_steps(10.0, 0.1, 0.1) == math.inf      # no gain: never
    assert break_even_steps(10.0, 0.1, 0.12) == math.inf     # slower: never
    assert describe_break_even(math.inf) == "never"
    assert describe_break_even(1233.2) == "after 1,234 steps"
    assert describe_break_even(2.0, "calls") == "after 2 calls"
    for bad in ((-1, 0.2, 0.1), (1, 0, 0.1), (1, 0.2, 0)):
        with pytest.raises(ValueError, match="need compile_s >= 0"):
            break_even_steps(*bad)


def _m(label, times, warmup=()):
    return Measurement(label=label, times_s=times, warmup_s=warmup)


def test_compile_overhead_and_timing():
    compiled = _m("c", (0.10, 0.11, 0.09, 0.10), warmup=(5.1, 0.3))
    assert compile_overhead_s(compiled) == pytest.approx(5.1 + 0.3 - 2 * 0.10)
    assert compile_overhead_s(_m("c", (1.0, 1.0), warmup=(0.5,))) == 0.0  # never negative
    with pytest.raises(ValueError, match="has no warm-up times"):
        compile_overhead_s(_m("c", (1.0, 1.0)))
    eager = _m("e", (0.20, 0.21, 0.19, 0.20))
    t = CompileTiming("w", eager, compiled, compile_overhead_s(compiled))
    assert t.speedup == pytest.approx(2.0)
    assert t.break_even == pytest.approx(5.2 / 0.10)
    s = t.summary()
    assert s["workload"] == "w" and s["break_even_steps"] == pytest.approx(52.0)
    assert "faster" in s["verdict"]


def test_timing_from_runs():
    base = RunConfig(device="cpu")
    eager = synthetic_result(base, {"forward": 100.0})
    comp = synthetic_result(base.replace(compile="default"), {"forward": 80.0})
    comp = type(comp)(**{**comp.__dict__, "phases": {
        **comp.phases, "step": Measurement("step", comp.step.times_s, warmup_s=(30.0,))}})
    t = timing_from_runs(eager, comp, "resnet")
    assert t.compile_s == pytest.approx(30.0 - comp.step.median)
    assert t.speedup == pytest.approx(1.25)
    with pytest.raises(ValueError, match="need an eager run and a compiled run"):
        timing_from_runs(comp, eager, "x")


def _branchy(x):
    if x.sum() > 0:                       # data-dependent Python branch: a graph break
        return torch.relu(x) * 2
    return torch.sigmoid(x) - 1


def _branch_free(x):
    return torch.where(x.sum() > 0, torch.relu(x) * 2, torch.sigmoid(x) - 1)


def test_graph_breaks_on_a_data_dependent_branch():
    x = torch.randn(16)
    g = graph_breaks(_branchy, x)
    assert (g.graphs, g.breaks) == (2, 1)
    assert "if x.sum() > 0:" in g.reasons[0] and "_branchy" in g.reasons[0]
    assert g.lines == ("if x.sum() > 0:                       # data-dependent Python branch: "
                       "a graph break",)                        # the user's source line
    g = graph_breaks(_branch_free, x)
    assert (g.graphs, g.breaks, g.reasons, g.lines) == (1, 0, (), ())
    for v in (x.abs(), -x.abs()):
        torch.testing.assert_close(_branch_free(v), _branchy(v))


def test_count_compiles_and_recompiles():
    shapes = [(torch.randn(n),) for n in (8, 16, 24, 32)]
    c = count_compiles(torch.sin, shapes)
    # the second shape fails the size guard; dynamo recompiles once with a dynamic size
    assert (c.calls, c.graphs, c.recompiles) == (4, 2, 1)
    assert "size mismatch at index 0. expected 8, actual 16" in c.reasons[0]
    c = count_compiles(torch.sin, shapes, dynamic=True)
    assert (c.graphs, c.recompiles, c.reasons) == (1, 0, ())
    with pytest.raises(ValueError, match="at least one argument tuple"):
        count_compiles(torch.sin, [])


def test_kernel_summary_parses_output_code():
    code = '''
cpp_fused_add_relu_0 = async_compile.cpp_pybinding(['float*'], \'\'\'...\'\'\')
triton_poi_fused_mul_1 = async_compile.triton('triton_poi_fused_mul_1', \'\'\'...\'\'\')
def call(args):
    buf0 = extern_kernels.convolution(arg0_1, arg1_1, None)
    buf1 = torch.ops.aten.convolution_backward.default(buf0, arg0_1)
    buf2 = extern_kernels.convolution(buf0, arg1_1, None)
    buf3 = torch.ops.inductor._alloc_from_pool(buf2, 0)
    cpp_fused_add_relu_0(buf0)
'''
    k = kernel_summary(code)
    assert k.fused == ("cpp_fused_add_relu_0", "triton_poi_fused_mul_1")
    assert k.library == {"extern_kernels.convolution": 2, "torch.ops.aten.convolution_backward": 1}
    assert k.library_calls == 3
    assert repr(k).startswith("KernelSummary(2 generated kernels")
    assert kernel_summary([code, code]).library_calls == 6


@pytest.mark.slow
def test_inductor_fuses_the_pointwise_chain(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x, w, b = pointwise_inputs(64, 32)
    with torch.no_grad():
        out, code = generated_code(torch.compile(pointwise_chain), x, w, b)
        torch.testing.assert_close(out, pointwise_chain(x, w, b), rtol=1e-4, atol=1e-4)
        k = kernel_summary(code)
        assert len(k.fused) == 1 and k.library == {}   # 7 ATen ops, one generated kernel
        compiled = torch.compile(pointwise_chain)
        t = time_compile(lambda: pointwise_chain(x, w, b), lambda: compiled(x, w, b),
                         label="chain", warmup=1, repeats=3)
    assert t.eager.n == t.compiled.n == 3 and t.compile_s >= 0
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        time_compile(lambda: None, lambda: None, label="x", warmup=0)


def test_inductor_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLAB_RESULTS", str(tmp_path))
    assert inductor_cache_dir() == tmp_path / "inductor-cache" / "lab05"
    assert inductor_cache_dir("x", root="/r") == type(tmp_path)("/r/inductor-cache/x")


def test_run_in_fresh_process_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="nothing to compile"):
        run_in_fresh_process(RunConfig(device="cpu"), tmp_path)

    def failing(cmd, **kw):
        assert kw["env"]["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "c").resolve())
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nBoom: inductor failed")
    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(RuntimeError, match="(?s)exit 1.*Boom: inductor failed"):
        run_in_fresh_process(RunConfig(device="cpu", compile="default"), tmp_path / "c")


@pytest.mark.slow
def test_run_in_fresh_process_cold_then_warm(tiny_dataset, tmp_path):
    """A tiny model compiled in two fresh processes sharing a cache: the second is warm."""
    cfg = RunConfig(device="cpu", model="tiny", dataset=tiny_dataset, image_size=16,
                    batch_size=4, steps=2, warmup_steps=1, compile="default")
    cache = tmp_path / "cache"
    cold = run_in_fresh_process(cfg, cache, clear=True)
    warm = run_in_fresh_process(cfg, cache)
    assert cold.cold and not warm.cold and any(cache.iterdir())
    assert cold.result.config == cfg and len(cold.result.losses) == 3
    assert isinstance(cold.kernels, KernelSummary) and len(cold.kernels.fused) >= 1
    assert cold.kernels.library.get("extern_kernels.convolution", 0) >= 2
    assert warm.kernels.fused == cold.kernels.fused  # the same code, from the cache
    assert "cold cache" in repr(cold) and "warm cache" in repr(warm)


def test_op_time_share():
    a = torch.randn(256, 256)
    fn = lambda: torch.mm(a, a).add_(1)  # noqa: E731
    fn()
    share = op_time_share(fn, ("mm",))
    assert 0.0 < share < 1.0                             # add_ takes some time too
    # Two profiles are two timings, so comparing their shares moves with machine load
    # (CI once saw mm+add_ < mm alone). Only facts true of any one profile are asserted.
    assert op_time_share(fn, ("",)) == pytest.approx(1.0)    # every op matches ""
    assert op_time_share(fn, ("no_such_op",)) == 0.0


@pytest.mark.slow
def test_lab04_05_modules_import_without_side_effects():
    import sys as _sys

    code = (
        "import logging, torch\n"
        "threads = torch.get_num_threads(); handlers = list(logging.getLogger().handlers)\n"
        "import perflab.analysis.accumulation, perflab.analysis.checkpointing, perflab.analysis.compilation\n"
        "import perflab.analysis.compile_cache, perflab.analysis.max_batch, perflab.analysis.memory_parts\n"
        "import perflab.train.workloads, os\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised at import'\n"
        "assert torch.get_num_threads() == threads, 'thread count changed at import'\n"
        "assert logging.getLogger().handlers == handlers, 'logging configured at import'\n"
        "assert 'matplotlib.pyplot' not in __import__('sys').modules, 'pyplot imported'\n"
        "assert 'TORCHINDUCTOR_CACHE_DIR' not in os.environ, 'inductor cache dir set'\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr


def test_cache_lookups_count_inductor_hits_and_misses(monkeypatch):
    """The FX graph cache counters, as inductor bumps them: a stretch is the difference
    of two readings; it was warm only when every graph came from the cache."""
    from torch._dynamo.utils import counters

    monkeypatch.setitem(counters, "inductor", counters["inductor"].copy())
    before = cache_lookups()
    counters["inductor"]["fxgraph_cache_hit"] += 2            # forward and backward loaded
    warm = cache_lookups() - before
    assert warm == CacheLookups(hits=2) and warm.all_hits
    counters["inductor"]["fxgraph_cache_miss"] += 1           # one more compiled
    mixed = cache_lookups() - before
    assert mixed == CacheLookups(hits=2, misses=1) and not mixed.all_hits
    assert not CacheLookups().all_hits                        # nothing looked up: not warm
    assert not CacheLookups(hits=3, bypasses=1).all_hits
