"""``perflab plan``: memory per GPU and step time of 3-D parallel layouts of a transformer,
and the best layouts for a GPU count and a batch (:func:`perflab.analysis.planner.plan`).

Without layout flags every valid layout is searched; each layout flag given holds that
field (all of them: that one layout). Bad input is refused before any work, naming the
flag and the fix. ``--json`` prints the layouts, best first, as a JSON list.
"""
from __future__ import annotations

import argparse
import json

from perflab.analysis.planner import (
    GPU_PRESET_NAMES, RECOMPUTE_MODES, Assumptions, LayoutPlan, TransformerShape,
    gpu_preset, parameter_count, plan,
)

__all__ = ["add_parser", "cmd_plan", "TEXT_TOP", "JSON_TOP"]

#: Layouts the text output lists, and the ``--json`` list's length.
TEXT_TOP, JSON_TOP = 5, 20

_DESCRIPTION = (
    "Plan data x tensor x pipeline (x context) parallelism for a transformer: memory per GPU "
    "by part (parameters, gradients, optimizer states by ZeRO stage, activations after "
    "Korthikanti et al. 2022, pipeline in-flight micro-batches, communication buffers), "
    "whether it fits, and the step time by part (compute, memory-bound elementwise work, "
    "recomputation, exposed tensor-parallel, pipeline and data-parallel communication, "
    "bubble, optimizer), tokens/s, model TFLOP/s per GPU, MFU and HFU (Chowdhery et al. 2022 "
    "App. B: MFU never counts recomputation). Without layout flags it searches every valid "
    "layout and prints the best few with what limits each; each layout flag given holds "
    "that field. Assumes FlashAttention, tensor-parallel collectives not overlapped and the "
    "gradient reduction overlapped with backward. Formulas, GPU figures and their sources, "
    "and the validation against published runs: docs/PLANNER.md.")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``perflab plan --layers L --hidden H --heads A [--kv-heads K]
    [--ffn-hidden F] [--gated-ffn] --seq-len S --vocab V --gpu NAME --gpus N
    --global-batch B [--tp T --pp P --vpp V --cp C --micro-batch M --zero Z --sp
    --recompute none|selective|full] [--json]``."""
    p = subparsers.add_parser(
        "plan", help="plan a 3-D parallel layout: memory per GPU, step time, MFU; the best "
        "layouts for a GPU count and a batch", description=_DESCRIPTION)
    model = p.add_argument_group("the model")
    model.add_argument("--layers", type=int, required=True, help="transformer layers L")
    model.add_argument("--hidden", type=int, required=True, help="hidden size h")
    model.add_argument("--heads", type=int, required=True, help="attention (query) heads")
    model.add_argument("--kv-heads", type=int, default=None,
                       help="key/value heads (grouped-query attention; default: --heads)")
    model.add_argument("--ffn-hidden", type=int, default=None,
                       help="the MLP's inner size (default: 4 x --hidden)")
    model.add_argument("--gated-ffn", action="store_true",
                       help="a gated MLP (SwiGLU: three matrices instead of two)")
    model.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    model.add_argument("--vocab", type=int, required=True, help="vocabulary size")
    job = p.add_argument_group("the cluster and the batch")
    job.add_argument("--gpu", required=True, choices=GPU_PRESET_NAMES,
                     help="GPU preset (every figure's source: docs/PLANNER.md)")
    job.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    job.add_argument("--global-batch", type=int, required=True,
                     help="sequences per optimizer step")
    lay = p.add_argument_group("the layout (each flag given holds that field; the rest is "
                               "searched; dp = gpus / (tp x pp x cp))")
    lay.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    lay.add_argument("--pp", type=int, default=None, help="pipeline stages")
    lay.add_argument("--vpp", type=int, default=None,
                     help="virtual stages per pipeline rank (interleaved 1F1B when > 1)")
    lay.add_argument("--cp", type=int, default=None, help="context-parallel size")
    lay.add_argument("--micro-batch", type=int, default=None,
                     help="sequences per micro-batch")
    lay.add_argument("--zero", type=int, default=None, choices=(0, 1, 2, 3),
                     help="ZeRO stage over the data-parallel ranks")
    lay.add_argument("--sp", action="store_const", const=True, default=None,
                     help="sequence parallelism (with --tp > 1); without it both are tried")
    lay.add_argument("--recompute", default=None, choices=RECOMPUTE_MODES,
                     help="activation recomputation")
    p.add_argument("--json", action="store_true",
                   help=f"print the best {JSON_TOP} layouts as a JSON list, best first")
    p.set_defaults(fn=cmd_plan)


def _fixed(args: argparse.Namespace) -> dict:
    """The layout fields the command line gives (the rest is searched)."""
    return {name: getattr(args, name) for name in ("tp", "pp", "vpp", "cp", "micro_batch",
                                                   "zero", "sp", "recompute")
            if getattr(args, name) is not None}


def cmd_plan(args: argparse.Namespace) -> int:
    """Run ``perflab plan``; returns the exit status.

    Raises:
        ValueError: a bad model, GPU count, batch or layout flag (before any search).
    """
    model = TransformerShape(layers=args.layers, hidden=args.hidden, heads=args.heads,
                             kv_heads=args.kv_heads, ffn_hidden=args.ffn_hidden,
                             gated_ffn=args.gated_ffn, seq_len=args.seq_len, vocab=args.vocab)
    fixed = _fixed(args)
    gpu = gpu_preset(args.gpu)
    plans = plan(model, gpu, args.gpus, args.global_batch, fixed=fixed, top=JSON_TOP)
    if args.json:
        print(json.dumps([p.to_dict() for p in plans], indent=1))
        return 0
    print(_header(model, args, gpu))
    shown = plans[:TEXT_TOP]
    fitting = sum(p.fits for p in plans)
    if len(plans) > 1:
        if not shown[0].fits:
            print(f"no layout fits in {gpu.hbm_bytes / 2 ** 30:.0f} GiB; the smallest:")
        else:
            print(f"best {len(shown)} layouts{' that fit' if fitting >= len(shown) else ''}:")
        print(_table(shown))
        print()
    print(_breakdown(shown[0]))
    print("\nGPU figures (" + gpu.name + "):")
    for name, source in gpu.sources.items():
        print(f"  {name}: {source}")
    return 0


def _header(model: TransformerShape, args: argparse.Namespace, gpu) -> str:
    shape = (f"{model.layers} layers, hidden {model.hidden}, {model.heads} heads"
             + (f" ({model.kv_heads} kv)" if model.kv_heads != model.heads else "")
             + f", ffn {model.ffn_hidden}{' gated' if model.gated_ffn else ''}, "
               f"seq {model.seq_len}, vocab {model.vocab}")
    tokens = args.global_batch * model.seq_len
    return (f"model: {parameter_count(model) / 1e9:.2f} B parameters ({shape})\n"
            f"job: {args.gpus} x {gpu.name} ({gpu.gpus_per_node} per node, "
            f"{gpu.peak_flops / 1e12:g} TFLOP/s bf16 dense, {gpu.hbm_bytes / 2 ** 30:.0f} GiB), "
            f"global batch {args.global_batch} sequences = {tokens:,} tokens\n"
            f"assumed: matmul efficiency {gpu.matmul_efficiency:g} and "
            f"{gpu.elementwise_passes:g} elementwise HBM passes (fitted on published runs), "
            f"FlashAttention, TP collectives exposed, gradient reduction overlapped with "
            f"backward\n")


def _table(plans: list[LayoutPlan]) -> str:
    head = (f"{'#':>2}  {'layout':<50} {'fits':<4} {'GiB/GPU':>7} {'step s':>8} "
            f"{'tokens/s':>10} {'TFLOP/s':>7} {'MFU':>5} {'HFU':>5}  limited by")
    lines = [head]
    for i, p in enumerate(plans, 1):
        lines.append(f"{i:>2}  {p.layout.label():<50} {'yes' if p.fits else 'no':<4} "
                     f"{p.memory.total_bytes / 2 ** 30:>7.1f} {p.step_s:>8.3f} "
                     f"{p.tokens_per_s:>10.4g} {p.tflops_per_gpu:>7.1f} {p.mfu:>5.1%} "
                     f"{p.hfu:>5.1%}  {p.limited_by()}")
    return "\n".join(lines)


def _breakdown(p: LayoutPlan) -> str:
    mem = p.memory.gib()
    hbm = p.gpu.hbm_bytes / 2 ** 30
    parts = p.time.parts()
    step = parts.pop("step")
    lines = [f"layout: {p.layout.label()} ({p.layout.gpus} GPUs, {p.num_microbatches} "
             f"micro-batches per step)",
             f"memory per GPU, GiB ({p.memory.stage} pipeline stage, micro-batches in "
             f"flight: {p.memory.inflight:g}): "
             + ", ".join(f"{k} {v:.2f}" for k, v in mem.items() if k != "total")
             + f"; total {mem['total']:.2f} of {hbm:.0f} ({'fits' if p.fits else 'does NOT fit'})",
             "step time, s: " + ", ".join(f"{k} {v:.4g}" for k, v in parts.items() if v > 0)
             + f"; step {step:.4g}",
             f"throughput: {p.tokens_per_s:,.0f} tokens/s, {p.tflops_per_gpu:.1f} model "
             f"TFLOP/s per GPU, MFU {p.mfu:.1%}, HFU {p.hfu:.1%} (HFU adds recomputation)",
             f"limited by: {p.limited_by()}"]
    return "\n".join(lines)
