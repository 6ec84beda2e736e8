"""Published TPU training runs the step-time model is fitted and judged on, table by table, each with its source.

A row is one published step: where it ran, how (model, mesh, strategy, layout, remat, what went to host, the
splash block sizes where the source gives them) and what it measured (MFU low..high, or a median step time). Its
`source` is its table: the unit the calibration holds out of its own fit (orchestrator/calibrate/fit.py).

MFU is against bf16 peak with MaxText's current causal FLOP count: every row is from 2026, and jobs/flops.py
reproduces each TFLOP/s a source gives to within 0.6 % (step-time rounding), so no row needs the pre-mid-2025
full-attention correction. A source that gives a range (a microbenchmark and the recipe's own run) keeps both
ends; the model is compared with the midpoint.

MaxText `remat_policy=custom` with `context` (the attention output) saved or offloaded and the other names
rematerialised is our `save_attn`; `offload` lists what went to host memory. A row with `excluded` set is never
fitted: the model has no term for what made it differ (a clock setting); it is still shown with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator import REPO
from orchestrator.plan import cluster_model

CONF = REPO / "conf"
V5P_LC, TPU7X_LC = "tpu-recipes v5p 8B-LC", "tpu-recipes Ironwood 8B-LC"
PR4687, PR4836, IRONWOOD = "MaxText #4687", "MaxText #4836", "tpu-recipes Ironwood"
SOURCES = {  # tag -> where the figures are (the sources' tables, "Measured MFU" / step time columns)
    V5P_LC: "github.com/AI-Hypercomputer/tpu-recipes training/v5p/Llama3.1-8B-LongContext-Maxtext/"
    "cluster_toolkit/README.md (runs of 2026-10-05)",
    TPU7X_LC: "github.com/AI-Hypercomputer/tpu-recipes training/ironwood/Llama3.1-8B-LongContext-Maxtext/"
    "cluster_toolkit/README.md (runs of 2026-10-05)",
    PR4687: "github.com/AI-Hypercomputer/maxtext/pull/4687 (Ulysses CP): v5p-128, 2M tokens/step, "
    "remat custom context=device, best block sizes per strategy (2048 Ulysses, 1024 ring and all-gather)",
    PR4836: "github.com/AI-Hypercomputer/maxtext/pull/4836 (USP CP): v5p-128, CP64, batch 1, no load "
    "balancing, default remat (full) and splash blocks (512), median step times",
    IRONWOOD: "github.com/AI-Hypercomputer/tpu-recipes training/ironwood/README.md, Llama3.1-70B bf16 table "
    "(the 128K recipe: run_recipe.sh of llama3.1-70b/128k-bf16-tpu7x-4x8x8, sa_block_q/kv 2048)",
}
LLAMA2_7B = "llama2_7b"  # PR #4687's model, not in conf/model (see `model`)


@dataclass(frozen=True)
class Published:
    """One published step: where it ran, how, and what it measured (MFU low..high, or a step time)."""

    label: str
    cluster: str  # conf/cluster name whose chip constants apply
    chips_devices: int  # JAX devices of the run
    model: str  # conf/model name, or llama2_7b
    strategy: str
    mesh: MeshSpec
    length: int
    batch: int  # global sequences per step (per_device_batch_size x devices)
    source: str  # the table it belongs to
    layout: str = "contiguous"  # zigzag = MaxText's causal load balancing
    remat: str = "full"  # MaxText's default
    offload: tuple[str, ...] = ()
    mfu: tuple[float, float] | None = None  # published MFU range (fractions) ...
    step_s: float | None = None  # ... or a published step time
    excluded: str = ""  # why this row is never fitted on ("": it is)
    block_q: int = 512  # splash's, where the source gives them (MaxText's default otherwise)
    block_kv: int = 512

    @property
    def spec(self) -> TrialSpec:
        return _spec(self)

    @property
    def table(self) -> str:
        return self.source

    def published_mfu(self, tflops_per_device: float, peak: float) -> float:
        if self.mfu is not None:
            return sum(self.mfu) / 2
        return tflops_per_device / (self.step_s * peak)

    def published_step(self, tflops_per_device: float, peak: float) -> float:
        """The step in seconds: as published, or model FLOPs over the published MFU's midpoint."""
        if self.step_s is not None:
            return self.step_s
        return tflops_per_device / (self.published_mfu(tflops_per_device, peak) * peak)


def _load(group: str, name: str) -> dict:
    from orchestrator.config.load import group_option  # Hydra's import only when a row is first built

    return group_option(group, name)


@cache
def model(name: str) -> ModelSpec:
    if (
        name == LLAMA2_7B
    ):  # Llama 3.1 8B's shape with multi-head attention, Llama 2's vocabulary, MLP and rope
        return replace(
            model("llama3_1_8b"), name=name, vocab=32000, kv_heads=32, mlp=11008, rope_theta=10000.0
        )
    return ModelSpec(**_load("model", name))


@cache
def cluster(name: str, devices: int) -> ClusterSpec:
    c = cluster_model.load(name)[0]
    return replace(c, hosts=devices // c.devices_per_host)


def _spec(p: Published) -> TrialSpec:
    return TrialSpec(
        model=model(p.model),
        mesh=p.mesh,
        strategy=StrategySpec(name=p.strategy, layout=p.layout, block_q=p.block_q, block_kv=p.block_kv),
        context_length=p.length,
        train=TrainSpec(batch=p.batch, remat=p.remat),
        cluster=cluster(p.cluster, p.chips_devices),
    )


def _lc(
    cluster_: str,
    devices: int,
    length: int,
    cp: int,
    batch: int,
    offload,
    mfu,
    remat="save_attn",
    excluded="",
):
    """A row of the long-context recipes: the Llama3.1-8B variant (head_dim 256), ring CP, zigzag."""
    src = V5P_LC if cluster_ == "v5p_128" else TPU7X_LC
    return Published(
        label=f"{cluster_} 8B-hd256 ring {length // 1024:,}K",
        cluster=cluster_,
        chips_devices=devices,
        model="llama3_1_8b_long",
        strategy="ring",
        layout="zigzag",
        mesh=MeshSpec(fsdp=devices // cp, context=cp),
        length=length,
        batch=batch,
        remat=remat,
        offload=tuple(offload),
        mfu=mfu,
        source=src,
        excluded=excluded,
    )


OUT, BOTH = ("attn_out",), ("attn_out", "layer_input")  # what went to host memory
K, M = 1024, 1024 * 1024
ROWS: list[Published] = [
    _lc("v5p_128", 64, 64 * K, 4, 32, (), (0.673, 0.673)),
    _lc("v5p_128", 64, 256 * K, 16, 8, BOTH, (0.681, 0.681)),
    _lc("v5p_128", 64, 1 * M, 64, 2, OUT, (0.6486, 0.6875)),
    _lc("v5p_128", 64, 2 * M, 64, 2, BOTH, (0.6763, 0.6988)),
    _lc("v5p_128", 64, 4 * M, 64, 2, BOTH, (0.6950, 0.7029)),
    _lc("v5p_128", 64, 10 * M, 64, 1, (), (0.3674, 0.3674), remat="full"),
    _lc("v5p_128", 64, 14 * M, 64, 1, ("layer_input",), (0.3707, 0.3707), remat="offload"),
    _lc("tpu7x_128", 128, 64 * K, 2, 64, (), (0.517, 0.517)),
    _lc("tpu7x_128", 128, 256 * K, 8, 16, (), (0.507, 0.507)),
    _lc("tpu7x_128", 128, 1 * M, 32, 4, (), (0.4998, 0.5090)),
    _lc("tpu7x_128", 128, 2 * M, 64, 2, (), (0.5080, 0.5103)),
    _lc("tpu7x_128", 128, 4 * M, 128, 1, (), (0.5093, 0.5093)),
    _lc(
        "tpu7x_128",
        128,
        4 * M,
        128,
        1,
        (),
        (0.4460, 0.4460),
        excluded="without --xla_tpu_dvfs_p_state=7: a clock the model has no term for",
    ),
    _lc("tpu7x_128", 128, 10 * M, 128, 1, (), (0.5211, 0.5254)),
    _lc("tpu7x_128", 128, 14 * M, 128, 1, BOTH, (0.4871, 0.4880)),
    _lc("tpu7x_128", 128, 16 * M, 128, 1, BOTH, (0.488, 0.488)),
]
# PR #4687: every cell 2M tokens per step on 64 v5p chips, each strategy at its best block size.
for _name, _layout, _mfu, _block in (
    ("ulysses", "contiguous", 0.522, 2048),
    ("all_gather", "zigzag", 0.529, 1024),
    ("ring", "zigzag", 0.285, 1024),
):
    ROWS.append(
        Published(
            label=f"v5p llama2-7b {_name} 32K cp16",
            cluster="v5p_128",
            chips_devices=64,
            model="llama2_7b",
            strategy=_name,
            layout=_layout,
            mesh=MeshSpec(fsdp=4, context=16),
            length=32 * K,
            batch=64,
            remat="save_attn",
            mfu=(_mfu, _mfu),
            source=PR4687,
            block_q=_block,
            block_kv=_block,
        )
    )
ROWS.append(
    Published(
        label="v5p 8B ulysses 64K cp4",
        cluster="v5p_128",
        chips_devices=64,
        model="llama3_1_8b",
        strategy="ulysses",
        mesh=MeshSpec(fsdp=16, context=4),
        length=64 * K,
        batch=32,
        remat="save_attn",
        mfu=(0.530, 0.530),
        source=PR4687,
        block_q=2048,
        block_kv=2048,
    )
)
# PR #4836: median step times, stock Llama3-8B (32 q / 8 kv heads, head_dim 128), CP over all 64 chips.
_USP = {"all_gather": (64, 1), "ring": (64, 1), "usp16x4": (16, 4), "usp8x8": (8, 8), "usp32x2": (32, 2)}
_STEPS = {
    "all_gather": (1.31, 4.03, 14.33),
    "ring": (1.68, 4.63, 15.35),
    "usp16x4": (1.31, 4.02, 13.92),
    "usp8x8": (1.44, 4.05, 13.65),
    "usp32x2": (1.65, 4.52, 14.72),
}
for _key, _steps in _STEPS.items():
    _r, _u = _USP[_key]
    for _length, _step in zip((64 * K, 128 * K, 256 * K), _steps, strict=True):
        ROWS.append(
            Published(
                label=f"v5p 8B {_key} {_length // K}K cp64",
                cluster="v5p_128",
                chips_devices=64,
                model="llama3_1_8b",
                strategy="usp" if _key.startswith("usp") else _key,
                mesh=MeshSpec(context=_r, context_ulysses=_u),
                length=_length,
                batch=1,
                step_s=_step,
                source=PR4836,
            )
        )
ROWS += [
    Published(
        label="tpu7x llama3.1-70b 8K fsdp",
        cluster="tpu7x_128",
        chips_devices=128,
        model="llama3_1_70b",
        strategy="none",
        mesh=MeshSpec(fsdp=128),
        length=8 * K,
        batch=256,
        remat="save_attn",
        step_s=12.20,
        source=IRONWOOD,
    ),
    # MaxText's default context_parallel_strategy (all_gather) with its default load balancing.
    Published(
        label="tpu7x llama3.1-70b 128K cp8",
        cluster="tpu7x_128",
        chips_devices=512,
        model="llama3_1_70b",
        strategy="all_gather",
        layout="zigzag",
        mesh=MeshSpec(fsdp=64, context=8),
        length=128 * K,
        batch=64,
        remat="save_attn",
        step_s=34.02,
        source=IRONWOOD,
        block_q=2048,
        block_kv=2048,
    ),
]
