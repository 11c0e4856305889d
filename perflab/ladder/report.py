"""What a ladder climb found: the :class:`Ladder` table, its plots and report.

:func:`perflab.ladder.search.climb` measures; this module shows: a table (step time,
throughput with 95 % CI, speedup per rung and cumulative, MFU, peak memory), a waterfall
of the cumulative speedup, the phase breakdown per rung, ``report.md`` with the
environment summary (the Lab 08 widget is :func:`perflab.ui.panels.ladder_panel`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from matplotlib.figure import Figure

from perflab.core.env import env_summary
from perflab.viz.figures import InlineFigure, figure_to_png
from perflab.analysis.flops import utilization
from perflab.core.measurement import Comparison
from perflab.viz.plots import plot_phases
from perflab.core.result import RunResult

__all__ = ["Rung", "Ladder", "TABLE_COLUMNS"]

#: Columns of :attr:`Ladder.table`, in order.
TABLE_COLUMNS = ("rung", "move", "status", "change", "batch_size", "step_time_ms", "samples_per_s",
                 "samples_per_s_ci_low", "samples_per_s_ci_high", "speedup",
                 "speedup_ci_low", "speedup_ci_high", "p_value", "cumulative_speedup",
                 "mfu_pct", "mfu_peak", "peak_mem_gib", "verdict")
_KEPT, _DROPPED = "#009E73", "#B0B0B0"  # Okabe-Ito green, grey (as perflab.viz.plots)


@dataclass(frozen=True)
class Rung:
    """One measured move of the search (a trial).

    Attributes:
        name: the rung (one of :data:`perflab.ladder.search.RUNGS`), rungs joined by "+" for a
            joint move, "-rung" for a removal.
        change: what the rung changed, e.g. ``"amp='bf16'"``.
        incumbent: the best-so-far config's RunResult, measured in the same interleaved
            rounds as the candidate.
        candidate: the candidate's RunResult.
        comparison: per-sample time, incumbent vs candidate (speedup > 1: faster).
        kept: True when the candidate is significantly faster (it became the best).
        note: how a larger batch was chosen, in words ("" otherwise).
        move: "add" (first pass), "retry" (a dropped rung on a newer best), "joint"
            (interacting rungs together) or "remove" (a kept rung switched off).
        on: the rungs on in the candidate, in :data:`perflab.ladder.search.RUNGS` order.
    """

    name: str
    change: str
    incumbent: RunResult
    candidate: RunResult
    comparison: Comparison
    kept: bool
    note: str = ""
    move: str = "add"
    on: tuple[str, ...] = ()


def _mfu(result: RunResult) -> tuple[float, str]:
    """MFU in % against the peak of the run's own dtype (NaN when the peak is
    unavailable) and that peak with its source, e.g. "bf16 1.1 GFLOP/s, measured: ...";
    see :func:`perflab.analysis.flops.utilization`."""
    u = utilization(result)
    p = u.peak
    value = "unavailable" if p.flops_per_s is None else f"{p.flops_per_s / 1e9:,.4g} GFLOP/s"
    return (math.nan if u.mfu_pct is None else u.mfu_pct), f"{p.dtype} {value}, {p.source}"


def _row(rung: str, status: str, change: str, r: RunResult | None, c: Comparison | None,
         cumulative: float, verdict: str, mfu: bool, move: str = "") -> dict[str, Any]:
    nan = math.nan
    row = dict.fromkeys(TABLE_COLUMNS, nan)
    row.update(rung=rung, move=move, status=status, change=change,
               cumulative_speedup=cumulative, verdict=verdict, mfu_peak="")
    if r is not None:
        lo, hi = r.samples_per_s_ci95
        pct, peak = _mfu(r) if mfu else (nan, "")
        row.update(batch_size=r.config.batch_size, step_time_ms=r.step.median * 1e3,
                   samples_per_s=r.samples_per_s, samples_per_s_ci_low=lo,
                   samples_per_s_ci_high=hi, peak_mem_gib=r.peak_mem_gib,
                   mfu_pct=pct, mfu_peak=peak)
    if c is not None:
        row.update(speedup=c.speedup, speedup_ci_low=c.ci95[0], speedup_ci_high=c.ci95[1],
                   p_value=c.p_value)
    return row


def _noisy(rung: Rung) -> bool:
    return rung.incumbent.step.noisy or rung.candidate.step.noisy


class Ladder:
    """The outcome of :func:`perflab.ladder.search.climb`.

    Attributes:
        baseline: the naive baseline's RunResult (measured in the first trial), or None
            when nothing was measured.
        rungs: the measured moves (:class:`Rung`), in the order they were tried.
        best_config: the config with every kept fix (settings outside RunConfig, such
            as the fused optimizer, are in ``best_on`` / ``best_settings``).
        skipped: rung name -> why it was not measured.
        out_dir: where the RunResults were saved and the report goes (None: not saved).
        order: the rung names as requested (skipped ones included).
        best_on: the rungs on in the best config.
        greedy_on: the rungs on after the first pass (what a greedy ladder keeps).
        best_settings: the rungs of ``best_on`` applied around the run, not in RunConfig.
    """

    def __init__(self, *, baseline: RunResult | None, rungs: Sequence[Rung], best_config,
                 skipped: dict[str, str], out_dir: Path | None, order: Sequence[str],
                 best_on: Sequence[str] | None = None, greedy_on: Sequence[str] | None = None,
                 best_settings: Sequence[str] = ()):
        self.baseline, self.rungs, self.best_config = baseline, list(rungs), best_config
        self.skipped, self.out_dir, self.order = dict(skipped), out_dir, list(order)
        kept = [n for r in self.rungs if r.kept for n in r.on]
        self.best_on = tuple(best_on if best_on is not None else dict.fromkeys(kept))
        self.greedy_on = tuple(greedy_on if greedy_on is not None else self.best_on)
        self.best_settings = tuple(best_settings)
        self._tables: dict[bool, pd.DataFrame] = {}

    @property
    def kept(self) -> list[str]:
        """Moves that were significantly faster and kept, in order (a rung name, rungs
        joined by "+" for a joint move, "-rung" for a removal)."""
        return [r.name for r in self.rungs if r.kept]

    @property
    def dropped(self) -> list[str]:
        """Moves that were measured and did not help here (not significant, or slower)."""
        return [r.name for r in self.rungs if not r.kept]

    @property
    def trials(self) -> int:
        """Comparisons measured (each: interleaved rounds of incumbent and candidate)."""
        return len(self.rungs)

    @property
    def cumulative_speedup(self) -> float:
        """Product of the kept moves' speedups (each measured side by side, per sample)."""
        return math.prod(r.comparison.speedup for r in self.rungs if r.kept)

    def table_with(self, *, mfu: bool = True) -> pd.DataFrame:
        """:attr:`table`; ``mfu=False`` skips counting FLOPs and the peak (faster)."""
        if mfu not in self._tables:
            rows = []
            if self.baseline is not None:
                rows.append(_row("baseline", "baseline", "naive", self.baseline, None, 1.0,
                                 "baseline", mfu))
            cum = 1.0
            for r in self.rungs:
                c = r.comparison
                cum *= c.speedup if r.kept else 1.0
                word = "kept" if r.kept else "dropped"
                miss = ("; did not help on this hardware" if r.move != "remove" else
                        f"; {r.name[1:]} stays on (not faster without it)")
                verdict = (f"{word}: {c.speedup:.2f}x per sample (95 % CI {c.ci95[0]:.2f}-"
                           f"{c.ci95[1]:.2f}x), p = {c.p_value:.3g}"
                           + ("" if r.kept else miss)
                           + ("; noisy (IQR > 10 % of the median: other programs "
                              "competed for the cores?)" if _noisy(r) else ""))
                rows.append(_row(r.name, word, r.change, r.candidate, c, cum, verdict, mfu,
                                 r.move))
            for name in self.order:
                if name in self.skipped:
                    rows.append(_row(name, "skipped", "", None, None, cum,
                                     f"skipped: {self.skipped[name]}", mfu))
            self._tables[mfu] = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
        return self._tables[mfu].copy()

    @property
    def table(self) -> pd.DataFrame:
        """One row per measured move, in order (baseline first, skipped rungs last);
        columns :data:`TABLE_COLUMNS`. ``speedup`` is candidate vs the best so far, per
        sample; ``cumulative_speedup`` the product of kept speedups up to that row;
        ``mfu_pct`` from :func:`perflab.analysis.flops.utilization` against the peak of the run's
        own dtype, ``mfu_peak`` that peak and its source (datasheet or measured)."""
        return self.table_with(mfu=True)

    def __repr__(self) -> str:
        return (f"Ladder({len(self.rungs)} rungs measured: kept {self.kept}, dropped "
                f"{self.dropped}, skipped {sorted(self.skipped)}; cumulative speedup "
                f"{self.cumulative_speedup:.2f}x)")

    # -- plots ------------------------------------------------------------------------
    def plot_waterfall(self) -> Figure:
        """Cumulative speedup, rung by rung: a kept rung is a green step up from the
        previous level, a dropped one a grey bar of what it would have given (not
        carried on); the last bar is the total. Speedups are per sample."""
        fig = InlineFigure(figsize=(8.0, 4.0), layout="constrained")
        ax = fig.add_subplot()
        level, names = 1.0, []
        for i, r in enumerate(self.rungs):
            s = r.comparison.speedup
            top = level * s
            ax.bar(i, top - level, bottom=level, color=_KEPT if r.kept else _DROPPED,
                   hatch=None if r.kept else "//", edgecolor="black", linewidth=0.5)
            ax.annotate(f"{s:.2f}x\np={r.comparison.p_value:.2g}", (i, max(top, level)),
                        xytext=(0, 3), textcoords="offset points", ha="center",
                        fontsize="small")
            level = top if r.kept else level
            names.append(r.name)
        n = len(self.rungs)
        ax.bar(n, level - 1.0, bottom=1.0, color="#0072B2", edgecolor="black", linewidth=0.5)
        ax.annotate(f"{level:.2f}x", (n, level), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontweight="bold")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.12 * (hi - lo))  # room for the labels above the bars
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(n + 1), names + ["total"])
        ax.set_ylabel("cumulative speedup over the baseline (x)")
        ax.set_title("optimization ladder: green kept, hatched grey dropped (not "
                     "significant or slower)", fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        return fig

    def plot_phases(self) -> Figure:
        """Phase breakdown (data, forward, backward, optimizer) of the baseline and every
        rung's candidate, per step (:func:`perflab.viz.plots.plot_phases`)."""
        results = ([self.baseline] if self.baseline is not None else []) + [
            r.candidate for r in self.rungs]
        shown = [dataclasses.replace(r, config=r.config.replace(
            label=f"{r.config.label} (bs {r.config.batch_size})")) for r in results]
        return plot_phases(shown)

    # -- report -----------------------------------------------------------------------
    def write_report(self, out_dir: str | Path | None = None) -> Path:
        """Write ``report.md``, ``table.csv``, ``waterfall.png`` and ``phases.png``.

        Args:
            out_dir: the folder; None -> :attr:`out_dir`.

        Returns:
            The path of report.md.

        Raises:
            ValueError: no folder given and the ladder was not saved.
        """
        out = Path(out_dir) if out_dir else self.out_dir
        if out is None:
            raise ValueError("this ladder was climbed with save=False; pass "
                             "write_report(out_dir=...)")
        out.mkdir(parents=True, exist_ok=True)
        table = self.table
        table.to_csv(out / "table.csv", index=False)
        (out / "waterfall.png").write_bytes(figure_to_png(self.plot_waterfall()))
        if self.baseline is not None:
            (out / "phases.png").write_bytes(figure_to_png(self.plot_phases()))
        device = self.baseline.config.device if self.baseline else "auto"
        lines = ["# Optimization ladder", "",
                 f"Cumulative speedup: **{self.cumulative_speedup:.2f}x** per sample "
                 f"(product of the kept rungs' side-by-side speedups).", "",
                 f"Kept: {', '.join(self.kept) or 'none'}. Best config: "
                 f"`{self.best_config.display_label()}`"
                 + (f" with {', '.join(self.best_settings)}" if self.best_settings else "")
                 + ".", "",
                 f"Search: {self.trials} comparisons (first pass, then joint moves of "
                 "interacting rungs, re-tries of dropped rungs and removals of kept ones"
                 f"). The first, greedy pass alone kept "
                 f"`{'+'.join(self.greedy_on) or 'nothing'}`; the search ends at "
                 f"`{'+'.join(self.best_on) or 'nothing'}`.", ""]
        for r in self.rungs:
            if not r.kept:
                c = r.comparison
                lines.append(f"- **{r.name}** did not help here: {c.speedup:.2f}x per "
                             f"sample (95 % CI {c.ci95[0]:.2f}-{c.ci95[1]:.2f}x, "
                             f"p = {c.p_value:.3g}).")
        lines += [f"- **{k}** skipped: {v}." for k, v in self.skipped.items()]
        noisy = [r.name for r in self.rungs if _noisy(r)]
        if noisy:
            lines += ["", f"Noisy measurements (IQR > 10 % of the median) in: "
                      f"{', '.join(noisy)}. Decisions there have less power; re-run on "
                      "a quiet machine to confirm them."]
        lines += ["", "## Table", "", _markdown(table), "",
                  "![cumulative speedup](waterfall.png)", ""]
        if self.baseline is not None:
            lines += ["![phases per rung](phases.png)", ""]
        lines += _hardware_lines(device, self)
        lines += ["## Environment", "", "```", str(env_summary(device)), "```", ""]
        path = out / "report.md"
        path.write_text("\n".join(lines))
        return path


def _hardware_lines(device: str, ladder: "Ladder") -> list[str]:
    """The measured roofline, and what it says about the amp rung's verdict."""
    from perflab.analysis.roofline import measure_roofline

    roof = measure_roofline(device)
    lines = ["## Why, from this machine's roofline", "", "```", repr(roof), "```", ""]
    amp = [r for r in ladder.rungs if "amp" in r.name.split("+")]
    if ladder.baseline is not None and amp:
        dtype = amp[0].candidate.config.amp
        word = "kept" if any(r.kept for r in amp) else "dropped"
        lines += [f"amp was {word}: {roof.explain(dtype)}.", ""]
    return lines


def _markdown(df: pd.DataFrame) -> str:
    """A GitHub Markdown table. Written here because ``DataFrame.to_markdown`` needs
    the optional ``tabulate`` package, which perflab does not depend on."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "–" if math.isnan(v) else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v).replace("|", "/")
    rows = [" | ".join(df.columns), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(cell(v) for v in rec) for rec in df.itertuples(index=False)]
    return "\n".join(f"| {r} |" for r in rows)
