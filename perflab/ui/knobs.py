"""The knobs of an :func:`~perflab.ui.widgets.experiment_panel`: specs, widgets, values.

A knob is a :class:`~perflab.core.config.RunConfig` field with a spec: a list of choices
(a dropdown) or a ``range`` / ``(min, max[, step])`` tuple of ints (a slider, max
inclusive). :func:`validate_knobs` checks the specs against the baseline config (every
knob must be able to show the baseline's value) and normalises them;
:func:`knob_widgets` builds a widget per knob set to the baseline; :func:`knob_values`
reads the values selected and :func:`set_knob_values` selects saved ones again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import ipywidgets as W

from perflab.core.config import RunConfig

__all__ = ["find_choice", "knob_values", "knob_widgets", "set_knob_values", "slider_bounds",
           "validate_knobs"]


def find_choice(choices: Sequence[Any], value: Any) -> int | None:
    """Index of ``value`` in ``choices`` (``True`` does not match ``1``), else None."""
    for i, c in enumerate(choices):
        if c == value and isinstance(c, bool) == isinstance(value, bool):
            return i
    return None


def slider_bounds(name: str, spec: Any) -> tuple[int, int, int]:
    """(min, max, step) of a ``range`` or ``(min, max[, step])`` tuple of ints."""
    if isinstance(spec, range):
        if len(spec) == 0:
            raise ValueError(f"knob {name!r}: {spec!r} is empty; give a non-empty range")
        return min(spec), max(spec), abs(spec.step)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in spec)
    if len(spec) not in (2, 3) or not ints:
        raise ValueError(f"knob {name!r}: a tuple must be (min, max) or (min, max, step) "
                         f"of ints for a slider, got {spec!r}; use a list for choices")
    lo, hi, step = (*spec, 1) if len(spec) == 2 else spec
    if not (lo <= hi and step >= 1):
        raise ValueError(f"knob {name!r}: need min <= max and step >= 1, got {spec!r}")
    return lo, hi, step


def validate_knobs(base: RunConfig, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Check knob names and that each base value is selectable; returns normalised specs."""
    if not isinstance(base, RunConfig):
        raise TypeError(f"base must be a RunConfig, got {type(base).__name__}")
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    specs: dict[str, Any] = {}
    for name, spec in knobs.items():
        if name not in fields:
            raise ValueError(f"knob {name!r} is not a RunConfig field; choose from {fields}")
        value = getattr(base, name)
        if isinstance(spec, (range, tuple)):
            lo, hi, step = slider_bounds(name, spec)
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not lo <= value <= hi or (value - lo) % step):
                raise ValueError(
                    f"knob {name!r}: base.{name}={value!r} is not on the slider "
                    f"{lo}..{hi} step {step}; change the range to include it, or use a "
                    f"list of choices that contains {value!r}")
            specs[name] = (lo, hi, step)
        elif isinstance(spec, list):
            if not spec:
                raise ValueError(f"knob {name!r}: empty list of choices; give at least "
                                 f"one value (including base.{name}={value!r})")
            if find_choice(spec, value) is None:
                raise ValueError(f"knob {name!r}: base.{name}={value!r} is not among the "
                                 f"choices {spec!r}; add it so the baseline is selectable")
            specs[name] = list(spec)
        else:
            raise ValueError(f"knob {name!r}: expected a list of choices (dropdown) or a "
                             f"range / (min, max, step) tuple of ints (slider), got {spec!r}")
    return specs


def knob_widgets(base: RunConfig, specs: Mapping[str, Any]) -> dict[str, W.ValueWidget]:
    """A ``Dropdown`` (list spec) or ``IntSlider`` (``(min, max, step)``) per validated
    knob, named after it and set to its value in ``base``."""
    style = {"description_width": "initial"}
    controls: dict[str, W.ValueWidget] = {}
    for name, spec in specs.items():
        if isinstance(spec, list):
            ctl = W.Dropdown(options=[(str(c), c) for c in spec], description=name,
                             index=find_choice(spec, getattr(base, name)), style=style)
        else:
            lo, hi, step = spec
            ctl = W.IntSlider(value=getattr(base, name), min=lo, max=hi, step=step,
                              description=name, style=style, continuous_update=False)
        controls[name] = ctl
    return controls


def knob_values(controls: Mapping[str, W.ValueWidget]) -> dict[str, Any]:
    """Knob name -> the value its widget has selected."""
    out = {}
    for name, ctl in controls.items():
        out[name] = ctl.options[ctl.index][1] if isinstance(ctl, W.Dropdown) else ctl.value
    return out


def set_knob_values(controls: Mapping[str, W.ValueWidget], values: Mapping[str, Any]) -> None:
    """Select ``values`` again (e.g. saved before a kernel restart); a knob that is gone or
    a value its widget cannot show is skipped."""
    for name, value in values.items():
        ctl = controls.get(name)
        if isinstance(ctl, W.Dropdown):
            i = find_choice([o[1] for o in ctl.options], value)
            if i is not None:
                ctl.index = i
        elif ctl is not None and isinstance(value, int) and ctl.min <= value <= ctl.max:
            ctl.value = value
