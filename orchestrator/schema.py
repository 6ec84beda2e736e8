"""The config schema: each key's type (a dataclass field), its range or allowed values (RULES).

A trial's sections take their keys and types from the seam's own dataclasses (jobs/spec.py), so a field added
there is checked without a second list; the driver's switches have small dataclasses here. orchestrator/checks.py
holds a composed config against this before Ray or a tracking store starts. Each key's meaning is a line in
orchestrator/keydocs.py; orchestrator/reference.py renders all three into docs/reference/config.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from jobs import strategies
from jobs.cp_rules import LAYOUTS
from jobs.spec import (
    DTYPES,
    HOST_STATE,
    KERNELS,
    LONG_DOCS,
    MESH_AXES,
    PACKS,
    PROFILE_HOSTS,
    REMAT_NAMES,
    REMATS,
    ClusterSpec,
    ModelSpec,
    RunSpec,
    StrategySpec,
    TrainSpec,
)

DATA_KINDS = ("recall", "tokens", "documents")
TOKEN_DTYPES = ("uint16", "uint32")  # jobs/data.py memory-maps a flat file of these
CLUSTER_KINDS = ("local", "local_multihost", "fake_tpu", "tpu", "address", "fake_gpu", "gpu")
PLATFORMS = ("cpu", "gpu", "tpu")
OUTPUTS = ("table", "json")
PROGRESS = ("auto", "rich", "plain")


@dataclass(frozen=True)
class Rule:
    """What a key accepts beyond its type: a range, a set of names, "auto", or any non-empty string."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    auto: bool = False  # "auto" is also accepted (mesh axes grid.resolve_mesh fills from the cluster)
    nonempty: bool = False


POSITIVE, COUNT, NON_NEGATIVE = Rule(gt=0), Rule(ge=1), Rule(ge=0)
# A tuple[str, ...] key with choices is a list of distinct names from them (checks._names).
RULES: dict[str, Rule] = {
    "context_length": COUNT,
    "model.name": Rule(nonempty=True),
    **{f"model.{k}": COUNT for k in ("vocab", "embed", "layers", "q_heads", "kv_heads", "head_dim", "mlp")},
    "model.rope_theta": POSITIVE,
    "model.norm_eps": POSITIVE,
    "strategy.name": Rule(choices=strategies.NAMES),
    "strategy.layout": Rule(choices=LAYOUTS),
    "strategy.kernel": Rule(choices=KERNELS),
    **{f"strategy.{k}": COUNT for k in ("block_q", "block_kv")},
    **{f"mesh.{k}": COUNT for k in ("data", "fsdp", "tensor")},
    "mesh.context": Rule(ge=1, auto=True),
    "mesh.context_ulysses": Rule(ge=1, auto=True),
    "mesh.dcn": Rule(choices=("", *MESH_AXES)),
    "train.steps": COUNT,
    "train.batch": COUNT,
    "train.dtype": Rule(choices=DTYPES),
    "train.remat": Rule(choices=REMATS, auto=True),  # auto: the planner's fastest fitting policy per point
    "train.lr": NON_NEGATIVE,  # 0 is a throughput-only run; a negative one climbs the loss
    "train.warmup": NON_NEGATIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.grad_clip": POSITIVE,  # optax clips to this global norm: 0 would zero every update
    "train.grad_accum": COUNT,
    "train.seed": NON_NEGATIVE,  # numpy's default_rng rejects negative seeds, on the host, mid-trial
    "train.data.kind": Rule(choices=DATA_KINDS),
    "train.data.dtype": Rule(choices=TOKEN_DTYPES),
    "train.data.pack": Rule(choices=PACKS),
    "train.data.long_docs": Rule(choices=LONG_DOCS),
    "train.memory.save": Rule(choices=REMAT_NAMES),
    "train.memory.offload": Rule(choices=REMAT_NAMES),
    "train.memory.host": Rule(choices=HOST_STATE),
    "run.checkpoint_every": NON_NEGATIVE,  # 0: no checkpoints
    "run.profile_steps": NON_NEGATIVE,  # each entry; step 0 (and steps past train.steps): checks._profile_steps
    "run.profile_hosts": Rule(choices=PROFILE_HOSTS),
    "cluster.name": Rule(nonempty=True),
    "cluster.kind": Rule(choices=CLUSTER_KINDS),
    "cluster.platform": Rule(choices=PLATFORMS),
    **{f"cluster.{k}": COUNT for k in ("hosts", "devices_per_host", "slices", "slices_per_trial")},
    "cluster.dcn_bytes_per_s": NON_NEGATIVE,  # 0: DCN time not modelled
    "cluster.peak_tflops_per_device": NON_NEGATIVE,  # 0: measured on the spot
    "cluster.hbm_bytes_per_device": NON_NEGATIVE,
    "cluster.ici_bytes_per_s": NON_NEGATIVE,
    "cluster.max_step_seconds": NON_NEGATIVE,  # 0: no budget
    "cluster.concurrency": NON_NEGATIVE,  # 0: one trial per slice
    "cluster.matmul_efficiency": Rule(gt=0, le=1),  # a fraction of peak
    "cluster.attention_efficiency": Rule(gt=0, le=1),
    "cluster.attention_head_dim_half": NON_NEGATIVE,
    "cluster.attention_block_half": NON_NEGATIVE,
    "cluster.attention_recompute": NON_NEGATIVE,
    "cluster.collective_links": Rule(gt=0),
    "cluster.step_overhead_s": NON_NEGATIVE,
    "cluster.host_bytes_per_s": NON_NEGATIVE,  # 0: offload transfers not modelled
    "cluster.compile_seconds": NON_NEGATIVE,
    "cluster.price_per_chip_hour": NON_NEGATIVE,
    "tracking.uri": Rule(nonempty=True),
    "tracking.experiment": Rule(nonempty=True),
    "output": Rule(choices=OUTPUTS),
    "progress": Rule(choices=PROGRESS),
    "top": COUNT,
    "aot_workers": NON_NEGATIVE,  # 0: one compile per CPU the Ray cluster has
    "aot_draws": Rule(ge=1),
    "budget.chip_hours": NON_NEGATIVE,  # 0: no budget
    "search.batch": COUNT,  # each entry of the list
    "search.grad_accum": COUNT,
    "retries.preemption": NON_NEGATIVE,
    "retries.failure": NON_NEGATIVE,
    "gate.max_drop": Rule(ge=0, le=1),  # a fraction of the baseline; above 1 it could never trip
    "gate.window": COUNT,  # baseline runs the median is taken over
    "gate.noise_k": NON_NEGATIVE,  # 0: the band is max_drop whatever the noise
}


@dataclass(frozen=True)
class MeshConfig:
    """conf/mesh/: fixed axis sizes; the context axes may be "auto" until grid.resolve_mesh fills them."""

    data: int
    fsdp: int
    tensor: int
    context: int | str = "auto"
    context_ulysses: int | str = "auto"
    dcn: str = ""  # the axis across slices (cluster.slices_per_trial > 1)


@dataclass(frozen=True)
class ClusterConfig(ClusterSpec):
    """conf/cluster/: ClusterSpec's keys, with `env` as YAML writes it, a mapping of names to strings (the
    frozen spec keeps it as sorted pairs, to stay hashable)."""

    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PointConfig:
    """One grid point before it becomes a TrialSpec: the only keys a sweep may set."""

    model: ModelSpec
    strategy: StrategySpec
    mesh: MeshConfig
    cluster: ClusterConfig
    context_length: int
    train: TrainSpec
    run: RunSpec


@dataclass(frozen=True)
class Tracking:
    uri: str
    experiment: str
    artifact_location: str = ""


@dataclass(frozen=True)
class Retries:
    """Separate budgets: a lost host (preemption) is not a bug (failure)."""

    preemption: int = 3
    failure: int = 1


@dataclass(frozen=True)
class Gate:
    """The regression gate (orchestrator.regress): baseline, the median of the last `window` runs; band,
    max(max_drop, noise_k x their ± spread)."""

    enabled: bool = True
    max_drop: float = 0.10
    window: int = 5
    noise_k: float = 1.5


@dataclass(frozen=True)
class Budget:
    chip_hours: float = 0.0  # a sweep predicted to need more is refused before launch (0: no budget)


@dataclass(frozen=True)
class Search:
    """recommend=true: sizes the search may choose besides the point's own (empty: the point's value only)."""

    batch: tuple[int, ...] = ()  # global batches to try, in sequences
    grad_accum: tuple[int, ...] = ()  # microbatches per step to try


@dataclass(frozen=True)
class SweepConfig:
    """conf/sweep/: the grid's shape (axes, zip, set) is checked by grid.points."""

    name: str = ""
    id: str = ""
    axes: dict = field(default_factory=dict)
    zip: list = field(default_factory=list)
    set: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    """The driver's switches: one value for the whole sweep, never part of a trial."""

    tracking: Tracking
    dry_run: bool = False
    output: str = "table"
    aot: bool = False
    aot_topology: str = ""
    aot_workers: int = 0  # compiles at once on the Ray pool (0: one per CPU)
    aot_cache: str = (
        ""  # the shared compile cache: a directory or gs://bucket/prefix ("": $CP_AOT_CACHE or .cache/aot)
    )
    aot_draws: int = 1  # compiles per point, each in its own process; judged by the worst (aot.draws)
    record: bool = False  # with dry_run: the plan as planned MLflow runs
    skip_invalid: bool = False
    progress: str = "auto"
    recommend: bool = False  # print the fastest strategy x mesh x memory policy for the point; start nothing
    top: int = 5  # with recommend: how many configurations
    search: Search = field(default_factory=Search)
    retries: Retries = field(default_factory=Retries)
    gate: Gate = field(default_factory=Gate)
    budget: Budget = field(default_factory=Budget)
    sweep: SweepConfig | None = None


TRIAL_KEYS = tuple(f.name for f in dataclasses.fields(PointConfig))
