"""Lab 11's attention panel: pick a sequence length, a block size and the causal mask, press
Run, and see the naive attention's and yours side by side: peak memory and time, measured.

* :func:`attention_panel`: the panel. What it measures is a callable the notebook passes
  in (the student's own ``tiled_attention`` behind it), so this panel depends on no lab's
  code. Its plot is :func:`perflab.viz.kernel_plots.plot_impl_bars`.
"""
from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

import ipywidgets as W

from perflab.ui.shell import Panel
from perflab.viz.figures import figure_to_png
from perflab.viz.kernel_plots import plot_impl_bars

__all__ = ["attention_panel"]

Measure = Callable[[int, int, bool], Sequence[Mapping]]


def attention_panel(measure: Measure, *, seq_lens: Sequence[int] = (128, 256, 512, 1024),
                    block_sizes: Sequence[int] = (16, 32, 64, 128), causal: bool = True,
                    title: str = "Attention: the naive formula against your tiles"):
    """Panel: ``measure(T, block, causal)`` returns one row per implementation (``impl``,
    ``peak_mib``, ``median_ms``), measured on this machine when Run is pressed; the rows are
    drawn as bars and summed up in the status line.

    Args:
        measure: the experiment; its exceptions are shown in the panel.
        seq_lens, block_sizes: the choices of the two sliders (ints >= 1).
        causal: the checkbox's first value.

    Raises:
        ValueError: an empty list of choices or a choice < 1.
    """
    for name, vals in (("seq_lens", seq_lens), ("block_sizes", block_sizes)):
        if not vals or min(vals) < 1:
            raise ValueError(f"attention_panel: {name} must be ints >= 1, got {list(vals)!r}")
    return _AttentionPanel(measure, list(seq_lens), list(block_sizes), causal, title)


class _AttentionPanel(Panel):
    """See :func:`attention_panel`."""

    busy_status = "measuring ..."

    def __init__(self, measure, seq_lens, block_sizes, causal, title):
        self.measure, self.result = measure, None
        self.seq = W.SelectionSlider(options=seq_lens, value=seq_lens[0], description="T")
        self.block = W.SelectionSlider(options=block_sizes, value=block_sizes[0],
                                       description="block")
        self.causal = W.Checkbox(value=causal, description="causal")
        super().__init__(title, html.escape(
            "Pick T and your tiles' block size (block_q = block_k), then Run: both "
            "attentions run here, their peak memory counted and their time measured."),
            W.HBox([self.seq, self.block, self.causal]), log=False,
            lock=[self.seq, self.block, self.causal])

    def _run(self):
        T, block, causal = self.seq.value, self.block.value, bool(self.causal.value)
        rows = [dict(r) for r in self.measure(T, block, causal)]
        self.image.value = figure_to_png(plot_impl_bars(
            rows, title=f"T = {T}, block {block}, {'causal' if causal else 'not causal'}: measured here"))
        self.status.value = html.escape("; ".join(
            f"{r['impl']}: {r['peak_mib']:.3g} MiB, {r['median_ms']:.3g} ms" for r in rows))
        self.result = {"T": T, "block": block, "causal": causal, "rows": rows}
        return self.result
