"""``perflab.core.result_store``: list, load, compare and re-plot the results already saved.

Every :func:`perflab.run` (and every round, sweep point, rank and ladder rung) writes a
``RunResult`` JSON under the results folder the moment it is measured; this module
reads them back, so a kernel restart or a closed terminal loses nothing::

    from perflab import list_results, load_results, compare_results
    from perflab.viz.plots import plot_results
    list_results()                                 # a table, newest last
    a, b = load_results(["results/...-a.json", "results/...-b.json"])
    compare_results([a, b])                        # step-time table with 95 % CIs
    plot_results([a, b])                           # the lab's before/after figure

The same from a shell (:mod:`perflab.cli.results`): ``perflab results`` (list),
``perflab results show FILE``, ``perflab results compare A B ...``,
``perflab results plot A B ... --out fig.png``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from perflab.core.config import RunConfig
    from perflab.core.result import RunResult

# torch, pandas and matplotlib are imported inside the functions that use them: the CLI
# (perflab.cli.results) imports this module to build its parser for every command,
# `perflab --version` included, and must start in well under a second.

__all__ = ["list_results", "load_results", "find_saved", "compare_results", "as_results",
           "RESULT_COLUMNS"]

#: Columns of :func:`list_results`.
RESULT_COLUMNS = ("created", "label", "rank", "device", "step_ms", "samples_per_s",
                  "peak_mem_gib", "path")


#: Folders and files under the results folder that hold other JSON (profiler traces,
#: panel records, ladder arguments, lab run times): never listed as results.
_NOT_RESULTS = ("traces", "panels", "ladder.json", "lab_times.json")


def _json_files(where: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """The result files named by ``where`` (folders are searched recursively)."""
    from perflab.core.paths import default_results_dir

    if where is None:
        where = [default_results_dir()]
    elif isinstance(where, (str, Path)):
        where = [where]
    files: list[Path] = []
    for item in where:
        p = Path(item).expanduser()
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.json") if not f.name.startswith(".")
                            and not set(f.relative_to(p).parts) & set(_NOT_RESULTS))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p} is neither a result file nor a folder; list the "
                                    "saved results with `perflab results`")
    return files


def _read(path: Path) -> "RunResult | str | None":
    """The result in ``path``; why it is not one when it looks like one (a RunResult's
    keys); None for other JSON (silently not a result)."""
    from perflab.core.result import RunResult

    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    if not (isinstance(d, dict) and "config" in d and "phases" in d):
        return None
    try:
        return RunResult.from_dict(d, path=str(path))
    except (ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"


def list_results(where: str | Path | Sequence[str | Path] | None = None) -> "pd.DataFrame":
    """A table of the saved results in ``where`` (folders searched recursively).

    Args:
        where: a folder, a file, or a list of them; None -> the results folder
            (:func:`perflab.core.paths.default_results_dir`).

    Returns:
        One row per result, oldest first, columns :data:`RESULT_COLUMNS` (step time in
        ms (median), throughput in samples/s, peak memory in GiB). Files that are not
        perflab results (other JSON, another schema) are left out and listed, with the
        reason, in ``table.attrs["skipped"]``.

    Raises:
        FileNotFoundError: a path in ``where`` does not exist.
    """
    import pandas as pd

    rows, skipped = [], {}
    for path in _json_files(where):
        r = _read(path)
        if r is None:
            continue
        if isinstance(r, str):
            skipped[str(path)] = r
            continue
        rows.append({"created": r.created, "label": r.label, "rank": r.rank,
                     "device": r.env.get("device"), "step_ms": r.step.median * 1e3,
                     "samples_per_s": r.samples_per_s, "peak_mem_gib": r.peak_mem_gib,
                     "path": str(path)})
    table = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    table = table.sort_values("created", kind="stable").reset_index(drop=True)
    table.attrs["skipped"] = skipped
    return table


def load_results(where: str | Path | Sequence[str | Path]) -> "list[RunResult]":
    """Load the results named by ``where`` (files, or folders searched recursively),
    in the order given (files within a folder: by name, i.e. by time).

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a file is not a perflab result (names the file and why).
    """
    out = []
    for path in _json_files(where):
        r = _read(path)
        if r is None or isinstance(r, str):
            if isinstance(where, (str, Path)) and Path(where).is_dir() and r is None:
                continue                              # other JSON in a folder: not asked for
            raise ValueError(f"{path} is not a perflab result ({r or 'other JSON'})")
        out.append(r)
    return out


def find_saved(config: "RunConfig", where: str | Path | None = None, *,
               device: str | None = None) -> "RunResult | None":
    """The newest saved single-process result of exactly ``config``, or None.

    Args:
        config: compared field by field (``RunConfig.to_dict``), label included.
        where: folder to search (non-recursive); None -> the results folder.
        device: only results measured on this device (``env["device"]``, e.g. "cpu");
            None -> ``str(config.resolved_device())``.
    """
    from perflab.core.paths import default_results_dir

    folder = Path(where) if where is not None else default_results_dir()
    if not folder.is_dir():
        return None
    want = config.to_dict()
    dev = device or str(config.resolved_device())
    for path in sorted(folder.glob("*.json"), reverse=True):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(d, dict) and d.get("config") == want and d.get("rank") is None
                and d.get("env", {}).get("device") == dev):
            r = _read(path)
            if r is not None and not isinstance(r, str):
                return r
    return None


def as_results(items: Sequence["RunResult | str | Path"]) -> "list[RunResult]":
    """RunResults as given, and the results saved at each path (a file or a folder).

    Raises:
        ValueError: nothing given, or nothing saved at the paths.
    """
    from perflab.core.result import RunResult

    out = []
    for it in items:
        out += [it] if isinstance(it, RunResult) else load_results(it)
    if not out:
        raise ValueError("no results given: pass RunResults or paths of saved results")
    return out


def compare_results(items: Sequence["RunResult | str | Path"], *,
                    baseline: int = 0) -> "pd.DataFrame":
    """:func:`~perflab.core.measurement.compare_table` of the step times of saved (or
    in-memory) results.

    Raises:
        ValueError: no results, or one with fewer than 2 measured steps.
    """
    from perflab.core.measurement import compare_table

    results = as_results(items)
    return compare_table([r.step.relabel(r.label) for r in results], baseline=baseline)
