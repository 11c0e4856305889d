"""FLOPs of a training step, peak FLOP/s, and model / hardware FLOPs utilisation (Lab 08).

* FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (PyTorch's own
  counter: matmuls, convolutions and attention, a multiply-add counted as 2 FLOPs;
  elementwise ops, normalisation and pooling are not counted, as in the literature).
  ResNet-18's forward at 224 px is 3.63 GFLOPs = 1.81 GMACs per sample; its backward
  about twice that (input and weight gradients; the first conv needs no input gradient).
* Utilisation follows the PaLM paper (Chowdhery et al. 2022, appendix B):
  MFU = achieved *model* FLOP/s / peak FLOP/s, where model FLOPs are the useful ones
  (forward + backward); HFU = achieved *hardware* FLOP/s / peak, where hardware FLOPs
  also count the forward pieces activation checkpointing recomputes in backward.
* Peak FLOP/s (the datasheet table, or a measured matmul peak; never a guess) are
  :mod:`perflab.analysis.peak`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from perflab.core.config import TOKEN_MODELS, RunConfig
from perflab.data.tokens import VOCAB_SIZE
from perflab.models import build_model
from perflab.core.result import RunResult
from perflab.analysis.peak import PeakFlops, dtype_of, peak_flops

__all__ = ["FlopCount", "count_flops", "Utilization", "utilization", "mfu_pct"]


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one training step (``FlopCounterMode``; a multiply-add = 2 FLOPs).

    Attributes:
        batch_size: samples per step the per-step numbers are for.
        forward_flops: forward FLOPs per step (model + loss).
        backward_flops: backward FLOPs per step without recomputation.
        recompute_flops: forward FLOPs activation checkpointing re-runs in backward, per
            step (0 without checkpointing).
        by_op: forward FLOPs per step by aten op (e.g. convolution, addmm).
    """

    batch_size: int
    forward_flops: int
    backward_flops: int
    recompute_flops: int
    by_op: dict[str, int]

    @property
    def model_flops(self) -> int:
        """Useful FLOPs per step: forward + backward (PaLM's "model FLOPs")."""
        return self.forward_flops + self.backward_flops

    @property
    def hardware_flops(self) -> int:
        """FLOPs executed per step: model FLOPs + recomputation (PaLM's "hardware")."""
        return self.model_flops + self.recompute_flops

    @property
    def model_flops_per_sample(self) -> float:
        return self.model_flops / self.batch_size

    @property
    def hardware_flops_per_sample(self) -> float:
        return self.hardware_flops / self.batch_size

    @property
    def forward_flops_per_sample(self) -> float:
        return self.forward_flops / self.batch_size

    def __repr__(self) -> str:
        g = 1e9
        return (f"FlopCount(per sample: forward {self.forward_flops / self.batch_size / g:.3f}"
                f" GFLOPs, backward {self.backward_flops / self.batch_size / g:.3f}, "
                f"recompute {self.recompute_flops / self.batch_size / g:.3f}; per step of "
                f"{self.batch_size}: model {self.model_flops / g:.2f} GFLOPs, hardware "
                f"{self.hardware_flops / g:.2f})")


def _counted(fn) -> tuple[int, dict[str, int], object]:
    with FlopCounterMode(display=False) as counter:
        out = fn()
    by_op = {str(op).split(".")[-1] if "." in str(op) else str(op): n
             for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return counter.get_total_flops(), by_op, out


def count_flops(model: RunConfig | torch.nn.Module, *, batch_size: int | None = None,
                image_size: int | None = None, num_classes: int = 10,
                checkpointing: str | int | None = None, seq_len: int | None = None
                ) -> FlopCount:
    """Count one training step's FLOPs with ``torch.utils.flop_counter.FlopCounterMode``.

    The step (forward + cross-entropy, then backward) runs on the ``meta`` device (shapes
    only, no arithmetic, so counting 224 px takes a fraction of a second) on a copy of
    the model. With activation checkpointing the backward is counted twice, without and
    with it: the difference is what checkpointing recomputes.

    Args:
        model: a :class:`RunConfig` (its model, image_size or seq_len, batch_size and
            checkpointing), or an ``nn.Module`` mapping (B, 3, S, S) float32 to
            (B, num_classes) logits, or, with ``seq_len``, (B, T) int64 tokens to
            (B, T, vocab) logits (a :class:`perflab.models.GPT`).
        batch_size: samples per step (>= 1); default the config's (or 1 for a module).
        image_size: S in pixels (>= 16); default the config's (or 224 for a module).
        num_classes: classes of the final layer when built from a config (the embedded
            dataset has 10).
        checkpointing: overrides the config's setting; for a module it must have
            ``set_checkpointing`` (perflab's ResNet and GPT).
        seq_len: tokens per sample T for a token model (default: the config's for a
            token-model config; a module is fed images unless it is given).

    Returns:
        A :class:`FlopCount` (integer FLOPs per step).

    Raises:
        ValueError: batch_size < 1, image_size < 16, or checkpointing asked of a module
            without ``set_checkpointing``.
    """
    if isinstance(model, RunConfig):
        batch_size = model.batch_size if batch_size is None else batch_size
        image_size = model.image_size if image_size is None else image_size
        checkpointing = model.checkpointing if checkpointing is None else checkpointing
        if model.model in TOKEN_MODELS:
            seq_len = model.seq_len if seq_len is None else seq_len
            num_classes = VOCAB_SIZE
        net = build_model(model.model, num_classes)
    else:
        batch_size = 1 if batch_size is None else batch_size
        image_size = 224 if image_size is None else image_size
        net = model
    checkpointing = "none" if checkpointing is None else checkpointing
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 sample, got {batch_size!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 16:
        raise ValueError(f"image_size must be an int >= 16 pixels, got {image_size!r}")
    if checkpointing != "none" and not hasattr(net, "set_checkpointing"):
        raise ValueError(f"checkpointing={checkpointing!r} needs a model with "
                         "set_checkpointing (perflab's ResNet); pass checkpointing='none'")
    import copy
    net = copy.deepcopy(net).to("meta").train()
    if hasattr(net, "set_checkpointing"):
        net.set_checkpointing("none")
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be an int >= 1 token, got {seq_len!r}")
        x = torch.zeros(batch_size, seq_len, dtype=torch.int64, device="meta")  # (B, T)
        y = torch.zeros(batch_size * seq_len, dtype=torch.int64, device="meta")  # (B*T,)
    else:
        x = torch.empty(batch_size, 3, image_size, image_size, device="meta")  # (B, 3, S, S)
        y = torch.zeros(batch_size, dtype=torch.int64, device="meta")          # (B,)

    def loss_of() -> torch.Tensor:
        logits = net(x)
        return F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits, y)

    def step_flops() -> tuple[int, int, dict[str, int]]:
        fwd, by_op, loss = _counted(loss_of)
        bwd, _, _ = _counted(lambda: loss.backward())  # type: ignore[union-attr]
        net.zero_grad(set_to_none=True)
        return fwd, bwd, by_op

    forward, backward, by_op = step_flops()
    recompute = 0
    if checkpointing != "none":
        net.set_checkpointing(checkpointing)
        recompute = step_flops()[1] - backward
    return FlopCount(batch_size=batch_size, forward_flops=forward, backward_flops=backward,
                     recompute_flops=recompute, by_op=by_op)


def mfu_pct(flops_per_step: float, step_time_s: float, peak_flops_per_s: float | None
            ) -> float | None:
    """Utilisation in percent: 100 * (flops_per_step / step_time_s) / peak (PaLM, app. B).

    Pass model FLOPs for MFU, hardware FLOPs (with recomputation) for HFU.
    Returns None when the peak is unavailable.

    Raises:
        ValueError: flops_per_step < 0 or step_time_s <= 0.
    """
    if flops_per_step < 0:
        raise ValueError(f"flops_per_step must be >= 0, got {flops_per_step!r}")
    if not step_time_s > 0:
        raise ValueError(f"step_time_s must be > 0 seconds, got {step_time_s!r}")
    if peak_flops_per_s is None:
        return None
    return 100.0 * flops_per_step / step_time_s / peak_flops_per_s


@dataclass(frozen=True)
class Utilization:
    """Achieved FLOP/s of a run and its MFU / HFU (None = unavailable)."""

    label: str
    step_time_s: float
    model_flops_per_s: float
    hardware_flops_per_s: float
    mfu_pct: float | None
    hfu_pct: float | None
    peak: PeakFlops

    def __repr__(self) -> str:
        f = lambda v: "unavailable" if v is None else f"{v:.2f} %"  # noqa: E731
        return (f"Utilization {self.label!r}: {self.model_flops_per_s / 1e9:,.2f} model "
                f"GFLOP/s, MFU {f(self.mfu_pct)}, HFU {f(self.hfu_pct)} of {self.peak!r}")


def utilization(result: RunResult, *, flops: FlopCount | None = None,
                peak: PeakFlops | None = None) -> Utilization:
    """MFU and HFU of a measured run (PaLM, appendix B), from its median step time.

    Args:
        result: a :class:`RunResult` (its config gives model, batch, checkpointing).
        flops: FLOPs (scaled per sample to the run's batch size); default
            :func:`count_flops` of ``result.config``.
        peak: default :func:`peak_flops` for the config's device and :func:`dtype_of`.
    """
    flops = flops or count_flops(result.config, num_classes=result.num_classes)
    peak = peak or peak_flops(result.config.device, dtype_of(result.config))
    t, b = result.step.median, result.config.batch_size
    model, hardware = flops.model_flops_per_sample * b, flops.hardware_flops_per_sample * b
    return Utilization(result.label, t, model / t, hardware / t,
                       mfu_pct(model, t, peak.flops_per_s),
                       mfu_pct(hardware, t, peak.flops_per_s), peak)
