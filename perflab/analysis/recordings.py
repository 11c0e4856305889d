"""Recordings made on real GPU machines, shipped with the package: profiler traces and
nccl-tests tables.

Each recording is output copied verbatim from a public source; the source, its commit or
date, the hardware and the license of every file are in ``perflab/recordings/gpu/SOURCES.md``
and ``perflab/recordings/nccl/SOURCES.md``. Nothing here is simulated or edited.

* :func:`gpu_trace_names` / :func:`gpu_trace`: torch.profiler (Kineto) traces of GPU
  training steps, one folder per job holding ``rank-N.json.gz``, one file per rank (Meta's
  HolisticTraceAnalysis test traces, MIT). A folder is what
  :func:`perflab.analysis.trace.load_ranks` and every function of
  :mod:`perflab.analysis.trace_analysis` accept.
* :func:`nccl_table_names` / :func:`read_nccl_tests`: all-reduce sweeps printed by
  NVIDIA's nccl-tests (``all_reduce_perf``), parsed into one row per message size.

nccl-tests' columns (NVIDIA nccl-tests, doc/PERFORMANCE.md): ``time`` is the mean time of
one operation in microseconds; ``algbw = size / time`` (the algorithm bandwidth, GB/s with
1 GB = 1e9 bytes); ``busbw`` is algbw times a per-collective factor that makes it
comparable to the hardware's link bandwidth whatever the number of ranks n, ``2(n-1)/n``
for all-reduce (a ring moves ``2(n-1)/n`` of the buffer through each rank's link). That
holds when every hop is the same kind of link (the ranks of one node, on NVLink); on two
nodes NCCL keeps most hops inside the nodes and spreads what crosses the network over all
of a node's interfaces, so a multi-node table's busbw is not the network's bandwidth per
GPU (Lab 06, section 8). Each row is measured twice: out-of-place (separate send and
receive buffers) and in-place. With MPI, ``time`` is the mean over the ranks (nccl-tests'
``-a 1``, its default since mid-2021; older versions print rank 0's).
"""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pandas as pd

__all__ = ["gpu_trace_names", "gpu_trace", "nccl_table_names", "read_nccl_tests",
           "NCCL_TESTS_COLUMNS", "NCCL_TABLE_NRANKS"]

#: Columns of :func:`read_nccl_tests`, in order: message size (bytes) and element count,
#: data type and reduction as nccl-tests prints them, then time (microseconds), algbw and
#: busbw (GB/s, 1e9 bytes/s) out-of-place and ``*_inplace``.
NCCL_TESTS_COLUMNS = ("size_bytes", "count", "dtype", "redop", "time_us", "algbw_GBps",
                      "busbw_GBps", "time_us_inplace", "algbw_GBps_inplace",
                      "busbw_GBps_inplace")

#: Ranks of each shipped nccl-tests table, as its source states them
#: (``perflab/recordings/nccl/SOURCES.md``); :func:`read_nccl_tests` uses it when the
#: copied output has no ``# Rank ... device`` lines to count.
NCCL_TABLE_NRANKS = {
    "aws-p4d-2node-16gpu-efa": 16,
    "aws-p4de-2node-16gpu-efa": 16,
    "aws-p5-1node-8gpu": 8,
    "aws-p5-2node-16gpu-efa": 16,
}

# One result row: size count type redop [root] time algbw busbw #wrong time algbw busbw
# #wrong. ``root`` (-1 for all-reduce) appeared in nccl-tests 2.x; older versions print
# an ``error`` column (e.g. 2e-07) where newer ones print ``#wrong``. A launcher's tag
# may precede it: ``0: `` (srun --label) or ``[1,0]<stdout>:`` (mpirun --tag-output).
_TAG = r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:)?\s*"
_NUM = r"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_ROW = re.compile(_TAG + r"(\d+)\s+(\d+)\s+([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s+(?:-?\d+\s+)?"
                  + r"\s+".join([_NUM] * 3) + r"\s+\S+\s+" + r"\s+".join([_NUM] * 3)
                  + r"\s+\S+\s*$")
# ``#  Rank  3 Group  0 Pid 1234 on host device  3 [0x79] NVIDIA H100 80GB HBM3`` (older
# versions: no ``Group``); NCCL_DEBUG=INFO lines ``... rank 3 nranks 16 cudaDev 3 ...``.
_RANK_LINE = re.compile(_TAG + r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+"
                        r"\S+\s+device\s+\d+")
_NRANKS = re.compile(r"\bnranks\s+(\d+)\b")


def _folder(*parts: str) -> Path:
    return Path(str(files("perflab").joinpath("recordings", *parts)))


def gpu_trace_names() -> list[str]:
    """Names of the shipped GPU traces (folders of ``perflab/recordings/gpu/``), sorted.

    Returns:
        e.g. ``["single-gpu-resnet50", "two-rank-ddp"]``: the folders holding at least one
        ``rank-N.json.gz``. ``perflab/recordings/gpu/SOURCES.md`` describes each (GPU,
        ranks, what the step runs, origin and license).
    """
    root = _folder("gpu")
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and any(p.glob("rank-*.json.gz")))


def gpu_trace(name: str) -> Path:
    """The folder of one shipped GPU trace: ``rank-N.json.gz`` per rank.

    Pass it to :func:`perflab.analysis.trace.load_ranks` or to any function of
    :mod:`perflab.analysis.trace_analysis` (``temporal_breakdown(gpu_trace(name))``).

    Args:
        name: one of :func:`gpu_trace_names`.

    Returns:
        The folder's path (a ``pathlib.Path`` inside the installed package).

    Raises:
        ValueError: ``name`` is not a shipped trace; the message lists the shipped ones.
    """
    names = gpu_trace_names()
    if name not in names:
        raise ValueError(f"no shipped GPU trace {name!r}; shipped: {names} "
                         "(perflab/recordings/gpu/SOURCES.md describes each)")
    return _folder("gpu", name)


def nccl_table_names() -> list[str]:
    """Names of the shipped nccl-tests outputs (``perflab/recordings/nccl/<name>.txt``),
    sorted; ``perflab/recordings/nccl/SOURCES.md`` gives each one's source, hardware,
    command line and number of ranks."""
    return sorted(p.stem for p in _folder("nccl").glob("*.txt"))


def _nranks(text: str) -> int | None:
    ranks = {int(m.group(1)) for m in map(_RANK_LINE.match, text.splitlines()) if m}
    if ranks:
        return max(ranks) + 1
    counts = {int(n) for n in _NRANKS.findall(text)}
    return counts.pop() if len(counts) == 1 else None


def read_nccl_tests(text_or_name: str) -> pd.DataFrame:
    """Parse the output of an nccl-tests run (``all_reduce_perf`` and the other
    ``*_perf`` tests): one row per message size.

    Every line of the form ``size count type redop [root] time algbw busbw #wrong time
    algbw busbw #wrong`` is a row, whatever precedes it on the line (a launcher's
    ``0:`` or ``[1,0]<stdout>:`` tag); header lines (``#``), NCCL log lines and blank
    lines are skipped. Units are nccl-tests': time in microseconds, bandwidths in GB/s
    (1e9 bytes/s); ``algbw = size / time`` and, for all-reduce, ``busbw = algbw *
    2(n-1)/n`` (NVIDIA nccl-tests, doc/PERFORMANCE.md).

    Args:
        text_or_name: a shipped table's name (:func:`nccl_table_names`), or the text the
            test printed (``Path("out.txt").read_text()``).

    Returns:
        DataFrame with :data:`NCCL_TESTS_COLUMNS`: ``size_bytes`` and ``count`` int64,
        ``dtype`` and ``redop`` str (``"float"``, ``"sum"``), the six times and
        bandwidths float64, rows in the order printed. ``attrs``: ``"nranks"`` (int, or
        None when unknown: the number of ``# Rank ... device`` lines, else a single
        ``nranks N`` of NCCL's log, else for a shipped table the count its source states
        in :data:`NCCL_TABLE_NRANKS`; ``nThread/nGpus`` in the header count one process's
        GPUs, not the ranks of an MPI run, so they are not used) and ``"source"``
        (``"perflab/recordings/nccl/<name>.txt"``, or ``"text"``).

    Raises:
        ValueError: one word (no spaces) that is not a shipped name (the message lists
            them), or text holding no nccl-tests result row.
    """
    names = nccl_table_names()
    if text_or_name in names:
        text = (_folder("nccl") / f"{text_or_name}.txt").read_text(encoding="utf-8")
        source = f"perflab/recordings/nccl/{text_or_name}.txt"
    elif re.fullmatch(r"[\w.+-]*", text_or_name.strip()):  # one word: meant as a name
        raise ValueError(f"no shipped nccl-tests table {text_or_name!r}; shipped: {names} "
                         "(or pass the text all_reduce_perf printed, not a file name)")
    else:
        text, source = text_or_name, "text"
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            g = m.groups()
            rows.append((int(g[0]), int(g[1]), g[2], g[3], *map(float, g[4:])))
    if not rows:
        raise ValueError("no nccl-tests result rows found: expected lines such as "
                         "'  1048576  262144  float  sum  -1  28.56  36.71  64.24  0  28.37"
                         "  36.96  64.68  0' (size count type redop root time algbw busbw "
                         "#wrong, out-of-place then in-place) as all_reduce_perf prints them")
    table = pd.DataFrame(rows, columns=list(NCCL_TESTS_COLUMNS))
    table = table.astype({"size_bytes": "int64", "count": "int64"})
    nranks = _nranks(text)
    if nranks is None and source != "text":
        nranks = NCCL_TABLE_NRANKS.get(text_or_name)
    table.attrs = {"nranks": nranks, "source": source}
    return table
