"""Check a written report against the run it reports on (Lab 08's report check).

A report is honest when every number in it is a value the run measured, printed at
some precision, and every fix it calls "kept" is one the ladder's statistical test kept.
This module reads a report's text and says where it is not:

* :func:`report_numbers` finds the numbers in the text (``1.52x``, ``12.3 %``,
  ``1,234``, ``3.1e-05``, ``0.85-1.10x`` as two numbers), ignoring digits that belong
  to names (``ResNet-18``, ``fp32``, ``bf16``, ``Lab 08``'s ``08`` is *not* ignored)
  and list markers at the start of a line (``1.``, ``2)``);
* :func:`unmeasured_numbers` returns those that match no measured value at the
  precision they are printed with (``1.52`` matches 1.5213 printed with ``:.2f``; a
  number followed by ``%`` also matches 100 x a fraction printed with ``:.1%``);
* :func:`rungs_called_kept` finds the ladder rungs the text calls kept: a rung name
  (or a joint move ``amp+channels_last``, a removal ``-amp``) whose nearest status word
  in its clause is "kept" (not "not kept", "dropped", "did not help", ...);
* :func:`report_problems` puts both together into messages a check can assert on;
* :func:`flatten_numbers` turns what a lab measured (dicts, lists, DataFrames, plain
  numbers) into the ``{name: value}`` mapping the others compare against;
* :func:`run_numbers` and :func:`run_report_problems` are Lab 08's rule for a report on a
  *run* (the dict its ``write_report(run)`` reads: the ablation, the kept changes
  together, MFU, the roofline placement, the memory peak): the numbers it may print, and
  everything its report must say. The lab's self-check applies them to this run and
  grading to runs drawn at grade time.

Why our own parser: the rule ("every number is a measured value at its printed
precision") is this course's, and no library states it; Python's own ``format`` decides
what a value looks like printed, so the comparison is exact, not a tolerance.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from perflab.ladder.rungs import RUNGS

__all__ = ["ReportNumber", "report_numbers", "unmeasured_numbers", "rungs_called_kept",
           "report_problems", "flatten_numbers", "REPORT_SETTINGS", "run_numbers",
           "run_report_problems"]

#: The lab's fixed settings a report may print besides the run's values: the confidence
#: level of every interval (95 %), the test's alpha and the profiled steps of the memory
#: timeline.
REPORT_SETTINGS = {"confidence_pct": 95, "alpha": 0.05, "steps_profiled": 2}

_NUM = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LIST_MARKER = re.compile(r"(?m)^[ \t]*(?:[-*][ \t]+)?\d+[.)](?=[ \t])")
_NAME_CHAR = re.compile(r"[A-Za-z_.\d]")
_NEG_PHRASES = (r"not\s+(?:been\s+)?kept|n't\s+(?:been\s+)?kept|never\s+kept|dropped|"
                r"rejected|removed|did\s+not\s+help|didn't\s+help|not\s+significant")
_STATUS = re.compile(rf"\b(?P<neg>{_NEG_PHRASES})\b|\b(?P<pos>kept)\b", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[;!?\n]|\.(?=\s|$)")


@dataclass(frozen=True)
class ReportNumber:
    """A number as printed in a report.

    Attributes:
        text: the characters as printed, e.g. "1,234.5" or "-0.25" or "3.1e-05".
        value: the number (float).
        decimals: digits after the point (of the mantissa, for "e" notation).
        scientific: printed in "e" notation.
        percent: followed by "%".
        start: offset of the number in the text.
    """

    text: str
    value: float
    decimals: int
    scientific: bool
    percent: bool
    start: int


def report_numbers(text: str) -> list[ReportNumber]:
    """The numbers printed in ``text``, in order (see the module docstring for what is
    skipped: digits inside names such as ``fp32`` / ``ResNet-18``, list markers).

    Raises:
        ValueError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str (the report), got {type(text).__name__}")
    markers = {m.end() - 2 for m in _LIST_MARKER.finditer(text)}  # offset of the digit
    found = []
    for m in _NUM.finditer(text):
        start, token = m.start(), m.group()
        before = text[start - 1] if start else " "
        if _NAME_CHAR.match(before) or text[m.end():m.end() + 1].isdigit():
            continue  # part of a name (fp32, v2.1) or of a longer token
        if m.end() - 1 in markers and token.isdigit():
            continue  # "1." or "2)" opening a list item
        if before == "-":
            prev = text[start - 2] if start >= 2 else " "
            if prev.isalpha() or prev == "_":
                continue  # ResNet-18, layer-4: a name, not a minus sign
            if not (prev.isdigit() or prev in "x%"):  # "0.85-1.10x" is a range
                token, start = "-" + token, start - 1
        mantissa = re.split(r"[eE]", token)[0]
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        percent = text[m.end():m.end() + 2].lstrip(" ")[:1] == "%"
        found.append(ReportNumber(token, float(token.replace(",", "")), decimals,
                                  "e" in token.lower(), percent, start))
    return found


def _printed(value: float, number: ReportNumber) -> float:
    """``value`` printed at ``number``'s precision, read back."""
    spec = f".{number.decimals}{'e' if number.scientific else 'f'}"
    return float(format(value, spec))


def _matches(number: ReportNumber, values: Iterable[float]) -> bool:
    for v in values:
        if not math.isfinite(v):
            continue
        for scaled in ((v, 100 * v) if number.percent else (v,)):
            if _printed(scaled, number) == number.value:
                return True
    return False


def unmeasured_numbers(text: str, measured: Mapping[str, float] | Iterable[float]
                       ) -> list[str]:
    """The numbers in ``text`` that no value of ``measured`` gives at the precision
    they are printed with (each as printed, in order).

    Args:
        text: the report.
        measured: the run's measured values (a ``{name: value}`` mapping or values).

    Raises:
        ValueError: ``text`` not a str, or a measured value that is not a number.
    """
    values = list(measured.values() if isinstance(measured, Mapping) else measured)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        raise ValueError(f"measured values must be numbers, got {bad[:3]!r}; pass "
                         "flatten_numbers(...) of what the run measured")
    values = [float(v) for v in values]
    return [n.text for n in report_numbers(text) if not _matches(n, values)]


def _rung_pattern(rungs: Sequence[str]) -> re.Pattern:
    names = "|".join(sorted(map(re.escape, rungs), key=len, reverse=True))
    return re.compile(rf"(?<![\w.\-])-?(?:{names})(?:\+(?:{names}))*(?![\w])")


def rungs_called_kept(text: str, rungs: Sequence[str] = RUNGS) -> list[str]:
    """Rung names ``text`` calls kept, in order of mention (a joint move
    ``amp+channels_last`` gives both names, a removal ``-amp`` gives "-amp").

    A mention is *called kept* when, of the status words in its clause (clauses end at
    ``;``, ``!``, ``?``, a newline or a sentence's full stop), the one nearest to it is
    "kept" and not a negative ("not kept", "dropped", "did not help", "removed", ...);
    status words in the mention's own comma-separated part of the clause come first
    ("channels_last was not kept, amp was kept"; "Kept: data_loading, amp").

    Raises:
        ValueError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str (the report), got {type(text).__name__}")
    pattern, called = _rung_pattern(rungs), []
    bounds = [0] + [m.end() for m in _CLAUSE_END.finditer(text)] + [len(text)]
    for lo, hi in zip(bounds, bounds[1:]):
        clause = text[lo:hi]
        status = [(m.start(), m.end(), m.group("pos") is not None)
                  for m in _STATUS.finditer(clause)]
        if not status:
            continue
        commas = [0] + [i + 1 for i, c in enumerate(clause) if c == ","] + [len(clause) + 1]
        for m in pattern.finditer(clause):
            def gap(s):
                return max(s[0] - m.end(), m.start() - s[1], 0)
            # the mention's own comma-separated part decides when it has a status word
            # ("a was not kept, b was kept"); else the clause does ("Kept: a, b")
            lo_c = max(c for c in commas if c <= m.start())
            hi_c = min(c for c in commas if c > m.start())
            near = [s for s in status if lo_c <= s[0] and s[1] < hi_c] or status
            if min(near, key=gap)[2]:
                token = m.group()
                called += [token] if token.startswith("-") else token.split("+")
    return called


def report_problems(text: Any, measured: Mapping[str, float], kept_moves: Sequence[str],
                    rungs: Sequence[str] = RUNGS, min_words: int = 30) -> list[str]:
    """What is wrong with a report, as messages (empty: nothing).

    Args:
        text: the report (anything else is one problem).
        measured: ``{name: value}`` of every value the run measured.
        kept_moves: the ladder's kept moves (``Ladder.kept``: "amp", "amp+channels_last",
            "-amp").
        rungs: the rung names to look for.
        min_words: the shortest report accepted.
    """
    if not isinstance(text, str) or len(text.split()) < min_words:
        return [f"write a report of a few sentences (at least {min_words} words) in the "
                "string `report`"]
    problems = []
    stray = unmeasured_numbers(text, measured)
    if stray:
        problems.append(f"these numbers are not values this run measured (at the precision "
                        f"printed): {', '.join(stray)}; print every number from a "
                        "measurement with an f-string, and name labs and rungs in words")
    kept = {n for move in kept_moves for n in ([move] if move.startswith("-")
                                               else move.split("+"))}
    wrong = [r for r in dict.fromkeys(rungs_called_kept(text, rungs)) if r not in kept]
    if wrong:
        problems.append(f"the report calls {', '.join(wrong)} kept, but the ladder kept "
                        f"{', '.join(kept_moves) or 'nothing'}: read the table's status")
    return problems


def flatten_numbers(obj: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number inside ``obj`` as ``{path: value}``: dicts, lists, tuples,
    pandas DataFrames / Series (cell by cell), objects with ``to_dict()``, numbers
    (bools and strings are skipped; NaN and inf too)."""
    out: dict[str, float] = {}
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return out
    if isinstance(obj, (int, float)) or type(obj).__name__ in ("float64", "int64", "float32"):
        v = float(obj)
        if math.isfinite(v):
            out[prefix or "value"] = v
        return out
    if hasattr(obj, "to_dict") and not isinstance(obj, Mapping):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten_numbers(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten_numbers(v, f"{prefix}[{i}]"))
    return out


def _rows(table: Any) -> list[dict]:
    """A table's rows as dicts: a DataFrame's records, or a list of dicts as given."""
    if hasattr(table, "to_dict") and not isinstance(table, Mapping):
        return table.to_dict("records")
    return [dict(r) for r in table]


def run_numbers(run: Mapping[str, Any]) -> dict[str, float]:
    """Every number a report on ``run`` may print, as ``{path: value}``: every number in
    ``run`` (:func:`flatten_numbers`: the tables cell by cell, the nested dicts), the memory
    peak's byte counts in MiB (``run["memory_peak"]``'s ints / 2**20) and
    :data:`REPORT_SETTINGS`.

    Raises:
        ValueError: ``run`` is not a mapping.
    """
    if not isinstance(run, Mapping):
        raise ValueError(f"run must be a dict of the run's values, got {type(run).__name__}")
    peak = run.get("memory_peak") or {}
    mib = {k: v / 2 ** 20 for k, v in peak.items()
           if isinstance(v, int) and not isinstance(v, bool)}
    return flatten_numbers({"run": dict(run), "memory_mib": mib, "settings": REPORT_SETTINGS})


def run_report_problems(text: Any, run: Mapping[str, Any], rungs: Sequence[str]) -> list[str]:
    """What Lab 08's report on ``run`` gets wrong, as messages (empty: nothing).

    ``run`` holds ``"models"``, ``"ablation"`` (a DataFrame or a list of row dicts: model,
    change, status "kept"/"dropped"/"skipped", speedup, ...), ``"best"`` (per model, the
    kept changes together: ``"speedup"``, None when nothing was kept), ``"mfu"`` (per model:
    ``"mfu_pct"``, None when unavailable), ``"memory_bound_ops"`` and ``"memory_peak"``
    (``"category"``), and any other values the report may print. The report must pass
    :func:`report_problems` against :func:`run_numbers` (at least 30 words, every number
    a value of the run at its printed precision, no change called kept that the ablation
    did not keep), name every change the ablation timed, call every kept change kept,
    give the word MFU and each model's MFU value where known, each model's kept changes'
    speedup together where something was kept, a memory-bound operator when there is one,
    and the category that held the most memory at the peak.

    Args:
        text: the report (anything else is one problem).
        run: the run's values, as above.
        rungs: the change names to look for (Lab 08's ``CHANGES``).

    Raises:
        ValueError: ``run`` is not a mapping.
    """
    values = run_numbers(run)
    rows = _rows(run["ablation"])
    kept = sorted({r["change"] for r in rows if r["status"] == "kept"})
    timed = sorted({r["change"] for r in rows if r["status"] != "skipped"})
    problems = report_problems(text, values, kept, rungs=rungs)
    if not isinstance(text, str):
        return problems
    unnamed = [c for c in timed if not re.search(rf"(?<![\w.]){re.escape(c)}(?!\w)", text)]
    if unnamed:
        problems.append("say what the ablation found for every change it timed: no "
                        + ", ".join(unnamed))
    unlabelled = sorted(set(kept) - set(rungs_called_kept(text, rungs)))
    if unlabelled:
        problems.append("say which changes were kept: the report does not call "
                        + ", ".join(unlabelled) + " kept")
    numbers = report_numbers(text)

    def printed(value: float) -> bool:
        return any(_matches(n, [float(value)]) for n in numbers)

    if "MFU" not in text:
        problems.append("give each model's MFU (the word MFU and its value)")
    for name in run["models"]:
        mfu = run["mfu"][name].get("mfu_pct")
        if mfu is not None and not printed(mfu):
            problems.append(f"give {name}'s MFU, {mfu!r} %, printed from the run")
        together = run["best"][name].get("speedup")
        if together is not None and not printed(together):
            problems.append(f"give the speedup of {name}'s kept changes together "
                            f"({together!r}x), printed from the run")
    ops = list(run["memory_bound_ops"])   # as words: "mul" in matmul_precision is no operator
    if ops and not any(re.search(rf"(?<![\w.]){re.escape(op)}(?!\w)", text) for op in ops):
        problems.append(f"name a memory-bound operator of your placement: {', '.join(ops)}")
    category = run["memory_peak"]["category"]
    if category not in text:
        problems.append(f"name the peak's category ({category})")
    return problems
