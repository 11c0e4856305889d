"""Synthetic RunResults with fixed numbers, for tests that need no training."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from perflab.core.config import RunConfig
from perflab.core.measurement import Measurement
from perflab.core.memory import PeakMemory
from perflab.core.result import RunResult
from perflab.core.timing import PhaseTimer


def synthetic_result(config: RunConfig, phase_ms: dict[str, float], *, n: int = 8,
                     jitter: bool = True, peak_bytes: int = 10 ** 9,
                     peak_kind: str = "test", env: dict | None = None) -> RunResult:
    """A RunResult whose phases take ``phase_ms`` (ms) per step, each within +-2 %
    (a fixed, deterministic spread) when ``jitter``; step = the phases' sum."""
    spread = [1 + 0.01 * ((i * 7) % 5 - 2) if jitter else 1.0 for i in range(n)]
    times = {k: tuple(v * 1e-3 * j for j in spread) for k, v in phase_ms.items()}
    step = tuple(sum(t[i] for t in times.values()) for i in range(n))
    phases = {k: Measurement(label=k, times_s=t, samples_per_step=config.batch_size)
              for k, t in {**times, "step": step}.items()}
    return RunResult(config=config, phases=phases, losses=(2.3,) * n,
                     peak_memory=PeakMemory(peak_bytes, peak_kind),
                     env=env or {"device": "cpu", "device_name": "Test CPU"}, num_classes=10,
                     wall_s=1.0, created="2025-01-01T00:00:00+00:00")


def record_tiny_cpu_trace(path: Path, active: int) -> Path:
    """Record a real CPU-only Chrome trace of ``active`` PhaseTimer-annotated steps
    (data / forward / backward / optimizer) of a tiny MLP into ``path``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = PhaseTimer("cpu")
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=active, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))
                                ) as prof:
        for _ in range(2 + active):
            with timer.step():
                with timer.phase("data"):
                    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))  # (B, 16), (B,)
                with timer.phase("forward"):
                    loss = F.cross_entropy(model(x), y)
                with timer.phase("backward"):
                    loss.backward()
                with timer.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
            prof.step()
    return path
