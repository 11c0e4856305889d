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

from perflab.analysis.compile_cache import cache_lookups
from perflab.core.config import RunConfig
from perflab.core.measurement import compare
from perflab.core.result import RunResult
from perflab.ladder.report import Rung
from perflab.ladder.rungs import (
    GROUPS, INTERACTING, RUNGS, Variant, checkpointed_batch_size, make_variant, per_sample,
)

if TYPE_CHECKING:
    from perflab.ladder.search import _Trials

__all__ = ["RESCUE_FACTOR", "COLD_COMPILE_S", "COLD_OVER_WARM"]

#: A rung measured significantly slower than this factor when added alone is not tried
#: again, neither re-tried nor in joint moves. The rungs that interact with it
#: (:data:`INTERACTING`: amp x channels_last x compile) change its effect through layout
#: and fusion; they are assumed not to turn a step this many times slower into a faster
#: one. The case behind it: bf16 autocast on a CPU that emulates bf16 (no AVX512-BF16 or
#: AMX) runs each step ~10x slower, and trying it with NHWC and with compile cost most of
#: the ladder's time while every such trial was slower again. A rung slower by less is
#: re-tried as before (a rung it interacts with may still make it pay).
RESCUE_FACTOR = 2.0

#: Seconds a graph's compile is assumed to cost before this process has measured one: a
#: cold compile (inductor's cache empty) of ResNet-18's training step at the tiny size,
#: 60 s in fp32 and 65 s in bf16 on a 2-core CPU shared with other jobs (load average
#: 1.6-3.8), each in a fresh process
#: (:func:`perflab.analysis.compile_cache.run_in_fresh_process`). Whether the cache holds
#: a graph is known only after compiling it, so the budget assumes it does not.
COLD_COMPILE_S = 60.0

#: How many times longer inductor takes to compile a graph it has not cached (tracing,
#: code generation, the C++/Triton compiler) than to load one from its cache (tracing and
#: the lookup): the same runs as :data:`COLD_COMPILE_S` took 3.1 s (fp32) and 3.4 s
#: (bf16) with the cache warm, 19x less. The budget's estimate of a graph this process
#: has not built, when every compile it measured was a cache hit.
COLD_OVER_WARM = 19.0


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
        # the longest compile of a graph new to this process (its first steps' extra),
        # when inductor compiled it (a cache miss) and when it loaded it from its cache
        self.cold_compile_s = 0.0
        self.warm_compile_s = 0.0
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
        lookups = cache_lookups()
        a, b = self.trials.measure([inc, cand])
        lookups = cache_lookups() - lookups
        extras = [_compile_extra_s(r) for r in (a, b)]
        self.trial_s.append(max(0.0, time.monotonic() - t_trial - sum(extras)))
        new = [x for v, x in zip((inc, cand), extras)
               if _graph(v) is not None and _graph(v) not in self.graphs]
        if new and lookups.all_hits:   # replayed or uncounted compiles count as cold
            self.warm_compile_s = max([self.warm_compile_s] + new)
        elif new:
            self.cold_compile_s = max([self.cold_compile_s] + new)
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
        plus :meth:`_new_graph_s` when the candidate needs a compiled graph this process
        has not built (a built graph costs nothing: dynamo reuses it for a new model
        instance). 0 before any trial."""
        if not self.trial_s:
            return 0.0
        half = self.trial_s[-1] / 2
        slow = math.prod(self.slower.get(r, (1.0, 0))[0] for r in cand_on - self.on)
        graph = _graph(cand)
        compile_s = self._new_graph_s() if graph is not None and graph not in self.graphs else 0.0
        return half + half * slow + compile_s

    def _new_graph_s(self) -> float:
        """The compile a graph this process has not built is expected to cost, as if
        inductor's cache does not hold it (whether it does is known only afterwards):
        the longest cold compile (a cache miss) measured so far; with cache hits only,
        the longest of those times :data:`COLD_OVER_WARM` (a hit skips the work a miss
        does: its time alone would let a cold compile run past the budget); before any
        compile, :data:`COLD_COMPILE_S`."""
        if self.cold_compile_s:
            return self.cold_compile_s
        if self.warm_compile_s:
            return self.warm_compile_s * COLD_OVER_WARM
        return COLD_COMPILE_S

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
