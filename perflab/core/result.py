"""``RunResult``: what one ``run(config)`` measured, saved as JSON so nothing is lost.

A kernel restart, a crashed widget or a later session can reload any result with
:meth:`RunResult.load`; every result is written under ``results/`` as soon as it exists.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from perflab.core.config import TOKEN_MODELS, RunConfig
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.core.paths import default_results_dir
from perflab.core.storage import write_new_json

if TYPE_CHECKING:   # imported where a table is made: spawned ranks import this module
    import pandas as pd   # and pandas would cost each of them 0.25 s of CPU at start

__all__ = ["RunResult", "PHASES"]

#: The phases of a training step, in order. "other" is step time not inside any phase.
PHASES = ("data", "forward", "backward", "optimizer")
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunResult:
    """One measured training run.

    Attributes:
        config: the :class:`RunConfig` that produced it.
        phases: a :class:`Measurement` per phase (``PHASES``), plus ``"other"`` (time
            between phases) and ``"step"`` (whole step), warm-up excluded. Seconds.
        losses: training loss of every step, warm-up included (float).
        peak_memory: peak memory during the run, with what kind of peak it is.
        env: :func:`perflab.env_summary` as a dict.
        num_classes: classes in the dataset.
        wall_s: wall-clock seconds of the whole run (set-up included).
        created: UTC timestamp (ISO 8601).
        path: where the JSON was saved, or None.
        rank: the data-parallel rank that measured it (None for a single-process run).
        extra: further JSON-serialisable measurements a lab attaches (e.g. DDP's buckets,
            per-step collective wait), saved and reloaded with the result.
    """

    config: RunConfig
    phases: dict[str, Measurement]
    losses: tuple[float, ...]
    peak_memory: PeakMemory
    env: dict
    num_classes: int
    wall_s: float
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    path: str | None = None
    rank: int | None = None
    extra: dict = field(default_factory=dict)

    # -- derived numbers --------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.config.display_label()

    @property
    def step(self) -> Measurement:
        """Whole-step times (seconds), warm-up excluded."""
        return self.phases["step"]

    @property
    def samples_per_s(self) -> float:
        """Throughput of this process (or rank) = samples per optimizer step
        (``batch_size x accumulation_steps``) / median step time (samples/s)."""
        return self.config.samples_per_step / self.step.median

    @property
    def tokens_per_s(self) -> float | None:
        """A token model's throughput in tokens/s (samples/s x ``seq_len``, the unit
        language-model papers report); None for an image model."""
        if self.config.model not in TOKEN_MODELS:
            return None
        return self.samples_per_s * self.config.seq_len

    @property
    def samples_per_s_ci95(self) -> tuple[float, float]:
        """95 % CI of throughput (from the median step time's CI)."""
        return self.step.samples_per_s_ci95  # type: ignore[return-value]

    @property
    def peak_mem_gib(self) -> float:
        return self.peak_memory.peak_gib

    def phase_shares(self) -> dict[str, float]:
        """Each phase's share of the mean step time (fractions; with "other" they sum to 1).

        Means are used, not medians, because means add: mean(a + b) = mean(a) + mean(b).
        """
        total = self.step.mean
        return {p: self.phases[p].mean / total for p in (*PHASES, "other") if p in self.phases}

    @property
    def data_wait_share(self) -> float:
        """Fraction of the mean step spent waiting for the next batch."""
        return self.phase_shares()["data"]

    def phase_table(self) -> pd.DataFrame:
        """Per-phase median and mean (ms), IQR (ms), share of the step (%)."""
        import pandas as pd

        shares = self.phase_shares()
        rows = []
        for p in (*PHASES, "other", "step"):
            if p not in self.phases:
                continue
            m = self.phases[p]
            rows.append({"phase": p, "median_ms": m.median * 1e3, "mean_ms": m.mean * 1e3,
                         "iqr_ms": m.iqr * 1e3,
                         "share_pct": 100 * shares.get(p, 1.0)})
        return pd.DataFrame(rows).set_index("phase")

    def __repr__(self) -> str:
        lo, hi = self.samples_per_s_ci95
        shares = ", ".join(f"{p} {100 * s:.0f} %" for p, s in self.phase_shares().items())
        warn = "  (noisy: IQR > 10 % of median)" if self.step.noisy else ""
        return (f"RunResult {self.label!r} on {self.env.get('device')}: "
                f"step {self.step.median * 1e3:.1f} ms median, "
                f"{self.samples_per_s:,.1f} samples/s (95 % CI {lo:,.1f}-{hi:,.1f})"
                + (f", {self.tokens_per_s:,.0f} tokens/s" if self.tokens_per_s else "")
                + f"{warn}\n"
                f"  phases: {shares}\n"
                f"  peak memory {self.peak_mem_gib:.2f} GiB ({self.peak_memory.kind})")

    # -- persistence ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION, "config": self.config.to_dict(),
            "phases": {k: m.to_dict() for k, m in self.phases.items()},
            "losses": list(self.losses),
            "peak_memory": {"peak_bytes": self.peak_memory.peak_bytes,
                            "kind": self.peak_memory.kind},
            "env": self.env, "num_classes": self.num_classes, "wall_s": self.wall_s,
            "created": self.created, "rank": self.rank, "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict, path: str | None = None) -> "RunResult":
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"result schema {d.get('schema')!r} is not {SCHEMA_VERSION}; "
                             "re-run the experiment with this perflab version")
        return cls(config=RunConfig.from_dict(d["config"]),
                   phases={k: Measurement.from_dict(m) for k, m in d["phases"].items()},
                   losses=tuple(d["losses"]), peak_memory=PeakMemory(**d["peak_memory"]),
                   env=d["env"], num_classes=d["num_classes"], wall_s=d["wall_s"],
                   created=d["created"], path=path, rank=d.get("rank"),
                   extra=d.get("extra", {}))

    def save(self, results_dir: str | Path | None = None) -> "RunResult":
        """Write ``<results_dir>/<UTC time>-<label>.json`` atomically under a new name
        (``-2``, ``-3``, ... when taken: concurrent savers never overwrite each other);
        returns a copy with ``path`` set.

        Raises:
            perflab.core.storage.StorageError: the folder is not writable or the disk is full;
                nothing (not even an empty file) is left, and this result is still in
                memory: save it elsewhere with ``result.save("other/folder")``.
        """
        out = Path(results_dir) if results_dir else default_results_dir()
        stamp = self.created.replace(":", "").replace("-", "").split(".")[0]
        slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.label)[:60]
        if self.rank is not None:
            slug += f"-rank{self.rank}"
        data = self.to_dict()
        path = write_new_json(out, f"{stamp}-{slug}", data)
        return RunResult.from_dict(data, path=str(path))

    @classmethod
    def load(cls, path: str | Path) -> "RunResult":
        """Read a result saved by :meth:`save`.

        Raises:
            FileNotFoundError: no such file. ValueError: not a perflab result.
        """
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not valid JSON ({e}); is it a perflab result?") from e
        return cls.from_dict(d, path=str(p))
