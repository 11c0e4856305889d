"""The moves of the ladder's search (:func:`perflab.ladder.search.climb`): add a rung,
re-try a dropped one, try interacting rungs jointly, remove a kept one; which moves are
not worth measuring (a rung far slower alone, a move over the time budget); and the
progress bar's estimate of the time left."""
from __future__ import annotations

import itertools
import math
import time
from typing import TYPE_CHECKING, Sequence

from tqdm.auto import tqdm

from perflab.core.config import RunConfig
from perflab.core.measurement import compare
from perflab.core.result import RunResult
from perflab.ladder.report import Rung
from perflab.ladder.rungs import (
    GROUPS, INTERACTING, RUNGS, Variant, checkpointed_batch_size, make_variant, per_sample,
)

if TYPE_CHECKING:
    from perflab.ladder.search import _Trials

__all__ = ["RESCUE_FACTOR"]

#: A rung measured significantly slower than this factor when added alone is not tried
#: again, neither re-tried nor in joint moves. The rungs that interact with it
#: (:data:`INTERACTING`: amp x channels_last x compile) change its effect through layout
#: and fusion; they are assumed not to turn a step this many times slower into a faster
#: one. The case behind it: bf16 autocast on a CPU that emulates bf16 (no AVX512-BF16 or
#: AMX) runs each step ~10x slower, and trying it with NHWC and with compile cost most of
#: the ladder's time while every such trial was slower again. A rung slower by less is
#: re-tried as before (a rung it interacts with may still make it pay).
RESCUE_FACTOR = 2.0


def _change(a: RunConfig, b: RunConfig, settings: Sequence[str]) -> str:
    parts = [f"{k}={v!r}" for k, v in b.to_dict().items()
             if k != "label" and v != getattr(a, k)]
    return ", ".join(parts + [f"{s}=True" for s in settings])


def _compile_extra_s(result: RunResult) -> float:
    """Seconds the warm-up steps took beyond steady steps: torch.compile's compile (and
    recompiles) happen in the first step of a run (``RunResult.step.warmup_s``)."""
    step = result.step
    if not step.warmup_s or not step.times_s:
        return 0.0
    return max(0.0, sum(step.warmup_s) - len(step.warmup_s) * step.median)


def _graph(variant: Variant | str) -> frozenset | None:
    """What a compiled variant's graph depends on (every rung on but the input pipeline,
    which changes no traced op), or None when it is not compiled."""
    if isinstance(variant, str) or variant.config.compile == "off":
        return None
    return frozenset(variant.on) - {"data_loading"}


class _Search:
    """The moves of :func:`climb` over a set of rungs that are on."""

    def __init__(self, base: RunConfig, todo: list[str], trials: "_Trials", alpha: float,
                 progress: bool, max_trials: int | None, budget_s: float | None = None):
        self.base, self.todo, self.trials, self.alpha = base, todo, trials, alpha
        self.max_trials, self.budget_s = max_trials, budget_s
        self.t0 = time.monotonic()
        self.slower: dict[str, tuple[float, int]] = {}  # rung -> (slowdown alone, trial)
        self.trial_s: list[float] = []  # wall seconds of each measured trial, compiles out
        self.compile_s = 0.0  # the longest compile a trial measured (first-step extra)
        self.graphs: set[frozenset] = set()  # compiled graphs this process has built
        self.first_pass_left = len(todo)
        self.on: frozenset[str] = frozenset()
        self.done: list[Rung] = []
        self.skipped: dict[str, str] = {}
        self.tested: set[tuple[frozenset, frozenset]] = set()
        self.failed_at: dict[frozenset, set[str]] = {}  # on -> rungs that failed alone
        self.kept_at: dict[str, int] = {}  # rung -> trial it was (last) kept in
        self.baseline: RunResult | None = None
        self.greedy_on: tuple[str, ...] = ()
        self.big_batch: int | None = None
        self.best_result: RunResult | None = None
        self.bar = tqdm(desc="ladder", unit="trial", total=len(todo), disable=not progress)

    def variant(self, on) -> Variant:
        v = make_variant(self.base, on, big_batch=self.big_batch)
        assert not isinstance(v, str), v  # moves only build variants that exist
        return v

    def _add(self, rung: str) -> frozenset:
        group = next((g for g in GROUPS.values() if rung in g), (rung,))
        return frozenset(self.on - set(group)) | {rung}

    def _full(self) -> bool:
        return self.max_trials is not None and len(self.done) >= self.max_trials

    def try_move(self, cand_on: frozenset, name: str, move: str) -> bool:
        if self._full() or (self.on, cand_on) in self.tested or cand_on == self.on:
            return False
        if "larger_batch" in cand_on and self.big_batch is None:
            self.big_batch, self.batch_note = checkpointed_batch_size(
                self.variant(self.on).config, self.best_result)
            if self.big_batch <= self.base.batch_size:
                self.skipped["larger_batch"] = ("checkpointing frees no room for a larger "
                                                f"batch: {self.batch_note}")
                self.todo.remove("larger_batch")
                return False
        cand = make_variant(self.base, cand_on, big_batch=self.big_batch)
        if isinstance(cand, str):
            self.skipped.setdefault(name, cand)
            return False
        if move in ("retry", "joint"):
            hopeless = [r for r in cand_on - self.on
                        if self.slower.get(r, (1.0, 0))[0] > RESCUE_FACTOR]
            if hopeless:
                for r in hopeless:
                    f, t = self.slower[r]
                    self.skipped.setdefault(r, (
                        f"measured {f:.1f}x slower alone (trial {t}), more than the "
                        f"{RESCUE_FACTOR:g}x a rung it interacts with is assumed to "
                        "recover: not re-tried"))
                return False
        estimate = self._estimate_s(cand_on, cand)
        if (self.budget_s is not None and self.trial_s
                and time.monotonic() - self.t0 + estimate > self.budget_s):
            self.skipped.setdefault(name, (
                f"not measured: about {estimate:.0f} s would pass budget_s="
                f"{self.budget_s:g} s ({time.monotonic() - self.t0:.0f} s spent)"))
            return False
        inc = self.variant(self.on)
        self.tested.add((self.on, cand_on))
        self._show_progress(name, move, estimate)
        t_trial = time.monotonic()
        a, b = self.trials.measure([inc, cand])
        extras = [_compile_extra_s(r) for r in (a, b)]
        self.compile_s = max([self.compile_s] + extras)
        self.trial_s.append(max(0.0, time.monotonic() - t_trial - sum(extras)))
        self.graphs.update(g for g in (_graph(inc), _graph(cand)) if g is not None)
        if move == "add":
            self.first_pass_left -= 1
        if self.bar.total is not None and self.bar.n + 1 > self.bar.total:
            self.bar.total = self.bar.n + 1
        self.bar.update()
        self.baseline = self.baseline or a
        cmp = compare(per_sample(a.step, inc.config.batch_size, inc.key),
                      per_sample(b.step, cand.config.batch_size, cand.key), alpha=self.alpha)
        kept = cmp.significant and cmp.speedup > 1
        note = self.batch_note if "larger_batch" in cand_on - self.on else ""
        self.done.append(Rung(name, _change(inc.config, cand.config, [
            s for s in cand.settings if s not in inc.settings]), a, b, cmp, kept, note,
            move=move, on=cand.on))
        if kept:
            for r in cand_on - self.on:
                self.kept_at[r] = len(self.done)
            self.on, self.best_result = cand_on, b
        else:
            self.best_result = a
            if move in ("add", "retry"):
                self.failed_at.setdefault(self.on, set()).add(name)
            if len(cand_on - self.on) == 1 and cmp.significant and cmp.speedup < 1:
                (r,) = cand_on - self.on
                self.slower[r] = (1 / cmp.speedup, len(self.done) - 1)
        return kept

    def _estimate_s(self, cand_on: frozenset, cand: Variant) -> float:
        """Seconds the move to ``cand_on`` should take: the last trial's time without its
        compiles, the candidate half scaled by the slowdowns its new rungs showed alone,
        plus the longest compile measured so far when the candidate needs a compiled
        graph this process has not built (a cached graph costs nothing: dynamo reuses it
        for a new model instance). 0 before any trial."""
        if not self.trial_s:
            return 0.0
        half = self.trial_s[-1] / 2
        slow = math.prod(self.slower.get(r, (1.0, 0))[0] for r in cand_on - self.on)
        graph = _graph(cand)
        compile_s = self.compile_s if graph is not None and graph not in self.graphs else 0.0
        return half + half * slow + compile_s

    def _show_progress(self, name: str, move: str, estimate: float) -> None:
        """The bar's postfix: the move, trials left in the first pass, the estimate and
        the budget left."""
        parts = [f"{move} {name}"]
        if self.first_pass_left:
            parts.append(f"first pass: {self.first_pass_left} left")
        if self.trial_s:
            parts.append(f"~{estimate:.0f} s this trial")
            if self.first_pass_left:
                mean = sum(self.trial_s) / len(self.trial_s)
                parts.append(f"~{mean * self.first_pass_left:.0f} s to the end of the pass")
        if self.budget_s is not None:
            parts.append(f"budget left {self.budget_s - (time.monotonic() - self.t0):.0f} s")
        self.bar.set_postfix_str(", ".join(parts))

    def run(self, search: bool) -> None:
        self.batch_note = ""
        for rung in list(self.todo):
            if rung in self.todo:
                self.try_move(self._add(rung), rung, "add")
        self.greedy_on = tuple(r for r in RUNGS if r in self.on)
        if not search:
            return
        for _ in range(len(self.todo) + 1):  # each changing pass keeps a move; bounded
            changed = self._joint()
            for rung in [r for r in self.todo if r not in self.on]:
                changed |= self.try_move(self._add(rung), rung, "retry")
            changed |= self._joint()
            last = max(self.kept_at.values(), default=0)
            for rung in [r for r in RUNGS if r in self.on and self.kept_at.get(r, 0) < last]:
                changed |= self.try_move(self.on - {rung}, f"-{rung}", "remove")
            if not changed or self._full():
                return

    def _joint(self) -> bool:
        """Try interacting rungs that each failed alone on the current best, together."""
        failed = sorted((self.failed_at.get(self.on, set()) & set(INTERACTING))
                        - self.on, key=RUNGS.index)
        for k in (2, 3):
            for combo in itertools.combinations(failed, k):
                if any(len(set(combo) & set(g)) > 1 for g in GROUPS.values()):
                    continue
                cand = frozenset(self.on) | set(combo)
                if self.try_move(cand, "+".join(combo), "joint"):
                    return True
        return False
