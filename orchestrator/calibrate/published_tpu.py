"""Published TPU training runs the step-time model is calibrated and checked on, each with its source.

MFU is against bf16 peak with MaxText's current causal FLOP count: every row is from 2026, and jobs/flops.py
reproduces each TFLOP/s a source gives to within 0.6 % (step-time rounding), so no row needs the pre-mid-2025
full-attention correction. Runs that give a range (a microbenchmark and the recipe's own run) keep both
ends; the model is compared with the midpoint.

MaxText `remat_policy=custom` with `context` (the attention output) saved or offloaded and the other names
rematerialised is our `save_attn`; `offload` lists what went to host memory. `held_out` rows are never used
to fit: every row of 8M tokens or more, and the ones named with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator import REPO
from orchestrator.plan import hardware

CONF = REPO / "conf"
V5P_LC, TPU7X_LC = "tpu-recipes v5p 8B-LC", "tpu-recipes Ironwood 8B-LC"
PR4687, PR4836, IRONWOOD = "MaxText #4687", "MaxText #4836", "tpu-recipes Ironwood"
SOURCES = {  # tag -> where the figures are (the sources' tables, "Measured MFU" / step time columns)
    V5P_LC: "github.com/AI-Hypercomputer/tpu-recipes training/v5p/Llama3.1-8B-LongContext-Maxtext/"
    "cluster_toolkit/README.md (runs of 2026-10-05)",
    TPU7X_LC: "github.com/AI-Hypercomputer/tpu-recipes training/ironwood/Llama3.1-8B-LongContext-Maxtext/"
    "cluster_toolkit/README.md (runs of 2026-10-05)",
    PR4687: "github.com/AI-Hypercomputer/maxtext/pull/4687 (Ulysses CP): v5p-128, 2M tokens/step, "
    "remat custom context=device",
    PR4836: "github.com/AI-Hypercomputer/maxtext/pull/4836 (USP CP): v5p-128, CP64, batch 1, no load "
    "balancing, default remat (full), median step times",
    IRONWOOD: "github.com/AI-Hypercomputer/tpu-recipes training/ironwood/README.md, Llama3.1-70B bf16 table",
}
LLAMA2_7B = ModelSpec(
    "llama2_7b",
    vocab=32000,
    embed=4096,
    layers=32,
    q_heads=32,
    kv_heads=32,
    head_dim=128,
    mlp=11008,
    rope_theta=10000.0,
)


@dataclass(frozen=True)
class Published:
    """One published step: where it ran, how, and what it measured (MFU low..high, or a step time)."""

    label: str
    cluster: str  # conf/cluster name whose chip constants apply
    chips_devices: int  # JAX devices of the run
    model: str  # conf/model name, or llama2_7b
    strategy: str
    layout: str  # zigzag = MaxText's causal load balancing
    mesh: MeshSpec
    length: int
    batch: int  # global sequences per step (per_device_batch_size x devices)
    remat: str
    offload: tuple[str, ...]
    mfu: tuple[float, float] | None  # published MFU range (fractions)
    step_s: float | None  # or a published step time
    source: str
    held_out: str = ""  # why this row is never fitted on ("" = calibration)

    @property
    def spec(self) -> TrialSpec:
        return _spec(self)

    def published_mfu(self, tflops_per_device: float, peak: float) -> float:
        if self.mfu is not None:
            return sum(self.mfu) / 2
        return tflops_per_device / (self.step_s * peak)


def _load(group: str, name: str) -> dict:
    from orchestrator.config.load import group_option  # Hydra's import only when a row is first built

    return group_option(group, name)


@cache
def model(name: str) -> ModelSpec:
    if name == LLAMA2_7B.name:
        return LLAMA2_7B
    return ModelSpec(**_load("model", name))


@cache
def cluster(name: str, devices: int) -> ClusterSpec:
    c = hardware.load(name)[0]
    return replace(c, hosts=devices // c.devices_per_host)


def _spec(p: Published) -> TrialSpec:
    return TrialSpec(
        model=model(p.model),
        mesh=p.mesh,
        strategy=StrategySpec(name=p.strategy, layout=p.layout),
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
    src,
    remat="save_attn",
    held_out="",
) -> Published:
    """A row of the long-context recipes: the Llama3.1-8B variant (head_dim 256), ring CP, zigzag."""
    mesh = MeshSpec(fsdp=devices // cp, context=cp)
    label = f"{cluster_} 8B-hd256 ring {length // 1024:,}K"
    return Published(
        label,
        cluster_,
        devices,
        "llama3_1_8b_long",
        "ring",
        "zigzag",
        mesh,
        length,
        batch,
        remat,
        tuple(offload),
        mfu,
        None,
        src,
        held_out,
    )


OUT, BOTH = ("attn_out",), ("attn_out", "layer_input")  # what went to host memory
K, M = 1024, 1024 * 1024
LONG = "8M tokens or more"
# fmt: off
ROWS: list[Published] = [
    _lc("v5p_128", 64, 64 * K, 4, 32, (), (0.673, 0.673), V5P_LC),
    _lc("v5p_128", 64, 256 * K, 16, 8, BOTH, (0.681, 0.681), V5P_LC),
    _lc("v5p_128", 64, 1 * M, 64, 2, OUT, (0.6486, 0.6875), V5P_LC),
    _lc("v5p_128", 64, 2 * M, 64, 2, BOTH, (0.6763, 0.6988), V5P_LC),
    _lc("v5p_128", 64, 4 * M, 64, 2, BOTH, (0.6950, 0.7029), V5P_LC),
    _lc("v5p_128", 64, 10 * M, 64, 1, (), (0.3674, 0.3674), V5P_LC, remat="full", held_out=LONG),
    _lc("v5p_128", 64, 14 * M, 64, 1, ("layer_input",), (0.3707, 0.3707), V5P_LC, remat="offload", held_out=LONG),
    _lc("tpu7x_128", 128, 64 * K, 2, 64, (), (0.517, 0.517), TPU7X_LC),
    _lc("tpu7x_128", 128, 256 * K, 8, 16, (), (0.507, 0.507), TPU7X_LC),
    _lc("tpu7x_128", 128, 1 * M, 32, 4, (), (0.4998, 0.5090), TPU7X_LC),
    _lc("tpu7x_128", 128, 2 * M, 64, 2, (), (0.5080, 0.5103), TPU7X_LC),
    _lc("tpu7x_128", 128, 4 * M, 128, 1, (), (0.5093, 0.5093), TPU7X_LC),
    _lc("tpu7x_128", 128, 4 * M, 128, 1, (), (0.4460, 0.4460), TPU7X_LC,
        held_out="without --xla_tpu_dvfs_p_state=7: a clock the model has no term for"),
    _lc("tpu7x_128", 128, 10 * M, 128, 1, (), (0.5211, 0.5254), TPU7X_LC, held_out=LONG),
    _lc("tpu7x_128", 128, 14 * M, 128, 1, BOTH, (0.4871, 0.4880), TPU7X_LC, held_out=LONG),
    _lc("tpu7x_128", 128, 16 * M, 128, 1, BOTH, (0.488, 0.488), TPU7X_LC, held_out=LONG),
]
# fmt: on
# PR #4687: every cell 2M tokens per step on 64 v5p chips.
for _name, _layout, _mfu in (
    ("ulysses", "contiguous", 0.522),
    ("all_gather", "zigzag", 0.529),
    ("ring", "zigzag", 0.285),
):
    ROWS.append(
        Published(
            f"v5p llama2-7b {_name} 32K cp16",
            "v5p_128",
            64,
            "llama2_7b",
            _name,
            _layout,
            MeshSpec(fsdp=4, context=16),
            32 * K,
            64,
            "save_attn",
            (),
            (_mfu, _mfu),
            None,
            PR4687,
        )
    )
ROWS.append(
    Published(
        "v5p 8B ulysses 64K cp4",
        "v5p_128",
        64,
        "llama3_1_8b",
        "ulysses",
        "contiguous",
        MeshSpec(fsdp=16, context=4),
        64 * K,
        32,
        "save_attn",
        (),
        (0.530, 0.530),
        None,
        PR4687,
        held_out="chosen: stock 8B (head_dim 128) at a length no fitted head_dim-128 row has",
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
                f"v5p 8B {_key} {_length // K}K cp64",
                "v5p_128",
                64,
                "llama3_1_8b",
                _key[:3] if _key.startswith("usp") else _key,
                "contiguous",
                MeshSpec(context=_r, context_ulysses=_u),
                _length,
                1,
                "full",
                (),
                None,
                _step,
                PR4836,
                held_out="chosen: the 256K column of PR #4836" if _length == 256 * K else "",
            )
        )
ROWS += [
    Published(
        "tpu7x llama3.1-70b 8K fsdp",
        "tpu7x_128",
        128,
        "llama3_1_70b",
        "none",
        "contiguous",
        MeshSpec(fsdp=128),
        8 * K,
        256,
        "save_attn",
        (),
        None,
        12.20,
        IRONWOOD,
    ),
    # MaxText's default context_parallel_strategy (all_gather) with its default load balancing.
    Published(
        "tpu7x llama3.1-70b 128K cp8",
        "tpu7x_128",
        512,
        "llama3_1_70b",
        "all_gather",
        "zigzag",
        MeshSpec(fsdp=64, context=8),
        128 * K,
        64,
        "save_attn",
        (),
        None,
        34.02,
        IRONWOOD,
        held_out="chosen: the only 70B long-context run",
    ),
]
