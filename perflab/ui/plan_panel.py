"""Lab 12's planning panel: sliders for a layout, stacked bars of its memory per GPU
against HBM and of its step time, redrawn at each change (a model, no launch).

* :func:`plan_panel`: the panel. The model is a callable the notebook passes in (the
  student's own ``memory_per_gpu`` and ``step_time`` behind it), so this panel depends on
  no lab's code. Its plot is :func:`perflab.viz.plan_plots.plot_plan`.
"""
from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

import ipywidgets as W

from perflab.ui.shell import Panel
from perflab.viz.figures import figure_to_png
from perflab.viz.plan_plots import plot_plan

__all__ = ["plan_panel"]

Evaluate = Callable[[dict], tuple[Mapping[str, float], Mapping[str, float]]]


def plan_panel(evaluate: Evaluate, *, gpus: int, batch: int, hbm_bytes: float,
               tp: Sequence[int] = (1, 2, 4, 8), pp: Sequence[int] = (1, 2, 4, 8),
               micro_batch: Sequence[int] = (1, 2, 4), start: Mapping | None = None,
               title: str = "Plan a layout"):
    """Panel: pick tp, pp, the micro-batch, the ZeRO stage, sequence parallelism and
    recomputation (dp = gpus / (tp * pp) and the micro-batch count m = batch / (dp * mb)
    follow); ``evaluate(fields)`` returns ``(memory parts in bytes, time parts in
    seconds)`` for ``fields`` = ``{"tp", "pp", "dp", "vpp", "micro_batch",
    "num_microbatches", "zero", "sp", "recompute"}``, drawn as stacked bars beside the
    layout chosen first. The bars are redrawn whenever a control changes (and on Run).

    Args:
        evaluate: the model; its exceptions (an invalid layout) are shown in the panel.
        gpus: GPU count; batch: sequences per step; hbm_bytes: HBM per GPU.
        tp, pp, micro_batch: the choices of each slider.
        start: the first layout's fields (default the smallest of each choice, ZeRO 1,
            no SP, no recomputation).

    Raises:
        ValueError: a count < 1 or an empty list of choices.
    """
    for name, vals in (("tp", tp), ("pp", pp), ("micro_batch", micro_batch)):
        if not vals or min(vals) < 1:
            raise ValueError(f"plan_panel: {name} choices must be ints >= 1, got {list(vals)!r}")
    if gpus < 1 or batch < 1 or hbm_bytes <= 0:
        raise ValueError(f"plan_panel: gpus, batch and hbm_bytes must be > 0, got {gpus}, "
                         f"{batch}, {hbm_bytes}")
    return _PlanPanel(evaluate, gpus, batch, hbm_bytes, list(tp), list(pp), list(micro_batch),
                      dict(start or {}), title)


class _PlanPanel(Panel):
    """See :func:`plan_panel`."""

    def __init__(self, evaluate, gpus, batch, hbm_bytes, tps, pps, mbs, start, title):
        self.evaluate, self.gpus, self.batch, self.hbm_bytes = evaluate, gpus, batch, hbm_bytes
        self.result = None
        self.tp = W.SelectionSlider(options=tps, value=start.get("tp", tps[0]), description="tp")
        self.pp = W.SelectionSlider(options=pps, value=start.get("pp", pps[0]), description="pp")
        self.mb = W.SelectionSlider(options=mbs, value=start.get("micro_batch", mbs[0]),
                                    description="micro-batch")
        self.zero = W.IntSlider(value=start.get("zero", 1), min=0, max=3, description="ZeRO")
        self.sp = W.Checkbox(value=start.get("sp", False), description="sequence parallel")
        self.recompute = W.Dropdown(options=["none", "selective", "full"],
                                    value=start.get("recompute", "none"), description="recompute")
        self.dp = W.HTML("")
        controls = W.VBox([W.HBox([self.tp, self.pp, self.mb]),
                           W.HBox([self.zero, self.sp, self.recompute]), self.dp])
        super().__init__(title, html.escape(
            f"{gpus} GPUs, {batch} sequences per step: move a control and the bars follow "
            "(a model, nothing runs). dp = gpus / (tp * pp); the first bar is the layout "
            "you started from."), controls, log=False)
        self.first = None
        for w in (self.tp, self.pp, self.mb, self.zero, self.sp, self.recompute):
            w.observe(lambda _change: self.run(), names="value")
        self.run()

    def fields(self) -> dict:
        """The layout the controls describe (dp and m derived)."""
        tp, pp, mb = self.tp.value, self.pp.value, self.mb.value
        if self.gpus % (tp * pp):
            raise ValueError(f"tp * pp = {tp * pp} does not divide {self.gpus} GPUs")
        dp = self.gpus // (tp * pp)
        if self.batch % (dp * mb):
            raise ValueError(f"dp * micro-batch = {dp} * {mb} does not divide the batch of "
                             f"{self.batch} sequences")
        return {"tp": tp, "pp": pp, "dp": dp, "vpp": 1, "micro_batch": mb,
                "num_microbatches": self.batch // (dp * mb), "zero": self.zero.value,
                "sp": bool(self.sp.value) and tp > 1, "recompute": self.recompute.value}

    def _run(self):
        f = self.fields()
        self.dp.value = html.escape(f"dp = {f['dp']}, micro-batches per step m = "
                                    f"{f['num_microbatches']}")
        memory, time = self.evaluate(f)
        label = f"tp{f['tp']} pp{f['pp']} dp{f['dp']} mb{f['micro_batch']}"
        shown = [(dict(memory), dict(time), label)]
        if self.first is None:
            self.first = shown[0]
        elif self.first[2] != label or self.first[0] != shown[0][0]:
            shown = [self.first, *shown]
        self.image.value = figure_to_png(plot_plan([s[0] for s in shown], [s[1] for s in shown],
                                                   [s[2] for s in shown], self.hbm_bytes))
        total = sum(v for k, v in memory.items() if k != "total")
        step = time.get("step", sum(time.values()))
        self.status.value = html.escape(
            f"{label}: {total / 2 ** 30:.1f} GiB per GPU of {self.hbm_bytes / 2 ** 30:.0f} "
            f"({'fits' if total <= self.hbm_bytes else 'does not fit'}), {step:.3g} s per step")
        self.result = {"fields": f, "memory": dict(memory), "time": dict(time)}
        return self.result
