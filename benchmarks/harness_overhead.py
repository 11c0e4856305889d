"""How much does perflab's measuring cost, and does it agree with torch.utils.benchmark?

Prints two ratios, each measured side by side in this one run (interleaved rounds, so
drift on a shared machine hits both sides alike):

1. ``run()``'s median step time / a hand-written training loop's median step time on
   the same config (target <= 1.02: PhaseTimer's syncs and profiler ranges are cheap).
2. ``perflab.measure``'s median / ``torch.utils.benchmark.Timer``'s median for the same
   training-step function (target: within 5 %).

Usage: python benchmarks/harness_overhead.py [--image-size 64] [--batch-size 32]
       [--steps 15] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.benchmark as tbench

from perflab import Measurement, RunConfig, compare, measure, run
from perflab.data import infinite_batches
from perflab.step import build_training, train_step


def hand_loop_step_times(config: RunConfig) -> list[float]:
    """The loop a practitioner writes by hand: fetch, forward, backward, step, one
    perf_counter pair around each step (a deliberate second clock, as the reference)."""
    torch.manual_seed(config.seed)
    loader, model, opt, device = build_training(config)
    batches = infinite_batches(loader)
    times = []
    for i in range(config.warmup_steps + config.steps):
        t0 = time.perf_counter()
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if i >= config.warmup_steps:
            times.append(time.perf_counter() - t0)
    batches.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    config = RunConfig(image_size=args.image_size, batch_size=args.batch_size,
                       steps=args.steps, warmup_steps=3)
    print(f"config: {args.image_size} px, batch {args.batch_size}, {args.steps} steps x "
          f"{args.rounds} rounds, {torch.get_num_threads()} threads")

    perflab_steps, hand_steps = [], []
    for _ in range(args.rounds):
        perflab_steps += run(config, progress=False, save=False).step.times_s
        hand_steps += hand_loop_step_times(config)
    r1 = statistics.median(perflab_steps) / statistics.median(hand_steps)
    print(f"run() median step {statistics.median(perflab_steps) * 1e3:.2f} ms, hand loop "
          f"{statistics.median(hand_steps) * 1e3:.2f} ms -> ratio {r1:.4f} (target <= 1.02)")
    c = compare(Measurement("run()", tuple(perflab_steps)),
                Measurement("hand loop", tuple(hand_steps)))
    print(f"  hand loop vs run(): speedup 95 % CI {c.ci95[0]:.3f}-{c.ci95[1]:.3f}x; {c.verdict}")

    loader, model, opt, device = build_training(config)
    x, y = next(iter(loader))
    step = lambda: train_step(model, x, y, opt)  # noqa: E731
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours += measure(step, warmup=3, repeats=args.steps).times_s
        # Timer defaults to num_threads=1; give it the threads perflab.measure runs with.
        timer = tbench.Timer(stmt="step()", globals={"step": step},
                             num_threads=torch.get_num_threads())
        theirs += [timer.timeit(1).median for _ in range(args.steps)]
    r2 = statistics.median(ours) / statistics.median(theirs)
    print(f"perflab.measure median {statistics.median(ours) * 1e3:.2f} ms, "
          f"torch.utils.benchmark.Timer {statistics.median(theirs) * 1e3:.2f} ms -> ratio "
          f"{r2:.4f} (target within 5 %: {'met' if abs(r2 - 1) <= 0.05 else 'NOT met'})")
    print(f"harness overhead target {'met' if r1 <= 1.02 else 'NOT met'}")


if __name__ == "__main__":
    main()
