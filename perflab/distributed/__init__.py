"""Data-parallel training on torch.distributed: launcher, DDP worker, torchrun entry.

* :func:`launch_fn`: run a module-level function on N ranks (elastic launcher).
* :func:`launch`: run a :class:`~perflab.core.config.RunConfig` on N ranks -> one
  :class:`~perflab.core.result.RunResult` per rank.
* ``python -m perflab.distributed``: the same worker under ``torchrun``.
"""
from perflab.distributed.launch import (LaunchTimeoutError, RankFailedError,
                                        default_backend, launch_fn)
from perflab.distributed.runs import launch, launch_sweep
from perflab.distributed.worker import ddp_worker

__all__ = ["launch_fn", "launch", "launch_sweep", "ddp_worker", "RankFailedError", "LaunchTimeoutError",
           "default_backend"]
