"""Plan a 3-D parallel layout for training a transformer: memory per GPU and step time of
data x tensor x pipeline (x context) parallelism from formulas with their sources, and the
best layout for a model, a GPU count and a batch (``perflab plan`` is its command line).

What it models, per layout (one :class:`Layout`: tp, pp, vpp, cp, dp, micro-batch, ZeRO
stage, sequence parallelism, recomputation) of one :class:`TransformerShape` on one
:class:`GPUSpec`:

* **Memory per GPU** (:func:`memory_per_gpu`), the worse of the first and the last
  pipeline stage: parameters, gradients and Adam states in mixed precision (2 + 2 + 12
  bytes per parameter, divided by the data-parallel ranks by ZeRO stage 1, 2 or 3:
  Rajbhandari et al. 2020, "ZeRO", Sec. 5); activations per transformer layer from
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (Table 2: ``sbh(34 + 5as/h)``, split by tp and, with sequence parallelism, the
  LayerNorm/dropout part too; selective recomputation keeps ``34sbh/t``; full keeps the
  layer's input) times the micro-batches a stage holds in flight (1F1B: ``p`` on the first
  stage, PipeDream-Flush / Narayanan et al. 2021 Sec. 2.2; interleaved: ``p + (p-1)/v``,
  Korthikanti Sec. 4.2.3), the embedding/output/loss activations of Korthikanti Sec. 4.3,
  and communication buffers. ZeRO never divides activations; with FlashAttention
  (:class:`Assumptions`, the default) no s x s scores are kept.
* **Step time** (:func:`step_time`) on the slowest stage: compute = FLOPs / (peak x
  matmul efficiency); memory-bound elementwise work (passes over the stored activations
  at HBM bandwidth); recomputation (full: one more forward; selective: the attention
  core's forward); tensor-parallel communication per layer and micro-batch (2 all-reduces
  forward + 2 backward, or with sequence parallelism 2 all-gathers + 2 reduce-scatters
  each way: Korthikanti Sec. 4.2.2; full recomputation repeats the forward's); the
  pipeline bubble ``(p-1)/(v*m)`` of the pipelined time (Narayanan et al. 2021, Sec. 2.2.2)
  and the point-to-point sends; the data-parallel gradient reduction that backward does
  not hide; the optimizer step (HBM-bound). Collectives use the alpha-beta model with a
  ring's latency hops and nccl-tests' bus bandwidth (``T = hops * alpha + f * n /
  busbw``, f = 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter / all-gather), the
  bandwidth term hierarchical when a group spans nodes (:func:`collective_time_s`).
* **Throughput and utilisation** (:class:`LayoutPlan`): tokens/s, model TFLOP/s per GPU,
  MFU and HFU as Chowdhery et al. 2022 (PaLM) Appendix B define them: model FLOPs are the
  forward + backward of the model (Korthikanti Eq. 7, ``72BLsh^2(1 + s/6h + V/12hL)`` for
  a GPT), never recomputation; hardware FLOPs add what recomputation runs again (with
  full recomputation, Narayanan et al. 2021 Eq. 3, ``96BLsh^2(1 + s/6h + V/16hL)``).

GPU presets (:data:`GPU_PRESET_NAMES`, :func:`gpu_preset`) carry every figure with its
source: peak and HBM from NVIDIA's spec sheets; NVLink and inter-node latency and
bandwidth from the nccl-tests tables shipped in ``perflab/recordings/nccl/`` where one
applies (:func:`link_from_nccl_table`), from the spec sheets otherwise (the source says
which); the matmul efficiency and the elementwise passes fitted on named published runs
(:mod:`perflab.analysis.published_runs`, ``benchmarks/planner_validation.py``,
docs/PLANNER.md).

:func:`plan` searches every valid layout (or the ones a partly given layout allows) and
returns them best first; :func:`check_layout_fields` refuses bad input, naming the field
(and the ``perflab plan`` flag) and the fix, before any work.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Iterator, Literal

__all__ = [
    "TransformerShape", "Layout", "LinkSpec", "GPUSpec", "Assumptions", "GPU_PRESET_NAMES",
    "gpu_preset", "link_from_nccl_table", "RECOMPUTE_MODES", "LAYOUT_FIELDS",
    "layer_parameters", "parameter_count", "activation_bytes_per_layer",
    "inflight_microbatches", "bubble_fraction", "forward_flops_per_token",
    "model_flops_per_step", "hardware_flops_per_step", "narayanan_eq3_flops",
    "collective_time_s", "tp_collectives_per_layer", "stage_params_per_gpu", "comm_buffer_bytes",
    "MemoryBreakdown", "StepTimeBreakdown",
    "LayoutPlan", "memory_per_gpu", "step_time", "evaluate_layout", "check_layout_fields",
    "candidate_layouts", "plan",
]

#: Activation recomputation modes: ``"none"`` keeps every activation; ``"selective"``
#: recomputes the attention core (QK^T, softmax, dropout, attention over V: Korthikanti et
#: al. 2022 Sec. 5; also what FlashAttention stores); ``"full"`` keeps each layer's input
#: and reruns its forward in backward.
RECOMPUTE_MODES = ("none", "selective", "full")

#: The fields of a :class:`Layout` and the ``perflab plan`` flag that sets each (dp is
#: what the GPU count leaves: gpus / (tp * pp * cp)).
LAYOUT_FIELDS = {"tp": "--tp", "pp": "--pp", "vpp": "--vpp", "cp": "--cp", "dp": "--gpus",
                 "micro_batch": "--micro-batch", "zero": "--zero", "sp": "--sp",
                 "recompute": "--recompute"}

#: Bytes per parameter of mixed-precision Adam (ZeRO paper, Sec. 3.1: 2 for the bf16/fp16
#: parameters, 2 for their gradients, K = 12 for the fp32 master copy, momentum and
#: variance).
PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: Bytes an Adam step moves through HBM per parameter of its shard: reads fp32 master,
#: momentum, variance (12) and the bf16 gradient (2), writes the three fp32 states (12)
#: and the bf16 parameter (2).
OPTIMIZER_STEP_BYTES = 28
#: Bytes of one activation element (bf16/fp16) and of one dropout-mask element.
ACT_BYTES = 2
#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``), two in flight.
DP_BUCKET_BYTES = 25 * 2 ** 20


def _positive_int(name: str, value: object, flag: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        where = f" ({flag})" if flag else ""
        raise ValueError(f"{name}{where} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """A decoder-only transformer (GPT / Llama style), the planner's model.

    Attributes:
        layers: transformer layers L (``--layers``).
        hidden: hidden size h (``--hidden``); the head size is h / heads.
        heads: attention (query) heads a (``--heads``).
        seq_len: tokens per sequence s (``--seq-len``).
        vocab: vocabulary size V (``--vocab``); the output layer shares the embedding's
            weights (Megatron's GPT default), so V*h parameters are counted once.
        kv_heads: key/value heads (``--kv-heads``; grouped-query attention when fewer
            than ``heads``); default ``heads``.
        ffn_hidden: the MLP's inner size f (``--ffn-hidden``); default 4h.
        gated_ffn: a gated MLP (SwiGLU: three h x f matrices instead of two,
            ``--gated-ffn``).

    Parameters per layer are the matrices, their biases and two LayerNorms (12h^2 + 13h
    for a GPT: Narayanan et al. 2021 Sec. 5.1); the model adds the word embedding (V*h),
    learned position embeddings (s*h) and the final LayerNorm (2h).

    Raises:
        ValueError: a size that is not an int >= 1, hidden not divisible by heads, or
            heads not divisible by kv_heads (the message names the flag).
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    gated_ffn: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            _positive_int(name, getattr(self, name), "--" + name.replace("_", "-"))
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _positive_int("kv_heads", self.kv_heads, "--kv-heads")
        _positive_int("ffn_hidden", self.ffn_hidden, "--ffn-hidden")
        if not isinstance(self.gated_ffn, bool):
            raise ValueError(f"gated_ffn (--gated-ffn) must be a bool, got {self.gated_ffn!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden (--hidden) = {self.hidden} is not divisible by heads "
                             f"(--heads) = {self.heads}: the head size hidden/heads must be "
                             "an integer; choose heads that divide hidden")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads (--heads) = {self.heads} is not divisible by kv_heads "
                             f"(--kv-heads) = {self.kv_heads}: each key/value head serves a "
                             "whole group of query heads; choose kv_heads that divide heads")

    @property
    def head_dim(self) -> int:
        """h / a, the size of one attention head."""
        return self.hidden // self.heads


RecomputeMode = Literal["none", "selective", "full"]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout. GPUs = tp * pp * cp * dp; ranks are ordered tp fastest, then
    cp, dp, pp (Megatron-LM's order), so a tp group is consecutive GPUs of one node.

    Attributes:
        tp: tensor-parallel size (Megatron-LM, Shoeybi et al. 2019), ``--tp``.
        pp: pipeline stages, ``--pp``; vpp: virtual stages (model chunks) per pipeline
            rank, the interleaved 1F1B schedule (Narayanan et al. 2021 Sec. 2.2.2) when
            > 1, ``--vpp``.
        cp: context-parallel size (the sequence split over ranks, ring attention),
            ``--cp``.
        dp: data-parallel size (what the GPU count leaves).
        micro_batch: sequences per micro-batch b, ``--micro-batch``.
        zero: ZeRO stage over the dp x cp ranks: 0 none, 1 optimizer states, 2 + gradients,
            3 + parameters (Rajbhandari et al. 2020), ``--zero``.
        sp: sequence parallelism with tp (Korthikanti et al. 2022 Sec. 4.2.2), ``--sp``.
        recompute: one of :data:`RECOMPUTE_MODES`, ``--recompute``.

    Raises:
        ValueError: a size < 1, zero outside 0-3, an unknown recompute mode, sp without
            tp > 1, or vpp > 1 without pp > 1.
    """

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    dp: int = 1
    micro_batch: int = 1
    zero: int = 0
    sp: bool = False
    recompute: RecomputeMode = "none"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "cp", "dp", "micro_batch"):
            _positive_int(name, getattr(self, name), LAYOUT_FIELDS[name])
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero (--zero) must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute (--recompute) must be one of {RECOMPUTE_MODES}, got "
                             f"{self.recompute!r}")
        if not isinstance(self.sp, bool):
            raise ValueError(f"sp (--sp) must be a bool, got {self.sp!r}")
        if self.sp and self.tp == 1:
            raise ValueError("sp (--sp) needs tp > 1: sequence parallelism splits what tensor "
                             "parallelism leaves replicated; set --tp 2 or more, or drop --sp")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp (--vpp) = {self.vpp} needs pp > 1: virtual stages interleave "
                             "a pipeline; set --pp 2 or more, or --vpp 1")

    @property
    def gpus(self) -> int:
        """tp * pp * cp * dp."""
        return self.tp * self.pp * self.cp * self.dp

    def label(self) -> str:
        """A short name: ``"tp8 pp8 vpp2 dp4 mb1 zero1 sp recompute=selective"`` (cp and vpp
        only when > 1)."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"vpp{self.vpp}"] if self.vpp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"dp{self.dp}", f"mb{self.micro_batch}", f"zero{self.zero}"]
        parts += ["sp"] if self.sp else []
        return " ".join(parts + [f"recompute={self.recompute}"])


@dataclass(frozen=True)
class LinkSpec:
    """A link's alpha-beta figures: a collective on n ranks takes ``hops * alpha_s + f * n /
    busbw_bytes_per_s`` (a ring's 2(n-1) latency hops for an all-reduce, n-1 for a
    reduce-scatter or all-gather: Patarasuk & Yuan 2009, the convention of
    :class:`perflab.core.simulated.LinkModel`; nccl-tests' bus bandwidth and its factor f,
    doc/PERFORMANCE.md); a send takes ``alpha_s + bytes / busbw_bytes_per_s``.

    Attributes:
        alpha_s: latency of one ring hop (seconds).
        busbw_bytes_per_s: bus bandwidth per GPU (bytes/s); also a send's bandwidth.
        source: where both figures come from.
    """

    alpha_s: float
    busbw_bytes_per_s: float
    source: str


@dataclass(frozen=True)
class GPUSpec:
    """A GPU and the node it sits in, each figure with its source (:attr:`sources`).

    Attributes:
        name: the preset's name (``"a100-80gb"``).
        peak_flops: dense bf16 tensor-core peak, FLOP/s.
        hbm_bytes: HBM capacity (bytes); hbm_bytes_per_s: its bandwidth.
        gpus_per_node: GPUs on one NVLink/NVSwitch domain.
        nvlink: collectives inside a node; network: the inter-node part, per GPU.
        matmul_efficiency: the fraction of peak the model's FLOPs run at (fitted on
            published runs, :mod:`perflab.analysis.published_runs`).
        elementwise_passes: HBM passes over a layer's stored activations per forward
            (LayerNorm, GeLU, softmax, dropout, residual adds: memory-bound; fitted
            likewise).
        sources: figure name -> its source.
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    gpus_per_node: int
    nvlink: LinkSpec
    network: LinkSpec
    matmul_efficiency: float
    elementwise_passes: float
    sources: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True, kw_only=True)
class Assumptions:
    """What the software fuses and overlaps, and overrides of the preset's fitted figures
    (not flags of ``perflab plan``, which runs with these defaults).

    Attributes:
        matmul_efficiency: overrides the GPU preset's fitted value (a fraction, 0 < e <= 1).
        elementwise_passes: overrides the GPU preset's fitted value (>= 0).
        flash_attention: the attention core is fused (FlashAttention: Dao et al. 2022):
            its s x s scores never reach HBM, so they are neither stored (the 5as^2b of
            Korthikanti's formulas vanishes, whatever ``recompute`` is) nor streamed.
            Default True, as PyTorch's SDPA and Transformer Engine run; False gives
            Korthikanti et al.'s accounting (the 2021-22 runs), where
            recompute="selective" is what keeps no scores.
        tp_comm_overlap: tensor-parallel collectives overlapped with the layer's GEMMs
            (Megatron-LM ``--tp-comm-overlap``): only the part longer than the GEMMs is
            exposed. Default False: every TP collective is exposed (Megatron-LM 2021-22).
        dp_comm_overlap: the gradient reduction overlapped with the last micro-batch's
            backward (PyTorch DDP's buckets, Megatron-LM ``--overlap-grad-reduce``).
            Default True.

    Raises:
        ValueError: an efficiency outside (0, 1], or passes < 0.
    """

    matmul_efficiency: float | None = None
    elementwise_passes: float | None = None
    flash_attention: bool = True
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = True

    def __post_init__(self) -> None:
        e = self.matmul_efficiency
        if e is not None and not (isinstance(e, (int, float)) and 0 < e <= 1):
            raise ValueError(f"matmul_efficiency must be a fraction in (0, 1], got {e!r}")
        k = self.elementwise_passes
        if k is not None and not (isinstance(k, (int, float)) and k >= 0):
            raise ValueError(f"elementwise_passes must be a number >= 0, got {k!r}")


# --- GPU presets ------------------------------------------------------------------------

#: The GPU presets :func:`gpu_preset` builds (``perflab plan --gpu NAME``).
GPU_PRESET_NAMES = ("a100-80gb", "h100-sxm")

# The matmul efficiencies and elementwise passes, fitted by
# perflab.analysis.published_runs.fit_efficiency on its CALIBRATION_ROWS;
# benchmarks/planner_validation.py re-fits and prints them, and
# tests/analysis/test_planner.py checks these are the fit's minimum.
_FITTED = {"a100-80gb": (0.705, 2.618), "h100-sxm": (0.541, 4.638)}  # (matmul, elementwise)


def link_from_nccl_table(name: str) -> LinkSpec:
    """Alpha and bus bandwidth of a shipped nccl-tests all-reduce table
    (``perflab/recordings/nccl/<name>.txt``, :func:`perflab.analysis.recordings.read_nccl_tests`).

    Fits ``T(n) = alpha + n / algbw`` to every row (out-of-place time) with
    :func:`perflab.analysis.collectives.fit_alpha_beta` (rows weighted by 1/T: the sizes
    span 9 decades), then ``busbw = algbw * 2(n-1)/n`` (nccl-tests' all-reduce
    factor for n ranks) and the latency per ring hop ``alpha / (2(n-1))``.

    Args:
        name: a table of :func:`perflab.analysis.recordings.nccl_table_names`.

    Returns:
        :class:`LinkSpec`.

    Raises:
        ValueError: not a shipped table, or its rank count is unknown.
    """
    from perflab.analysis.collectives import fit_alpha_beta
    from perflab.analysis.recordings import read_nccl_tests

    table = read_nccl_tests(name)
    ranks = table.attrs["nranks"]
    if not ranks:
        raise ValueError(f"nccl-tests table {name!r} has no known rank count")
    fit = fit_alpha_beta(table["size_bytes"].to_numpy(float),
                         table["time_us"].to_numpy(float) * 1e-6, world_size=ranks)
    return LinkSpec(fit.alpha_hop_s, fit.busbw_bytes_per_s,
                    f"fit T = alpha + n/algbw (rows weighted 1/T) to nccl-tests all_reduce_perf "
                    f"perflab/recordings/nccl/{name}.txt ({ranks} ranks): alpha per ring hop = "
                    f"alpha / 2({ranks}-1), busbw = algbw * 2({ranks}-1)/{ranks}")


@functools.lru_cache(maxsize=None)
def gpu_preset(name: str) -> GPUSpec:
    """The GPU preset ``name`` (one of :data:`GPU_PRESET_NAMES`), every figure sourced.

    * ``a100-80gb``: NVIDIA A100 80GB SXM4 in a DGX A100 node (8 GPUs on NVSwitch, one
      200 Gb/s HDR InfiniBand HCA per GPU), the GPU and node of Narayanan et al. 2021 and
      Korthikanti et al. 2022 (NVIDIA's Selene).
    * ``h100-sxm``: NVIDIA H100 SXM5 80GB in an 8-GPU NVSwitch node with 400 Gb/s of
      network per GPU (DGX H100; AWS p5.48xlarge), the GPU of Megatron-LM's H100 table.

    Returns:
        :class:`GPUSpec` (cached: built once per process; the NVLink and inter-node
        figures are fitted to the shipped nccl-tests tables on first use).

    Raises:
        ValueError: an unknown name (the message lists the presets).
    """
    if name not in GPU_PRESET_NAMES:
        raise ValueError(f"unknown GPU preset {name!r} (--gpu); presets: "
                         f"{', '.join(GPU_PRESET_NAMES)}")
    h100_nvlink = link_from_nccl_table("aws-p5-1node-8gpu")
    if name == "h100-sxm":
        net = link_from_nccl_table("aws-p5-2node-16gpu-efa")
        sources = {
            "peak_flops": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 Tensor Core "
                          "1,979 TFLOPS with sparsity, so 989.5 dense",
            "hbm": "same datasheet: H100 SXM 80GB HBM3, 3.35 TB/s",
            "gpus_per_node": "DGX H100 / AWS p5.48xlarge: 8 H100 SXM on NVSwitch",
            "nvlink": h100_nvlink.source,
            "network": "alpha: " + net.source + "; busbw: 400 Gb/s per GPU (DGX H100: 8 "
                       "ConnectX-7 400 Gb/s; AWS p5.48xlarge: 3,200 Gbps EFA per 8 GPUs). The "
                       "2-node table's large messages run at its 1-node busbw (NVLink-bound), "
                       "so it does not show the network's bandwidth",
            "matmul_efficiency": "fitted with elementwise_passes on three rows of the "
                                 "Megatron-LM README's H100 table "
                                 "(perflab.analysis.published_runs.CALIBRATION_ROWS; "
                                 "docs/PLANNER.md)",
            "elementwise_passes": "fitted with matmul_efficiency, as above",
        }
        return GPUSpec(
            name=name, peak_flops=989.5e12, hbm_bytes=80 * 2 ** 30, hbm_bytes_per_s=3.35e12,
            gpus_per_node=8, nvlink=h100_nvlink,
            network=LinkSpec(net.alpha_s, 400e9 / 8, "alpha from " + net.source
                             + "; busbw 400 Gb/s per GPU (spec)"),
            matmul_efficiency=_FITTED[name][0], elementwise_passes=_FITTED[name][1],
            sources=sources)
    net = link_from_nccl_table("aws-p4de-2node-16gpu-efa")
    # No shipped table covers one A100 node: its NVLink bandwidth is the spec's 300 GB/s
    # per direction scaled by the fraction of the H100 spec (450 GB/s per direction) that
    # the H100 table reaches; its latency is the H100 table's (same NCCL over NVSwitch).
    scale = h100_nvlink.busbw_bytes_per_s / 450e9
    nvlink = LinkSpec(h100_nvlink.alpha_s, 300e9 * scale,
                      f"spec 300 GB/s per direction (A100 datasheet: NVLink 600 GB/s "
                      f"bidirectional) x {scale:.3f}, the fraction of the H100 spec (450 GB/s "
                      f"per direction) reached in aws-p5-1node-8gpu; alpha from that H100 table "
                      f"(no one-node A100 table is shipped)")
    sources = {
        "peak_flops": "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS "
                      "(dense; 624 with sparsity)",
        "hbm": "same datasheet: A100 80GB SXM, HBM2e, 2,039 GB/s",
        "gpus_per_node": "DGX A100: 8 A100 SXM4 on NVSwitch (Korthikanti et al. 2022 Sec. 6: "
                         "Selene nodes of 8 A100 80GB)",
        "nvlink": nvlink.source,
        "network": "alpha: " + net.source + " (2 x AWS p4de.24xlarge, A100 80GB over EFA; "
                   "Selene's InfiniBand may be faster); busbw: 200 Gb/s per GPU (DGX A100: "
                   "8 HDR 200 Gb/s HCAs; Korthikanti et al. 2022 Sec. 6: eight 200 Gbps HDR "
                   "InfiniBand HCAs per Selene node). The p4de table's network is 400 Gbps "
                   "per 8 GPUs, not a DGX A100's, so its bandwidth is not used",
        "matmul_efficiency": "fitted with elementwise_passes on three rows of Narayanan et "
                             "al. 2021 Table 1 "
                             "(perflab.analysis.published_runs.CALIBRATION_ROWS; "
                             "docs/PLANNER.md)",
        "elementwise_passes": "fitted with matmul_efficiency, as above",
    }
    return GPUSpec(
        name=name, peak_flops=312e12, hbm_bytes=80 * 2 ** 30, hbm_bytes_per_s=2.039e12,
        gpus_per_node=8, nvlink=nvlink,
        network=LinkSpec(net.alpha_s, 200e9 / 8, "alpha from " + net.source
                         + "; busbw 200 Gb/s per GPU (DGX A100 spec)"),
        matmul_efficiency=_FITTED[name][0], elementwise_passes=_FITTED[name][1],
        sources=sources)


# --- model: parameters, FLOPs, activations ----------------------------------------------

def layer_parameters(model: TransformerShape) -> int:
    """Parameters of one transformer layer: Q and output projections (2h^2), K and V
    (2h * kv_heads * head_dim), the MLP (2hf, or 3hf gated), their biases and two
    LayerNorms (weight + bias). A GPT (kv = heads, f = 4h): 12h^2 + 13h (Narayanan et al.
    2021 Sec. 5.1)."""
    h, f = model.hidden, model.ffn_hidden
    kv = model.kv_heads * model.head_dim
    attention = 2 * h * h + 2 * h * kv + (h + 2 * kv) + h   # q, o; k, v; qkv bias; o bias
    mlp = (3 if model.gated_ffn else 2) * h * f + (2 if model.gated_ffn else 1) * f + h
    return attention + mlp + 4 * h


def parameter_count(model: TransformerShape) -> int:
    """All parameters: L layers, the word embedding (V*h, shared with the output layer),
    learned position embeddings (s*h) and the final LayerNorm (2h). A GPT: 12Lh^2(1 +
    13/12h + (V + s)/12Lh) + 2h (Narayanan et al. 2021 Sec. 5.1, plus the final norm)."""
    h = model.hidden
    return model.layers * layer_parameters(model) + (model.vocab + model.seq_len) * h + 2 * h


def forward_flops_per_token(model: TransformerShape) -> tuple[float, float]:
    """Forward FLOPs per token (a multiply-add = 2): ``(per transformer layer, of the
    logits layer)``. Per layer: QKV 2h(h + 2*kv*d), attention scores and attention over
    values 4sh (the full s x s, as Narayanan et al. 2021 and Megatron-LM count it), output
    projection 2h^2, MLP 4hf (6hf gated); a GPT: 24h^2 + 4sh. Logits: 2hV (Korthikanti et
    al. 2022 App. A)."""
    h, s, f = model.hidden, model.seq_len, model.ffn_hidden
    kv = model.kv_heads * model.head_dim
    layer = 2 * h * (h + 2 * kv) + 4 * s * h + 2 * h * h + 2 * h * f * (3 if model.gated_ffn else 2)
    return float(layer), float(2 * h * model.vocab)


# The search evaluates thousands of layouts of one shape: memoised per shape.
_layer_params = functools.lru_cache(maxsize=64)(layer_parameters)
_flops_per_token = functools.lru_cache(maxsize=64)(forward_flops_per_token)


def _attention_core_flops_per_token(model: TransformerShape) -> float:
    """Forward FLOPs per token of QK^T and attention over V (what selective recomputation
    reruns): 4sh."""
    return 4.0 * model.seq_len * model.hidden


def model_flops_per_step(model: TransformerShape, global_batch: int) -> float:
    """Model FLOPs of one step of ``global_batch`` sequences: forward + backward (3x the
    forward), never recomputation (Chowdhery et al. 2022 App. B). A GPT: Korthikanti et al.
    2022 Eq. 7, ``72BLsh^2(1 + s/6h + V/12hL)``."""
    layer, logits = forward_flops_per_token(model)
    return 3.0 * global_batch * model.seq_len * (model.layers * layer + logits)


def hardware_flops_per_step(model: TransformerShape, global_batch: int,
                            recompute: RecomputeMode) -> float:
    """Hardware FLOPs of one step: model FLOPs plus what recomputation runs again (full: one
    more forward of every layer, not of the logits: Narayanan et al. 2021 Eq. 3; selective:
    the attention core's forward, 4Bs^2h per layer).

    Raises:
        ValueError: an unknown recompute mode.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    tokens = global_batch * model.seq_len
    layer, _ = forward_flops_per_token(model)
    extra = {"none": 0.0, "selective": _attention_core_flops_per_token(model),
             "full": layer}[recompute]
    return model_flops_per_step(model, global_batch) + tokens * model.layers * extra


def narayanan_eq3_flops(model: TransformerShape, global_batch: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs of one step of a GPT with full recomputation,
    ``96 B s l h^2 (1 + s/6h + V/16lh)`` (assumes kv_heads = heads and f = 4h; for other
    shapes use :func:`hardware_flops_per_step`)."""
    b, s, l, h, v = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def activation_bytes_per_layer(model: TransformerShape, micro_batch: int, *, tp: int = 1,
                               sp: bool = False, recompute: RecomputeMode = "none",
                               cp: int = 1, flash_attention: bool = False) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch, on one
    GPU (Korthikanti et al. 2022 Sec. 4 and Table 2; 2-byte activations, 1-byte dropout
    masks; s is the GPU's share s/cp).

    For a GPT (kv = heads, f = 4h): ``sbh(34 + 5as/h)`` alone; with tp,
    ``sbh(10 + 24/t + 5as/(ht))`` (the 10sbh of LayerNorms, their outputs and the dropout
    masks stay replicated); with tp and sp, ``sbh/t (34 + 5as/h)``; selective recomputation
    drops the ``5as^2b`` attention core: ``sbh(10 + 24/t)``, or ``34sbh/t`` with sp; full
    recomputation keeps the layer's input, ``2sbh`` (``2sbh/t`` with sp, whose input is
    already split over the sequence). Other shapes: Q is 2sbh, K and V 2sbh*kv/a each,
    the MLP's inner activations 4sbf (6sbf gated).

    Args:
        model: the shape; micro_batch: b (sequences).
        tp, sp, recompute, cp: the layout's.
        flash_attention: no s x s scores are kept whatever ``recompute`` is (the
            ``5as^2b`` term is 0, as with selective recomputation).

    Returns:
        Bytes (float).
    """
    s = model.seq_len / cp
    b, h, a = micro_batch, model.hidden, model.heads
    sbh = s * b * h
    split = sbh / tp if sp else sbh
    if recompute == "full":
        return 2 * split
    replicated = 10 * split                       # 2 LN inputs, QKV and fc1 inputs, 2 masks
    kv_frac = model.kv_heads / a
    mlp = (6 if model.gated_ffn else 4) * s * b * model.ffn_hidden
    tp_split = (2 * sbh + 4 * sbh * kv_frac + 2 * sbh + mlp) / tp   # Q, K+V, proj in, MLP
    core = 0.0 if recompute == "selective" or flash_attention else _core_bytes(model, b, tp, cp)
    return replicated + tp_split + core


def _core_bytes(model: TransformerShape, micro_batch: int, tp: int, cp: int) -> float:
    """The attention core's stored bytes, 5as^2b/t (scores, softmax output, its dropout mask
    and output: Korthikanti et al. 2022 Sec. 4.1), s^2 as (s/cp) x s with context
    parallelism."""
    return 5 * model.heads * (model.seq_len / cp) * model.seq_len * micro_batch / tp


def inflight_microbatches(pp: int, vpp: int, num_microbatches: int, stage: int = 0) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak, in units of the
    stage's whole share of layers (L/p).

    1F1B (vpp = 1, PipeDream-Flush: Narayanan et al. 2021 Sec. 2.2.1): stage i holds
    ``min(p - i, m)``: the first stage p (Korthikanti et al. 2022 Sec. 4.2.3: "the first
    stage must store activations for p microbatches"), the last one 1. Interleaved
    (vpp = v > 1): Megatron-LM's warm-up of ``2(p - i - 1) + (v - 1)p`` chunks plus the
    one in backward, each L/(pv) layers: ``(2(p - i - 1) + (v - 1)p + 1)/v``, which is
    ``p + (p - 1)/v`` on the first stage (Korthikanti: L(1 + (p-1)/(pv)) layers).
    Capped at the m micro-batches of the step.

    Raises:
        ValueError: a size < 1 or a stage outside 0..pp-1.
    """
    for name, v in (("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        _positive_int(name, v)
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..{pp - 1}, got {stage!r}")
    return _inflight(pp, vpp, num_microbatches, stage)


def _inflight(pp: int, vpp: int, num_microbatches: int, stage: int) -> float:
    if vpp == 1:
        return float(min(pp - stage, num_microbatches))
    chunks = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1
    return min(chunks / vpp, float(num_microbatches))


def bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """The pipeline bubble as a fraction of the pipelined (ideal) time: ``(p - 1)/(v m)``
    (Narayanan et al. 2021 Sec. 2.2: (p-1)/m for 1F1B, divided by v with v interleaved
    chunks per rank).

    Raises:
        ValueError: a size < 1.
    """
    for name, v in (("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        _positive_int(name, v)
    return (pp - 1) / (vpp * num_microbatches)


# --- communication ----------------------------------------------------------------------

_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
           "all_gather": lambda n: (n - 1) / n}
_HOPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
         "all_gather": lambda n: n - 1}


def collective_time_s(kind: str, nbytes: float, ranks: int, ranks_per_node: int,
                      gpu: GPUSpec) -> float:
    """Seconds of one collective of ``nbytes`` per rank (the buffer nccl-tests calls size).

    Inside one node: ``hops(n) * alpha + f(n) * nbytes / busbw`` on NVLink, with a ring's
    hops (2(n-1) for an all-reduce, n-1 for a reduce-scatter or all-gather) and f = 2(n-1)/n
    or (n-1)/n (nccl-tests doc/PERFORMANCE.md). Across nodes (k ranks per node, N =
    ranks/k nodes): the latency of a ring over all the ranks at the network's alpha per
    hop, plus the bandwidth term of a hierarchical collective: the node part on NVLink
    over k ranks and the network part over N nodes with nbytes/k per GPU on its own NIC,
    pipelined (the slower of the two).

    Args:
        kind: ``"all_reduce"``, ``"reduce_scatter"`` or ``"all_gather"``.
        nbytes: bytes per rank; ranks: the group's size; ranks_per_node: how many of
            them share a node (1 <= k <= ranks).
        gpu: the links' figures.

    Returns:
        Seconds (0 for one rank).

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in _FACTOR:
        raise ValueError(f"kind must be one of {sorted(_FACTOR)}, got {kind!r}")
    if ranks <= 1:
        return 0.0
    k = max(1, min(ranks_per_node, ranks))
    inside = _FACTOR[kind](k) * nbytes / gpu.nvlink.busbw_bytes_per_s if k > 1 else 0.0
    nodes = ranks // k
    if nodes <= 1:
        return _HOPS[kind](ranks) * gpu.nvlink.alpha_s + inside
    across = _FACTOR[kind](nodes) * (nbytes / k) / gpu.network.busbw_bytes_per_s
    return _HOPS[kind](ranks) * gpu.network.alpha_s + max(inside, across)


def _p2p_time_s(nbytes: float, link: LinkSpec) -> float:
    return link.alpha_s + nbytes / link.busbw_bytes_per_s


def tp_collectives_per_layer(sp: bool, recompute: RecomputeMode) -> dict[str, int]:
    """Tensor-parallel collectives one transformer layer runs per micro-batch (forward +
    backward), each on the full ``b*s*h`` activation: 2 all-reduces forward and 2 backward
    (the f and f-bar of Megatron-LM), or with sequence parallelism 2 all-gathers + 2
    reduce-scatters each way (Korthikanti et al. 2022 Sec. 4.2.2: "four all-gathers and four
    reduce-scatters in a single forward and backward pass"); full recomputation reruns the
    forward's (2 more all-reduces, or 2 more all-gathers and 2 more reduce-scatters).

    Returns:
        ``{collective kind: count}`` per layer and micro-batch."""
    extra = 2 if recompute == "full" else 0
    if sp:
        return {"all_gather": 4 + extra, "reduce_scatter": 4 + extra}
    return {"all_reduce": 4 + extra}


# --- memory and time of one layout ------------------------------------------------------

@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the fuller pipeline stage (``stage``: "first" or "last").

    Attributes:
        params_bytes, grads_bytes, optimizer_bytes: the model states (ZeRO-divided).
        activations_bytes: layers' activations x micro-batches in flight, plus the
            embedding, output-layer and loss activations of that stage.
        comm_buffers_bytes: tensor-parallel gather buffers, pipeline send/receive buffers,
            data-parallel buckets (ZeRO-3: two layers' gathered parameters and their
            gradients).
        inflight: micro-batches in flight on that stage (in whole-stage units).
        stage: "first" or "last".
    """

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    comm_buffers_bytes: float
    inflight: float
    stage: str

    @property
    def total_bytes(self) -> float:
        """Sum of the parts."""
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.comm_buffers_bytes)

    def gib(self) -> dict[str, float]:
        """The parts and ``total`` in GiB (2^30 bytes)."""
        parts = {"params": self.params_bytes, "grads": self.grads_bytes,
                 "optimizer": self.optimizer_bytes, "activations": self.activations_bytes,
                 "comm_buffers": self.comm_buffers_bytes, "total": self.total_bytes}
        return {k: v / 2 ** 30 for k, v in parts.items()}


@dataclass(frozen=True)
class StepTimeBreakdown:
    """Seconds of one training step on the slowest stage, by part (exposed time only).

    Attributes:
        compute_s: model FLOPs (forward + backward) at peak x matmul efficiency.
        elementwise_s: memory-bound work (LayerNorm, GeLU, softmax, dropout, residual
            adds): ``elementwise_passes`` x the layer's stored activation bytes, 3 forward-
            equivalents, over HBM bandwidth.
        recompute_s: recomputation's extra forward work (its FLOPs and elementwise part).
        tp_comm_s: exposed tensor-parallel collectives.
        cp_comm_s: exposed context-parallel (ring attention) exchanges.
        bubble_s: pipeline bubble, (p-1)/(v m) of the pipelined time.
        pp_p2p_s: pipeline point-to-point sends.
        dp_comm_s: gradient (ZeRO: and parameter) collectives backward does not hide.
        optimizer_s: the optimizer step (HBM-bound).
    """

    compute_s: float
    elementwise_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        """Sum of the parts."""
        return (self.compute_s + self.elementwise_s + self.recompute_s + self.tp_comm_s
                + self.cp_comm_s
                + self.bubble_s + self.pp_p2p_s + self.dp_comm_s + self.optimizer_s)

    def parts(self) -> dict[str, float]:
        """Each part in seconds, ``step`` last."""
        return {**{k.removesuffix("_s"): v for k, v in asdict(self).items()},
                "step": self.step_s}


def stage_params_per_gpu(model: TransformerShape, layout: Layout) -> tuple[float, float]:
    """Parameters one GPU holds on the first and on the last pipeline stage, before ZeRO
    divides anything: ``(first, last)`` (equal when pp = 1).

    Each stage has L/pp layers of :func:`layer_parameters`, split over tp; the first stage
    adds the word embedding (V*h/tp) and the learned position embedding (s*h, replicated);
    the last the final LayerNorm (2h) and, when pp > 1, its own copy of the output layer
    (V*h/tp, the embedding's tied weights: Megatron-LM keeps one on each end and
    all-reduces their gradients). Narayanan et al. 2021 Sec. 5.1 counts the same
    parameters for the whole model.
    """
    return _stage_params(model, layout)


def _stage_params(model: TransformerShape, layout: Layout) -> tuple[float, float]:
    """Parameters held by one GPU of the first and of the last stage."""
    h, t = model.hidden, layout.tp
    layers = model.layers / layout.pp * _layer_params(model) / t
    embedding = model.vocab * h / t + model.seq_len * h
    first = layers + embedding + (2 * h if layout.pp == 1 else 0)
    last = layers + 2 * h + (model.vocab * h / t if layout.pp > 1 else embedding)
    return first, last


def _num_microbatches(layout: Layout, global_batch: int) -> int:
    return global_batch // (layout.dp * layout.micro_batch)


def comm_buffer_bytes(model: TransformerShape, layout: Layout) -> float:
    """Communication buffers per GPU (bytes): with tp > 1 a gathered input and an output
    to reduce (2 x 2bsh, s the GPU's share s/cp); with pp > 1 send and receive buffers,
    forward and backward (4 x 2bsh/t); with more than one dp x cp rank two of PyTorch
    DDP's 25 MiB gradient buckets, or with ZeRO-3 the current and the prefetched layer's
    gathered parameters and their gradients (2 x (2 + 2) x layer parameters / t)."""
    t, b, h = layout.tp, layout.micro_batch, model.hidden
    s = model.seq_len / layout.cp
    buffers = 0.0
    if t > 1:
        buffers += 2 * ACT_BYTES * s * b * h           # gathered input, output to reduce
    if layout.pp > 1:
        buffers += 4 * ACT_BYTES * s * b * h / t       # send/receive, forward and backward
    if layout.dp * layout.cp > 1:
        # ZeRO-3: the current and the prefetched layer, gathered, with their gradients
        buffers += (2 * (PARAM_BYTES + GRAD_BYTES) * _layer_params(model) / t
                    if layout.zero == 3 else 2 * DP_BUCKET_BYTES)
    return buffers


def memory_per_gpu(model: TransformerShape, layout: Layout, gpu: GPUSpec,
                   global_batch: int, assumptions: Assumptions | None = None) -> MemoryBreakdown:
    """Memory per GPU of ``layout`` (bytes by part) on the fuller of the first and last
    pipeline stages. Sources and terms: see the module docstring and
    :class:`MemoryBreakdown`; activations come from :func:`activation_bytes_per_layer` and
    :func:`inflight_microbatches`, never divided by ZeRO.

    Args:
        model, layout: the shape and the layout (validate it first with
            :func:`check_layout_fields`); gpu: the preset (unused for bytes, kept for
            symmetry with :func:`step_time`); global_batch: sequences per step.
        assumptions: only ``flash_attention`` matters here (default
            :class:`Assumptions`).

    Returns:
        :class:`MemoryBreakdown`.
    """
    t, p, v = layout.tp, layout.pp, layout.vpp
    shard = layout.dp * layout.cp                     # ZeRO shards over dp x cp ranks
    m = _num_microbatches(layout, global_batch)
    flash = (assumptions or Assumptions()).flash_attention
    per_layer = activation_bytes_per_layer(model, layout.micro_batch, tp=t, sp=layout.sp,
                                           recompute=layout.recompute, cp=layout.cp,
                                           flash_attention=flash)
    layers_per_stage = model.layers / p
    s, b, h = model.seq_len / layout.cp, layout.micro_batch, model.hidden
    split = t if layout.sp else 1
    buffers = comm_buffer_bytes(model, layout)
    candidates = []
    for stage, psi in zip(("first", "last"), _stage_params(model, layout)):
        index = 0 if stage == "first" else p - 1
        inflight = _inflight(p, v, m, index)
        acts = inflight * layers_per_stage * per_layer
        if stage == "first":
            acts += inflight * s * b * h / split       # embedding dropout mask (Sec. 4.3)
        if stage == "last" or p == 1:                  # final LN, output input, fp32 logits
            acts += 2 * ACT_BYTES * s * b * h / split + 4 * s * b * model.vocab / t
        candidates.append(MemoryBreakdown(
            params_bytes=PARAM_BYTES * psi / (shard if layout.zero >= 3 else 1),
            grads_bytes=GRAD_BYTES * psi / (shard if layout.zero >= 2 else 1),
            optimizer_bytes=OPTIMIZER_BYTES * psi / (shard if layout.zero >= 1 else 1),
            activations_bytes=acts, comm_buffers_bytes=buffers, inflight=inflight,
            stage=stage))
        if p == 1:
            break
    return max(candidates, key=lambda mb: mb.total_bytes)


def _ranks_per_node(stride: int, size: int, gpu: GPUSpec) -> int:
    """Ranks of a group (``size`` ranks ``stride`` apart) that share one node."""
    return max(1, min(size, gpu.gpus_per_node // stride)) if stride <= gpu.gpus_per_node else 1


def step_time(model: TransformerShape, layout: Layout, gpu: GPUSpec, global_batch: int,
              assumptions: Assumptions | None = None) -> StepTimeBreakdown:
    """Seconds of one training step of ``layout`` by part, on the slowest (last) stage.

    Per micro-batch and stage: compute = FLOPs / (t * cp) / (peak * efficiency), the last
    stage adding the logits layer; elementwise = ``elementwise_passes`` x the layer's
    stored activations (without the attention scores under FlashAttention) x 3 / HBM
    bandwidth; recomputation adds its forward FLOPs and elementwise passes; tensor-parallel
    collectives from
    :func:`tp_collectives_per_layer` on ``b*(s/cp)*h`` bf16 elements within the tp group;
    context-parallel exchanges of K and V (cp - 1 per layer forward, twice that backward),
    exposed beyond the attention core's compute. Pipelined time = m x that; bubble =
    :func:`bubble_fraction` x the pipelined time; point-to-point = 2 v m blocking sends of
    ``b*(s/cp)*h/t`` elements (Narayanan's scatter/gather). Data parallel (over dp x cp
    ranks): bf16 gradients of the stage's parameters reduced once a step (ZeRO 0/1: an
    all-reduce's volume; ZeRO-2: a reduce-scatter per micro-batch and an all-gather; ZeRO-3:
    two all-gathers and a reduce-scatter per micro-batch), exposed beyond the last
    micro-batch's backward when overlapped. Optimizer: :data:`OPTIMIZER_STEP_BYTES` per
    parameter of the GPU's optimizer shard over HBM bandwidth.

    Args:
        model, layout, gpu, global_batch: as :func:`memory_per_gpu`.
        assumptions: overlap and efficiency (default :class:`Assumptions`).

    Returns:
        :class:`StepTimeBreakdown`.
    """
    a = assumptions or Assumptions()
    eff = a.matmul_efficiency or gpu.matmul_efficiency
    rate = gpu.peak_flops * eff
    t, p, v, cp = layout.tp, layout.pp, layout.vpp, layout.cp
    b = layout.micro_batch
    m = _num_microbatches(layout, global_batch)
    tokens = b * model.seq_len                          # per micro-batch, whole sequence
    layer, logits = _flops_per_token(model)
    layers = model.layers / p
    split = t * cp
    compute_mb = (3 * tokens * (layers * layer + logits)) / split / rate
    recompute_per_layer = {"none": 0.0, "full": layer,
                           "selective": _attention_core_flops_per_token(model)}[layout.recompute]
    recompute_mb = tokens * layers * recompute_per_layer / split / rate
    # memory-bound work: passes over the stored activations, 3 forward-equivalents (as the
    # FLOPs) plus what recomputation reruns
    passes = gpu.elementwise_passes if a.elementwise_passes is None else a.elementwise_passes
    core = 0.0 if a.flash_attention else _core_bytes(model, b, t, cp)
    rest = activation_bytes_per_layer(model, b, tp=t, sp=layout.sp, cp=cp,
                                      flash_attention=True)
    stream = passes * layers / gpu.hbm_bytes_per_s
    elementwise_mb = stream * 3 * (rest + core)
    recompute_mb += stream * {"none": 0.0, "selective": core, "full": rest + core}[layout.recompute]
    flops_mb = compute_mb
    compute_mb += elementwise_mb
    gemm_mb = compute_mb + recompute_mb

    act_bytes = ACT_BYTES * b * (model.seq_len / cp) * model.hidden
    tp_mb = 0.0
    if t > 1:
        k = min(t, gpu.gpus_per_node)
        per_layer = sum(n * collective_time_s(kind, act_bytes, t, k, gpu)
                        for kind, n in tp_collectives_per_layer(layout.sp, layout.recompute).items())
        tp_mb = layers * per_layer
        if a.tp_comm_overlap:
            tp_mb = max(0.0, tp_mb - gemm_mb)
    cp_mb = 0.0
    if cp > 1:
        kv_bytes = 2 * ACT_BYTES * b * (model.seq_len / cp) * model.kv_heads * model.head_dim / t
        link = gpu.nvlink if t * cp <= gpu.gpus_per_node else gpu.network
        exchange = 3 * (cp - 1) * _p2p_time_s(kv_bytes, link)
        attention_s = 3 * tokens * _attention_core_flops_per_token(model) / split / rate
        cp_mb = layers * max(0.0, exchange - attention_s)
    per_mb = gemm_mb + tp_mb + cp_mb
    pipelined = m * per_mb
    bubble = bubble_fraction(p, v, m) * pipelined
    p2p = 0.0
    if p > 1:
        stride = t * cp * layout.dp
        link = gpu.nvlink if stride * p <= gpu.gpus_per_node else gpu.network
        p2p = 2 * v * m * _p2p_time_s(act_bytes / t, link)

    shard = layout.dp * cp
    psi = max(_stage_params(model, layout))
    dp = 0.0
    if shard > 1:
        k = _ranks_per_node(t, shard, gpu)
        grad_bytes = GRAD_BYTES * psi
        rs = collective_time_s("reduce_scatter", grad_bytes, shard, k, gpu)
        ag = collective_time_s("all_gather", PARAM_BYTES * psi, shard, k, gpu)
        backward_mb = gemm_mb - compute_mb / 3          # backward + recompute of one mb
        if layout.zero <= 1:
            total = collective_time_s("all_reduce", grad_bytes, shard, k, gpu)
            dp = max(0.0, total - backward_mb) if a.dp_comm_overlap else total
        elif layout.zero == 2:
            dp = (m * (max(0.0, rs - backward_mb) if a.dp_comm_overlap else rs)) + ag
        else:
            per = 2 * ag + rs
            dp = m * (max(0.0, per - gemm_mb) if a.dp_comm_overlap else per)
    opt_params = psi / (shard if layout.zero >= 1 else 1)
    optimizer = OPTIMIZER_STEP_BYTES * opt_params / gpu.hbm_bytes_per_s
    return StepTimeBreakdown(compute_s=m * flops_mb, elementwise_s=m * elementwise_mb,
                             recompute_s=m * recompute_mb,
                             tp_comm_s=m * tp_mb, cp_comm_s=m * cp_mb, bubble_s=bubble,
                             pp_p2p_s=p2p, dp_comm_s=dp, optimizer_s=optimizer)


@dataclass(frozen=True)
class LayoutPlan:
    """One layout evaluated: memory, time, throughput and utilisation.

    Attributes:
        model, layout, gpu, global_batch: what was evaluated.
        memory: :class:`MemoryBreakdown`; time: :class:`StepTimeBreakdown`.
        fits: total memory <= the GPU's HBM (no allowance for fragmentation or the CUDA
            context: leave headroom).
        num_microbatches: m = global_batch / (dp * micro_batch).
        model_flops, hardware_flops: per step (:func:`model_flops_per_step`,
            :func:`hardware_flops_per_step`).
    """

    model: TransformerShape
    layout: Layout
    gpu: GPUSpec
    global_batch: int
    memory: MemoryBreakdown
    time: StepTimeBreakdown
    fits: bool
    num_microbatches: int
    model_flops: float
    hardware_flops: float

    @property
    def step_s(self) -> float:
        """Seconds per step."""
        return self.time.step_s

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of the whole job."""
        return self.global_batch * self.model.seq_len / self.step_s

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (model FLOPs / step / GPUs / 1e12)."""
        return self.model_flops / self.step_s / self.layout.gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, a fraction: model FLOP/s per GPU / peak (PaLM App. B;
        recomputation never counted)."""
        return self.model_flops / self.step_s / self.layout.gpus / self.gpu.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation, a fraction: with recomputation's FLOPs."""
        return self.hardware_flops / self.step_s / self.layout.gpus / self.gpu.peak_flops

    def limited_by(self) -> str:
        """What limits this layout: the memory when it does not fit or has under 10 %
        headroom, then the two largest non-compute parts of the step with their share
        (e.g. ``"pipeline bubble 12%, recompute 9%"``)."""
        out = []
        used = self.memory.total_bytes / self.gpu.hbm_bytes
        if not self.fits:
            out.append(f"memory: needs {self.memory.total_bytes / 2 ** 30:.1f} GiB > "
                       f"{self.gpu.hbm_bytes / 2 ** 30:.0f} GiB")
        elif used > 0.9:
            out.append(f"memory {used:.0%} of HBM")
        names = {"recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP comm",
                 "bubble": "pipeline bubble", "pp_p2p": "PP p2p", "dp_comm": "DP comm",
                 "optimizer": "optimizer"}
        parts = self.time.parts()
        ranked = sorted(((parts[k] / self.step_s, label) for k, label in names.items()
                         if parts[k] > 0), reverse=True)
        out += [f"{label} {share:.0%}" for share, label in ranked[:2] if share >= 0.005]
        return ", ".join(out) or "compute"

    def to_dict(self) -> dict:
        """JSON-ready: ``layout`` (its fields), ``fits``, ``memory_gib_per_gpu``,
        ``step_s``, ``tokens_per_s``, ``tflops_per_gpu``, ``mfu`` and ``hfu`` (fractions),
        ``memory_gib_by_part``, ``step_s_by_part``, ``num_microbatches``,
        ``bubble_fraction``, ``limited_by``."""
        lay = self.layout
        return {
            "layout": asdict(lay), "label": lay.label(), "fits": self.fits,
            "memory_gib_per_gpu": self.memory.total_bytes / 2 ** 30,
            "step_s": self.step_s, "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "memory_gib_by_part": self.memory.gib(), "memory_stage": self.memory.stage,
            "step_s_by_part": self.time.parts(), "num_microbatches": self.num_microbatches,
            "bubble_fraction": bubble_fraction(lay.pp, lay.vpp, self.num_microbatches),
            "limited_by": self.limited_by()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_layout_fields(model: TransformerShape, gpus: int, global_batch: int,
                        fixed: dict | None = None) -> None:
    """Refuse a layout (all of its fields, or the ones given in ``fixed``) that cannot run
    ``model`` on ``gpus`` GPUs with ``global_batch`` sequences, before any work. Each
    message names the field, its ``perflab plan`` flag and a fix.

    Checks: gpus and global_batch >= 1; tp divides heads, kv_heads and ffn_hidden; tp * pp
    * cp divides gpus (and equals gpus / dp when dp is given); pp * vpp divides layers;
    seq_len divisible by 2 cp (causal load balancing of context parallelism); the global
    batch divisible by dp * micro_batch; with vpp > 1, the number of micro-batches a
    multiple of pp (Megatron-LM's interleaved schedule).

    Args:
        model: the shape; gpus: GPU count; global_batch: sequences per step.
        fixed: layout fields already chosen (keys of :data:`LAYOUT_FIELDS`), or None.

    Raises:
        ValueError: the first violated rule, naming field, flag and fix.
    """
    _positive_int("gpus", gpus, "--gpus")
    _positive_int("global_batch", global_batch, "--global-batch")
    f = dict(fixed or {})
    unknown = set(f) - set(LAYOUT_FIELDS)
    if unknown:
        raise ValueError(f"unknown layout fields {sorted(unknown)}; fields: {list(LAYOUT_FIELDS)}")
    # types and ranges of each given field; the sp/tp and vpp/pp rules once both are given
    probe = {"tp": 2 if f.get("sp") is True else 1, "pp": 2 if f.get("vpp") not in (None, 1) else 1}
    Layout(**{**{k: v for k, v in probe.items() if k not in f}, **f})
    tp, pp, cp, vpp = f.get("tp"), f.get("pp"), f.get("cp"), f.get("vpp", 1)
    if "vpp" in f and model.layers % vpp:
        raise ValueError(f"layers (--layers) = {model.layers} is not divisible by vpp (--vpp) = "
                         f"{vpp}: each virtual stage needs whole layers; choose --vpp among "
                         f"{[d for d in _divisors(model.layers) if d <= 16]}")
    if tp is not None:
        for name, flag in (("heads", "--heads"), ("kv_heads", "--kv-heads"),
                           ("ffn_hidden", "--ffn-hidden")):
            value = getattr(model, name)
            if value % tp:
                ok = [d for d in _divisors(value) if d <= max(gpus, 1) and gpus % d == 0][:8]
                raise ValueError(f"tp (--tp) = {tp} does not divide {name} ({flag}) = {value}: "
                                 f"each tensor-parallel rank needs a whole share; choose --tp "
                                 f"among {ok}")
    known = [(n, x) for n, x in (("tp", tp), ("pp", pp), ("cp", cp)) if x is not None]
    product = math.prod(x for _, x in known)
    if known and gpus % product:
        names = " * ".join(f"{n}" for n, _ in known)
        values = " * ".join(str(x) for _, x in known)
        raise ValueError(f"--gpus {gpus} is not divisible by {names} = {values} = {product}: "
                         f"the layout's sizes must multiply to the GPU count (tp * pp * cp * dp "
                         f"= gpus); change --gpus or {', '.join('--' + n for n, _ in known)}")
    dp = f.get("dp")
    if dp is not None and known and len(known) == 3 and product * dp != gpus:
        raise ValueError(f"tp * pp * cp * dp = {product} * {dp} = {product * dp} != --gpus {gpus}: "
                         "the layout's sizes must multiply to the GPU count")
    if dp is None and len(known) == 3:
        dp = gpus // product
    if pp is not None and model.layers % (pp * vpp):
        raise ValueError(f"layers (--layers) = {model.layers} is not divisible by pp (--pp) * "
                         f"vpp (--vpp) = {pp} * {vpp}: each pipeline stage (and virtual stage) "
                         f"needs whole layers; choose pp * vpp among "
                         f"{[d for d in _divisors(model.layers) if d <= gpus][:10]}")
    if cp is not None and cp > 1 and model.seq_len % (2 * cp):
        raise ValueError(f"seq_len (--seq-len) = {model.seq_len} is not divisible by 2 * cp "
                         f"(--cp) = {2 * cp}: context parallelism gives each rank two equal "
                         "chunks of the sequence; choose a smaller --cp")
    mb = f.get("micro_batch")
    if dp is not None:
        unit = dp * (mb or 1)
        if global_batch % unit:
            what = f"dp * micro_batch = {dp} * {mb}" if mb else f"dp = {dp}"
            raise ValueError(f"global_batch (--global-batch) = {global_batch} is not divisible "
                             f"by {what} = {unit} (dp = gpus / (tp * pp * cp)): every data-"
                             f"parallel rank runs whole micro-batches; choose --global-batch a "
                             f"multiple of {unit}, or another --micro-batch / layout")
        if mb and vpp > 1 and pp is not None and (global_batch // unit) % pp:
            raise ValueError(f"vpp (--vpp) = {vpp} needs the number of micro-batches "
                             f"global_batch / (dp * micro_batch) = {global_batch // unit} to be a "
                             f"multiple of pp = {pp} (Megatron-LM's interleaved schedule); "
                             "change --global-batch, --micro-batch or --vpp 1")
    elif mb is not None and global_batch % mb:
        raise ValueError(f"global_batch (--global-batch) = {global_batch} is not divisible by "
                         f"micro_batch (--micro-batch) = {mb}; choose a --micro-batch that "
                         "divides it")


def evaluate_layout(model: TransformerShape, layout: Layout, gpu: GPUSpec, global_batch: int,
                    assumptions: Assumptions | None = None) -> LayoutPlan:
    """Memory, time, throughput and utilisation of one layout.

    Raises:
        ValueError: the layout cannot run (:func:`check_layout_fields`' rules).
    """
    check_layout_fields(model, layout.gpus, global_batch, asdict(layout))
    return _evaluate(model, layout, gpu, global_batch, assumptions)


def _evaluate(model, layout, gpu, global_batch, assumptions, memory=None) -> LayoutPlan:
    memory = memory or memory_per_gpu(model, layout, gpu, global_batch, assumptions)
    time = step_time(model, layout, gpu, global_batch, assumptions)
    return LayoutPlan(model=model, layout=layout, gpu=gpu, global_batch=global_batch,
                      memory=memory, time=time, fits=memory.total_bytes <= gpu.hbm_bytes,
                      num_microbatches=_num_microbatches(layout, global_batch),
                      model_flops=model_flops_per_step(model, global_batch),
                      hardware_flops=hardware_flops_per_step(model, global_batch,
                                                             layout.recompute))


def candidate_layouts(model: TransformerShape, gpu: GPUSpec, gpus: int, global_batch: int,
                      fixed: dict | None = None) -> Iterator[Layout]:
    """Every valid layout (the fields in ``fixed`` held), in no particular order.

    tp divides heads, kv_heads and ffn_hidden and is at most a node (the search's rule; a
    given ``tp`` may be larger); cp divides seq_len/2, at most a node; pp * vpp divides
    layers; dp = gpus / (tp pp cp) divides the batch; micro_batch divides the batch per dp
    rank; vpp > 1 only with m a multiple of pp; ZeRO 0 only with one dp x cp rank (with
    more, ZeRO-1 is as fast and smaller), else 1-3; sp with tp > 1; every recompute mode.
    """
    f = dict(fixed or {})
    node = gpu.gpus_per_node

    def options(name, values):
        return [f[name]] if name in f else values

    tps = options("tp", [d for d in _divisors(gpus) if d <= node and model.heads % d == 0
                         and model.kv_heads % d == 0 and model.ffn_hidden % d == 0])
    for tp in tps:
        cps = options("cp", [d for d in _divisors(gpus // tp) if d <= node
                             and (d == 1 or model.seq_len % (2 * d) == 0)])
        for cp in cps:
            if gpus % (tp * cp):
                continue
            for pp in options("pp", [d for d in _divisors(gpus // (tp * cp))
                                     if model.layers % d == 0]):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if "dp" in f and f["dp"] != dp or global_batch % dp:
                    continue
                for mb in options("micro_batch", _divisors(global_batch // dp)):
                    if (global_batch // dp) % mb:
                        continue
                    m = global_batch // (dp * mb)
                    vpps = [1] + [x for x in _divisors(model.layers // pp)
                                  if x > 1 and pp > 1 and m % pp == 0]
                    for vpp in options("vpp", vpps):
                        if vpp > 1 and (pp == 1 or m % pp or model.layers % (pp * vpp)):
                            continue
                        zeros = [0] if dp * cp == 1 else [1, 2, 3]
                        for zero in options("zero", zeros):
                            for sp in options("sp", [False, True] if tp > 1 else [False]):
                                if sp and tp == 1:
                                    continue
                                for rc in options("recompute", list(RECOMPUTE_MODES)):
                                    yield Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, dp=dp,
                                                 micro_batch=mb, zero=zero, sp=sp,
                                                 recompute=rc)


def _rank_key(p: LayoutPlan) -> tuple:
    lay = p.layout
    simpler = (lay.cp, lay.pp, lay.vpp, lay.tp, lay.zero, lay.micro_batch)
    first = float(f"{p.step_s if p.fits else p.memory.total_bytes:.6g}")  # ties: simpler
    return (not p.fits, first, p.memory.total_bytes, simpler)


def plan(model: TransformerShape, gpu: GPUSpec | str, gpus: int, global_batch: int, *,
         fixed: dict | None = None, assumptions: Assumptions | None = None,
         top: int | None = None) -> list[LayoutPlan]:
    """Evaluate every valid layout (:func:`candidate_layouts`; the fields in ``fixed``
    held) and return them best first: the ones that fit by step time, then the ones that
    do not by memory (equal ones: the simpler layout first, smaller cp, pp, vpp, tp).

    Of one layout's recomputation modes only the least that fits is kept (more
    recomputation is never faster here), or, when none fits, the smallest; so the list
    holds no dominated twin.

    Args:
        model: the shape; gpu: a :class:`GPUSpec` or a preset name; gpus: GPU count;
            global_batch: sequences per step.
        fixed: layout fields to hold (keys of :data:`LAYOUT_FIELDS`), e.g. ``{"tp": 8}``;
            a complete layout evaluates that one.
        assumptions: overlap and efficiency (default :class:`Assumptions`).
        top: keep the best ``top`` (default all).

    Returns:
        List of :class:`LayoutPlan`, best first.

    Raises:
        ValueError: bad input (:func:`check_layout_fields`), or no valid layout at all
            (the message says which constraint leaves none).
    """
    gpu = gpu_preset(gpu) if isinstance(gpu, str) else gpu
    check_layout_fields(model, gpus, global_batch, fixed)
    fitting: dict[tuple, tuple[Layout, MemoryBreakdown]] = {}
    too_big: dict[tuple, tuple[Layout, MemoryBreakdown]] = {}
    for layout in candidate_layouts(model, gpu, gpus, global_batch, fixed):
        key = (layout.tp, layout.pp, layout.vpp, layout.cp, layout.dp, layout.micro_batch,
               layout.zero, layout.sp)
        if key in fitting:
            continue                                   # less recomputation already fits
        memory = memory_per_gpu(model, layout, gpu, global_batch, assumptions)
        if memory.total_bytes <= gpu.hbm_bytes:
            fitting[key] = (layout, memory)
            too_big.pop(key, None)
        elif key not in too_big or memory.total_bytes < too_big[key][1].total_bytes:
            too_big[key] = (layout, memory)
    if not fitting and not too_big:
        raise ValueError(f"no valid layout of {gpus} GPUs runs a global batch of {global_batch} "
                         f"sequences with {fixed or 'no fixed fields'}: dp = gpus / (tp pp cp) "
                         "must divide --global-batch and tp must divide --heads; try another "
                         "--gpus or --global-batch")
    ranked = sorted((_evaluate(model, lay, gpu, global_batch, assumptions, mem)
                     for lay, mem in fitting.values()), key=_rank_key)
    rest = sorted(too_big.values(), key=lambda lm: lm[1].total_bytes)
    if top:
        ranked, rest = ranked[:top], rest[:max(0, top - len(ranked))]
    return ranked + sorted((_evaluate(model, lay, gpu, global_batch, assumptions, mem)
                            for lay, mem in rest), key=_rank_key)
