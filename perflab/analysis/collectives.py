"""Timing allreduce: the per-step "comm" phase, message-size sweeps and the alpha-beta fit.

* :func:`timed_allreduce_buckets`: one step's gradient buckets allreduced in order,
  alone (the "comm" phase of a DDP run), through the simulated link when one is given.
* :func:`allreduce_sweep`: allreduce time per message size on ``world_size`` ranks
  (1 KB .. 64 MB, repeats, median), on the real backend or the simulated link.
* :func:`fit_alpha_beta`: least-squares fit of ``T(n) = alpha + n / beta`` with R^2;
  :func:`plot_alpha_beta`: predicted vs measured, log-log.
* :func:`algbw_bytes_per_s`, :func:`busbw_bytes_per_s`: algorithm and bus bandwidth as
  nccl-tests defines them (NVIDIA nccl-tests, doc/PERFORMANCE.md): ``algbw = S / t``,
  ``busbw = algbw * 2(p-1)/p`` for allreduce.

Message size ``n`` is the allreduced tensor's size on each rank (bytes), as nccl-tests'
``size``; the simulated link charges the ring's ``2(p-1)/p * n`` wire bytes and ``2(p-1)``
latency hops (see :class:`perflab.core.simulated.LinkModel`), so the fitted ``beta`` is an
algorithm bandwidth and ``busbw`` of it is the link's bandwidth, and the fitted ``alpha``
is one whole allreduce's latency at the sweep's p (``alpha_hop_s`` of it is the link's).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from perflab.distributed import launch_fn
from perflab.distributed.ddp import (check_compression, register_comm_hook,
                                     timed_allreduce_buckets)
from perflab.viz.figures import new_ax
from perflab.core.simulated import SimulatedLink, ring_allreduce_wire_bytes
from perflab.core.timing import PerfCounterClock

__all__ = ["allreduce_sweep", "sweep_on_rank", "fit_alpha_beta",
           "AlphaBetaFit", "algbw_bytes_per_s", "busbw_bytes_per_s", "plot_alpha_beta",
           "SWEEP_SIZES_BYTES", "link_hook_probe", "recorded_allreduce_sweep"]

#: 1 KiB, 4 KiB, ..., 64 MiB: the default message sizes of a sweep (powers of 4).
SWEEP_SIZES_BYTES = tuple(2 ** k for k in range(10, 27, 2))


def sweep_on_rank(sizes_bytes: Sequence[int], repeats: int, warmup: int,
                  links: Sequence[SimulatedLink | None]) -> list[list[list[float]]]:
    """Rank body of :func:`allreduce_sweep` (module level so spawned ranks import it).

    Returns ``times_s[link_index][size_index][repeat]``: seconds of one synchronised
    allreduce.
    """
    return [[[timed_allreduce_buckets([n], link=link) for _ in range(warmup + repeats)
              ][warmup:] for n in sizes_bytes] for link in links]


def allreduce_sweep(sizes_bytes: Sequence[int] = SWEEP_SIZES_BYTES, *, world_size: int = 2,
                    repeats: int = 5, warmup: int = 1,
                    link: SimulatedLink | None | Sequence[SimulatedLink | None] = None,
                    timeout_s: float = 300) -> pd.DataFrame:
    """Allreduce time per message size on ``world_size`` local ranks (one launch).

    Each repeat's time is the mean over ranks of their own times (nccl-tests' default,
    ``-a 1``: "report average iteration time"); the table holds the median over
    repeats, the min and max, and nccl-tests' bandwidths.

    Args:
        sizes_bytes: message sizes in bytes (fp32 tensors of n/4 elements), each >= 4.
        world_size: ranks (>= 2), one thread each.
        repeats: timed repeats per size (>= 1); warmup: untimed ones before (>= 0).
        link: the simulated link, None for the real backend (gloo on CPU), or a list of
            them: each is swept in turn in the same launch (one process start-up).
        timeout_s: launch timeout.

    Returns:
        DataFrame, one row per (link, size): ``link, size_bytes, time_s (median),
        time_min_s, time_max_s, algbw_GBps, busbw_GBps, world_size``; ``link`` is the
        link's ``describe()`` text or "real gloo loopback".

    Raises:
        ValueError: bad sizes / repeats / warmup / world_size / link (before any launch).
    """
    sizes = [int(n) for n in sizes_bytes]
    if not sizes or any(n < 4 for n in sizes):
        raise ValueError(f"sizes_bytes must be a non-empty list of sizes >= 4 bytes, "
                         f"got {sizes_bytes!r}")
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2 for an allreduce sweep, "
                         f"got {world_size!r}")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats!r}, {warmup!r}")
    links = list(link) if isinstance(link, (list, tuple)) else [link]
    if any(lk is not None and not isinstance(lk, SimulatedLink) for lk in links):
        raise ValueError(f"link must be None, a SimulatedLink or a list of them, got {link!r}")
    per_rank = launch_fn(sweep_on_rank, world_size, args=(sizes, repeats, warmup, links),
                         device="cpu", timeout_s=timeout_s)
    rows = []
    for j, lk in enumerate(links):
        for i, n in enumerate(sizes):
            mean = np.mean([per_rank[r][j][i] for r in range(world_size)], axis=0)  # (repeats,)
            t = float(np.median(mean))
            rows.append({"link": lk.describe() if lk else "real gloo loopback",
                         "size_bytes": n, "time_s": t, "time_min_s": float(mean.min()),
                         "time_max_s": float(mean.max()),
                         "algbw_GBps": algbw_bytes_per_s(n, t) / 1e9,
                         "busbw_GBps": busbw_bytes_per_s(n, t, world_size) / 1e9,
                         "world_size": world_size})
    return pd.DataFrame(rows)


def recorded_allreduce_sweep(name: str = "allreduce_sweep_gloo2.json"
                             ) -> tuple[pd.DataFrame, dict]:
    """A shipped allreduce sweep (``perflab/recordings/<name>``): fixed data a lab fits.

    Returns:
        ``(table, meta)``: the table has :func:`allreduce_sweep`'s columns (``link,
        size_bytes, time_s, time_min_s, time_max_s, world_size`` and both bandwidths);
        ``meta`` holds the rest of the file (``source``: the seeded script that made it,
        ``simulated_link``: that link's ``alpha_s`` and ``beta_bytes_per_s``, the machine).

    Raises:
        ValueError: no recording of that name (the message lists the shipped ones).
    """
    from perflab.core.storage import read_recording

    meta = read_recording(name, "allreduce_")
    table = pd.DataFrame(meta.pop("rows"))
    table["algbw_GBps"] = table.size_bytes / table.time_s / 1e9
    table["busbw_GBps"] = [busbw_bytes_per_s(n, t, int(w)) / 1e9 for n, t, w
                           in zip(table.size_bytes, table.time_s, table.world_size)]
    return table, meta


def algbw_bytes_per_s(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth = size / time (bytes/s); nccl-tests doc/PERFORMANCE.md.

    Raises:
        ValueError: ``time_s <= 0``.
    """
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0 seconds, got {time_s!r}")
    return size_bytes / time_s


def busbw_bytes_per_s(size_bytes: float, time_s: float, world_size: int) -> float:
    """Bus bandwidth of an allreduce = algbw * 2(p-1)/p (bytes/s); nccl-tests
    doc/PERFORMANCE.md: the per-rank link traffic of a ring, comparable to the hardware's
    peak whatever the rank count."""
    return algbw_bytes_per_s(ring_allreduce_wire_bytes(size_bytes, world_size), time_s)


class AlphaBetaFit:
    """Result of :func:`fit_alpha_beta`: ``T(n) = alpha_s + n / beta_bytes_per_s``.

    Attributes:
        alpha_s: fitted latency (seconds); beta_bytes_per_s: fitted (algorithm) bandwidth.
        r2: coefficient of determination of the fit on the measured times.
        world_size: ranks of the sweep (for :attr:`busbw_bytes_per_s`).
    """

    def __init__(self, alpha_s: float, beta_bytes_per_s: float, r2: float, world_size: int):
        self.alpha_s, self.beta_bytes_per_s = alpha_s, beta_bytes_per_s
        self.r2, self.world_size = r2, world_size

    @property
    def alpha_hop_s(self) -> float:
        """The fitted latency per ring hop, ``alpha_s / (2(p-1))`` (seconds): a ring
        allreduce on p ranks pays 2(p-1) latency hops (Patarasuk & Yuan 2009), so this is
        the link's alpha, the one that carries over to other rank counts. NaN for p = 1."""
        hops = 2 * (self.world_size - 1)
        return self.alpha_s / hops if hops else float("nan")

    @property
    def busbw_bytes_per_s(self) -> float:
        """The fitted bandwidth as nccl-tests' bus bandwidth (x 2(p-1)/p): the link's."""
        return ring_allreduce_wire_bytes(self.beta_bytes_per_s, self.world_size)

    def predict_s(self, size_bytes: np.ndarray | float) -> np.ndarray | float:
        """Modelled time (seconds) of a message of ``size_bytes``."""
        return self.alpha_s + np.asarray(size_bytes, dtype=float) / self.beta_bytes_per_s

    def __repr__(self) -> str:
        return (f"AlphaBetaFit(alpha={self.alpha_s * 1e6:.1f} us, beta="
                f"{self.beta_bytes_per_s / 1e9:.4g} GB/s, busbw="
                f"{self.busbw_bytes_per_s / 1e9:.4g} GB/s, R^2={self.r2:.4f})")


def fit_alpha_beta(size_bytes: Sequence[float], time_s: Sequence[float], *,
                   world_size: int = 2) -> AlphaBetaFit:
    """Least-squares fit of ``T(n) = alpha + n / beta`` (Hockney 1994) to a sweep.

    Solved with ``numpy.linalg.lstsq`` on ``[1, n] @ [alpha, 1/beta] = T``, each row
    divided by its T (relative errors): sweeps are log-spaced over 4-5 decades, and
    plain least squares would let the largest messages decide everything, leaving alpha
    (which only the small messages show) unconstrained. R^2 = 1 - SS_res / SS_tot of the
    unweighted times.

    Args:
        size_bytes: message sizes (bytes), at least 2 distinct, all >= 0.
        time_s: measured seconds per message (same length, all > 0).
        world_size: ranks of the sweep (kept for the bus-bandwidth conversion).

    Returns:
        :class:`AlphaBetaFit`.

    Raises:
        ValueError: lengths differ, fewer than 2 distinct sizes, a time <= 0, or a fitted
            bandwidth <= 0 (times do not grow with size: nothing to fit).
    """
    n = np.asarray(size_bytes, dtype=float)
    t = np.asarray(time_s, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError(f"size_bytes and time_s must be 1-D and the same length, got "
                         f"{n.shape} and {t.shape}")
    if len(np.unique(n)) < 2 or (n < 0).any():
        raise ValueError("size_bytes needs at least 2 distinct sizes >= 0 to fit a line")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("time_s must be finite and > 0 seconds")
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]  # (k, 2), rows scaled by 1/T
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_beta <= 0:
        raise ValueError("the fitted bandwidth is not positive: the times do not grow with "
                         "message size (sweep larger sizes, or more repeats)")
    pred = alpha + n * inv_beta
    r2 = 1.0 - float(((t - pred) ** 2).sum() / ((t - t.mean()) ** 2).sum())
    return AlphaBetaFit(float(alpha), float(1.0 / inv_beta), r2, world_size)


def plot_alpha_beta(sweep: pd.DataFrame, fit: AlphaBetaFit, ax=None, title: str | None = None):
    """Measured (points, min-max bars) vs the fitted alpha-beta line, log-log.

    ``sweep``: a table from :func:`allreduce_sweep`. The title names the link (its
    ``describe()`` text, or "real gloo loopback") and the fitted alpha, beta and R^2.
    Returns the matplotlib Figure.
    """
    ax = new_ax(ax, (6.0, 4.0))
    n = sweep["size_bytes"].to_numpy(float)
    t = sweep["time_s"].to_numpy(float)
    err = [t - sweep["time_min_s"].to_numpy(float), sweep["time_max_s"].to_numpy(float) - t]
    ax.errorbar(n, t * 1e3, yerr=np.array(err) * 1e3, fmt="o", label="measured (median)")
    grid = np.geomspace(n.min(), n.max(), 100)
    ax.plot(grid, fit.predict_s(grid) * 1e3, "-",
            label=f"fit: alpha={fit.alpha_s * 1e6:.0f} us, "
                  f"beta={fit.beta_bytes_per_s / 1e9:.3g} GB/s, R^2={fit.r2:.3f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title(title or f"{sweep['link'].iloc[0]}, {int(sweep['world_size'].iloc[0])} ranks",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure


def link_hook_probe(layer_sizes: Sequence[int], bucket_cap_mb: float,
                    link: SimulatedLink | None, compressions: Sequence[str] = ("none",),
                    steps: int = 3, with_baseline: bool = False) -> dict[str, dict]:
    """Rank body: a small MLP under DDP, once per compression; what each step sent and took.

    Module level so :func:`perflab.distributed.launch_fn` can start it (one launch, so
    one process start-up, for all variants). For each compression a fresh
    ``nn.Sequential(Linear(layer_sizes[0], layer_sizes[1]), ...)`` (same seed) is
    wrapped in DDP with :func:`perflab.distributed.ddp.register_comm_hook` (with ``link=None``,
    torch's own ``fp16_compress_hook``/``bf16_compress_hook``) and trained ``steps``
    SGD steps on this rank's random (8, layer_sizes[0]) batches. ``with_baseline`` adds
    a variant "baseline": plain DDP, no hook (to check the hook's averaging).

    Returns:
        ``{compression: {"records": [[(index, nbytes, start_s, done_s), ...] per step]
        (times relative to the step's start, seconds; empty without a link),
        "step_s": [forward+backward seconds per step], "param_sum": float}}``.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for compression in ([*compressions, "baseline"] if with_baseline else compressions):
        hooked = compression != "baseline"
        if hooked:
            check_compression(compression)
        torch.manual_seed(0)
        layers = [torch.nn.Linear(a, b) for a, b in zip(layer_sizes[:-1], layer_sizes[1:])]
        ddp = DistributedDataParallel(torch.nn.Sequential(*layers),
                                      bucket_cap_mb=bucket_cap_mb)
        state = register_comm_hook(ddp, compression, link) if hooked else None
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(dist.get_rank())
        clock = PerfCounterClock()
        records, step_s = [], []
        for _ in range(steps):
            x = torch.randn(8, layer_sizes[0], generator=gen)  # (B=8, features)
            if state is not None:
                state.reset()
            t0 = clock.now()
            ddp(x).square().mean().backward()
            step_s.append(clock.now() - t0)
            opt.step()
            opt.zero_grad()
            records.append([(r.index, r.nbytes, r.start_s - t0, r.done_s - t0)
                            for r in (state.records if state else [])])
        out[compression] = {
            "records": records, "step_s": step_s,
            "param_sum": float(sum(p.detach().double().sum() for p in ddp.parameters()))}
    return out
