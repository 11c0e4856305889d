"""ZeRO: per-device model-state memory of data-parallel training, stage by stage (Lab 08).

The formulas are those of Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 3 (and 5.1) and Figure 1. Mixed-precision
training with Adam keeps, per parameter (Psi parameters in all):

* 2 bytes: the fp16 (or bf16) parameters used in forward and backward,
* 2 bytes: their fp16 gradients,
* K = 12 bytes of optimizer state: an fp32 master copy of the parameters (4), Adam's
  momentum (4) and variance (4).

Plain data parallelism (stage 0) replicates all (2 + 2 + K) * Psi = 16 * Psi bytes on
every device. ZeRO partitions them over the N_d data-parallel devices:

==========  =========================  =====================================
stage       what is partitioned        bytes per device
==========  =========================  =====================================
0 (DDP)     nothing                    (2 + 2 + K) * Psi
1 P_os      optimizer state            (2 + 2) * Psi + K * Psi / N_d
2 P_os+g    + gradients                2 * Psi + (2 + K) * Psi / N_d
3 P_os+g+p  + parameters               (2 + 2 + K) * Psi / N_d
==========  =========================  =====================================

Figure 1's worked example (Psi = 7.5 B, K = 12, N_d = 64) gives 120 GB, 31.4 GB,
16.6 GB and 1.9 GB (the paper's GB are 10^9 bytes). These are model states only:
activations, temporary buffers and fragmentation (the paper's "residual states",
section 3.2) come on top. PyTorch implements stage 1 as
``torch.distributed.optim.ZeroRedundancyOptimizer`` and stages 2-3 in FSDP
(``ShardingStrategy.SHARD_GRAD_OP`` / ``FULL_SHARD``; FSDP2's ``fully_shard`` is stage 3).

:func:`zero_vs_measured` sets these formulas beside the bytes measured per rank from the
tensors themselves (:func:`perflab.analysis.sharding.state_bytes`, Lab 09), for the fp32 AdamW the
labs train: p = g = 4 bytes, K = 8 (momentum + variance, no master copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

__all__ = ["ZeroMemory", "zero_memory", "zero_table", "zero_vs_measured", "ZERO_STAGES",
           "METHOD_STAGE", "GB"]

#: The paper's gigabyte: 10^9 bytes (Figure 1: 7.5 B params x 16 B = 120 GB).
GB = 1e9
#: Stage number -> the paper's name for what is partitioned (Figure 1).
ZERO_STAGES = {0: "baseline (DDP)", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
#: The ZeRO stage each Lab 09 method implements (FSDP2's fully_shard shards all three;
#: "zero2" is the student's P_os+g).
METHOD_STAGE = {"ddp": 0, "ddp_fp16": 0, "ddp_powersgd": 0, "zero1": 1,
                "zero_redundancy": 1, "zero2": 2, "fsdp2": 3}


@dataclass(frozen=True)
class ZeroMemory:
    """Per-device model-state bytes for one ZeRO stage (Rajbhandari et al. 2020, Fig. 1).

    Attributes:
        num_params: Psi, the model's parameter count.
        world_size: N_d, the data-parallel degree (devices sharing the states).
        stage: 0 (plain data parallelism) to 3.
        params_bytes: fp16/bf16 parameters held on one device (bytes).
        grads_bytes: fp16/bf16 gradients held on one device (bytes).
        optimizer_bytes: optimizer state (fp32 master params, momentum, variance) on
            one device (bytes).
    """

    num_params: int
    world_size: int
    stage: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        """Model-state bytes per device: params + grads + optimizer state."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_gb(self) -> float:
        """:attr:`total_bytes` in the paper's GB (10^9 bytes)."""
        return self.total_bytes / GB

    def __repr__(self) -> str:
        return (f"ZeroMemory(stage {self.stage} {ZERO_STAGES[self.stage]}, "
                f"Psi={self.num_params:,}, N_d={self.world_size}: "
                f"{self.total_gb:.3g} GB per device)")


def _check_int(name: str, value: object, low: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}; {fix}")


def zero_memory(num_params: int, world_size: int, stage: int, *,
                param_bytes: int = 2, grad_bytes: int = 2,
                optimizer_bytes_per_param: int = 12) -> ZeroMemory:
    """Per-device model-state memory of ZeRO ``stage`` (ZeRO paper, section 3 / Fig. 1).

    With Psi = ``num_params``, N_d = ``world_size``, K = ``optimizer_bytes_per_param``:
    stage 0 keeps (p + g + K) Psi bytes per device; stage 1 p Psi + g Psi + K Psi / N_d;
    stage 2 p Psi + (g + K) Psi / N_d; stage 3 (p + g + K) Psi / N_d (p, g: bytes per
    parameter and per gradient).

    Args:
        num_params: Psi, parameters of the model (>= 1).
        world_size: N_d, data-parallel devices (>= 1).
        stage: 0, 1, 2 or 3.
        param_bytes: bytes per training-precision parameter (2 for fp16/bf16).
        grad_bytes: bytes per gradient (2 for fp16/bf16).
        optimizer_bytes_per_param: K (12 for mixed-precision Adam: fp32 master copy,
            momentum and variance; 8 for fp32 Adam without a master copy).

    Returns:
        A :class:`ZeroMemory` (bytes, floats because of the division by N_d).

    Raises:
        ValueError: a count is not a positive int, ``stage`` not in 0..3, or a byte size
            negative.
    """
    _check_int("num_params", num_params, 1, "pass the model's parameter count (Psi)")
    _check_int("world_size", world_size, 1, "pass the number of data-parallel devices (N_d)")
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ValueError(f"stage must be one of {sorted(ZERO_STAGES)} "
                         f"({', '.join(ZERO_STAGES.values())}), got {stage!r}")
    for name, v in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                    ("optimizer_bytes_per_param", optimizer_bytes_per_param)):
        _check_int(name, v, 0, "use a byte count per parameter, e.g. 2 for fp16")
    psi, n = num_params, world_size
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = grad_bytes * psi / (n if stage >= 2 else 1)
    optim = optimizer_bytes_per_param * psi / (n if stage >= 1 else 1)
    return ZeroMemory(num_params=psi, world_size=n, stage=stage, params_bytes=params,
                      grads_bytes=grads, optimizer_bytes=optim)


def zero_table(model_or_num_params: torch.nn.Module | int, world_size: int, *,
               param_bytes: int = 2, grad_bytes: int = 2,
               optimizer_bytes_per_param: int = 12) -> pd.DataFrame:
    """ZeRO stages 0-3 side by side for one model and data-parallel degree.

    Args:
        model_or_num_params: an ``nn.Module`` (Psi = its parameter count, shared
            parameters counted once, as ``model.parameters()`` yields them) or Psi.
        world_size: N_d (>= 1).
        param_bytes, grad_bytes, optimizer_bytes_per_param: as in :func:`zero_memory`.

    Returns:
        A DataFrame indexed by ``stage`` (0..3) with columns ``partitioned`` (the
        paper's name), ``params_gb``, ``grads_gb``, ``optimizer_gb``, ``total_gb``
        (per device, 10^9 bytes), ``total_mib`` (2^20 bytes) and ``saving_x`` (stage 0
        total / this stage's total).

    Raises:
        ValueError: as :func:`zero_memory`.
    """
    if isinstance(model_or_num_params, torch.nn.Module):
        psi = sum(p.numel() for p in model_or_num_params.parameters())
    else:
        psi = model_or_num_params
    rows = []
    for stage in ZERO_STAGES:
        m = zero_memory(psi, world_size, stage, param_bytes=param_bytes,
                        grad_bytes=grad_bytes,
                        optimizer_bytes_per_param=optimizer_bytes_per_param)
        rows.append({"stage": stage, "partitioned": ZERO_STAGES[stage],
                     "params_gb": m.params_bytes / GB, "grads_gb": m.grads_bytes / GB,
                     "optimizer_gb": m.optimizer_bytes / GB, "total_gb": m.total_gb,
                     "total_mib": m.total_bytes / 2**20})
    df = pd.DataFrame(rows).set_index("stage")
    df["saving_x"] = df.total_gb.iloc[0] / df.total_gb
    return df


def zero_vs_measured(measured: dict[str, dict[str, int]], num_params: int, world_size: int, *,
                     param_bytes: int = 4, grad_bytes: int = 4,
                     optimizer_bytes_per_param: int = 8) -> pd.DataFrame:
    """The ZeRO formulas beside bytes measured on one rank, method by method.

    Args:
        measured: method (a key of :data:`METHOD_STAGE`) -> ``{"params_bytes",
            "grads_bytes", "optimizer_bytes"}`` as :func:`perflab.analysis.sharding.state_bytes`
            returns them for one rank.
        num_params: Psi of the model trained.
        world_size: N_d of the run.
        param_bytes, grad_bytes, optimizer_bytes_per_param: as :func:`zero_memory`;
            the defaults are fp32 AdamW (4, 4, K = 8).

    Returns:
        One row per method: ``method, stage, part`` (params / grads / optimizer),
        ``predicted_bytes``, ``measured_bytes``, ``diff_bytes`` (measured - predicted).
        Expected differences: Adam's scalar ``step`` tensors (4 bytes per parameter
        tensor, in the optimizer state) and, for ZeRO-1 sharded by whole parameters, an
        uneven split (up to the largest parameter's state).

    Raises:
        ValueError: an unknown method, or as :func:`zero_memory`.
    """
    rows = []
    for method, got in measured.items():
        if method not in METHOD_STAGE:
            raise ValueError(f"unknown method {method!r}; known: {sorted(METHOD_STAGE)}")
        stage = METHOD_STAGE[method]
        want = zero_memory(num_params, world_size, stage, param_bytes=param_bytes,
                           grad_bytes=grad_bytes,
                           optimizer_bytes_per_param=optimizer_bytes_per_param)
        for part, predicted in (("params", want.params_bytes), ("grads", want.grads_bytes),
                                ("optimizer", want.optimizer_bytes)):
            m = got[f"{part}_bytes"]
            rows.append({"method": method, "stage": stage, "part": part,
                         "predicted_bytes": predicted, "measured_bytes": m,
                         "diff_bytes": m - predicted})
    return pd.DataFrame(rows)
