"""Record the allreduce sweep Lab 06's alpha-beta exercise fits (a shipped recording).

Two gloo ranks on this machine (one thread each) time an allreduce of 1 KiB .. 64 MiB
(perflab.analysis.collectives.SWEEP_SIZES_BYTES, 5 repeats after 2 warm-ups, median of the ranks' mean) on the
real loopback backend and through a simulated slow link (alpha = 10 ms per hop, so 20 ms
per allreduce at p = 2; 1 Gbit/s), in
one launch (perflab.analysis.collectives.allreduce_sweep). The result, with the machine it was measured on,
is written to perflab/recordings/allreduce_sweep_gloo2.json. Seeded (torch.manual_seed)
although an allreduce's time does not depend on the values sent.

Usage: python benchmarks/record_allreduce_sweep.py [--out PATH]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import perflab
from perflab.analysis.collectives import SWEEP_SIZES_BYTES, allreduce_sweep
from perflab import SimulatedLink

OUT = Path(perflab.__file__).parent / "recordings" / "allreduce_sweep_gloo2.json"
CAL_LINK = SimulatedLink(name="slow-wan", alpha_s=10e-3, beta_bytes_per_s=1e9 / 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.manual_seed(0)
    sweep = allreduce_sweep(SWEEP_SIZES_BYTES, world_size=2, repeats=5, warmup=2,
                            link=[None, CAL_LINK])
    record = {
        "source": "benchmarks/record_allreduce_sweep.py",
        "what": "allreduce time per message size, 2 gloo ranks x 1 thread, median of 5 "
                "repeats (each the mean over ranks), real loopback and a simulated link",
        "simulated_link": {"name": CAL_LINK.name, "alpha_s": CAL_LINK.alpha_s,
                           "beta_bytes_per_s": CAL_LINK.beta_bytes_per_s,
                           "model": "ring allreduce on p ranks: 2(p-1) alpha + 2(p-1)/p n / "
                                    "beta (perflab.core.simulated.LinkModel)"},
        "device_name": perflab.env_summary("cpu").device_name,
        "cpu_cores": perflab.env_summary("cpu").cpu_cores,
        "torch": torch.__version__,
        "rows": sweep[["link", "size_bytes", "time_s", "time_min_s", "time_max_s",
                       "world_size"]].to_dict(orient="records"),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {len(record['rows'])} rows to {args.out}")


if __name__ == "__main__":
    main()
