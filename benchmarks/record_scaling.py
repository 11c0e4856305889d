"""Record the scaling runs Lab 09's step model is fitted to (a shipped recording).

1, 2, 3, 4, 6 and 8 gloo ranks, weak and strong, on the 10gbe and 1gbe simulated links,
with simulated compute (each rank sleeps its batch's forward+backward, measured once on
one rank, and computes one sample so DDP all-reduces real gradients of the real sizes),
the real gloo all-reduce of one step's gradients (no link) at every rank count in the same
launch, and a 2-rank all-reduce sweep per link: perflab.labs.lab09.record_scaling. Written
to perflab/recordings/<SCALING_RECORDING>. Takes 2-3 minutes on 2 cores; record it on a
quiet machine (the load average before and after is stored with it).

Usage: python benchmarks/record_scaling.py [--out PATH] [--steps N]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import perflab
from perflab.labs.lab09 import SCALING_RECORDING, record_scaling

OUT = Path(perflab.__file__).parent / "recordings" / SCALING_RECORDING


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    out = record_scaling(str(args.out), steps=args.steps)
    print(f"wrote {len(out['runs'])} runs ({out['machine']}; {out['compute']}) to {args.out}")


if __name__ == "__main__":
    main()
