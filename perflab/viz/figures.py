"""Matplotlib figures without pyplot: the one figure type every perflab plot returns.

Every perflab plot builds :class:`InlineFigure` objects directly: no pyplot, no global
state, no backend switching, so plotting from a widget callback never touches a
notebook's own figures. An :class:`InlineFigure` shows itself as PNG in Jupyter (it
carries ``_repr_png_``); :func:`figure_to_png` turns any figure into PNG bytes (for
``ipywidgets.Image``). Colours are fixed per phase (:data:`PHASE_COLORS`, the
colour-blind-safe Okabe-Ito palette), so "data" is the same colour in every lab.
"""
from __future__ import annotations

import io

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["InlineFigure", "new_ax", "figure_to_png", "PHASE_COLORS"]

#: One colour per phase, the same in every perflab plot (Okabe-Ito palette).
PHASE_COLORS: dict[str, str] = {
    "data": "#D55E00",       # vermillion: waiting for input stands out
    "forward": "#0072B2",    # blue
    "backward": "#56B4E9",   # sky blue
    "optimizer": "#009E73",  # bluish green
    "other": "#B0B0B0",      # grey: loop overhead between phases
}


class InlineFigure(Figure):
    """A :class:`matplotlib.figure.Figure` that displays itself as PNG in Jupyter
    without pyplot (``InlineFigure(figsize=(w_in, h_in), layout="constrained")``)."""

    def _repr_png_(self) -> bytes:
        return figure_to_png(self)


def new_ax(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """``ax`` itself, or the Axes of a new :class:`InlineFigure` of ``figsize`` inches."""
    if ax is not None:
        return ax
    return InlineFigure(figsize=figsize, layout="constrained").add_subplot()


def figure_to_png(fig: Figure, dpi: int = 100) -> bytes:
    """PNG bytes of ``fig`` at ``dpi`` dots per inch (white background).

    Raises:
        ValueError: ``dpi`` is not positive.
    """
    if not dpi > 0:
        raise ValueError(f"dpi must be > 0, got {dpi!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()
