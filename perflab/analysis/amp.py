"""Mixed precision, measured: which ops ran in low precision, loss parity, loss scaling.

``RunConfig.amp`` turns on ``torch.autocast`` (bf16, or fp16 with
``torch.amp.GradScaler``) inside :func:`perflab.train.step.train_step`. This module holds
what Lab 03 measures about it besides speed:

* :func:`op_dtypes`: every aten op a forward + loss ran, with its input and output
  dtypes, recorded below autocast (so casts are visible) by a ``TorchDispatchMode``,
  the mechanism ``torch.utils.flop_counter.FlopCounterMode`` uses;
* :func:`loss_parity`: the per-step |loss_fp32 - loss_amp| of two runs with the same
  seed and data, and :func:`plot_parity`;
* :func:`scaler_trace`: fp16's loss scale over steps and the steps GradScaler skipped
  (CUDA only), after the PyTorch AMP recipe ("Automatic Mixed Precision examples").
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from perflab.core.config import RunConfig
from perflab.viz.figures import InlineFigure
from perflab.data.prefetch import BatchStream
from perflab.core.result import RunResult
from perflab.train.step import AMP_DTYPES, build_training, make_scaler, train_step

__all__ = ["op_dtypes", "ops_kept_in_fp32", "Parity", "loss_parity", "plot_parity",
           "scaler_trace", "scaler_steps"]

_LOW = {torch.bfloat16, torch.float16}
#: Ops that move or view data without computing on it: left out of op_dtypes' table.
_BOOKKEEPING = {"aten.detach", "aten.view", "aten.t", "aten.empty", "aten._to_copy",
                "aten.alias", "aten._unsafe_view", "aten.expand", "aten.clone"}


class _DtypeRecorder(TorchDispatchMode):
    """Records (op, float input dtypes, float output dtypes) of every aten call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        def floats(tree: Any) -> tuple[str, ...]:
            return tuple(sorted({str(t.dtype).replace("torch.", "")
                                 for t in tree_flatten(tree)[0]
                                 if isinstance(t, torch.Tensor) and t.is_floating_point()}))
        self.calls.append((str(func.overloadpacket), floats((args, kwargs)), floats(out)))
        return out


def op_dtypes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
              amp: str = "bf16", casts: bool = False) -> pd.DataFrame:
    """Run one forward + cross-entropy loss under autocast and tabulate each op's dtypes.

    Args:
        model: maps (B, 3, H, W) to (B, num_classes) logits.
        x: images (B, 3, H, W) float32 on the model's device. y: labels (B,) int64.
        amp: "off", "bf16" or "fp16" (autocast dtype as in ``train_step``).
        casts: include autocast's own casts (``aten._to_copy``) and view/bookkeeping ops.

    Returns:
        One row per (op, input dtypes, output dtypes): ``op`` (e.g.
        ``"aten.convolution"``), ``calls``, ``inputs`` and ``outputs`` (float dtypes,
        comma-separated), ``precision``: "low" (every float output bf16/fp16), "fp32"
        (float outputs all fp32) or "mixed". Ops without float outputs are dropped.
        Ordered by first call.

    Raises:
        ValueError: unknown ``amp`` mode.
    """
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of {tuple(AMP_DTYPES)}, got {amp!r}")
    rec = _DtypeRecorder()
    with torch.autocast(x.device.type, dtype=AMP_DTYPES[amp], enabled=amp != "off"):
        with rec:
            torch.nn.functional.cross_entropy(model(x), y)
    counts = Counter(rec.calls)
    rows = []
    for (op, ins, outs), n in counts.items():
        if not outs or (not casts and op in _BOOKKEEPING):
            continue
        kinds = {"low" if d in ("bfloat16", "float16") else "fp32" if d == "float32"
                 else "other" for d in outs}
        rows.append({"op": op, "calls": n, "inputs": ", ".join(ins),
                     "outputs": ", ".join(outs),
                     "precision": kinds.pop() if len(kinds) == 1 else "mixed"})
    return pd.DataFrame(rows, columns=["op", "calls", "inputs", "outputs", "precision"])


def ops_kept_in_fp32(table: pd.DataFrame) -> list[str]:
    """Ops of an :func:`op_dtypes` table whose float outputs all stayed fp32 and that
    read only fp32 floats (autocast kept them in fp32), in order."""
    keep = table[(table["precision"] == "fp32") & (table["inputs"] == "float32")]
    return list(dict.fromkeys(keep["op"]))


@dataclass(frozen=True)
class Parity:
    """Per-step loss difference of ``other`` against ``reference``.

    Step 0 starts from the same weights and batch, so its difference is the number
    format's rounding alone. After it the weights differ slightly, later steps see
    slightly different models, and training amplifies that (as two weather forecasts
    from almost the same start drift apart): per-step differences then also measure
    how chaotic training is. Moving averages over ``window`` steps show whether the
    curves still *track* each other.

    Attributes:
        reference, other: the two runs' labels.
        table: per step: ``step``, ``loss_reference``, ``loss_other``, ``abs_diff``,
            and ``smooth_reference``, ``smooth_other`` (trailing moving averages).
        first_step_abs: |difference| at step 0 (same weights, same batch).
        max_abs, mean_abs: max and mean |loss_other - loss_reference| over the steps.
        smooth_max_abs: max |difference| of the moving averages.
        mean_reference: mean reference loss (to read the differences against).
        window: steps per moving average.
    """

    reference: str
    other: str
    table: pd.DataFrame
    first_step_abs: float
    max_abs: float
    mean_abs: float
    smooth_max_abs: float
    mean_reference: float
    window: int

    def __repr__(self) -> str:
        return (f"Parity {self.other!r} vs {self.reference!r} over {len(self.table)} steps: "
                f"first step |diff| {self.first_step_abs:.4f}; max |diff| "
                f"{self.max_abs:.4f}, mean |diff| {self.mean_abs:.4f}; "
                f"{self.window}-step averages within {self.smooth_max_abs:.4f} "
                f"(mean loss {self.mean_reference:.3f})")


#: Fields two runs may differ in and still be compared step by step.
_PARITY_FREE = {"label", "amp", "channels_last", "compile", "checkpointing", "threads",
                "device_prefetch", "pin_memory", "storage_latency_ms"}


def loss_parity(reference: RunResult, other: RunResult, *, window: int = 5) -> Parity:
    """Compare two runs' losses step by step (warm-up steps included).

    Both runs must train on the same batches from the same initial weights: every
    field equal except ``amp`` and knobs that change speed, not data or weights
    (channels_last, compile, checkpointing, threads, device_prefetch, pin_memory,
    storage_latency_ms). Loader workers are not free: which worker draws which
    augmentation depends on their number.

    Args:
        window: steps per trailing moving average (>= 1; fewer at the start).

    Raises:
        ValueError: the runs differ in a field that changes the batches or the
            weights (named in the message), have different numbers of losses, or
            ``window`` < 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 step, got {window}")
    a, b = reference.config, other.config
    differ = sorted(k for k in a.to_dict() if k not in _PARITY_FREE
                    and getattr(a, k) != getattr(b, k))
    if differ:
        raise ValueError(f"{other.label!r} and {reference.label!r} differ in {differ}: they "
                         "did not see the same batches from the same weights; change only "
                         "amp (and performance knobs) between them")
    if len(reference.losses) != len(other.losses):
        raise ValueError(f"{len(reference.losses)} vs {len(other.losses)} losses; run both "
                         "with the same steps and warmup_steps")
    table = pd.DataFrame({"step": range(len(reference.losses)),
                          "loss_reference": reference.losses, "loss_other": other.losses})
    table["abs_diff"] = (table["loss_other"] - table["loss_reference"]).abs()
    for col in ("reference", "other"):
        table[f"smooth_{col}"] = table[f"loss_{col}"].rolling(window, min_periods=1).mean()
    smooth_diff = (table["smooth_other"] - table["smooth_reference"]).abs()
    return Parity(reference=reference.label, other=other.label, table=table,
                  first_step_abs=float(table["abs_diff"].iloc[0]),
                  max_abs=float(table["abs_diff"].max()),
                  mean_abs=float(table["abs_diff"].mean()),
                  smooth_max_abs=float(smooth_diff.max()),
                  mean_reference=float(table["loss_reference"].mean()), window=window)


def plot_parity(parities: list[Parity]):
    """Loss curves (top) and |difference| per step (bottom) for one or more
    :class:`Parity` against the same reference. Returns a Figure that shows itself."""
    if not parities:
        raise ValueError("plot_parity needs at least one Parity")
    fig = InlineFigure(figsize=(8.0, 5.5), layout="constrained")
    ax_loss, ax_diff = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    ref = parities[0].table
    ax_loss.plot(ref["step"], ref["loss_reference"], color="black", lw=0.8, alpha=0.4)
    ax_loss.plot(ref["step"], ref["smooth_reference"], color="black", lw=2,
                 label=f"{parities[0].reference} ({parities[0].window}-step average)")
    for p in parities:
        line, = ax_loss.plot(p.table["step"], p.table["loss_other"], lw=0.8, alpha=0.4)
        ax_loss.plot(p.table["step"], p.table["smooth_other"], lw=2, color=line.get_color(),
                     label=f"{p.other} ({p.window}-step average)")
        ax_diff.plot(p.table["step"], p.table["abs_diff"], marker=".", color=line.get_color(),
                     label=f"{p.other}: first step {p.first_step_abs:.2g}, "
                           f"max {p.max_abs:.3g}, mean {p.mean_abs:.3g}")
    ax_loss.set(ylabel="training loss (thin: per step)",
                title="same seed, same batches: loss per step")
    ax_diff.set(xlabel="step (warm-up included)", ylabel="|loss - reference|")
    for ax in (ax_loss, ax_diff):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def scaler_steps(model: torch.nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, *,
                 steps: int, amp: str = "fp16",
                 step_fn: Callable[..., torch.Tensor] | None = None) -> pd.DataFrame:
    """Train ``steps`` steps with ``scaler`` and record its scale after each.

    A step is *skipped* when GradScaler found inf/NaN gradients: it does not call
    ``optimizer.step`` and halves the scale (``backoff_factor``), so a step whose scale
    went down was skipped. Works with any device GradScaler supports.

    Returns:
        Per step: ``step``, ``loss`` (float), ``scale`` (after ``update``),
        ``skipped`` (bool).
    """
    step_fn = step_fn or train_step
    rows = []
    for i in range(steps):
        x, y = next(batches)
        before = scaler.get_scale()
        loss = step_fn(model, x, y, optimizer, amp=amp, scaler=scaler)
        after = scaler.get_scale()
        rows.append({"step": i, "loss": float(loss), "scale": after,
                     "skipped": after < before})
    return pd.DataFrame(rows)


def scaler_trace(config: RunConfig, *, steps: int = 50) -> pd.DataFrame:
    """fp16 training of ``config`` with a fresh GradScaler: scale and skipped steps.

    Uses ``config.replace(amp="fp16")``; the first steps usually skip while the scale
    (initially 2**16) backs off to a value where fp16 gradients do not overflow.

    Raises:
        ValueError: the config's device is not CUDA (fp16 training with loss scaling is
            a CUDA recipe here; on a CPU use amp="bf16", which needs no scaling), or
            ``steps`` < 1.
    """
    if config.resolved_device().type != "cuda":
        raise ValueError("scaler_trace needs a CUDA device (fp16 + GradScaler); on this "
                         f"{config.resolved_device().type} use amp='bf16', which has "
                         "fp32's exponent range and needs no loss scaling")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    config = config.replace(amp="fp16")
    loader, model, optimizer, device = build_training(config)
    scaler = make_scaler(config, device)  # config.amp is "fp16" here
    with BatchStream(loader, config, device) as batches:
        table = scaler_steps(model, batches, optimizer, scaler, steps=steps, amp="fp16")
    table["log2_scale"] = table["scale"].map(lambda s: math.log2(s) if s > 0 else math.nan)
    return table
