"""Input-pipeline efficiency (Lab 02) and the bf16/fp32 step-time ratio (Lab 03).

Prints, measured side by side in this one run (interleaved rounds, so drift on a shared
machine hits both sides of each ratio alike):

1. Input-pipeline efficiency = throughput / the compute-only bound (one batch kept on
   the device), at the quick size, for: the decode-bound baseline (JPEG decode + random
   resized crop per sample, num_workers=0), the same with SIMULATED slow storage, more
   workers for each, and the fixed pipeline (decoded uint8 cache, augmentation batched
   in torch, device prefetch; a persistent worker on a GPU). Target: fixed >= 97 % of
   the bound (one-sided Mann-Whitney tests on the pooled steps, above / below 97 %).
2. The worker sweep on the slow-storage case (perflab.analysis.loader_tuning.sweep_loader).
3. bf16 autocast vs fp32 step time at each image size (speedup, 95 % CI, Mann-Whitney
   p), and loss parity over the same seed and batches (first-step, max and mean
   |loss diff|, and the max difference of 5-step moving averages; lr 0.01).

Usage: python benchmarks/data_and_amp.py [--rounds 3] [--steps 15] [--latency-ms 4]
       [--sizes 32 64] [--parity-steps 40] [--parity-lr 0.01] [--skip-data] [--skip-amp]
Run it alone on the machine (e.g. under `flock /tmp/perflab-measure.lock`).
"""
from __future__ import annotations

import argparse
import warnings

import pandas as pd
import torch

from perflab import RunConfig, compare, env_summary
from perflab.analysis.amp import loss_parity
from perflab.analysis.loader_tuning import sweep_loader
from perflab.data.prefetch import pipeline_efficiency
from perflab.experiment import run, run_interleaved

# Slow-storage workers outnumber the cores on purpose: they wait, not compute.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def pipeline(args: argparse.Namespace) -> None:
    base = RunConfig.preset("quick", steps=args.steps)
    storage = base.replace(storage_latency_ms=args.latency_ms)
    # Lab 02's reference fix: decode once, augment whole batches on the device, copy
    # ahead on a side stream. On a GPU a persistent worker gathers batches into pinned
    # memory; on a CPU-only machine a worker only competes with the model for cores.
    gpu = torch.cuda.is_available()
    fix = dict(num_workers=1 if gpu else 0, persistent_workers=gpu, device_prefetch=True,
               pin_memory=gpu)
    worker_fix = dict(num_workers=1, persistent_workers=True, device_prefetch=True,
                      pin_memory=gpu)
    variants = {
        "baseline: decode per sample, 0 workers": base,
        "baseline, 2 workers": base.replace(num_workers=2, persistent_workers=True),
        "fixed: decoded cache (memory) + device prefetch":
            base.replace(decoded_cache="memory", **fix),
        "fixed: decoded cache (mmap) + device prefetch":
            base.replace(decoded_cache="mmap", **fix),
        "decoded cache (memory), 1 persistent worker":
            base.replace(decoded_cache="memory", **worker_fix),
        f"slow storage +{args.latency_ms:g} ms/file (simulated), 0 workers": storage,
        f"slow storage +{args.latency_ms:g} ms/file (simulated), 4 workers":
            storage.replace(num_workers=4, persistent_workers=True),
        f"slow storage +{args.latency_ms:g} ms/file (simulated), fixed (memory cache)":
            storage.replace(decoded_cache="memory", **fix),
    }
    print(f"\n== 1. input-pipeline efficiency: {base.image_size} px, batch {base.batch_size}; "
          f"each variant alternates with its own compute-only bound, {args.rounds} rounds "
          f"x {args.steps} steps ==")
    rows, bound = [], None
    for name, c in variants.items():
        if c.compute_only:
            continue
        v, b = run_interleaved([c.replace(label=name),
                                c.replace(compute_only=True, label="compute-only bound")],
                               rounds=args.rounds, progress=False)
        bound = bound or b
        e = pipeline_efficiency(v, b, target=0.97)
        rows.append({"variant": name, "samples_per_s": v.samples_per_s,
                     "bound_samples_per_s": b.samples_per_s,
                     "efficiency_pct": 100 * e.efficiency,
                     "ci95_pct": f"{100 * e.ci95[0]:.1f}-{100 * e.ci95[1]:.1f}",
                     "data_wait_pct": 100 * v.data_wait_share,
                     "vs 97 %": ("above" if e.exceeds_target else "below" if e.falls_short
                                 else "not different"),
                     "p above/below": f"{e.p_above:.2g}/{e.p_below:.2g}"})
    print(pd.DataFrame(rows).round(1).to_string(index=False))

    print(f"\n== 2. worker sweep, slow storage +{args.latency_ms:g} ms/file (simulated) ==")
    sweep = sweep_loader(storage, num_workers=[0, 1, 2, 4, 8], persistent_workers=[True],
                         bound=bound, progress=False)
    cols = ["num_workers", "persistent_workers", "samples_per_s", "efficiency_pct",
            "data_wait_pct", "worker_startup_s", "first_batch_s"]
    print(sweep.table[cols].round(3).to_string(index=False))


def amp(args: argparse.Namespace) -> None:
    env = env_summary()
    print(f"\n== 3. bf16 autocast vs fp32 on {env.device} (bf16 support: {env.bf16}, "
          f"{env.bf16_reason}) ==")
    rows = []
    for size in args.sizes:
        fp32 = RunConfig.preset("quick", image_size=size, steps=args.steps, label=f"fp32 {size}px")
        bf16 = fp32.replace(amp="bf16", label=f"bf16 {size}px")
        a, b = run_interleaved([fp32, bf16], rounds=args.rounds, progress=False)
        c = compare(a.step, b.step)
        n = args.parity_steps
        pcfg = dict(steps=n - 3, warmup_steps=3, lr=args.parity_lr)
        pa = run(fp32.replace(**pcfg), progress=False, save=False)
        pb = run(bf16.replace(**pcfg), progress=False, save=False)
        par = loss_parity(pa, pb)
        rows.append({"px": size, "fp32_ms": a.step.median * 1e3, "bf16_ms": b.step.median * 1e3,
                     "speedup": c.speedup, "ci95": f"{c.ci95[0]:.2f}-{c.ci95[1]:.2f}",
                     "p": f"{c.p_value:.2g}", "significant": c.significant,
                     "first-step |dloss|": par.first_step_abs,
                     f"max|dloss| ({n} steps)": par.max_abs, "mean|dloss|": par.mean_abs,
                     "5-step avg max|dloss|": par.smooth_max_abs,
                     "mean loss": par.mean_reference,
                     "peak_rss_gib fp32/bf16": f"{a.peak_mem_gib:.2f}/{b.peak_mem_gib:.2f}"})
    print(pd.DataFrame(rows).round(4).to_string(index=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--latency-ms", type=float, default=4.0)
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--parity-steps", type=int, default=40)
    ap.add_argument("--parity-lr", type=float, default=0.01,
                    help="lr of the parity runs (the presets' 0.05 makes the loss jump)")
    ap.add_argument("--skip-data", action="store_true")
    ap.add_argument("--skip-amp", action="store_true")
    args = ap.parse_args()
    print(env_summary())
    if not args.skip_data:
        pipeline(args)
    if not args.skip_amp:
        amp(args)


if __name__ == "__main__":
    main()
