"""Lab 12's glue ("Plan the cluster"): the plain data the student's planner works on, the
building blocks the lab gives (parameter counts per stage, communication buffers, the
alpha-beta collective), the published rows of Narayanan et al. 2021 Table 1 in those
types, and the reference planner (:mod:`perflab.analysis.planner`) run on them for display.

The student writes ``memory_per_gpu(model, layout)``, ``step_time(model, cluster,
layout)``, ``utilization(model, cluster, layout)`` and ``best_layout(model, cluster, gpus,
batch)`` on these types; the grader builds them from JSON data (:func:`model_of`,
:func:`cluster_of`, :func:`layout_of`) and judges against the planner
(``perflab.course.references.lab12``).

What the lab's planner assumes, the same in the student's and in the reference's (the
planner's :class:`~perflab.analysis.planner.Assumptions` of :func:`assumptions_of`):
Korthikanti et al. 2022's activation accounting (attention scores stored unless
recomputed: no FlashAttention), compute at ``peak * efficiency`` with no separate
memory-bound term, tensor-parallel collectives never overlapped, the data-parallel
reduction overlapped with backward when ``cluster.dp_overlap``, context parallelism 1.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Model", "Cluster", "ParallelLayout", "model_of", "cluster_of", "layout_of",
           "stage_parameters", "buffer_bytes", "collective_s", "preset_cluster",
           "narayanan_rows", "assumptions_of", "reference_plan", "reference_best",
           "RECOMPUTE", "LLAMA2_70B"]

#: Recomputation modes: keep everything, recompute the attention core, keep each layer's
#: input and rerun its forward.
RECOMPUTE = ("none", "selective", "full")


def _int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer (GPT / Llama).

    Attributes:
        layers: L. hidden: h. heads: a (query heads). seq_len: s (tokens per sequence).
        vocab: V (the output layer shares the embedding's weights).
        kv_heads: key/value heads (grouped-query attention when < heads); default heads.
        ffn_hidden: the MLP's inner size f; default 4h. gated: a gated MLP (SwiGLU: three
            h x f matrices).

    Raises:
        ValueError: a size that is not an int >= 1, hidden not divisible by heads, heads
            not divisible by kv_heads (naming the field).
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int = 0
    ffn_hidden: int = 0
    gated: bool = False

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "seq_len", "vocab"):
            _int(f, getattr(self, f))
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.ffn_hidden:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _int("kv_heads", self.kv_heads)
        _int("ffn_hidden", self.ffn_hidden)
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden = {self.hidden} must be divisible by heads = {self.heads}, "
                             f"and heads by kv_heads = {self.kv_heads}: choose sizes that divide")

    @property
    def head_dim(self) -> int:
        """h / a."""
        return self.hidden // self.heads


@dataclass(frozen=True)
class Cluster:
    """GPUs and their links, with the one efficiency the lab's planner fits.

    Attributes:
        name: a label. peak_flops: dense bf16 peak, FLOP/s. hbm_bytes: HBM per GPU
            (bytes); hbm_bytes_per_s: its bandwidth. gpus_per_node: GPUs on one NVLink
            domain.
        nvlink_alpha_s, nvlink_busbw: latency per ring hop (s) and bus bandwidth per GPU
            (bytes/s) inside a node; net_alpha_s, net_busbw: the same between nodes (per
            GPU, each on its own NIC).
        efficiency: the fraction of peak the model's FLOPs run at (0 < e <= 1).
        dp_overlap: the data-parallel gradient reduction overlaps backward (PyTorch DDP);
            False: it runs after backward (Megatron-LM's 2021 "local" DDP).

    Raises:
        ValueError: a figure <= 0 or an efficiency outside (0, 1].
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    gpus_per_node: int
    nvlink_alpha_s: float
    nvlink_busbw: float
    net_alpha_s: float
    net_busbw: float
    efficiency: float = 0.5
    dp_overlap: bool = True

    def __post_init__(self) -> None:
        _int("gpus_per_node", self.gpus_per_node)
        for f in ("peak_flops", "hbm_bytes", "hbm_bytes_per_s", "nvlink_busbw", "net_busbw"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a number > 0, got {v!r}")
        for f in ("nvlink_alpha_s", "net_alpha_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{f} must be a number >= 0 (seconds), got {v!r}")
        if not (isinstance(self.efficiency, (int, float)) and 0 < self.efficiency <= 1):
            raise ValueError(f"efficiency must be a fraction in (0, 1], got {self.efficiency!r}")


@dataclass(frozen=True)
class ParallelLayout:
    """One layout of ``tp * pp * dp`` GPUs running ``dp * micro_batch * num_microbatches``
    sequences per step (ranks ordered tp fastest, then dp, then pp: a tp group is
    consecutive GPUs of one node).

    Attributes:
        tp, pp, dp: tensor-, pipeline- and data-parallel sizes. vpp: model chunks per
            pipeline rank (interleaved 1F1B when > 1). micro_batch: b, sequences per
            micro-batch. num_microbatches: m, micro-batches per step per pipeline.
        zero: ZeRO stage 0-3 over the dp ranks. sp: sequence parallelism (needs tp > 1).
        recompute: ``"none"``, ``"selective"`` or ``"full"``.

    Raises:
        ValueError: a size < 1, zero outside 0-3, an unknown recompute mode, sp with tp = 1,
            vpp > 1 with pp = 1 (naming the field and the fix).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    num_microbatches: int = 1
    zero: int = 0
    sp: bool = False
    recompute: str = "none"

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "vpp", "micro_batch", "num_microbatches"):
            _int(f, getattr(self, f))
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.sp and self.tp == 1:
            raise ValueError("sp=True needs tp > 1 (sequence parallelism splits what tensor "
                             "parallelism replicates): set tp >= 2 or sp=False")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp = {self.vpp} needs pp > 1: set pp >= 2 or vpp=1")

    @property
    def gpus(self) -> int:
        """tp * pp * dp."""
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per step: dp * micro_batch * num_microbatches."""
        return self.dp * self.micro_batch * self.num_microbatches

    def label(self) -> str:
        """``"tp8 pp4 vpp2 dp8 mb1 m32 zero1 sp selective"``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"] + ([f"vpp{self.vpp}"] if self.vpp > 1 else [])
        parts += [f"dp{self.dp}", f"mb{self.micro_batch}", f"m{self.num_microbatches}",
                  f"zero{self.zero}"] + (["sp"] if self.sp else [])
        return " ".join(parts + [self.recompute])


def model_of(data) -> Model:
    """A :class:`Model` from a dict of its fields (or a Model)."""
    return data if isinstance(data, Model) else Model(**data)


def cluster_of(data) -> Cluster:
    """A :class:`Cluster` from a dict of its fields (or a Cluster)."""
    return data if isinstance(data, Cluster) else Cluster(**data)


def layout_of(data) -> ParallelLayout:
    """A :class:`ParallelLayout` from a dict of its fields (or a ParallelLayout)."""
    return data if isinstance(data, ParallelLayout) else ParallelLayout(**data)


#: Llama-2-70B's shape (Touvron et al. 2023, Table 1 and the released config): 80 layers,
#: hidden 8192, 64 heads, 8 key/value heads, SwiGLU MLP of 28672, 4096 tokens, 32000 words.
LLAMA2_70B = Model(layers=80, hidden=8192, heads=64, seq_len=4096, vocab=32000, kv_heads=8,
                   ffn_hidden=28672, gated=True)


# --- the planner's objects, for the given building blocks and the reference -------------

def _shape(model: Model):
    from perflab.analysis.planner import TransformerShape

    return TransformerShape(layers=model.layers, hidden=model.hidden, heads=model.heads,
                            seq_len=model.seq_len, vocab=model.vocab, kv_heads=model.kv_heads,
                            ffn_hidden=model.ffn_hidden, gated_ffn=model.gated)


def _planner_layout(layout: ParallelLayout):
    from perflab.analysis.planner import Layout as PlannerLayout

    return PlannerLayout(tp=layout.tp, pp=layout.pp, vpp=layout.vpp, dp=layout.dp,
                         micro_batch=layout.micro_batch, zero=layout.zero, sp=layout.sp,
                         recompute=layout.recompute)


def _gpu(cluster: Cluster):
    from perflab.analysis.planner import GPUSpec, LinkSpec

    return GPUSpec(name=cluster.name, peak_flops=float(cluster.peak_flops),
                   hbm_bytes=float(cluster.hbm_bytes),
                   hbm_bytes_per_s=float(cluster.hbm_bytes_per_s),
                   gpus_per_node=cluster.gpus_per_node,
                   nvlink=LinkSpec(cluster.nvlink_alpha_s, cluster.nvlink_busbw, "lab 12 cluster"),
                   network=LinkSpec(cluster.net_alpha_s, cluster.net_busbw, "lab 12 cluster"),
                   matmul_efficiency=cluster.efficiency, elementwise_passes=0.0)


def assumptions_of(cluster: Cluster):
    """The planner's :class:`~perflab.analysis.planner.Assumptions` of the lab's model:
    the cluster's efficiency, no memory-bound term, Korthikanti's activations (no
    FlashAttention), TP collectives exposed, DP overlapped as ``cluster.dp_overlap``."""
    from perflab.analysis.planner import Assumptions

    return Assumptions(matmul_efficiency=cluster.efficiency, elementwise_passes=0.0,
                       flash_attention=False, tp_comm_overlap=False,
                       dp_comm_overlap=cluster.dp_overlap)


# --- building blocks the lab gives ------------------------------------------------------

def stage_parameters(model: Model, layout: ParallelLayout) -> dict[str, float]:
    """Parameters one GPU holds on the first and on the last pipeline stage, before ZeRO
    divides anything: ``{"first": n, "last": n}`` (equal when pp = 1).

    A layer has 12h^2 + 13h parameters for a GPT (Narayanan et al. 2021 Sec. 5.1; Q, K, V
    and output projections, the MLP, biases and two LayerNorms; grouped K/V and a gated MLP
    change the count), split over tp. The first stage adds the word embedding (V*h/tp) and
    the learned position embedding (s*h); the last the final LayerNorm (2h) and, when pp >
    1, its own copy of the output layer (V*h/tp, the embedding's tied weights).
    """
    from perflab.analysis.planner import stage_params_per_gpu

    first, last = stage_params_per_gpu(_shape(model), _planner_layout(layout))
    return {"first": float(first), "last": float(last)}


def buffer_bytes(model: Model, layout: ParallelLayout) -> float:
    """Communication buffers per GPU (bytes): tp > 1, a gathered input and an output to
    reduce (2 x 2sbh); pp > 1, send/receive buffers (4 x 2sbh/t); dp > 1, two 25 MiB
    gradient buckets, or with ZeRO-3 two layers' gathered parameters and gradients
    (2 x 4 x layer parameters / t) (:func:`perflab.analysis.planner.comm_buffer_bytes`)."""
    from perflab.analysis.planner import comm_buffer_bytes

    return float(comm_buffer_bytes(_shape(model), _planner_layout(layout)))


def collective_s(kind: str, nbytes: float, ranks: int, ranks_per_node: int,
                 cluster: Cluster) -> float:
    """Seconds of one ring collective of ``nbytes`` per rank (the alpha-beta model of Labs
    06, 09 and 10 with nccl-tests' bus bandwidth): inside a node ``hops * alpha + f *
    nbytes / busbw`` (all-reduce: 2(n-1) hops, f = 2(n-1)/n; reduce-scatter and
    all-gather: n-1 hops, f = (n-1)/n); across N nodes of k ranks each, the ring's hops at
    the network's alpha plus the slower of the node part (f(k) on NVLink) and the network
    part (f(N) of nbytes/k per GPU on its NIC).

    Args:
        kind: ``"all_reduce"``, ``"reduce_scatter"`` or ``"all_gather"``.
        nbytes: bytes per rank. ranks: group size. ranks_per_node: how many share a node.

    Returns:
        Seconds (0.0 for one rank).

    Raises:
        ValueError: an unknown kind.
    """
    from perflab.analysis.planner import collective_time_s

    return collective_time_s(kind, nbytes, ranks, ranks_per_node, _gpu(cluster))


def preset_cluster(name: str, efficiency: float, *, dp_overlap: bool = True) -> Cluster:
    """A :class:`Cluster` from a planner GPU preset (``"a100-80gb"``, ``"h100-sxm"``: its
    peak, HBM, node and links with their sources, :func:`perflab.analysis.planner.gpu_preset`)
    and the given efficiency."""
    from perflab.analysis.planner import gpu_preset

    g = gpu_preset(name)
    return Cluster(name=name, peak_flops=g.peak_flops, hbm_bytes=g.hbm_bytes,
                   hbm_bytes_per_s=g.hbm_bytes_per_s, gpus_per_node=g.gpus_per_node,
                   nvlink_alpha_s=g.nvlink.alpha_s, nvlink_busbw=g.nvlink.busbw_bytes_per_s,
                   net_alpha_s=g.network.alpha_s, net_busbw=g.network.busbw_bytes_per_s,
                   efficiency=efficiency, dp_overlap=dp_overlap)


def narayanan_rows() -> list[dict]:
    """Narayanan et al. 2021 Table 1 (``perflab/recordings/published_runs.json``) in the
    lab's types: per row ``id``, ``params_billion``, ``model`` (:class:`Model`),
    ``layout`` (:class:`ParallelLayout`, as the authors' script ran it), ``gpus``,
    ``dp_overlap`` (PyTorch DDP overlapped; Megatron's local DDP did not) and
    ``published_tflops`` (hardware TFLOP/s per GPU: Eq. 3's FLOPs, recomputation
    counted)."""
    from perflab.analysis.published_runs import published_runs

    rows = []
    for r in published_runs("narayanan2021_table1"):
        lay = r["layout"]
        m = r["global_batch"] // (lay["dp"] * lay["micro_batch"])
        rows.append({"id": r["id"], "params_billion": r["published"]["params_billion"],
                     "model": Model(**r["model"]), "gpus": r["gpus"],
                     "layout": ParallelLayout(tp=lay["tp"], pp=lay["pp"], dp=lay["dp"], vpp=lay["vpp"],
                                      micro_batch=lay["micro_batch"], num_microbatches=m,
                                      zero=lay["zero"], sp=lay["sp"], recompute=lay["recompute"]),
                     "dp_overlap": r["assumptions"]["dp_comm_overlap"],
                     "published_tflops": float(r["published"]["hardware_tflops_per_gpu"])})
    return rows


# --- the reference planner, for display (never inside the student's functions) ---------

def reference_plan(model: Model, cluster: Cluster, layout: ParallelLayout):
    """The planner's :class:`~perflab.analysis.planner.LayoutPlan` of ``layout``
    (:func:`perflab.analysis.planner.evaluate_layout` under :func:`assumptions_of`)."""
    from perflab.analysis.planner import evaluate_layout

    return evaluate_layout(_shape(model), _planner_layout(layout), _gpu(cluster),
                           layout.global_batch, assumptions_of(cluster))


def reference_best(model: Model, cluster: Cluster, gpus: int, batch: int, top: int = 1):
    """The planner's best ``top`` layouts (:func:`perflab.analysis.planner.plan`, context
    parallelism held at 1) as ``[(ParallelLayout, LayoutPlan), ...]``."""
    from perflab.analysis.planner import plan

    out = []
    for p in plan(_shape(model), _gpu(cluster), gpus, batch, fixed={"cp": 1},
                  assumptions=assumptions_of(cluster), top=top):
        lay = p.layout
        out.append((ParallelLayout(tp=lay.tp, pp=lay.pp, dp=lay.dp, vpp=lay.vpp,
                           micro_batch=lay.micro_batch,
                           num_microbatches=batch // (lay.dp * lay.micro_batch), zero=lay.zero,
                           sp=lay.sp, recompute=lay.recompute), p))
    return out

