"""The optimization ladder (Lab 08, ``perflab ladder``): a search for the fastest config.

Starting from a naive baseline (per-sample JPEG decode in the main process, fp32, NCHW,
eager), :func:`climb` searches the rungs of :mod:`perflab.ladder.rungs` by local search
(first-improvement hill climbing), every move measured against the best so far:

1. **first pass** (the classic greedy ladder): each rung in order, added on top of the
   best so far (a rung of a group, e.g. ``max_autotune``, replaces the group's member);
2. **joint moves**: interacting rungs (``amp`` x ``channels_last`` x ``compile``, ...)
   that each failed alone on the current best are tried together (pairs, then the
   triple): bf16 may pay only in NHWC, or only once compiled;
3. **re-tries and removals**: after a rung is kept, every dropped rung is tried again on
   the new best, and every earlier kept rung is tried *off* (a later rung may make it
   useless); passes repeat until one keeps nothing (or ``max_trials``).

A move is measured with interleaved rounds (A B A B, so drift hits both sides) and
compared per sample (so a larger batch compares fairly) with
:func:`perflab.core.measurement.compare` (two-sided Mann-Whitney U, bootstrap CI of the
speedup); it is kept only when the candidate is significantly faster (p < alpha and
speedup > 1). The same pair is never measured twice. Every pooled RunResult is saved
the moment its trial finishes (``runs/*.json``, tagged with the trial and the rungs
that were on, rounds in ``runs/rounds/``), with ``ladder.json`` holding the climb's
arguments, so :func:`resume_climb` replays the saved trials and measures only the rest.
:func:`search_all` measures every combination (the exhaustive search the ladder is
checked against in ``benchmarks/ladder_search.py``).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from perflab.core.config import RunConfig
from perflab.ladder.report import Ladder
from perflab.ladder.rungs import (
    ROUNDS, RUNGS, SIZES, Variant, applied, check_size,
    checkpointed_batch_size, make_variant, naive_config, per_sample, rung_config,
    unavailable,
)
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.core.result import RunResult
from perflab.core.paths import default_results_dir
from perflab.core.storage import check_writable, write_atomic
from perflab.ladder.moves import _Search

__all__ = ["climb", "resume_climb", "search_all", "validate_climb"]

RunFn = Callable[..., list[RunResult]]
_STATE = "ladder.json"



def validate_climb(rungs: Sequence[str], skip: Sequence[str], rounds: int, alpha: float) -> None:
    """Refuse a climb's arguments before any run: unknown rung names, a string instead
    of a list, ``rounds`` < 1, ``alpha`` outside (0, 1).

    Raises:
        ValueError: naming the argument and the fix.
    """
    for name, names in (("rungs", rungs), ("skip", skip)):
        if isinstance(names, str):
            raise ValueError(f"{name} must be a list of rung names, got the string "
                             f"{names!r}; write {name}=[{names!r}]")
        bad = [r for r in names if r not in RUNGS]
        if bad:
            raise ValueError(f"unknown rung(s) {bad} in {name}; choose from {RUNGS}")
    if len(set(rungs)) != len(rungs):
        raise ValueError(f"rungs lists a rung twice: {list(rungs)}; name each once")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1 (interleaved A/B rounds), got {rounds!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), e.g. 0.05, got {alpha!r}")


def _pool(results: list[RunResult]) -> RunResult:
    """Rounds of one variant as one result (every round's measured steps). Written here
    rather than calling run_interleaved with every variant because a variant's settings
    (cudnn.benchmark, the fused optimizer) must be applied around its own rounds only."""
    first = results[0]
    phases = {n: Measurement(m.label, sum((r.phases[n].times_s for r in results), ()),
                             sum((r.phases[n].warmup_s for r in results), ()),
                             m.samples_per_step) for n, m in first.phases.items()}
    peak = max((r.peak_memory for r in results), key=lambda p: p.peak_bytes)
    return RunResult(config=first.config, phases=phases, losses=first.losses,
                     peak_memory=PeakMemory(peak.peak_bytes, peak.kind),
                     env=dict(first.env, rounds=len(results)), num_classes=first.num_classes,
                     wall_s=sum(r.wall_s for r in results), extra=dict(first.extra))


class _Trials:
    """Measures variants in interleaved rounds, saves each result as it is measured and
    replays the trials a resumed climb finds saved (same index and variants)."""

    def __init__(self, run_fn: RunFn, rounds: int, progress: bool, out: Path | None,
                 saved: dict[int, dict[str, RunResult]] | None = None):
        self.run_fn, self.rounds, self.progress, self.out = run_fn, rounds, progress, out
        self.saved, self.count, self.replayed, self.paths = saved or {}, 0, 0, []

    def measure(self, variants: Sequence[Variant]) -> list[RunResult]:
        index, self.count = self.count, self.count + 1
        old = self.saved.get(index, {})
        if all(v.key in old for v in variants):
            self.replayed += 1
            return [old[v.key] for v in variants]
        per: list[list[RunResult]] = [[] for _ in variants]
        for _ in range(self.rounds):
            for j, v in enumerate(variants):
                with applied(v.settings):
                    (r,) = self.run_fn([v.config], rounds=1, progress=self.progress)
                per[j].append(r.save(self.out / "runs" / "rounds") if self.out else r)
        pooled = []
        for j, v in enumerate(variants):
            r = _pool(per[j])
            tag = dict(trial=index, key=v.key, on=list(v.on), settings=list(v.settings),
                       role="incumbent" if j == 0 and len(variants) == 2 else "candidate")
            r = dataclasses.replace(r, extra={**r.extra, "ladder": tag})
            if self.out:
                r = r.save(self.out / "runs")
                self.paths.append(r.path)
            pooled.append(r)
        return pooled


def _load_saved(out: Path) -> dict[int, dict[str, RunResult]]:
    saved: dict[int, dict[str, RunResult]] = {}
    for path in sorted((out / "runs").glob("*.json")):
        r = RunResult.load(path)
        tag = r.extra.get("ladder")
        if tag:
            saved.setdefault(int(tag["trial"]), {})[tag["key"]] = r
    return saved


def climb(config: RunConfig | None = None, *, size: str = "quick",
          rungs: Sequence[str] = RUNGS, skip: Sequence[str] = (), rounds: int | None = None,
          alpha: float = 0.05, progress: bool = True, out_dir: str | Path | None = None,
          save: bool = True, run_fn: RunFn | None = None, search: bool = True,
          max_trials: int | None = None, budget_s: float | None = None,
          _saved: dict | None = None) -> Ladder:
    """Search the ladder from ``config`` (default ``naive_config(size)``); see the module
    docstring for the moves.

    Args:
        config: the baseline; None -> ``naive_config(size)``.
        size: a key of :data:`SIZES` (used when ``config`` is None, and for ``rounds``).
        rungs: the rungs to try, in first-pass order (names from :data:`RUNGS`).
        skip: rungs to leave out (listed as skipped in the table).
        rounds: interleaved rounds per comparison (>= 1); None -> ``ROUNDS[size]``.
        alpha: significance level of the keep decision, in (0, 1).
        progress: a tqdm bar over the trials (and each run's step bar).
        out_dir: folder for ``runs/*.json``, ``ladder.json`` and the report; None ->
            ``<results>/ladder/<UTC timestamp>``. Checked writable before any run.
        save: write every result as soon as it is measured.
        run_fn: ``run_fn([config], rounds=1, progress=...) -> [RunResult]``; default
            :func:`perflab.experiment.run_interleaved` without saving (tests pass a fake).
        search: False: the first pass only (the greedy ladder).
        max_trials: stop searching after this many comparisons (None: no limit).
        budget_s: wall-clock bound (seconds) of the search: a move whose estimated time
            (the incumbent's measured wall time, times the measured slowdown of the rungs
            it adds, plus a cold compile when it needs a torch.compile graph this process
            has not built, even where inductor's cache held the graphs compiled so far)
            would pass it is not measured, and the ladder's ``skipped`` names it. The
            first trial always runs. None: no bound.

    Returns:
        A :class:`Ladder` (its ``write_report()`` writes report.md and the plots).

    Raises:
        ValueError: unknown rung or size, rounds < 1, alpha outside (0, 1), a config
            RunConfig rejects, an ``out_dir`` that cannot be written or already holds a
            ladder -- all before any measurement.
        KeyboardInterrupt: after printing what was saved and how to resume.
    """
    check_size(size)
    rounds = ROUNDS[size] if rounds is None else rounds
    validate_climb(rungs, skip, rounds, alpha)
    if max_trials is not None and (isinstance(max_trials, bool) or not isinstance(
            max_trials, int) or max_trials < 1):
        raise ValueError(f"max_trials must be None or an int >= 1, got {max_trials!r}")
    if budget_s is not None and not (isinstance(budget_s, (int, float))
                                     and not isinstance(budget_s, bool) and budget_s > 0):
        raise ValueError(f"budget_s must be None or seconds > 0, got {budget_s!r}")
    if config is None:
        config = naive_config(size)
    elif not isinstance(config, RunConfig):
        raise ValueError(f"config must be a RunConfig or None, got {type(config).__name__}")
    out = None
    if save:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = check_writable(Path(out_dir) if out_dir else default_results_dir() / "ladder"
                             / stamp, field="out_dir")
        if _saved is None and (out / _STATE).exists():
            raise ValueError(f"out_dir={str(out)!r} already holds a ladder ({_STATE}); "
                             f"finish it with `perflab ladder --resume {out}` "
                             "(resume_climb) or pass a new folder")
        state = dict(config=config.to_dict(), size=size, rungs=list(rungs), skip=list(skip),
                     rounds=rounds, alpha=alpha, search=search, max_trials=max_trials,
                     budget_s=budget_s)
        write_atomic(out / _STATE, json.dumps(state, indent=1))
    if run_fn is None:
        from perflab.experiment import run_interleaved
        run_fn = partial(run_interleaved, save=False)
    trials = _Trials(run_fn, rounds, progress, out, _saved)
    skipped = {r: "skipped on request" for r in rungs if r in skip}
    for r in rungs:
        why = None if r in skip else unavailable(r, config)
        if why:
            skipped[r] = why
    todo = [r for r in rungs if r not in skipped]
    s = _Search(config, todo, trials, alpha, progress, max_trials, budget_s)
    try:
        s.run(search)
    except KeyboardInterrupt:
        saved = len(trials.paths)
        where = (f"{saved} result(s) of {len(s.done)} finished trial(s) saved in "
                 f"{out / 'runs'}; finish it with `perflab ladder --resume {out}`"
                 if out else "nothing saved (save=False)")
        print(f"\nladder interrupted: {where}")
        raise
    finally:
        s.bar.close()
    skipped.update(s.skipped)
    best = s.variant(s.on)
    return Ladder(baseline=s.baseline, rungs=s.done, best_config=best.config.replace(label=""),
                  skipped=skipped, out_dir=out, order=list(rungs), best_on=tuple(best.on),
                  greedy_on=s.greedy_on, best_settings=best.settings)


def resume_climb(out_dir: str | Path, *, progress: bool = True,
                 run_fn: RunFn | None = None) -> Ladder:
    """Finish an interrupted climb in ``out_dir``: replay its saved trials
    (``runs/*.json``) through the same search and measure only what is missing, with
    the arguments in its ``ladder.json``. A finished climb is replayed without any
    measurement (use it to rebuild report.md / table.csv).

    Raises:
        ValueError: ``out_dir`` holds no ``ladder.json`` (not a ladder folder).
    """
    out = Path(out_dir)
    if not (out / _STATE).is_file():
        raise ValueError(f"{str(out)!r} holds no {_STATE}: not a folder written by "
                         "`perflab ladder` (or climb(save=True)); pass the ladder's --out")
    state = json.loads((out / _STATE).read_text())
    return climb(RunConfig.from_dict(state["config"]), size=state["size"],
                 rungs=state["rungs"], skip=state["skip"], rounds=state["rounds"],
                 alpha=state["alpha"], search=state["search"],
                 max_trials=state["max_trials"], budget_s=state.get("budget_s"),
                 progress=progress, out_dir=out,
                 run_fn=run_fn, _saved=_load_saved(out))


def search_all(config: RunConfig | None = None, *, size: str = "tiny",
               rungs: Sequence[str] = ("data_loading", "amp", "channels_last", "compile"),
               rounds: int = 3, progress: bool = True, run_fn: RunFn | None = None
               ) -> pd.DataFrame:
    """Measure EVERY combination of ``rungs`` (that can run here), interleaved: each
    round runs every combination once, so drift hits all alike.

    Returns:
        One row per combination, fastest first: ``key`` (rungs joined by "+"),
        ``on`` (tuple), ``batch_size``, ``ms_per_sample`` (median),
        ``ms_per_sample_ci_low`` / ``_high`` (95 % CI of the median), ``samples_per_s``,
        ``result`` (the pooled RunResult).

    Raises:
        ValueError: unknown rung or size, rounds < 1.
    """
    check_size(size)
    validate_climb(rungs, (), rounds, 0.05)
    config = naive_config(size) if config is None else config
    if run_fn is None:
        from perflab.experiment import run_interleaved
        run_fn = partial(run_interleaved, save=False)
    usable = [r for r in rungs if unavailable(r, config) is None]
    variants = {}
    for k in range(len(usable) + 1):
        for combo in itertools.combinations(usable, k):
            big = checkpointed_batch_size(config)[0] if "larger_batch" in combo else None
            try:
                v = make_variant(config, combo, big_batch=big)
            except ValueError:  # two of one group
                continue
            if not isinstance(v, str):
                variants[v.key] = v
    trials = _Trials(run_fn, rounds, progress, None)
    results = trials.measure(list(variants.values()))
    rows = []
    for v, r in zip(variants.values(), results):
        m = per_sample(r.step, v.config.batch_size, v.key)
        lo, hi = m.ci95_median
        rows.append(dict(key=v.key, on=v.on, batch_size=v.config.batch_size,
                         ms_per_sample=m.median * 1e3, ms_per_sample_ci_low=lo * 1e3,
                         ms_per_sample_ci_high=hi * 1e3, samples_per_s=1 / m.median,
                         result=r))
    return pd.DataFrame(rows).sort_values("ms_per_sample", ignore_index=True)
