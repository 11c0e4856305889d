"""perflab: measured, hands-on labs for making PyTorch training fast.

This module is the small face a practitioner reaches for (``perflab.__all__``, grouped by
home below); everything else is imported from the subpackage that holds it, e.g.
``from perflab.analysis.amp import op_dtypes`` or ``from perflab.distributed import
launch_fn``. Names load lazily (PEP 562 ``__getattr__``), so ``import perflab`` imports no
torch, pandas, matplotlib or widgets until a name is used, and has no side effects: no
CUDA initialisation, no logging set-up, no global torch flags. ``docs/API.md`` lists every
public name of every subpackage (``python -m perflab.course.apidoc`` regenerates it).

The folders are the layers; each imports only the ones below it (``.importlinter``,
checked by ``tests/test_architecture.py``)::

    cli/ . course/        faces for the shell and the instructor
    ui/ . labs/           notebook panels; per-lab glue (independent of each other)
    ladder/               the optimization search and its report
    analysis/             one module per analysis
    experiment.py         the one place that decides one process vs ranks
    distributed/          launch, worker, DDP, the simulated link's hook
    train/                one training step; the labs' workloads
    data/ . viz/ . models.py    input pipeline; figures and plots; the models
    core/                 config, timing, measurement, memory, result, env, storage
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: module (under perflab) -> the public names this face re-exports from it (one home per
#: name; each module's own ``__all__`` lists the rest).
_PUBLIC: dict[str, list[str]] = {
    # configure, run and keep an experiment
    "core.config": ["RunConfig"],
    "experiment": ["run", "run_interleaved"],
    "core.result": ["RunResult"],
    "core.result_store": ["list_results", "load_results", "compare_results"],
    "core.simulated": ["SimulatedLink", "Straggler"],
    # time and measure your own code
    "core.timing": ["measure", "PhaseTimer"],
    "core.measurement": ["Measurement", "compare"],
    "core.memory": ["saved_activation_bytes"],
    "core.env": ["env_summary"],
    # the training step, its model and its input pipeline
    "train.step": ["train_step"],
    "models": ["build_model"],
    "data.dataset": ["ensure_dataset"],
    "data.loader": ["make_loader"],
    "data.prefetch": ["DevicePrefetcher"],
    # analyses: profiles and traces
    "analysis.profiling": ["profile"],
    "analysis.trace_analysis": ["temporal_breakdown", "comm_comp_overlap",
                                "idle_time_breakdown"],
    # analyses: FLOPs, memory, precision, compilation
    "analysis.flops": ["count_flops", "utilization"],
    "analysis.roofline": ["measure_roofline"],
    "analysis.memory_parts": ["memory_breakdown"],
    "analysis.max_batch": ["find_max_batch"],
    "analysis.amp": ["loss_parity"],
    "analysis.compilation": ["graph_breaks"],
    "analysis.loader_tuning": ["tune_loader"],
    # analyses: many ranks
    "analysis.collectives": ["fit_alpha_beta"],
    "analysis.overlap": ["overlap_metrics"],
    "analysis.stragglers": ["detect_stragglers"],
    "analysis.zero": ["zero_memory"],
    # the search and the notebook panel
    "ladder.search": ["climb"],
    "ui.widgets": ["experiment_panel"],
}

_HOME: dict[str, str] = {name: mod for mod, names in _PUBLIC.items() for name in names}

#: The subpackages (and top-level modules) a notebook or a practitioner may import from;
#: each one's ``__init__`` (or docstring) says what it is for.
PUBLIC_SUBMODULES = ("perflab.core", "perflab.data", "perflab.viz", "perflab.models",
                     "perflab.train", "perflab.distributed", "perflab.experiment",
                     "perflab.analysis", "perflab.ladder", "perflab.ui", "perflab.labs")

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """Import the public name's module on first use (PEP 562)."""
    if name in _HOME:
        value = getattr(importlib.import_module(f"perflab.{_HOME[name]}"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name == "distributed":
        return importlib.import_module("perflab.distributed")
    raise AttributeError(f"module 'perflab' has no attribute {name!r}; perflab.__all__ is "
                         "the practitioner's face, every other name is imported from its "
                         "subpackage (see docs/API.md)")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__", "PUBLIC_SUBMODULES", "distributed"])


#: Folders that hold faces (command line, course tooling), not library code.
_FACES = ("perflab.cli", "perflab.course", "perflab.__main__")


def _library_modules() -> list[str]:
    """Every library module under perflab (dotted names; faces and ``__main__`` left out),
    found on disk without importing any of them (pkgutil walks folders, not imports)."""
    import os
    import pkgutil

    found: list[str] = []

    def walk(path: str, prefix: str) -> None:
        for info in sorted(pkgutil.iter_modules([path]), key=lambda i: i.name):
            name = f"{prefix}.{info.name}"
            if name.startswith(_FACES) or info.name == "__main__":
                continue
            found.append(name)
            if info.ispkg:
                walk(os.path.join(path, info.name), name)

    for path in __path__:
        walk(path, "perflab")
    return found
