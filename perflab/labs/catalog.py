"""The lab map: each lab's number, title, notebook and the question it answers, and the
run time of each lab as the last test run on this machine measured it.

``LABS`` is the one list of labs: ``labs/00_start_here.ipynb``, ``perflab labs``,
``perflab doctor`` and the README's lab table show it (a test keeps the README in step).
Run times come from ``lab_times.json`` in the results folder, which the pytest plugin
:mod:`perflab.course.nbval_times` rewrites after every nbval run of the solutions that
timed them alone (``make check-solutions``): nothing here is typed in.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.core.devices import resolve_device
from perflab.core.env import bf16_support
from perflab.core.paths import default_results_dir, source_checkout_root

__all__ = ["Lab", "LABS", "START_HERE", "lab_times_path", "read_lab_times", "lab_map",
           "lab_capabilities"]

#: Version of the ``lab_times.json`` layout (``{"format": 1, "notebooks": {...}}``).
LAB_TIMES_FORMAT = 1


@dataclass(frozen=True)
class Lab:
    """One notebook of the course.

    Attributes:
        number: two digits, the start of the notebook's file name ("01").
        title: as in the README's lab table.
        question: the question the lab answers, in one sentence.
        notebook: file name in ``labs/`` (student copy) and ``solutions/``.
    """

    number: str
    title: str
    question: str
    notebook: str


#: The landing page (no experiment of its own to speak of; listed apart from the labs).
START_HERE = Lab("00", "Start here", "What is this course, how do checks and grading "
                 "work, and how do I run a lab on a GPU?", "00_start_here.ipynb")

#: The labs, in order.
LABS: tuple[Lab, ...] = (
    Lab("01", "Profile ResNet-18", "Where does a training step's time go, how do you "
        "time it correctly, and why does a real GPU step sit idle?", "01_profile_resnet18.ipynb"),
    Lab("02", "Fix data loading", "Is the model starved by its input pipeline?",
        "02_fix_data_loading.ipynb"),
    Lab("03", "Mixed precision", "What do autocast and GradScaler buy, and what do they "
        "cost?", "03_mixed_precision.ipynb"),
    Lab("04", "Activation checkpointing", "Saved-activation memory vs recompute time",
        "04_activation_checkpointing.ipynb"),
    Lab("05", "torch.compile", "Graph breaks, recompiles, fused kernels: when does compiling pay?",
        "05_torch_compile.ipynb"),
    Lab("06", "DDP overlap", "Your own bucketed DDP: allreduce overlapped with backward; "
        "your all-reduce benchmark beside real NCCL tables and a real NCCL trace",
        "06_ddp_overlap.ipynb"),
    Lab("07", "Stragglers", "Name the slow rank while training, then rebalance it",
        "07_stragglers.ipynb"),
    Lab("08", "Capstone", "Make a naive ResNet-18 and GPT script fast yourself: an ablation "
        "with tests, analytic FLOPs, MFU/HFU, the roofline, the memory peak, HTA's breakdown "
        "beside real GPU traces", "08_capstone.ipynb"),
    Lab("09", "Sharding and scaling", "What ZeRO-1, your ZeRO-2, your FSDP written by hand and "
        "your FSDP2 configuration save per rank, what they move, and how throughput scales "
        "with ranks",
        "09_sharding_and_scaling.ipynb"),
    Lab("10", "Tensor and pipeline parallelism", "How do you split one model's layers "
        "(tensor and sequence parallel: an MLP, then a transformer block, with your own f/g, "
        "all-gather and reduce-scatter) or its stack (pipeline: GPipe and 1F1B by hand, "
        "torch's interleaved 1F1B) across ranks, and what does each cost in collectives, "
        "bytes, messages, activation memory and idle time?",
        "10_tensor_and_pipeline_parallelism.ipynb"),
    Lab("11", "Kernels", "Why does fusion pay, and how do online softmax and FlashAttention-2 "
        "(your own, in PyTorch tiles and in Triton) and ring attention compute attention "
        "without the T x T matrix?", "11_kernels.ipynb"),
    Lab("12", "Plan the cluster", "Which data, tensor and pipeline layout, micro-batch, ZeRO "
        "stage, sequence parallelism and recomputation should a model use on a GPU cluster, "
        "from memory and step-time models checked against published runs?",
        "12_plan_the_cluster.ipynb"),
)


def lab_times_path(results_dir: str | Path | None = None) -> Path:
    """``<results>/lab_times.json``; ``results_dir`` None ->
    :func:`perflab.core.paths.default_results_dir` (``$PERFLAB_RESULTS``, else ``results/``)."""
    if results_dir is None:
        results_dir = default_results_dir()
    return Path(results_dir) / "lab_times.json"


def read_lab_times(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Measured nbval run time per lab number: ``{"01": {"seconds": 95.2, "cells": 31,
    "failed_cells": 0, "notebook": "solutions/01_...", "measured_at": "2026-...Z",
    "preset": "quick", "machine": "..."}, ...}``; ``{}`` when nothing was measured yet.

    Args:
        path: the file; None -> :func:`lab_times_path`.

    Raises:
        ValueError: the file exists but is not a lab-times file (the message names it).
    """
    path = lab_times_path() if path is None else Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        notebooks = data["notebooks"]
        if data.get("format") != LAB_TIMES_FORMAT or not isinstance(notebooks, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{path} is not a lab-times file (format {LAB_TIMES_FORMAT}); "
                         "delete it and run `make check-solutions` to measure again") from None
    return notebooks


def lab_map(times: dict[str, dict[str, Any]] | None = None, *, start_here: bool = False):
    """The lab map as a DataFrame: one row per lab with ``lab``, ``title``, ``question``,
    ``notebook``, ``nbval_s`` (seconds, NaN when not measured), ``nbval_time`` (text:
    "95 s (quick)", "95 s (quick, 2 failed cells)" or "not measured yet"),
    ``measured_at``, ``preset`` and ``machine``.

    Args:
        times: :func:`read_lab_times`'s result; None reads the default file.
        start_here: also list ``00_start_here`` first.
    """
    import pandas as pd

    times = read_lab_times() if times is None else times
    rows = []
    for lab in ((START_HERE,) if start_here else ()) + LABS:
        t = times.get(lab.number) or {}
        seconds = t.get("seconds")
        notes = [x for x in (t.get("preset"), t.get("failed_cells") and
                             f"{t['failed_cells']} failed cells") if x]
        text = "not measured yet" if seconds is None else f"{seconds:.0f} s" + (
            f" ({', '.join(notes)})" if notes else "")
        rows.append({"lab": lab.number, "title": lab.title, "question": lab.question,
                     "notebook": lab.notebook,
                     "nbval_s": float("nan") if seconds is None else float(seconds),
                     "nbval_time": text, "measured_at": t.get("measured_at"),
                     "preset": t.get("preset"), "machine": t.get("machine")})
    return pd.DataFrame(rows)


def lab_capabilities(device: str = "auto", roofline: Any = None) -> list[dict[str, str]]:
    """One row per lab: whether it ships in this checkout and what this machine can show.

    Args:
        device: a ``RunConfig.device`` value.
        roofline: a measured :class:`perflab.analysis.roofline.Roofline` of ``device`` (what
            ``perflab doctor`` passes): Lab 03's row then says, from the measurement,
            whether bf16 is faster here, with :func:`bf16_support`'s flags as context.
            None: the row gives the flags only and concludes nothing about speed.

    Returns:
        dicts with keys ``lab``, ``status`` ("ready", or "no notebook here" in a wheel install without the checkout) and ``note``.
    """
    import shutil

    import torch.distributed as dist


    dev = resolve_device(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    bf16, why = bf16_support(dev)
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    notes = {
        "01": f"phase timing on {dev}" + (" with CUDA events" if dev.type == "cuda" else ""),
        "02": f"worker sweep 0..{cores} on {cores} core(s); device prefetch "
              + ("on a side CUDA stream" if dev.type == "cuda" else "is a pass-through here"),
        "03": (f"{roofline.explain('bf16')} (flags: {why})" if roofline is not None
               else f"bf16 speed not measured (flags: {why}; `perflab doctor` measures it)")
              + "; fp16 + GradScaler " + ("available" if dev.type == "cuda" else "needs CUDA"),
        "04": "peak memory from " + ("the CUDA allocator" if dev.type == "cuda"
                                     else "process RSS (CPU)"),
        "05": f"inductor C++ compiler: {cxx or 'missing (install g++)'}",
        "06": "backends: " + ", ".join(b for b, ok in (("gloo", dist.is_gloo_available()),
                                                          ("nccl", dist.is_nccl_available()
                                                           and dev.type == "cuda")) if ok),
        "07": f"simulated stragglers across {cores} core(s)",
        "08": "MFU against the peak of the run's dtype: " + (
            "the datasheet's" if dev.type == "cuda" else "this CPU's measured matmul rate"),
        "09": f"FSDP2 / ZeRO-1 on gloo; scaling to 4 ranks on {cores} core(s)"
              + (" (oversubscribed beyond that)" if cores < 4 else ""),
        "10": f"tensor, pipeline and 2-D parallelism on gloo; 4 ranks on {cores} core(s)"
              + (" (oversubscribed)" if cores < 4 else ""),
        "11": _kernels_note(dev, cores),
        "12": "the cluster is modelled from published figures; nothing is launched here",
    }
    root = source_checkout_root()
    rows = []
    for lab in LABS:
        ready = bool(root and (root / "labs" / lab.notebook).is_file())
        # a wheel install has the library but not the notebooks (they ship in the checkout)
        rows.append({"lab": f"{lab.number} {lab.title}",
                     "status": "ready" if ready else "no notebook here",
                     "note": notes[lab.number]})
    return rows


def _kernels_note(dev, cores: int) -> str:
    """Lab 11's row: whether Triton imports here, and where its kernels run."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        triton = "triton not installed (Linux only: pip install 'triton>=3.0'); the PyTorch parts run"
    elif dev.type == "cuda":
        triton = "Triton kernels compiled for this GPU"
    else:
        triton = "Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1: checks numerics, not speed)"
    return f"{triton}; ring attention on 2 and 4 gloo ranks on {cores} core(s)" + (
        " (oversubscribed at 4)" if cores < 4 else "")
