"""``python -m perflab.distributed``: the DDP worker from the command line.

Under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK set) every process is one rank: it
initialises the process group from torchrun's environment and runs
:func:`perflab.distributed.worker.ddp_worker` unchanged; each rank saves its result and
rank 0 prints a table of all ranks::

    torchrun --nnodes 1 --nproc_per_node 2 -m perflab.distributed --preset quick \\
        --model tiny --steps 10 --world-size 2

(multi-node: ``--nnodes N --node_rank i --rdzv_backend c10d --rdzv_endpoint HOST:PORT``,
``--nproc_per_node`` = GPUs per node; ``--world-size`` must equal nnodes x nproc).
Without torchrun it starts the ranks itself with :func:`perflab.distributed.launch`,
as ``perflab run --world-size N`` does, and prints the same table
(:func:`perflab.distributed.runs.print_rank_results`).

Flags: every ``RunConfig`` field, as ``perflab run`` takes them
(:func:`perflab.core.config_flags.add_config_flags`); ``--link`` takes a preset name
(``1gbe``, ``10gbe``, ``ib100``, ``efa400``, ``nvlink``) and ``--straggler`` takes
``RANK:DELAY_S[:WHERE]`` (e.g. ``1:0.05:before_forward``).
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

from perflab.core.config_flags import add_config_flags, config_from_args
from perflab.distributed.runs import print_rank_results

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m perflab.distributed`` (RunConfig's, as ``perflab run``)."""
    p = argparse.ArgumentParser(prog="python -m perflab.distributed",
                                description="Data-parallel perflab run (DDP), one "
                                "RunResult per rank; also runs under torchrun.")
    add_config_flags(p)
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="stop ranks still running after this many seconds")
    p.add_argument("--no-save", action="store_true", help="do not write results/*.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _torchrun_rank(config, *, timeout_s: float, progress: bool, save: bool) -> int:
    """This process is one rank that torchrun started (RANK, WORLD_SIZE, LOCAL_RANK)."""
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
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        result = ddp_worker(config, progress=progress)
        if save:
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
        print_rank_results(config, gathered)
    return 0


def _launch_ranks(config, *, timeout_s: float, progress: bool, save: bool) -> int:
    """Not under torchrun: start ``config.world_size`` local ranks
    (:func:`perflab.distributed.launch`) and print one row per rank; 1 (message on
    stderr) when a rank failed or timed out."""
    from perflab.distributed import launch  # looked up per call (tests replace it)
    from perflab.distributed.launch import LaunchTimeoutError, RankFailedError

    try:
        results = launch(config, timeout_s=timeout_s, progress=progress, save=save)
    except (RankFailedError, LaunchTimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_rank_results(config, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m perflab.distributed [flags]``; returns the exit status (2: bad flags)."""
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:  # not under torchrun: start the ranks here
        return _launch_ranks(config, timeout_s=args.timeout_s, progress=not args.quiet,
                             save=not args.no_save)
    return _torchrun_rank(config, timeout_s=args.timeout_s, progress=not args.quiet,
                          save=not args.no_save)


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: gloo's background threads,
    # destroyed at interpreter exit, aborted a finished rank ("terminate called without
    # an active exception") in about 1 of 8 torchrun runs here, after its result was
    # saved and printed. Everything is flushed first, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
