"""``python -m perflab.distributed``: the DDP worker from the command line.

Under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK set) every process is one rank: it
initialises the process group from torchrun's environment and runs
:func:`perflab.distributed.worker.ddp_worker` unchanged; each rank saves its result and
rank 0 prints a table of all ranks::

    torchrun --nnodes 1 --nproc_per_node 2 -m perflab.distributed --preset quick \\
        --model tiny --steps 10 --world-size 2

(multi-node: ``--nnodes N --node_rank i --rdzv_backend c10d --rdzv_endpoint HOST:PORT``,
``--nproc_per_node`` = GPUs per node; ``--world-size`` must equal nnodes x nproc).
Without torchrun it starts the ranks itself with :func:`perflab.distributed.launch`.

Flags: every ``RunConfig`` field (as ``perflab run`` takes them); ``--link`` takes a
preset name (``1gbe``, ``10gbe``, ``ib100``, ``nvlink``) and ``--straggler`` takes
``RANK:DELAY_S[:WHERE]`` (e.g. ``1:0.05:before_forward``).
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import pandas as pd

__all__ = ["main", "parse_straggler", "summary_table"]


def parse_straggler(text: str):
    """``"RANK:DELAY_S[:WHERE]"`` -> :class:`perflab.stragglers.Straggler`.

    Raises:
        ValueError: not of that form (the message shows an example).
    """
    from perflab.stragglers import Straggler

    parts = text.split(":")
    try:
        rank, delay = int(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], e.g. "
                         f"1:0.05:before_forward; got {text!r}") from None
    if len(parts) > 3:
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], got {text!r}")
    return Straggler(rank=rank, delay_s=delay, where=parts[2] if len(parts) == 3
                     else "before_forward")


def summary_table(results) -> pd.DataFrame:
    """One row per rank: step, compute, comm medians (ms), samples/s, delay (ms)."""
    rows = [{"rank": r.rank, "step_ms": r.step.median * 1e3,
             "compute_ms": r.phases["compute"].median * 1e3,
             "comm_ms": r.phases["comm"].median * 1e3,
             "samples_per_s": r.samples_per_s,
             "delay_ms": r.extra["delay_s"] * 1e3} for r in results]
    return pd.DataFrame(rows).set_index("rank").round(2)


def build_parser() -> argparse.ArgumentParser:
    from perflab.cli import _add_config_flags

    p = argparse.ArgumentParser(prog="python -m perflab.distributed",
                                description="Data-parallel perflab run (DDP), one "
                                "RunResult per rank; also runs under torchrun.")
    _add_config_flags(p)
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="stop ranks still running after this many seconds")
    p.add_argument("--no-save", action="store_true", help="do not write results/*.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _config(args: argparse.Namespace):
    from perflab.cli import _config_from
    from perflab.link import SimulatedLink

    if isinstance(getattr(args, "link", None), str):
        args.link = None if args.link in ("none", "off") else SimulatedLink.preset(args.link)
    if isinstance(getattr(args, "straggler", None), str):
        args.straggler = None if args.straggler in ("none", "off") \
            else parse_straggler(args.straggler)
    return _config_from(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = _config(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:  # not under torchrun: start the ranks ourselves
        from perflab.distributed import launch

        results = launch(config, timeout_s=args.timeout_s, progress=not args.quiet,
                         save=not args.no_save)
        print(summary_table(results).to_string())
        return 0
    import torch
    import torch.distributed as dist

    from perflab.distributed.ddp import check_ddp_config
    from perflab.distributed.launch import default_backend
    from perflab.distributed.worker import ddp_worker

    world_size = int(os.environ["WORLD_SIZE"])
    if config.world_size != world_size:
        print(f"error: --world-size {config.world_size} but torchrun started {world_size} "
              f"ranks; pass --world-size {world_size}", file=sys.stderr)
        return 2
    backend = default_backend(config.device)
    check_ddp_config(config, backend)
    torch.set_num_threads(config.threads or 1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    try:
        result = ddp_worker(config, progress=not args.quiet)
        if not args.no_save:
            result = result.save()
        gathered = [None] * world_size
        dist.all_gather_object(gathered, result)
        # every rank done with its last collective before any rank tears gloo down: a
        # rank exiting mid-exchange made its peer abort ("terminate called without an
        # active exception") about once in a full test run here
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if result.rank == 0:
        print(f"{config.display_label()}: {world_size} ranks, backend {backend}")
        print(summary_table(gathered).to_string())
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: gloo's background threads,
    # destroyed at interpreter exit, aborted a finished rank ("terminate called without
    # an active exception") in about 1 of 8 torchrun runs here, after its result was
    # saved and printed. Everything is flushed first, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
