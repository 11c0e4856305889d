"""perflab: measured, hands-on labs for making PyTorch training fast.

The public API is this module and :mod:`perflab.distributed` (launching ranks). Every
name below is importable as ``from perflab import NAME``; it is loaded lazily (PEP 562
``__getattr__``), so ``import perflab`` imports no torch, pandas, matplotlib or widgets
until a name is used, and has no side effects: no CUDA initialisation, no logging
set-up, no global torch flags. ``docs/API.md`` lists every name with its one-line
docstring (``python -m perflab.apidoc`` regenerates it).

Layers (each imports only the ones below it; ``tests/test_architecture.py`` checks):

* faces: ``cli``, ``widgets``, ``panels``, ``rank_plots``, ``course`` (build, grading)
* analyses: ``trace``, ``overlap``, ``collectives``, ``stragglers``, ``flops``, ...
* training: ``step`` (one step for one process and every rank), ``train`` (``run``),
  ``distributed`` (ranks)
* core: ``config``, ``timing``, ``measurement``, ``memory``, ``result``, ``env``,
  ``models``, ``data``, ...
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: module (under perflab) -> the public names it defines. One home per name.
_PUBLIC: dict[str, list[str]] = {
    "config": ["CACHE_MODES", "COMM_HOOKS", "DEVICES", "MODELS", "PRESETS", "RunConfig", "resolve_device"],
    "measurement": ["Comparison", "Measurement", "NOISE_IQR_FRACTION", "compare", "compare_table"],
    "timing": ["Clock", "FakeClock", "PerfCounterClock", "PhaseTimer", "Stopwatch", "measure", "naive_time", "sync"],
    "result": ["PHASES", "RunResult", "default_results_dir", "source_checkout_root"],
    "spy": ["calls_to"],
    "storage": ["FileLock", "StorageError", "check_writable", "require_free_bytes", "write_atomic", "write_new_json"],
    "labs_index": ["LABS", "Lab", "START_HERE", "lab_map", "lab_times_path", "read_lab_times"],
    "env": ["EnvSummary", "bf16_support", "cpu_flags", "env_summary", "lab_capabilities"],
    "memory": ["GIB", "MIB", "ModelState", "PeakMemory", "SavedTensors", "SavedTensorsCounter", "model_state_bytes", "model_state_tensors", "read_peak", "reset_peak", "saved_activation_bytes", "tensor_peak_bytes"],
    "models": ["BasicBlock", "ResNet", "build_model", "resnet18", "tiny_cnn"],
    "dataset": ["CLASSES", "EMBEDDED_NAME", "SOURCES", "build_dataset", "dataset_fingerprint", "default_data_root", "ensure_dataset"],
    "data": ["EvalTransform", "IMAGENET_MEAN", "IMAGENET_STD", "IMAGE_EXTENSIONS", "ImageFolderDataset", "TrainTransform", "center_crop_resize", "infinite_batches", "make_loader", "normalize", "random_resized_crop", "to_tensor"],
    "cache": ["CachedBatches", "DecodedCache", "STORED_SCALE", "cache_dir", "cached_batches", "decode_stored", "get_cache", "stored_size"],
    "augment": ["crop_boxes", "fallback_crop_size", "random_resized_crop_batch", "resized_crop_batch"],
    "loading": ["BatchStream", "DevicePrefetcher", "Efficiency", "FirstBatch", "LOADER_FIELDS", "pipeline_efficiency", "time_first_batch"],
    "figures": ["InlineFigure", "PHASE_COLORS", "figure_to_png", "new_ax"],
    "link": ["BucketRecord", "COMPRESSIONS", "LINK_PRESETS", "LinkHookState", "LinkModel", "SimulatedLink", "link_hook", "register_link_hook", "ring_allreduce_wire_bytes"],
    "straggler": ["STRAGGLER_WHERE", "Straggler"],
    "step": ["AMP_DTYPES", "StragglerDelay", "build_model_and_optimizer", "build_training", "make_scaler", "OPTIMIZER_OPTIONS", "optimizer_options", "train_step"],
    "train": ["run", "run_interleaved"],
    "profiling": ["ProfileSummary", "TOP_OPS_COLUMNS", "cprofile_loader", "line_profile_dataset", "memory_profile_step", "profile", "quiet_native_stderr", "step_ranges"],
    "diagnosis": ["COMM_SHARE", "DATA_WAIT_SHARE", "Diagnosis", "HostSyncs", "MEMORY_FRACTION", "OPTIMIZER_SHARE", "SYNC_OPS", "count_host_syncs", "diagnose"],
    "amp": ["Parity", "loss_parity", "op_dtypes", "ops_kept_in_fp32", "plot_parity", "scaler_steps", "scaler_trace"],
    "checkpointing": ["SETTINGS", "STAGE_NAMES", "Segment", "TradeoffCurve", "checkpointed_stages", "chen_cost", "segment_plan", "sqrt_n_segments", "stage_table", "tradeoff_curve"],
    "max_batch": ["MaxBatch", "cpu_step_bytes", "find_max_batch", "search_max_batch"],
    "memory_parts": ["activation_formula_bytes", "memory_breakdown", "optimizer_state_multiplier"],
    "accumulation": ["AccumulationGap", "accumulated_gradients", "accumulation_gap", "full_batch_gradients"],
    "compilation": ["CompileCount", "CompileTiming", "GraphBreaks", "KernelSummary", "break_even_steps", "compile_overhead_s", "count_compiles", "describe_break_even", "generated_code", "graph_breaks", "kernel_summary", "op_time_share", "time_compile"],
    "compile_cache": ["CacheRun", "inductor_cache_dir", "run_in_fresh_process", "timing_from_runs"],
    "workloads": ["FakeAsyncDevice", "NUM_CLASSES", "TrainingParts", "pointwise_chain", "pointwise_inputs", "synthetic_batch", "tiny_training", "train_on_batches", "training_parts"],
    "overlap": ["IDEALS", "ideal_step_s", "last_bucket_s", "machine_bound_s", "overlap_efficiency", "overlap_metrics", "overlap_table", "plot_overlap", "run_ddp"],
    "ddp_check": ["GRAD_ATOL", "GRAD_RTOL", "bucket_recorder_hook", "compare_rank", "grads_of", "record_allreduces"],
    "ddp_measure": ["HOOKS", "WRAPPERS", "lab06_rank", "measure_rank", "wrapper_table"],
    "collectives": ["AlphaBetaFit", "SWEEP_SIZES_BYTES", "algbw_bytes_per_s", "allreduce_sweep", "busbw_bytes_per_s", "fit_alpha_beta", "link_hook_probe", "plot_alpha_beta", "recorded_allreduce_sweep"],
    "stragglers": ["DETECT_K", "DETECT_N", "DETECT_THRESHOLD", "StragglerVerdict", "ThroughputLoss", "detect_stragglers", "max_abs_zscore", "max_zscore_bound", "measured_throughput_loss", "predicted_slowdown", "predicted_throughput_loss", "ratio_to_median_with_self", "straggler_recording"],
    "straggler_run": ["ThreadCpuClock", "reference_gather", "straggler_rank"],
    "flops": ["FlopCount", "PEAK_TFLOPS", "PeakFlops", "Utilization", "count_flops", "dtype_of", "measure_peak_flops", "measured_peak", "mfu_pct", "peak_flops", "utilization"],
    "roofline": ["ACCELERATED_RATIO", "MatmulRoof", "ROOFLINE_DTYPES", "Roofline", "measure_bandwidth", "measure_matmul", "measure_roofline"],
    "zero": ["GB", "METHOD_STAGE", "ZERO_STAGES", "ZeroMemory", "zero_memory", "zero_table", "zero_vs_measured"],
    "sharding": ["COLLECTIVE_KINDS", "count_collectives", "local_nbytes", "state_bytes"],
    "sharding_run": ["SHARDING_METHODS", "mlp", "mlp_batches", "scaling_rank", "sharding_rank", "tasks_rank", "unsharded_adamw"],
    "sharding_scaling": ["SCALING_MODES", "core_label", "scaling_configs", "scaling_curve", "scaling_efficiency", "scaling_table"],
    "ladder_rungs": ["GROUPS", "INTERACTING", "ROUNDS", "RUNGS", "SIZES", "Variant", "applied", "checkpointed_batch_size", "make_variant", "naive_config", "per_sample", "rung_config", "unavailable"],
    "ladder": ["climb", "resume_climb", "search_all", "validate_climb"],
    "ladder_report": ["Ladder", "Rung", "TABLE_COLUMNS"],
    "report_check": ["ReportNumber", "flatten_numbers", "report_numbers", "report_problems", "rungs_called_kept", "unmeasured_numbers"],
    "trace": ["EVENT_COLUMNS", "PHASE_COLUMNS", "PHASE_PREFIX", "RankTrace", "events_frame", "load_ranks", "load_trace", "phase_times"],
    "trace_analysis": ["IDLE_CATEGORIES", "IDLE_COLUMNS", "OVERLAP_COLUMNS", "TEMPORAL_COLUMNS", "comm_comp_overlap", "idle_time_breakdown", "phase_breakdown", "plot_breakdown", "temporal_breakdown"],
    "loader_tuning": ["LoaderSweep", "LoaderTuning", "default_worker_counts", "plot_sweep", "sweep_loader", "tune_loader"],
    "plots": ["plot_comparison", "plot_phases", "plot_throughput"],
    "results": ["RESULT_COLUMNS", "compare_results", "find_saved", "list_results", "load_results", "plot_results"],
    "rank_plots": ["plot_loss_vs_prediction", "plot_rank_timeline"],
    "panels": ["bucket_panel", "ladder_panel", "link_panel"],
    "sharding_panel": ["plot_scaling", "plot_state_bytes", "scaling_panel"],
    "widgets": ["ExperimentPanel", "experiment_panel"],
}

_HOME: dict[str, str] = {name: mod for mod, names in _PUBLIC.items() for name in names}

#: Documented public submodules (besides this module).
PUBLIC_SUBMODULES = ("perflab.distributed",)

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """Import the public name's module on first use (PEP 562)."""
    if name in _HOME:
        value = getattr(importlib.import_module(f"perflab.{_HOME[name]}"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name == "distributed":
        return importlib.import_module("perflab.distributed")
    raise AttributeError(f"module 'perflab' has no attribute {name!r}; the public names "
                         "are perflab.__all__ (see docs/API.md)")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__", "PUBLIC_SUBMODULES", "distributed"])
