"""The shell every perflab panel is built on: :class:`Panel`.

A panel is a ``.perflab-panel`` ``VBox`` laid out as: a heading and one line of intro,
the panel's own controls, the ``.perflab-run`` Run button (with a progress bar beside it
when the panel has one), a status line, the ``.perflab-error`` box, the output of the run
(optional), the ``img.perflab-plot`` image, then whatever the panel shows below the plot.
Those class names are what the browser tests look for. Pressing Run calls
:meth:`Panel.run`, which runs synchronously (the kernel is busy, so no other cell
competes for the cores being measured): the button is disabled meanwhile, a click that
arrives while a run is in progress is ignored, and an exception is shown in the panel as
a red one-line message (:func:`error_html`), never as a traceback, so the panel stays
usable. A subclass builds its controls, calls ``Panel.__init__`` and implements
:meth:`Panel._run`.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import ipywidgets as W

from perflab.core.timing import Stopwatch

__all__ = ["ERROR_STYLE", "Panel", "error_html"]

#: The style of an error message in a panel (the error box, a failed status line).
ERROR_STYLE = "color:#b00020;font-weight:bold"


def error_html(exc: BaseException) -> str:
    """An exception as the red message every perflab panel shows (never a traceback)."""
    msg = html.escape(f"{type(exc).__name__}: {exc}").replace("\n", "<br>")
    return f'<div style="{ERROR_STYLE}">{msg}</div>'


class Panel:
    """The skeleton of a perflab panel (see the module docstring).

    Attributes:
        title: the heading (an ``HTML`` widget). run_button, status, error, image: the
        widgets every panel has; log: an ``Output`` capturing the run's own output (None
        when the panel was built without one). widget: the top-level ``VBox`` (a cell
        ending in the panel displays it).
    """

    #: The status line while a run is in progress (None: the run writes its own).
    busy_status: str | None = None
    #: The status line after a run raised; ``_run`` may change it as it goes.
    failed_status = "the run failed; the panel is still usable"
    #: A click handled this soon (seconds) after a run ended was queued while it ran.
    queued_click_window_s = 0.0

    def __init__(self, title: str, intro: str, controls: W.Widget, *,
                 progress: W.Widget | None = None, log: bool = True,
                 below: Sequence[W.Widget] = (), lock: Sequence[W.Widget] = ()) -> None:
        """Build the shell.

        Args:
            title: the heading (plain text, escaped here).
            intro: the line under it (HTML, escaped by the caller).
            controls: the panel's own controls, shown between the intro and Run.
            progress: a widget shown beside the Run button (a progress bar).
            log: capture the run's output (prints, tqdm bars) in ``self.log``.
            below: widgets shown below the plot (a verdict, a table).
            lock: controls disabled while a run is in progress.
        """
        self._running = False
        self._since_end: Stopwatch | None = None  # time since the last run ended
        self._lock = list(lock)
        self.title = W.HTML(f"<h4>{html.escape(title)}</h4><p>{intro}</p>")
        self.run_button = W.Button(description="Run", icon="play", button_style="primary")
        self.run_button.add_class("perflab-run")
        self.run_button.on_click(self._on_click)
        self.status = W.HTML("ready")
        self.error = W.HTML("")
        self.error.add_class("perflab-error")
        self.log = W.Output() if log else None
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.image.add_class("perflab-plot")
        run_row = self.run_button if progress is None else W.HBox([self.run_button, progress])
        self.widget = W.VBox([self.title, controls, run_row, self.status, self.error,
                              *([self.log] if log else []), self.image, *below])
        self.widget.add_class("perflab-panel")

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)

    def _on_click(self, _button: Any = None) -> None:
        if self._running or (self._since_end is not None
                              and self._since_end.elapsed_s < self.queued_click_window_s):
            return  # a click queued while the kernel was busy with the last run
        self.run()

    def _set_busy(self, busy: bool) -> None:
        self._running = busy
        self.run_button.disabled = busy
        for ctl in self._lock:
            ctl.disabled = busy

    def _show_error(self, exc: BaseException, what: str) -> None:
        """Show ``exc`` in the error box and ``what`` (what it means) as the status."""
        self.error.value = error_html(exc)
        self.status.value = html.escape(what)

    def _run(self) -> Any:
        """Measure and show the result; returns it (what :meth:`run` returns)."""
        raise NotImplementedError

    def run(self, *, raise_errors: bool = False) -> Any:
        """Do what the Run button does; returns what the run measured.

        Ignored (returns None) while a run is in progress. An exception from the run is
        shown in the panel and returns None, unless ``raise_errors`` (for scripts), which
        re-raises it.
        """
        if self._running:
            return None
        self._set_busy(True)
        self.error.value = ""
        if self.busy_status is not None:
            self.status.value = self.busy_status
        try:
            return self._run()
        except Exception as e:  # noqa: BLE001 - shown in the panel, the kernel lives on
            self._show_error(e, self.failed_status)
            if raise_errors:
                raise
            return None
        finally:
            self._set_busy(False)
            self._since_end = Stopwatch().start()
