"""Published GPU training runs (DGX H100, DGX B200) the step-time model is calibrated and checked on, each with
its source, as orchestrator/calibrate/published_tpu.py's `Published` rows.

How a source's row becomes ours:

- A GPU node is a one-host slice of conf/cluster/dgx_*.yaml. A row is one model replica: its TP x CP GPUs on
  devices/8 nodes with the context axis across them (mesh.dcn=context: tensor parallelism taken to be the
  innermost, NVLink-bound ranks, so a node holds TP x 8/TP context ranks, as our mesh's outer context factor
  indexes the node). The source's data-parallel replicas run the same step beside it; their once-a-step
  gradient reduction is left out. A replica's batch is the global batch over DP, one sequence per microbatch
  (train.grad_accum).
- Pipeline parallelism is no mesh axis here: a row with PP > 1 is not a row (NeMo's H100 8K point, PP 2).
- FLOPs: NeMo's TFLOP/s count the whole attention square (nemo/utils/flops_formulas.py, `12 * seq_len / hs`,
  halved for causal only from NVIDIA/NeMo#14424 of 2025-08-09, after every table here); jobs/flops.py's
  causal count is `causal_share` of theirs, per row. Where NeMo gives both tokens/s and TFLOP/s (CHECKS), our
  count with full attention reproduces its TFLOP/s within FLOP_TOLERANCE. torchtitan and MaxText give tokens/s
  or step time: their MFU is our count over the step.
- Precision: NeMo's tables are labelled FP8 and torchtitan's run Float8 on `nn.Linear` modules; both are
  taken as FP8 linear layers with BF16 attention. Every MFU here is against dense BF16 peak. The model prices
  matmuls at BF16 rates (no FP8 term), so a row whose linear layers are more than FP8_SHARE of its model
  FLOPs is held out.
- Remat: NeMo's tables do not say; none is assumed (NeMo's CP rows: ring CP, zigzag, our closest layout).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from jobs.flops import layer_flops
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.calibrate.published_tpu import LLAMA2_7B, Published, model
from orchestrator.plan import cluster_model

NEMO_H100, NEMO_B200, NEMO_PERF = "NeMo long-sequence H100", "NeMo long-sequence B200", "NeMo perf summary"
JAXTB, TITAN = "JAX-Toolbox MaxText", "torchtitan CP"
SOURCES = {  # tag -> where the figures are
    NEMO_H100: "github.com/NVIDIA/NeMo docs/source/performance/performance_long_sequence.md, LLAMA2-7B (FP8) - "
    "H100 (NeMo24.03.01, DGX-H100; PR #10784 of 2024-10-18), With CP columns",
    NEMO_B200: "same page, LLAMA3-8B (FP8) - B200 (NeMo25.04.rc2, DGX-B200); # of GPUs as in PR #13112 "
    "(2025-04-28): the later table's column repeats the H100 table's, which TP x CP x DP contradicts",
    NEMO_PERF: "NeMo performance summaries: docs/source/performance/performance_summary.md at PR #10094 "
    "(NeMo24.07, DGX-H100) and docs.nvidia.com/nemo-framework/user-guide/latest/performance/"
    "performance_summary.html (NeMo 25.02, DGX-B200)",
    JAXTB: "github.com/NVIDIA/JAX-Toolbox rosetta/rosetta/projects/maxtext/README.md (PR #786, 2024-05-01): "
    "Llama2-7B, H100 80G SXM, BF16, cudnn flash attention (Transformer Engine), remat minimal_flash",
    TITAN: "github.com/pytorch/torchtitan docs/performance.md (2025-01-30), Table 2: Llama 3.1 8B, FSDP + CP + "
    "torch.compile + Float8, local batch 1, full activation checkpointing; Grand Teton H100 96 GB HBM2e at "
    "the default 500 W limit; CP's default rotate method then: allgather (config_manager.py)",
}
FP8_SHARE = 0.10  # held out above this share of linear-layer FLOPs (FP8 runs them up to twice as fast)
FLOP_TOLERANCE = 0.001  # |ours / NeMo's - 1| over CHECKS: 0.05 % at most, measured (test_calibration_gpu)
K = 1024
PEAK = {"dgx_h100": 989.0, "dgx_b200": 2250.0}  # the configs' dense BF16 peaks (tests hold them equal)


def per_token_flops(m: ModelSpec, length: int, full_attention: bool = False) -> float:
    """Training FLOPs per token (3x forward), jobs/flops.py's count; `full_attention` counts the whole square."""
    weights, attention = layer_flops(m, length)
    return 3 * (weights + attention * (2 if full_attention else 1)) / length


def causal_share(m: ModelSpec, length: int) -> float:
    """Our causal count over a full-attention count (NeMo's before #14424)."""
    return per_token_flops(m, length) / per_token_flops(m, length, full_attention=True)


def linear_share(m: ModelSpec, length: int) -> float:
    """What the linear layers (and the unembedding) are of the model FLOPs: what FP8 speeds up."""
    weights, attention = layer_flops(m, length)
    return weights / (weights + attention)


@dataclass(frozen=True)
class GpuPublished(Published):
    """A GPU row: one replica on `chips_devices` GPUs (one node, or devices/8 nodes with mesh.dcn)."""

    grad_accum: int = 1  # microbatches per step (one sequence each)
    source_tflops: float = 0.0  # the source's own TFLOP/s per GPU (0: it gives a time or tokens/s)

    @property
    def spec(self) -> TrialSpec:
        return gpu_spec(self)


def cluster_option(name: str) -> dict:
    """conf/cluster/<name>.yaml as the driver reads it (Hydra's import only when first asked)."""
    from orchestrator.config.load import group_option

    return group_option("cluster", name)


def cluster_spec(name: str) -> ClusterSpec:
    """The config as the hosts get it."""
    return cluster_model.load(name)[0]


@cache
def gpu_cluster(name: str, devices: int) -> ClusterSpec:
    """conf/cluster/<name>.yaml for a trial on `devices` GPUs: one host per node, devices/8 nodes (a replica
    smaller than a node gets a node of its size)."""
    c = cluster_spec(name)
    per = min(devices, c.devices_per_host)
    nodes = max(devices // per, 1)
    return replace(c, hosts=1, devices_per_host=per, slices_per_trial=nodes, slices=max(c.slices, nodes))


def gpu_spec(p: GpuPublished) -> TrialSpec:
    return TrialSpec(
        model=model(p.model),
        mesh=p.mesh,
        strategy=StrategySpec(name=p.strategy, layout=p.layout),
        context_length=p.length,
        train=TrainSpec(batch=p.batch, remat=p.remat, grad_accum=p.grad_accum),
        cluster=gpu_cluster(p.cluster, p.chips_devices),
    )


def _nemo(
    cluster: str,
    name: str,
    src: str,
    length: int,
    gbs: int,
    tp: int,
    dp: int,
    cp: int,
    tflops: float,
    label: str = "",
) -> GpuPublished:
    """A NeMo row (TP, DP, CP, TFLOP/s per GPU in NeMo's full-attention count) as one replica of TP x CP GPUs:
    ring CP with K,V passed point to point, zigzag-balanced, one sequence per microbatch."""
    m = model(name)
    devices, batch = tp * cp, gbs // dp
    nodes = devices // 8
    mesh = MeshSpec(context=cp, tensor=tp, dcn="context" if nodes > 1 else "")
    mfu = tflops * causal_share(m, length) / PEAK[cluster]
    share = linear_share(m, length)
    held = f"FP8 linear layers are {share:.0%} of the FLOPs (> {FP8_SHARE:.0%})" if share > FP8_SHARE else ""
    strategy = "ring" if cp > 1 else "none"
    label = label or f"{cluster} {name} {strategy} {length // K:,}K tp{tp} cp{cp}"
    return GpuPublished(
        label,
        cluster,
        devices,
        name,
        strategy,
        mesh,
        length,
        batch,
        src,
        layout="zigzag" if cp > 1 else "contiguous",
        remat="none",
        mfu=(mfu, mfu),
        excluded=held,
        grad_accum=batch,
        source_tflops=tflops,
    )


def _titan(length: int, fsdp: int, cp: int, tps: float) -> GpuPublished:
    """torchtitan's Table 2: 8 GPUs, one sequence per FSDP rank, TPS/GPU -> a step time."""
    step, strategy = fsdp * length / (tps * 8), "all_gather" if cp > 1 else "none"
    return GpuPublished(
        f"dgx_h100 llama3_1_8b {strategy} {length // K}K fsdp{fsdp} cp{cp} (torchtitan)",
        "dgx_h100",
        8,
        "llama3_1_8b",
        strategy,
        MeshSpec(fsdp=fsdp, context=cp),
        length,
        fsdp,
        TITAN,
        layout="zigzag" if cp > 1 else "contiguous",
        step_s=step,
        excluded="500 W H100s of unknown peak (the source's footnote), Float8 linear layers",
    )


L2, L3 = LLAMA2_7B, "llama3_1_8b"
# fmt: off
ROWS: list[GpuPublished] = [
    # minimal_flash saves every weight matmul's output and the attention output: only elementwise work replays,
    # which the model counts as remat=none.
    GpuPublished("dgx_h100 llama2_7b none 4K fsdp8 bf16 (MaxText)", "dgx_h100", 8, L2, "none", MeshSpec(fsdp=8),
                 4 * K, 16, JAXTB, remat="none", step_s=0.721),
    # NeMo 24.03.01 on DGX-H100, Llama2-7B FP8: (SeqLen K, GBS, TP, DP, CP, TFLOP/s); 8K (PP 2) is no row.
    *(_nemo("dgx_h100", L2, NEMO_H100, s * K, gbs, tp, dp, cp, tf) for s, gbs, tp, dp, cp, tf in (
        (4, 1024, 1, 4, 1, 768), (16, 256, 2, 8, 1, 660), (32, 128, 2, 8, 2, 610), (64, 64, 4, 8, 2, 574),
        (128, 32, 4, 8, 4, 555), (256, 16, 4, 8, 8, 549), (512, 8, 8, 4, 16, 549), (1024, 4, 8, 4, 32, 536))),
    # NeMo 24.07 on DGX-H100: Llama3-8B 8K on 8 GPUs, GBS 128, CP 2 (DP 4), 697 TFLOP/s (12,036 tokens/s).
    _nemo("dgx_h100", L3, NEMO_PERF, 8 * K, 128, 1, 4, 2, 697, "dgx_h100 llama3_1_8b ring 8K cp2 (perf summary)"),
    # NeMo 25.04.rc2 on DGX-B200, Llama3-8B FP8.
    *(_nemo("dgx_b200", L3, NEMO_B200, s * K, gbs, tp, dp, cp, tf) for s, gbs, tp, dp, cp, tf in (
        (8, 512, 1, 2, 1, 1671), (16, 256, 1, 4, 1, 1717), (32, 128, 1, 4, 2, 1624), (64, 64, 1, 4, 4, 1600),
        (128, 32, 2, 4, 4, 1588), (256, 16, 4, 4, 4, 1590), (512, 8, 4, 4, 8, 1619), (1024, 4, 4, 4, 16, 1608))),
    *(_titan(s * K, f, c, tps) for s, f, c, tps in ((32, 8, 1, 3890), (64, 4, 2, 2540), (128, 2, 4, 1071),
                                                    (256, 1, 8, 548))),
]
# fmt: on


@dataclass(frozen=True)
class FlopCheck:
    """A source figure with both tokens/s and TFLOP/s per GPU: our count (its attention convention) must give
    its TFLOP/s."""

    label: str
    model: str
    length: int
    tokens_per_s: float  # per GPU
    tflops: float  # per GPU, the source's
    full_attention: bool
    source: str

    @property
    def ours(self) -> float:
        """TFLOP/s per GPU by jobs/flops.py at the source's tokens/s and attention convention."""
        return per_token_flops(model(self.model), self.length, self.full_attention) * self.tokens_per_s / 1e12

    @property
    def error(self) -> float:
        return self.ours / self.tflops - 1


CHECKS = [
    FlopCheck("NeMo 24.07 H100 Llama2-7B 4K", L2, 4 * K, 16847, 776, True, NEMO_PERF),
    FlopCheck("NeMo 24.07 H100 Llama3-8B 8K cp2", L3, 8 * K, 12036, 697, True, NEMO_PERF),
    FlopCheck("NeMo 25.02 B200 Llama3-8B 8K", L3, 8 * K, 26006, 1506, True, NEMO_PERF),
]
