"""What do activation checkpointing and torch.compile do on this machine, side by side?

Prints, all measured in this one run:

1. Checkpointing (ResNet-18 training, fixed batch): for each setting the bytes saved for
   backward and the step time, as ratios to no checkpointing (memory ratio, time ratio),
   and the largest batch within a memory budget with and without it.
2. torch.compile, three workloads, each eager vs compiled with compile time, steady-state
   speedup (95 % CI, Mann-Whitney verdict) and break-even step count: ResNet-18
   training (compiled in a fresh process with a cold inductor cache, then again warm),
   a fusion-bound pointwise chain, and ResNet-18 inference with inductor freezing (both
   compiled in this process with an empty cache directory).

On a shared machine run it under the measurement lock:
    flock /tmp/perflab-measure.lock python benchmarks/checkpointing_and_compile.py

Usage: python benchmarks/checkpointing_and_compile.py [--image-size 64] [--batch-size 32]
       [--repeats 10] [--budget-gib 0.25] [--skip-compile] [--skip-checkpointing]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import pandas as pd
import torch

from perflab import RunConfig, run
from perflab.analysis.checkpointing import tradeoff_curve
from perflab.analysis.compilation import (
    describe_break_even, generated_code, kernel_summary, time_compile,
)
from perflab.analysis.compile_cache import run_in_fresh_process, timing_from_runs
from perflab.analysis.max_batch import find_max_batch
from perflab.models import resnet18
from perflab.train.workloads import pointwise_chain, pointwise_inputs, synthetic_batch


def checkpointing(config: RunConfig, repeats: int, budget_gib: float) -> None:
    curve = tradeoff_curve(config, warmup=2, repeats=repeats)
    t = curve.table
    base = t.loc["none"]
    rows = pd.DataFrame({
        "checkpointed": t.checkpointed,
        "saved_MiB": t.saved_mib.round(2),
        "memory_ratio": (t.saved_mib / base.saved_mib).round(3),
        "peak_MiB": t.peak_mib.round(1),
        "step_ms": t.step_ms.round(1),
        "time_ratio": (t.step_ms / base.step_ms).round(3),
        "ci95_ms": [f"{lo:.0f}-{hi:.0f}" for lo, hi in zip(t.step_ci_low_ms, t.step_ci_high_ms)],
    })
    print(f"\n== activation checkpointing: ResNet-18, {config.image_size} px, batch "
          f"{config.batch_size}, on {curve.device} (ratios vs 'none') ==")
    print(rows.to_string())
    print(f"\nlargest batch within {budget_gib} GiB:")
    for s in ("none", 2, "per_stage"):
        r = find_max_batch(config.replace(checkpointing=s), budget_gib=budget_gib)
        print(f"  checkpointing={s!s:>9}: {r.batch_size}")


def compile_workloads(config: RunConfig, repeats: int) -> None:
    device = config.resolved_device()
    rows = []
    eager = run(config.replace(label="eager"), progress=False, save=False)
    with tempfile.TemporaryDirectory() as cache:
        cold = run_in_fresh_process(config.replace(compile="default"), cache, clear=True)
        warm = run_in_fresh_process(config.replace(compile="default"), cache)
    for name, r in (("ResNet-18 training (cold cache)", cold), ("  warm cache rerun", warm)):
        t = timing_from_runs(eager, r.result, name)
        rows.append({**t.summary(), "kernels": len(r.kernels.fused)})
    x, w, b = pointwise_inputs(device=device)
    chain_c = torch.compile(pointwise_chain)
    with torch.no_grad():
        chain, code = generated_code(lambda: time_compile(
            lambda: pointwise_chain(x, w, b), lambda: chain_c(x, w, b),
            label="pointwise chain (4096x1024)", device=device, repeats=repeats))
    rows.append({**chain.summary(), "kernels": len(kernel_summary(code).fused)})
    model = resnet18(10).to(device).eval()
    xb, _ = synthetic_batch(config, device=device)
    model_c = torch.compile(model)
    with torch.no_grad():
        inf, code = generated_code(lambda: time_compile(
            lambda: model(xb), lambda: model_c(xb), label="ResNet-18 inference (freezing)",
            device=device, repeats=repeats, inductor_config={"freezing": True}))
    rows.append({**inf.summary(), "kernels": len(kernel_summary(code).fused)})
    df = pd.DataFrame(rows).set_index("workload")
    df["break_even"] = [describe_break_even(v) for v in df.pop("break_even_steps")]
    df["speedup_ci95"] = [f"{lo:.2f}-{hi:.2f}x" for lo, hi in
                          zip(df.pop("speedup_ci_low"), df.pop("speedup_ci_high"))]
    print(f"\n== torch.compile (mode 'default') on {device}; speedup = eager / compiled median ==")
    cols = ["compile_s", "eager_ms", "compiled_ms", "speedup", "speedup_ci95", "break_even",
            "kernels", "verdict"]
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(df[cols].round(2).to_string())
    print(f"\ninductor cache: cold compile {cold.compile_s:.1f} s, warm {warm.compile_s:.1f} s "
          f"({cold.compile_s / warm.compile_s:.1f}x faster); whole process {cold.process_s:.0f} s"
          f" vs {warm.process_s:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--budget-gib", type=float, default=0.25)
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--skip-checkpointing", action="store_true")
    args = ap.parse_args()
    config = RunConfig.preset("quick", image_size=args.image_size, batch_size=args.batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_checkpointing:
        checkpointing(config, args.repeats, args.budget_gib)
    if not args.skip_compile:
        with tempfile.TemporaryDirectory() as cache:  # in-process compiles start cold too
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            compile_workloads(config, args.repeats)


if __name__ == "__main__":
    main()
