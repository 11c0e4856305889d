"""Predict, then measure: a lab's predictions, recorded with the time their cell ran.

A ``# PREDICT`` cell calls :meth:`Predictions.record`; the cell that measures calls
:meth:`Predictions.beside`, which prints the prediction next to the measurement with the
time each was taken. Every call to ``record`` is kept (value and UTC time) in
``<results>/predictions/lab<NN>.json``, written atomically, so a prediction edited after
the measurement shows up as such ("changed after the measurement") in the summary and in
the file the instructor can read; it cannot be changed silently.

A prediction cell left unanswered (the value still ``None``) records nothing and does not
break later cells: :meth:`Predictions.beside` then says that no prediction was made.

Why our own code: this is course bookkeeping (which cell said what, when), not something
a library provides; the storage is :func:`perflab.core.storage.write_atomic`.
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perflab.core.paths import default_results_dir
from perflab.core.storage import StorageError, write_atomic

__all__ = ["Prediction", "Predictions"]

#: Version of the file layout ``{"format": 1, "lab": "03", "predictions": {...},
#: "measured": {...}}``.
PREDICTIONS_FORMAT = 1


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _clock(t: datetime) -> str:
    return t.strftime("%H:%M:%S UTC")


@dataclass(frozen=True)
class Prediction:
    """The latest value recorded under one name, with every earlier one.

    Attributes:
        name: the prediction's name, e.g. ``"amp_ratio"``.
        value: the latest recorded value (a number, string or bool).
        unit: its unit as the lab printed it (``"x"``, ``"ms"``, ``""``).
        at: when it was recorded (UTC).
        history: every recorded ``(value, at)``, oldest first (the latest is last).
    """

    name: str
    value: Any
    unit: str
    at: datetime
    history: tuple[tuple[Any, datetime], ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        """True when more than one distinct value was recorded under this name."""
        return len({json.dumps(v) for v, _ in self.history}) > 1

    def changed_after(self, t: datetime) -> bool:
        """True when a value different from the one in force at ``t`` was recorded after
        ``t`` (an edit made once the measurement was known)."""
        before = [v for v, at in self.history if at <= t]
        if not before:
            return False
        return any(json.dumps(v) != json.dumps(before[-1]) for v, at in self.history if at > t)


class Predictions:
    """The predictions of one lab, kept in ``<results>/predictions/lab<NN>.json``.

    Args:
        lab: the lab's two-digit number, e.g. ``"03"``.
        folder: where the file goes; default ``<results>/predictions`` (the results
            folder is ``$PERFLAB_RESULTS`` or the checkout's ``results/``).

    Raises:
        ValueError: ``lab`` is not two digits.

    When the folder cannot be written (a read-only checkout), predictions are kept in
    memory for this kernel and a warning says so; nothing raises.
    """

    def __init__(self, lab: str, folder: str | Path | None = None):
        if not (isinstance(lab, str) and len(lab) == 2 and lab.isdigit()):
            raise ValueError(f"lab={lab!r}: give the lab's two-digit number, e.g. '03'")
        self.lab = lab
        self.path = Path(folder if folder is not None else default_results_dir() / "predictions"
                         ) / f"lab{lab}.json"
        self._data = self._load()
        self._memory_only = False

    def _load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") == PREDICTIONS_FORMAT and data.get("lab") == self.lab:
                data.setdefault("predictions", {})
                data.setdefault("measured", {})
                return data
        except (OSError, ValueError):
            pass
        return {"format": PREDICTIONS_FORMAT, "lab": self.lab, "predictions": {}, "measured": {}}

    def _save(self) -> None:
        if self._memory_only:
            return
        try:
            write_atomic(self.path, json.dumps(self._data, indent=1) + "\n")
        except StorageError as e:
            import warnings
            self._memory_only = True
            warnings.warn(f"predictions are kept in memory only for this kernel: {e}",
                          stacklevel=3)

    def record(self, name: str, value: Any, *, unit: str = "") -> Prediction | None:
        """Record ``value`` as the prediction ``name`` now, and print what was recorded.

        Args:
            name: a short identifier, e.g. ``"amp_ratio"``.
            value: a number, string or bool; ``None`` (or ``...``) means "not answered
                yet": nothing is recorded and a reminder is printed.
            unit: printed after the value (``"x"``, ``"ms"``).

        Returns:
            The :class:`Prediction` (with every earlier value), or None when unanswered.

        Raises:
            TypeError: ``value`` is not a number, string or bool (name the field to fix).
            ValueError: ``value`` is a NaN or infinite number.
        """
        if value is None or value is Ellipsis:
            print(f"no prediction recorded for {name!r}: set it above and run this cell "
                  "before the measurement (later cells still run)")
            return None
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = float(value) if not isinstance(value, numbers.Integral) else int(value)
            if not math.isfinite(value):
                raise ValueError(f"prediction {name!r} = {value}: give a finite number")
        elif not isinstance(value, (str, bool)):
            raise TypeError(f"prediction {name!r} = {value!r} ({type(value).__name__}): "
                            "give a number, a string or a bool")
        at = _now()
        entries = self._data["predictions"].setdefault(name, [])
        entries.append({"value": value, "unit": unit, "at": at.isoformat()})
        self._save()
        p = self.get(name)
        print(f"recorded at {_clock(at)}: {name} = {_show(value, unit)}"
              + (f" (changed from {_show(p.history[-2][0], unit)})"
                 if len(p.history) > 1 and p.history[-2][0] != value else ""))
        return p

    def get(self, name: str) -> Prediction | None:
        """The prediction recorded under ``name``, or None when none was."""
        entries = self._data["predictions"].get(name)
        if not entries:
            return None
        hist = tuple((e["value"], datetime.fromisoformat(e["at"])) for e in entries)
        return Prediction(name, hist[-1][0], entries[-1].get("unit", ""), hist[-1][1], hist)

    def measured_at(self, name: str) -> datetime | None:
        """When :meth:`beside` first showed the measurement for ``name`` (None: not yet)."""
        at = self._data["measured"].get(name)
        return datetime.fromisoformat(at) if at else None

    def beside(self, name: str, measured: Any, *, fmt: str = "{:.3g}", unit: str | None = None,
               source: str = "measured") -> str:
        """One line: the prediction ``name`` beside the ``measured`` value, with the times.

        The first call for ``name`` stamps the measurement's time (kept in the file, so
        re-running the summary does not move it); a prediction recorded or changed after
        that time is flagged.

        Args:
            name: the prediction's name as given to :meth:`record`.
            measured: the value this run measured (a number, or a string).
            fmt: format of numbers, e.g. ``"{:.2f}"``.
            unit: the unit printed after both values (default: the prediction's unit).
            source: the word for where ``measured`` came from, printed before it:
                "measured" (this run measured it), or e.g. "modelled" or "fitted" for a
                value a model computed (Lab 12 measures nothing).

        Returns:
            The line, e.g. ``"predicted 0.6x (recorded 15:42:01 UTC, before the
            measurement at 15:44:10 UTC); measured 8.1x"``.
        """
        if name not in self._data["measured"]:
            self._data["measured"][name] = _now().isoformat()
            self._save()
        t = self.measured_at(name)
        p = self.get(name)
        u = unit if unit is not None else (p.unit if p else "")
        shown = _show(measured, u, fmt)
        if p is None:
            return (f"no prediction was recorded for {name} (its PREDICT cell was left "
                    f"unanswered); {source} {shown}")
        in_time = p.history[0][1] <= t and not p.changed_after(t)
        first_at = next(at for v, at in p.history if json.dumps(v) == json.dumps(p.value))
        when = "before" if in_time else "AFTER"
        event = "measurement" if source == "measured" else "result"
        line = (f"predicted {_show(p.value, u, fmt)} (recorded {_clock(first_at if in_time else p.at)}, {when} the "
                f"{event} at {_clock(t)}); {source} {shown}")
        if p.changed_after(t):
            first = [v for v, at in p.history if at <= t][-1]
            line += (f"; the prediction was changed after the {event} (it was "
                     f"{_show(first, u, fmt)})")
        elif p.history and p.history[0][1] > t:
            line += f"; no prediction existed before the {event}"
        return line


def _show(value: Any, unit: str, fmt: str = "{:.3g}") -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and fmt == "{:.3g}":
        return f"{value:,}" + unit                   # 2000 -> "2,000", not "2e+03"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return fmt.format(value) + unit
    return f"{value}{(' ' + unit) if unit else ''}"
