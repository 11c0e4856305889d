"""How much of DDP's gradient allreduce hides behind backward, per bucket size?

Two gloo ranks on this machine (one thread each) train ResNet-18 data-parallel, once
per bucket_cap_mb, on the real loopback backend and on a SIMULATED 1 Gbit/s link
(perflab.link, preset "1gbe": alpha = 50 us, beta = 125 MB/s). For each run it prints,
per rank (medians): compute (the step under no_sync), comm (the buckets allreduced
alone), the DDP step, exposed communication, and overlap efficiency against both ideals
(textbook max(compute, comm); DDP's bound max(compute, forward + comm)), then the best
bucket size on the simulated link and whether it reaches the target (>= 0.8 vs the DDP
bound).

Why this workload: at 64 px and batch 32 per rank a one-thread ResNet-18 step takes
~0.45 s here, and its 44.7 MB of fp32 gradients take 0.36 s at 1 Gbit/s, so compute
and communication are comparable and bucket size matters. Optionally (--wan) a third
sweep on a high-latency link (alpha = 5 ms, 1 Gbit/s), where large buckets win.

All runs of a sweep share one launch (perflab.distributed.launch_sweep). On a shared machine
run it under the measurement lock:
    flock /tmp/perflab-measure.lock python benchmarks/ddp_overlap.py

Usage: python benchmarks/ddp_overlap.py [--steps 6] [--warmup 2]
       [--buckets 0.5 1 2 5 25] [--real-buckets 1 25] [--batch-size 32] [--image-size 64]
       [--bucket-view] [--wan]
"""
from __future__ import annotations

import argparse

import pandas as pd

from perflab.config import RunConfig
from perflab.link import SimulatedLink
from perflab.distributed import launch_sweep
from perflab.overlap import overlap_table
from perflab.timing import Stopwatch

COLUMNS = ["rank", "bucket_cap_mb", "buckets", "forward_ms", "compute_ms", "comm_ms",
           "step_ms", "exposed_comm_ms", "overlap_eff_textbook", "overlap_eff_ddp"]


def sweep(base: RunConfig, buckets: list[float], link: SimulatedLink | None) -> pd.DataFrame:
    configs = [base.replace(bucket_cap_mb=float(b), link=link) for b in buckets]
    with Stopwatch() as sw:
        runs = launch_sweep(configs, save=False)
    table = overlap_table(runs)
    print(f"\n== {table.attrs['title']}: {len(configs)} runs in one launch, "
          f"{sw.elapsed_s:.0f} s ==")
    print(table[COLUMNS].round(3).to_string(index=False))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--buckets", type=float, nargs="+", default=[0.5, 1, 2, 5, 25])
    ap.add_argument("--real-buckets", type=float, nargs="+", default=[1, 25])
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--bucket-view", action="store_true",
                    help="gradient_as_bucket_view=True (no copy of .grad into buckets)")
    ap.add_argument("--wan", action="store_true", help="also sweep alpha = 5 ms, 1 Gbit/s")
    a = ap.parse_args()
    base = RunConfig(device="cpu", model="resnet18", image_size=a.image_size,
                     batch_size=a.batch_size,
                     steps=a.steps, warmup_steps=a.warmup, world_size=2, threads=1,
                     gradient_as_bucket_view=a.bucket_view)
    print(f"ResNet-18, {base.image_size} px, batch {base.batch_size} per rank, "
          f"{base.world_size} gloo ranks x 1 thread, {a.steps} measured steps "
          f"(+{a.warmup} warm-up) per block")
    sweep(base, a.real_buckets, None)
    link = SimulatedLink.preset("1gbe")
    sim = sweep(base, a.buckets, link)
    per_bucket = sim.groupby("bucket_cap_mb")[["overlap_eff_ddp", "overlap_eff_textbook",
                                               "step_ms"]].median()
    best = per_bucket["step_ms"].idxmin()
    eff = per_bucket.loc[best]
    verdict = "meets" if eff.overlap_eff_ddp >= 0.8 else "MISSES"
    print(f"\nbest bucket on the {link.describe()}: {best:g} MB, step "
          f"{eff.step_ms:.0f} ms; overlap efficiency {eff.overlap_eff_ddp:.2f} vs the DDP "
          f"bound ({verdict} the 0.8 target), {eff.overlap_eff_textbook:.2f} vs the "
          "textbook max(compute, comm) (median of ranks)")
    if a.wan:
        sweep(base, a.real_buckets if len(a.real_buckets) > 1 else [1, 25],
              SimulatedLink(name="wan", alpha_s=5e-3, beta_bytes_per_s=125e6))


if __name__ == "__main__":
    main()
