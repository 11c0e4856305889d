"""Activation checkpointing: what is recomputed, what it saves, what it costs (Lab 04).

Checkpointing keeps only each checkpointed segment's *input* during the forward pass and
recomputes the segment's activations in backward (Chen et al. 2016, "Training Deep Nets
with Sublinear Memory Cost", arXiv:1604.06174). ResNet-18's units are its five stages
(``ResNet.stages()``: the stem and the four layer groups); ``RunConfig.checkpointing``
picks "none", "per_stage" or N segments (``torch.utils.checkpoint.checkpoint_sequential``).

* :func:`segment_plan` says which stages each setting checkpoints;
* :func:`stage_table` measures what each stage saves for backward;
* :func:`tradeoff_curve` measures saved bytes, peak tensor memory and step time for
  every setting, side by side; :meth:`TradeoffCurve.plot` draws it;
* :func:`chen_cost` and :func:`sqrt_n_segments` are the sqrt(n) rule of the paper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from perflab.core.config import RunConfig
from perflab.core.measurement import Measurement
from perflab.core.memory import (
    MIB, SavedTensorsCounter, saved_activation_bytes, tensor_peak_bytes,
)
from perflab.models import ResNet
from perflab.viz.figures import InlineFigure
from perflab.core.timing import measure
from perflab.train.step import train_step
from perflab.train.workloads import training_parts

__all__ = ["SETTINGS", "STAGE_NAMES", "Segment", "segment_plan", "checkpointed_stages",
           "chen_cost", "sqrt_n_segments", "stage_table", "TradeoffCurve", "tradeoff_curve"]

#: The names of ResNet-18's five stages, in order (``ResNet.stages()``).
STAGE_NAMES = ("stem", "layer1", "layer2", "layer3", "layer4")
#: Every setting of ``RunConfig.checkpointing`` for ResNet-18, from none to all stages.
SETTINGS: tuple[str | int, ...] = ("none", 1, 2, 3, 4, 5, "per_stage")


@dataclass(frozen=True)
class Segment:
    """Consecutive stages run together: ``stages`` (indices into STAGE_NAMES) and whether
    they are ``checkpointed`` (input kept, activations recomputed in backward)."""

    stages: tuple[int, ...]
    checkpointed: bool

    @property
    def names(self) -> str:
        """e.g. ``"layer2-layer4"`` or ``"stem"``."""
        first, last = STAGE_NAMES[self.stages[0]], STAGE_NAMES[self.stages[-1]]
        return first if first == last else f"{first}-{last}"


def segment_plan(mode: str | int, n_stages: int = len(STAGE_NAMES)) -> list[Segment]:
    """How ``mode`` splits ``n_stages`` stages into segments.

    For an int N this mirrors ``torch.utils.checkpoint.checkpoint_sequential``: segments
    of ``n_stages // N`` stages, of which the first ``N - 1`` are checkpointed and the
    rest (the last segment, possibly longer) runs normally and keeps its activations.
    So N = 1 checkpoints nothing.

    Raises:
        ValueError: ``mode`` is not "none", "per_stage" or an int in 1..n_stages.
    """
    all_stages = tuple(range(n_stages))
    if mode == "none":
        return [Segment(all_stages, False)]
    if mode == "per_stage":
        return [Segment((i,), True) for i in all_stages]
    if not (isinstance(mode, int) and not isinstance(mode, bool) and 1 <= mode <= n_stages):
        raise ValueError(f"checkpointing must be 'none', 'per_stage' or 1..{n_stages} "
                         f"segments, got {mode!r}")
    size = n_stages // mode
    plan = [Segment(tuple(range(s, s + size)), True)
            for s in range(0, size * (mode - 1), size)]
    return plan + [Segment(tuple(range(size * (mode - 1), n_stages)), False)]


def checkpointed_stages(mode: str | int) -> tuple[int, ...]:
    """Indices of the ResNet-18 stages whose activations ``mode`` recomputes."""
    return tuple(i for seg in segment_plan(mode) if seg.checkpointed for i in seg.stages)


def chen_cost(n: int, k: int) -> float:
    """Activation memory of n equal layers checkpointed in k segments, in layers.

    Chen et al. 2016, section 4.1: keeping the k segment boundaries costs O(k) and
    recomputing one segment of n/k layers in backward costs O(n/k); the total
    ``k + n / k`` is smallest at k = sqrt(n), where it is 2 sqrt(n) (instead of n), for
    one extra forward pass of compute.

    Raises:
        ValueError: n < 1 or k not in 1..n.
    """
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"need n >= 1 layers and 1 <= k <= n segments, got n={n}, k={k}")
    return k + n / k


def sqrt_n_segments(n: int) -> int:
    """The integer k in 1..n with the smallest :func:`chen_cost` (k = sqrt(n) rounded to
    the better neighbour; the smaller k on a tie)."""
    if n < 1:
        raise ValueError(f"need n >= 1 layers, got {n}")
    lo = max(1, math.floor(math.sqrt(n)))
    return min((k for k in (lo, lo + 1) if k <= n), key=lambda k: (chen_cost(n, k), k))


def stage_table(model: ResNet, x: torch.Tensor, y: torch.Tensor) -> pd.DataFrame:
    """What each stage of ``model`` saves for backward when nothing is checkpointed.

    Runs the stages one after another, each under its own :class:`SavedTensorsCounter`
    (parameters and buffers excluded), then the head (average pool, fc, cross-entropy).
    A stage's output is usually saved twice: by its last ReLU and by the next stage's
    first convolution, so it appears in both rows. The model's buffers are restored.

    Args:
        model: a perflab ResNet in train mode.
        x: (B, 3, H, W) float32 batch; y: (B,) int64 labels.

    Returns:
        DataFrame indexed by stage (STAGE_NAMES, then "head") with ``output_shape``,
        ``input_mib`` (the stage's input tensor) and ``saved_mib``.
    """
    exclude = [*model.parameters(), *model.buffers()]
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    rows = []
    h = x
    try:
        with torch.enable_grad():
            for name, stage in zip(STAGE_NAMES, model.stages()):
                with SavedTensorsCounter(exclude) as c:
                    out = stage(h)
                rows.append((name, tuple(out.shape), h.untyped_storage().nbytes() / MIB,
                             c.result().mib))
                h = out
            with SavedTensorsCounter(exclude) as c:
                loss = F.cross_entropy(model.fc(torch.flatten(model.avgpool(h), 1)), y)
            rows.append(("head", tuple(loss.shape), h.untyped_storage().nbytes() / MIB,
                         c.result().mib))
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])
    return pd.DataFrame(rows, columns=["stage", "output_shape", "input_mib", "saved_mib"]
                        ).set_index("stage")


@dataclass(frozen=True, eq=False)
class TradeoffCurve:
    """Memory and time of every checkpointing setting, measured in one session.

    Attributes:
        table: one row per setting (see :func:`tradeoff_curve`).
        steps: setting label -> :class:`Measurement` of the training step (seconds).
        config: the configuration measured (image size, batch size).
        device: where it was measured, e.g. ``"cpu"``.
    """

    table: pd.DataFrame
    steps: dict[str, Measurement]
    config: RunConfig
    device: str

    def plot(self) -> Figure:
        """Left: saved activations and peak tensor memory (MiB) per setting; right: step
        time (ms, median with 95 % CI whiskers) and its overhead over "none"."""
        t = self.table
        fig = InlineFigure(figsize=(11.0, 4.0), layout="constrained")
        ax_mem, ax_time = fig.subplots(1, 2, sharex=True)
        xs = range(len(t))
        ax_mem.bar([i - 0.2 for i in xs], t.saved_mib, 0.4, label="saved for backward",
                   color="#0072B2")
        ax_mem.bar([i + 0.2 for i in xs], t.peak_mib, 0.4, color="#E69F00",
                   label="peak of tensors in a step (incl. grads)")
        ax_mem.set_ylabel("MiB")
        ax_mem.legend(fontsize="small", frameon=False)
        ax_mem.set_title("memory", fontsize="medium")
        lo = [m - lo for m, lo in zip(t.step_ms, t.step_ci_low_ms)]
        hi = [hi - m for m, hi in zip(t.step_ms, t.step_ci_high_ms)]
        ax_time.errorbar(list(xs), t.step_ms, yerr=[lo, hi], fmt="o-", capsize=4,
                         color="#009E73")
        for i, (ms, pct) in enumerate(zip(t.step_ms, t.overhead_pct)):
            ax_time.annotate(f"{pct:+.0f} %", (i, ms), xytext=(0, 8),
                             textcoords="offset points", ha="center", fontsize="small")
        ax_time.set_ylabel("ms per training step (median)")
        ax_time.set_title('step time; label: overhead vs "none"', fontsize="medium")
        for ax in (ax_mem, ax_time):
            ax.set_xticks(list(xs), [f"{s}\n({c})" for s, c in zip(t.index, t.checkpointed)],
                          fontsize="x-small")
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        c = self.config
        fig.suptitle(f"activation checkpointing: ResNet-18, {c.image_size} px, batch "
                     f"{c.batch_size}, on {self.device}")
        return fig


def tradeoff_curve(config: RunConfig, settings: Sequence[str | int] = SETTINGS, *,
                   warmup: int = 2, repeats: int = 8) -> TradeoffCurve:
    """Measure every checkpointing setting on one model and one fixed batch.

    For each setting (applied with ``ResNet.set_checkpointing``): the bytes saved for
    backward (:func:`~perflab.core.memory.saved_activation_bytes`), the largest checkpointed
    segment's own saved bytes (what backward recomputes at once, from
    :func:`stage_table`), the peak of tensor bytes during one training step
    (:func:`~perflab.core.memory.tensor_peak_bytes`: includes gradients and temporaries), and
    the step time (:func:`~perflab.core.timing.measure` of ``train_step``).

    Args:
        config: a ResNet-18 config (its ``checkpointing`` is ignored; ``amp`` is used).
        settings: the settings to measure, in the order to show them.
        warmup, repeats: passed to :func:`~perflab.core.timing.measure` per setting.

    Returns:
        A :class:`TradeoffCurve`; its table is indexed by setting (str) with columns
        checkpointed, stored, saved_mib, saved_reduction_pct, recompute_mib, peak_mib,
        step_ms, step_ci_low_ms, step_ci_high_ms, overhead_pct. Reductions and overheads
        are relative to the first setting.

    Raises:
        ValueError: a model other than resnet18, or an unknown setting.
    """
    if config.model != "resnet18":
        raise ValueError(f"tradeoff_curve needs model='resnet18' (it has stages), "
                         f"got {config.model!r}")
    plans = {str(s): segment_plan(s) for s in settings}  # validates every setting first
    parts = training_parts(config.replace(checkpointing="none"))
    model, opt, x, y = parts.model, parts.optimizer, parts.x, parts.y
    per_stage = stage_table(model, x, y).saved_mib
    rows, steps = [], {}
    for s in settings:
        plan = plans[str(s)]
        model.set_checkpointing(s)
        step = lambda: train_step(model, x, y, opt, amp=config.amp)  # noqa: E731
        saved = saved_activation_bytes(model, x, y)
        m = measure(step, warmup=warmup, repeats=repeats, device=parts.device,
                    label=f"checkpointing={s}", samples_per_call=len(x))
        peak = tensor_peak_bytes(step, parts.device)
        recompute = max((sum(per_stage.iloc[i] for i in seg.stages)
                         for seg in plan if seg.checkpointed), default=0.0)
        lo, hi = m.ci95_median
        rows.append({
            "setting": str(s),
            "checkpointed": ",".join(seg.names for seg in plan if seg.checkpointed) or "-",
            "stored": ",".join(seg.names for seg in plan if not seg.checkpointed) or "-",
            "saved_mib": saved.mib, "recompute_mib": recompute,
            "peak_mib": peak.peak_bytes / MIB, "step_ms": m.median * 1e3,
            "step_ci_low_ms": lo * 1e3, "step_ci_high_ms": hi * 1e3})
        steps[str(s)] = m
    model.set_checkpointing("none")
    table = pd.DataFrame(rows).set_index("setting")
    table.insert(3, "saved_reduction_pct", 100 * (1 - table.saved_mib / table.saved_mib.iloc[0]))
    table["overhead_pct"] = 100 * (table.step_ms / table.step_ms.iloc[0] - 1)
    return TradeoffCurve(table=table, steps=steps, config=config, device=str(parts.device))
