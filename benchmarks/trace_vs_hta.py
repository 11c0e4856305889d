"""Is perflab.analysis.trace's analysis at least as fast as HolisticTraceAnalysis on the same files?

Times, per trace folder and in interleaved rounds (so drift on a shared machine hits both
sides alike), the whole job a user runs: read every rank's trace, then the temporal
breakdown, the communication/computation overlap and the idle-time breakdown of every
rank. perflab: ``load_ranks`` + ``temporal_breakdown`` + ``comm_comp_overlap`` +
``idle_time_breakdown``; HTA: ``TraceAnalysis(trace_dir=...)`` +
``get_temporal_breakdown`` + ``get_comm_comp_overlap`` + ``get_idle_time_breakdown``
(all ranks). Prints both medians and the ratio HTA / perflab (target >= 1: perflab is
not slower), and checks on the way that both give the same temporal breakdown.

HTA (PyPI ``traceinsight``) is optional and is not a perflab dependency (it pulls in
JupyterLab and plotly). Install it in a separate venv and point this script at the
folder that holds its ``hta`` package, e.g.::

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install traceinsight==0.6.1 \\
        pandas plotly pydot psutil networkx
    python benchmarks/trace_vs_hta.py \\
        --hta-site /tmp/hta-venv/lib/python3.11/site-packages

Without HTA it prints perflab's times alone and says so.

Usage: python benchmarks/trace_vs_hta.py [FOLDER ...] [--rounds 5] [--hta-site DIR]
(default folders: ../shared/fixtures/gpu-traces/*, HTA's own test traces)
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings
from pathlib import Path

from perflab.core.timing import Stopwatch
from perflab.analysis.trace import load_ranks
from perflab.analysis.trace_analysis import (
    comm_comp_overlap, idle_time_breakdown, temporal_breakdown,
)

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared/fixtures/gpu-traces"


def run_perflab(folder: Path):
    ranks = load_ranks(folder)
    out = temporal_breakdown(ranks)
    comm_comp_overlap(ranks)
    idle_time_breakdown(ranks, by_stream=True)
    return out


def run_hta(folder: Path):
    from hta.trace_analysis import TraceAnalysis
    with warnings.catch_warnings():  # HTA divides 0/0 on traces without NCCL kernels
        warnings.simplefilter("ignore", RuntimeWarning)
        a = TraceAnalysis(trace_dir=str(folder))
        out = a.get_temporal_breakdown(visualize=False)
        a.get_comm_comp_overlap(visualize=False)
        a.get_idle_time_breakdown(ranks=a.t.get_ranks(), visualize=False)
    return out


def timed(fn, folder: Path) -> tuple[float, object]:
    with Stopwatch() as sw:
        result = fn(folder)
    return sw.elapsed_s, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path,
                    help="folders of per-rank traces (default: the shared GPU fixtures)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hta-site", type=Path, default=None,
                    help="a site-packages folder holding HTA's 'hta' package")
    args = ap.parse_args()
    folders = args.folders or sorted(p for p in FIXTURES.glob("*") if p.is_dir())
    if not folders:
        sys.exit(f"no trace folders given and none found in {FIXTURES}")
    if args.hta_site is not None:
        sys.path.append(str(args.hta_site))  # after our own packages: ours win
    try:
        import hta  # noqa: F401
        have_hta = True
        logging.getLogger("hta").setLevel(logging.ERROR)
    except ImportError as e:
        have_hta = False
        print(f"HTA not importable ({e}); timing perflab alone. Install traceinsight in "
              "a separate venv and pass --hta-site (see this script's docstring).")
    for folder in folders:
        t_ours, t_hta = [], []
        for _ in range(args.rounds):
            s, mine = timed(run_perflab, folder)
            t_ours.append(s)
            if have_hta:
                s, theirs = timed(run_hta, folder)
                t_hta.append(s)
        a = statistics.median(t_ours)
        line = f"{folder.name}: perflab {a * 1e3:8.1f} ms"
        if have_hta:
            b = statistics.median(t_hta)
            same = all(abs(mine.loc[r, "span_us"] - theirs.set_index("rank").loc[
                r, "kernel_time(us)"]) < 1e-6 for r in mine.index)
            line += (f" | HTA {b * 1e3:8.1f} ms | HTA / perflab = {b / a:5.2f}x "
                     f"(target >= 1) | same spans: {same}")
        print(line + f"  (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
