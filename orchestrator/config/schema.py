"""The config schema: each key's type (a dataclass field), its range or allowed values (RULES), its meaning (DOCS),
and the error bad input raises (ConfigError, one Problem per line).

A trial's sections take their keys and types from the seam's own dataclasses (jobs/spec.py), so a field added
there is checked without a second list; the driver's switches have small dataclasses here.
orchestrator/config/keys.py holds a composed config against this before Ray or a tracking store starts;
docs/gen/reference.py renders it into docs/reference/config.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jobs import strategies
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
from jobs.strategies.rules import LAYOUTS
from orchestrator.plan.hardware import ClusterModel

DATA_KINDS = ("recall", "tokens", "documents")
TOKEN_DTYPES = ("uint16", "uint32")  # jobs/data/__init__.py memory-maps a flat file of these
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
class ClusterConfig(ClusterModel, ClusterSpec):
    """conf/cluster/: ClusterSpec's keys (what the hosts get) and ClusterModel's (what the planner prices with),
    with `env` as YAML writes it, a mapping of names to strings (the frozen spec keeps it as sorted pairs, to
    stay hashable)."""

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
    """The regression gate (orchestrator.results.gate): baseline, the median of the last `window` runs; band,
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


DOCS: dict[str, str] = {
    # --- top level: the trial's length and the driver's switches (one value for the whole sweep) -------------
    "context_length": "Tokens per sequence (L): what the context-parallel strategies split over the context axes.",
    "dry_run": "Plan and print the grid (verdict, predicted memory, step time and MFU per point); start no Ray, "
    "train nothing.",
    "output": "How `dry_run` prints the plan: a rich table, or JSON rows (one per grid point).",
    "aot": "With `dry_run`: also compile every valid point ahead of time for the cluster's TPU topology and "
    "print analytic vs compiled memory (needs libtpu: `pip install -e '.[tpu]'`).",
    "aot_topology": 'Topology for the `aot` compile instead of `cluster.topology`, e.g. `2x2x1` ("": the cluster\'s).',
    "aot_workers": "With `aot`: compiles at once, each a Ray task reserving the host memory a compile of its "
    "size needs (0: one per CPU of the Ray cluster).",
    "aot_cache": "With `aot`: the compile cache shared by every user and the nightly sweep, a directory or "
    '`gs://bucket/prefix`, keyed by the program\'s hash ("": `$CP_AOT_CACHE`, else `.cache/aot`).',
    "aot_draws": "With `aot`: compiles per point, each in a fresh process made to differ from the others; the "
    "verdict goes by the worst draw and states the spread (libtpu's peak for one program varies by process).",
    "record": "With `dry_run`: record the plan in MLflow as planned runs (sweep id `<id>-plan`, tag "
    "`planned=true`), with plots.",
    "skip_invalid": "Run the valid grid points even when some are invalid (without it an invalid point means "
    "exit code 2, nothing launched).",
    "progress": "Progress display: `rich` (a live table), `plain` (a log line per state change), `auto` "
    "(rich on a terminal, else plain).",
    "recommend": "For one point (model, cluster, context length): search every strategy x mesh x memory policy "
    "and print the `top` fastest that fit, each with its predicted step time, MFU, HBM and command line, and "
    "why the other strategies and policy families lose; start nothing. Nothing fits: exit 2.",
    "top": "With `recommend`: how many configurations to list (each a strategy and mesh under its best policy).",
    "search": "With `recommend`: sizes the search may choose besides the point's own, ranked by predicted "
    "seconds per token so a larger batch wins only if it raises throughput.",
    "search.batch": "Global batches (sequences per step) the recommender may choose, e.g. `[1,2,4]`; each must "
    "divide over the mesh's data x fsdp axes (empty: the point's `train.batch` only).",
    "search.grad_accum": "Microbatches per step the recommender may choose, e.g. `[1,2,4]`: less activation "
    "memory, each microbatch repeating the step's collectives (empty: the point's `train.grad_accum` only).",
    # --- model: conf/model/ ----------------------------------------------------------------------------------
    "model": "The model: a Llama-family dense decoder (RMSNorm, RoPE, GQA, SwiGLU), layers stacked and scanned.",
    "model.name": "Model name, shown in params, plan rows and plot titles.",
    "model.vocab": "Vocabulary size V (tokens); the unembedding is E x V.",
    "model.embed": "Hidden width E.",
    "model.layers": "Decoder layers N.",
    "model.q_heads": "Query heads Hq; a Ulysses degree must divide Hq / tensor.",
    "model.kv_heads": "Key/value heads Hkv (grouped-query attention: Hq is a multiple of it); `mesh.tensor` "
    "must divide it.",
    "model.head_dim": "Head dimension D.",
    "model.mlp": "SwiGLU hidden width M.",
    "model.rope_theta": "RoPE base frequency theta (positions are the tokens' true positions, also under zigzag).",
    "model.norm_eps": "RMSNorm epsilon.",
    "model.tie_embeddings": "Share one V x E table between the input embedding and the unembedding.",
    # --- strategy: conf/strategy/ ----------------------------------------------------------------------------
    "strategy": "Which context-parallel (CP) attention, its token layout and its local kernel.",
    "strategy.name": "CP strategy from the registry (jobs/strategies); `none` is the dense reference "
    "(context axes of size 1).",
    "strategy.layout": "Token order over the context shards: `zigzag` (2R chunks, device r holds r and 2R-1-r: "
    "equal causal work, needs context_length % 2R == 0), `contiguous` (natural order), or `balanced` (packed "
    "documents only: each row's document pieces assigned by their attention work, xla kernel).",
    "strategy.kernel": "Local attention kernel: `auto` (splash on TPU, flash on GPU, xla elsewhere), `xla` "
    "(blockwise, every backend), `splash` (Pallas, TPU only), `flash` (GPU only).",
    "strategy.block_q": "Query block of the local kernel, in tokens.",
    "strategy.block_kv": "Key/value block of the local kernel, in tokens.",
    # --- mesh: conf/mesh/ ------------------------------------------------------------------------------------
    "mesh": "Device mesh axis sizes (jobs/mesh.py owns the axes); their product must equal the trial's devices "
    "(`mesh=auto` fills the context axes).",
    "mesh.data": "Data-parallel axis: the batch is split over data x fsdp.",
    "mesh.fsdp": "Fully-sharded data-parallel axis: splits the batch; parameters and AdamW state are sharded "
    "over every axis but tensor.",
    "mesh.tensor": "Tensor-parallel axis: splits the heads and the MLP.",
    "mesh.context": "Context (sequence) axis: the whole CP degree for single-axis strategies, the ring of usp, "
    "the outer ring of double_ring; `auto`: every device not on data, fsdp or tensor, split as the strategy says.",
    "mesh.context_ulysses": "Inner context axis: usp's Ulysses degree, double_ring's inner ring (1 for the "
    "others); `auto`: chosen by the strategy (usp: the largest the heads allow).",
    "mesh.dcn": "The axis laid across slices over DCN when `cluster.slices_per_trial` > 1 (its outer factor "
    'indexes the slice); "": one slice.',
    # --- cluster: conf/cluster/ ------------------------------------------------------------------------------
    "cluster": "Where trials run, and the hardware and step-time constants the planner prices them with; "
    "execution only, never part of the trial id.",
    "cluster.name": "Cluster name: param and parent-run tag `cluster`; the regression gate compares runs of the "
    "same cluster only.",
    "cluster.kind": "How Ray is reached: `local` (a Ray started here), `local_multihost` (several JAX processes "
    "here, joined by jax.distributed), `fake_tpu` (local nodes posing as TPU hosts), `tpu` (real slices "
    "reserved with ray.util.tpu), `gpu` (an existing Ray cluster of GPU nodes at `cluster.address`; a node is a "
    "one-host slice, `hosts: 1`, its GPUs `devices_per_host`, so `slices_per_trial` nodes make a trial and "
    "`mesh.dcn` names the axis across them; each trial reserves its nodes whole in one STRICT_SPREAD placement "
    "group), `fake_gpu` (local nodes advertising `devices_per_host` GPUs, simulated CPU devices underneath), "
    "`address` (an existing Ray cluster at `cluster.address`).",
    "cluster.platform": "JAX backend of the hosts; `cpu` simulates `devices_per_host` devices per process.",
    "cluster.accelerator": "Chip name (`v5p`, `tpu7x`, `cpu`): the spec-sheet peak when "
    "`peak_tflops_per_device` is 0, and the TPU generation of slice reservations and AOT compiles.",
    "cluster.hosts": "Hosts per slice, one JAX process each (1 on GPU: a node is a slice).",
    "cluster.devices_per_host": "JAX devices per host (a v5p chip is one device, a tpu7x chip two).",
    "cluster.slices": "Slices in the cluster: trials at once are slices // slices_per_trial (on TPU, counted "
    "from the slices Ray sees, on GPU the nodes); a fake_tpu or fake_gpu cluster starts this many.",
    "cluster.slices_per_trial": "Slices one trial spans (multislice over DCN; `mesh.dcn` names the axis "
    "across them).",
    "cluster.topology": 'TPU slice topology, e.g. `4x4x4`, for slice reservations and AOT compiles ("": not a TPU).',
    "cluster.peak_tflops_per_device": "Peak bf16 TFLOP/s per JAX device, MFU's denominator; 0: the "
    "accelerator's spec-sheet peak, or on CPU a matmul measured on the spot (labelled `cpu_measured_<dtype>`).",
    "cluster.hbm_bytes_per_device": "Device memory per JAX device, in bytes: points the planner predicts "
    "above it are infeasible (0: no limit).",
    "cluster.ici_bytes_per_s": "ICI bandwidth of one link, one direction, in bytes/s (planner; 0: 1e11 assumed).",
    "cluster.dcn_bytes_per_s": "Data-centre network bandwidth per host, one direction, in bytes/s (planner; "
    "0: DCN time not modelled).",
    "cluster.max_step_seconds": "Planner's budget, in seconds per step: points predicted slower are "
    "infeasible on this cluster (0: no budget).",
    "cluster.compile_seconds": "Planner's cost: seconds one attempt's compile holds the trial's chips, "
    "added to its steps' chip-hours (0: not counted).",
    "cluster.price_per_chip_hour": "What one chip-hour costs you (any currency; no default: prices differ by "
    "contract and region). With it the plan shows each point's cost next to its chip-hours (0: chip-hours "
    "only).",
    "cluster.concurrency": "Trials at once (0: one per `slices_per_trial` slices; on TPU the slices Ray sees, "
    "on GPU its nodes).",
    "cluster.address": 'Ray address: "" starts a local Ray (or the fake TPU or GPU cluster), `auto` joins the '
    "cluster this machine belongs to, `ray://host:port` connects.",
    "cluster.env": "Extra environment of every host process, name -> string (quote numbers), set per attempt "
    "before JAX starts, e.g. `NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`, or `XLA_FLAGS` (appended to the platform's "
    "own flags, never replacing them).",
    "cluster.matmul_efficiency": "Step-time model: fraction of peak the layer matmuls reach.",
    "cluster.attention_efficiency": "Step-time model: the attention kernel's fraction of peak at large "
    "head_dim and blocks.",
    "cluster.attention_head_dim_half": "Step-time model: head_dim Dh at which softmax work halves the kernel's "
    "rate (x D/(D+Dh); 0: no head_dim effect).",
    "cluster.attention_block_half": "Step-time model: tokens per hop bh at which per-hop cost halves the "
    "kernel's rate (x b/(b+bh); 0: no block effect).",
    "cluster.attention_recompute": "Step-time model: attention forwards replayed in backward when remat does "
    "not keep the attention output.",
    "cluster.collective_links": "Step-time model: ICI links an all-gather or all-to-all drives at once (a "
    "ring hop uses one).",
    "cluster.step_overhead_s": "Step-time model: fixed seconds per step (dispatch, optimizer update, host loop).",
    "cluster.host_bytes_per_s": "Step-time model: host offload bandwidth per device, in bytes/s (0: offload "
    "transfers not modelled).",
    # --- train -----------------------------------------------------------------------------------------------
    "train": "Training settings of a trial.",
    "train.steps": "Optimizer steps per trial; each attempt's first step is warm-up, left out of the median "
    "step time.",
    "train.batch": "Global batch, in sequences of `context_length` tokens; a multiple of data x fsdp x "
    "grad_accum.",
    "train.dtype": "Compute dtype; parameters and AdamW state stay float32.",
    "train.remat": "Rematerialisation preset: `none` (keep every residual), `full` (recompute each layer in "
    "backward, keep its input), `save_attn` (also keep attention outputs), `offload` (layer inputs in pinned "
    "host memory), or `auto`: per grid point the planner's fastest memory policy that fits (a preset plus "
    "`train.memory`), resolved before launch, so the trial id, params and tags name the policy, never `auto`.",
    "train.lr": "AdamW peak learning rate: linear warm-up from 0, then cosine decay to lr/10 at the last step "
    "(0: a throughput-only run).",
    "train.warmup": "Warm-up steps of the learning rate.",
    "train.weight_decay": "AdamW decoupled weight decay.",
    "train.grad_clip": "Global gradient norm the update is clipped to.",
    "train.grad_accum": "Micro-batches accumulated per step (the batch is split into this many).",
    "train.seed": "Seed of the parameter init and the data (a batch is a pure function of seed and step).",
    "train.data": "What a trial trains on.",
    "train.data.kind": "`recall`: a synthetic key-value recall task whose answers sit ~L/2 tokens back (the "
    "loss beats ln 8 only if attention across devices is right); `tokens`: the token file at `path`; "
    "`documents`: pre-tokenized documents packed into rows (`sources`), attention never crossing a document.",
    "train.data.path": "Flat token file, local or `gs://bucket/object`, memory-mapped (each host reads its own "
    'shards); "" with `recall`.',
    "train.data.dtype": "Element type of the token file.",
    "train.data.sources": "With `documents`: ArrayRecord or Parquet shard files, or directories / `gs://` "
    "prefixes of them (one format each), as `python -m jobs.data.documents.corpus` writes (empty: `path` alone).",
    "train.data.weights": "With `documents`: the sources' mixture weights, one per source (empty: uniform).",
    "train.data.pack": "With `documents`: `first_fit` (each document into the first row with room) or "
    "`concat` (concatenated, then cut into rows).",
    "train.data.long_docs": "With `documents`: a document longer than a row is `split` into row-sized "
    "documents, or `truncate`d to one row.",
    "train.memory": "What the step keeps where, on top of the `train.remat` preset; left out of the trial id "
    "while all three lists are empty.",
    "train.memory.save": "Residuals kept in HBM between forward and backward instead of recomputed.",
    "train.memory.offload": "Residuals kept in pinned host memory between forward and backward.",
    "train.memory.host": "Train state kept in pinned host memory between steps (a TPU feature for now: on GPU "
    "it raised the compiled peak).",
    # --- run ---------------------------------------------------------------------------------------------------
    "run": "Execution details of a trial (where it checkpoints, how often, which steps it traces); not part of "
    "the trial id.",
    "run.checkpoint_dir": "Checkpoint root, local or `gs://`; a trial saves under `<root>/<sweep_id>/<trial_id>` "
    '("": `./.cache/checkpoints`).',
    "run.checkpoint_every": "Steps between orbax checkpoints (0: none); a retry or a rerun of the sweep resumes "
    "from the last one.",
    "run.profile_steps": "Steps to trace with `jax.profiler`, e.g. `[2,3]` (consecutive steps share one trace; "
    "never step 0, the warm-up); the trace files go to the trial's run under `profile/`, its breakdown to "
    "`measured/*` metrics, and the traced steps stay out of the median step time ([]: off).",
    "run.profile_hosts": "Which processes trace `run.profile_steps`: `first` (process 0) or `all` (each "
    "process's files under its own `profile/` folder; the metrics are process 0's).",
    # --- tracking: conf/tracking/ ------------------------------------------------------------------------------
    "tracking": "The MLflow store the driver writes to (workers never talk to MLflow); `tracking=none` records "
    "nothing.",
    "tracking.uri": "MLflow tracking URI: `sqlite:///mlflow.db` (a file in the working directory), a "
    "server's `http(s)://` URL, or `none` (no store: nothing recorded, no regression gate).",
    "tracking.experiment": "MLflow experiment of the sweep's runs (created when missing).",
    "tracking.artifact_location": "Artifact root of the experiment when this driver creates it, e.g. "
    '`gs://bucket/prefix` ("": the store\'s default).',
    # --- retries, gate -------------------------------------------------------------------------------------------
    "retries": "Retry budgets per trial, one per outcome kind: a lost host is not a bug.",
    "retries.preemption": "Reruns after a preemption (a host, node or slice lost); with `run.checkpoint_every` "
    "> 0 each resumes from the last checkpoint.",
    "retries.failure": "Reruns after an exception in the job; out of memory (`infeasible`) is never retried.",
    "budget": "Refusals before launch, on the plan's predicted cost.",
    "budget.chip_hours": "Largest predicted chip-hours for the sweep's runnable points (steps x predicted step "
    "time plus `cluster.compile_seconds`, times the trial's chips); above it the CLI exits 2 naming the most "
    "expensive points and what would fit (0: no budget).",
    "gate": "The regression gate after a sweep: each finished trial against the median of the last "
    "`gate.window` finished runs of its trial id on the same cluster, one per earlier sweep (planned runs never "
    "count).",
    "gate.enabled": "Run the regression gate when the sweep ends (not with `tracking=none`: no baseline).",
    "gate.max_drop": "Narrowest band: the largest drop of `final_mfu` or `final_tokens_per_s`, a fraction of "
    "the baseline median, allowed however quiet the baseline runs were (the whole band with one earlier run); "
    "beyond the band the parent run gets `regression=true` and the CLI exits 3.",
    "gate.window": "Baseline runs: the median of the last this many finished runs of the trial, one per earlier "
    "sweep.",
    "gate.noise_k": "Band width in noise: the band is max(`gate.max_drop`, this x the baseline runs' ± spread, "
    "(max - min) / (2 median)); 1.5 passes a quiet rerun half as far again below the median as the runs "
    "strayed, and still catches a 30 % drop while they stray under ±20 % (0: the band is `gate.max_drop`).",
    # --- sweep: conf/sweep/, added with +sweep=NAME ------------------------------------------------------------
    "sweep": "The grid: absent (a single trial) unless added with `+sweep=NAME`.",
    "sweep.name": "Sweep name: the parent run's `sweep_name` tag, and the start of a fresh sweep id.",
    "sweep.id": 'Sweep instance: "" makes a fresh `<name>-<YYYYmmdd-HHMMSS>`; a fixed id resumes it, skipping '
    "its finished trials.",
    "sweep.axes": "Grid axes, axis -> list of values: `model`, `strategy`, `mesh`, `cluster` take option names, "
    "any other axis is a dotted trial key; `${cp_strategies:}` is every registered CP strategy.",
    "sweep.zip": "Lists of axis names whose values move together (equal lengths) instead of being crossed.",
    "sweep.set": "Dotted trial key -> value, set on every grid point.",
}


class ConfigError(ValueError):
    """Bad input found before anything starts: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Problem:
    """One bad key: what is wrong and what is allowed; `line(where)` adds the grid point (a ConfigError's text)."""

    key: str
    value: Any  # dataclasses.MISSING: the key itself is the problem (unknown or missing)
    wrong: str
    allowed: str
    fix: str

    def line(self, where: str) -> str:
        shown = self.key if self.value is dataclasses.MISSING else f"{self.key}={self.value!r}"
        return f"{shown} {self.wrong} ({where}); allowed: {self.allowed} — {self.fix}"
