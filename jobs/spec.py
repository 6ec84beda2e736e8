"""The seam: a frozen, JSON-serialisable TrialSpec in; metric records (plain dicts) out.

Pure Python (no jax, ray or mlflow) so both planes import it. The trial id hashes only the
identity block (what changes the result); the execution block (cluster, paths) never enters it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MESH_AXES = ("data", "fsdp", "context", "context_ulysses", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch is sharded over these
REMAT_NAMES = ("layer_input", "attn_out", "mlp_act")  # jobs/model.py's checkpoint_names, per layer
HOST_STATE = ("optimizer", "params")  # train state that may live in pinned host memory between steps
# train.remat presets as (saved, offloaded) residual names; "none" has no jax.checkpoint at all.
# jobs/model.py builds each preset's jax.checkpoint policy from these.
REMAT_PRESETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "full": ((), ()),
    "save_attn": (("attn_out",), ()),
    "offload": ((), ("layer_input",)),
}
REMATS = ("none", *REMAT_PRESETS)
DTYPES = ("bfloat16", "float32")  # train.dtype: jax.numpy's names (jobs/step.py looks them up there)
# Local attention kernels and the platform each needs (None: every backend); jobs/attention/kernels/__init__.py
# implements each name. auto: splash on TPU, flash on GPU, xla elsewhere.
KERNEL_PLATFORM: dict[str, str | None] = {"auto": None, "xla": None, "splash": "tpu", "flash": "gpu"}
KERNELS = tuple(KERNEL_PLATFORM)
# Tokens per device per unembedding chunk of jobs/model.loss_fn (the planner's memory model sizes the logits
# by it); unchunked, the logits are the largest term at 14M tokens.
LOSS_CHUNK = 8192


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-family dense decoder (RMSNorm, RoPE, GQA, SwiGLU)."""

    name: str
    vocab: int
    embed: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def n_params(self) -> int:
        attn = self.embed * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)
        ffn = 3 * self.embed * self.mlp
        per_layer = attn + ffn + 2 * self.embed
        emb = self.vocab * self.embed * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + emb + self.embed


@dataclass(frozen=True)
class MeshSpec:
    """Sizes of the fixed mesh axes. Two-axis strategies shard the sequence over context (outer, major) x
    context_ulysses (inner): usp's Ulysses groups, double_ring's inner rings (the name is usp's)."""

    data: int = 1
    fsdp: int = 1
    context: int = 1
    context_ulysses: int = 1
    tensor: int = 1
    # The axis laid across slices (over DCN) when a trial spans cluster.slices_per_trial > 1: its outer
    # factor indexes the slice, the rest of the mesh stays inside one slice (ICI). "": one slice.
    dcn: str = ""

    @property
    def size(self) -> int:
        return self.data * self.fsdp * self.context * self.context_ulysses * self.tensor

    @property
    def cp(self) -> int:
        return self.context * self.context_ulysses

    def shape(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in MESH_AXES}

    def label(self) -> str:
        shape = "x".join(f"{a}{getattr(self, a)}" for a in MESH_AXES if getattr(self, a) > 1) or "single"
        return f"{shape}/dcn:{self.dcn}" if self.dcn else shape


@dataclass(frozen=True)
class StrategySpec:
    """Which context-parallel attention, its layout and its local kernel."""

    name: str = "ring"
    layout: str = "zigzag"  # zigzag (load-balanced causal order) | contiguous
    kernel: str = (
        "auto"  # auto (splash on TPU, flash on GPU, else xla) | xla (every backend) | splash | flash
    )
    block_q: int = 512
    block_kv: int = 512


PACKS, LONG_DOCS = (
    ("first_fit", "concat"),
    ("split", "truncate"),
)  # train.data.pack, long_docs (jobs/data/documents)


@dataclass(frozen=True)
class DataSpec:
    kind: str = (
        "recall"  # recall (synthetic key->value recall) | tokens (flat uint16/uint32 file) | documents
    )
    path: str = ""
    dtype: str = "uint16"
    # kind=documents (jobs/data/documents/): ArrayRecord / Parquet shard files or directories, local or gs://
    # (empty: `path` alone), their mixture weights (empty: uniform), the packer and what a document longer
    # than a row becomes. Left out of the trial id at their defaults (TrialSpec.identity).
    sources: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    pack: str = "first_fit"  # first_fit | concat (concatenate, then split into rows)
    long_docs: str = "split"  # split (row-sized pieces, each its own document) | truncate


@dataclass(frozen=True)
class MemorySpec:
    """What the step keeps where, on top of the train.remat preset."""

    save: tuple[str, ...] = ()  # residuals kept in HBM between forward and backward
    offload: tuple[str, ...] = ()  # residuals moved to pinned host memory between forward and backward
    host: tuple[str, ...] = ()  # train state kept in pinned host memory between steps: "optimizer", "params"


def residuals(remat: str, memory: MemorySpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(saved, offloaded) residual names: the preset's plus memory's, in REMAT_NAMES order."""
    saved, offloaded = REMAT_PRESETS.get(remat, ((), ()))
    keep = set(saved) | set(memory.save)
    move = set(offloaded) | set(memory.offload)
    return tuple(n for n in REMAT_NAMES if n in keep), tuple(n for n in REMAT_NAMES if n in move)


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 10
    batch: int = 1  # global batch, in sequences
    dtype: str = "bfloat16"  # compute dtype; parameters stay fp32
    remat: str = "full"  # none | full | save_attn | offload
    lr: float = 3e-3
    warmup: int = 5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    grad_accum: int = 1
    seed: int = 0
    data: DataSpec = field(default_factory=DataSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)


@dataclass(frozen=True)
class ClusterSpec:
    """Where a trial runs; execution only, never part of the trial id. What the planner alone needs of the
    same cluster (capacities, link rates, fitted step-time constants, budgets) is
    orchestrator/plan/hardware.py's ClusterModel, read from the same conf/cluster/*.yaml, never sent to a host."""

    name: str = "local"
    kind: str = "local"  # local | local_multihost | fake_tpu | tpu | fake_gpu | gpu | address
    platform: str = "cpu"  # cpu | gpu | tpu
    accelerator: str = "cpu"
    hosts: int = 1
    devices_per_host: int = 8
    slices: int = 1  # slices in the cluster (trials at once, one per slice_per_trial slices)
    slices_per_trial: int = 1  # slices one trial spans (multislice over DCN; mesh.dcn names the axis)
    topology: str = ""
    peak_tflops_per_device: float = 0.0  # the MFU denominator; 0: measured on the spot (CPU)
    concurrency: int = 0  # trials at once (0: one per slice)
    address: str = ""  # Ray address: "" starts a local Ray, "auto" or ray://... connects
    # Every host process's extra environment (NCCL_*, XLA_FLAGS): YAML's mapping, as sorted pairs (hashable)
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        pairs = self.env.items() if isinstance(self.env, Mapping) else self.env
        env = tuple(sorted(((k, v) for k, v in pairs), key=lambda kv: str(kv[0])))
        if bad := [k for k, v in env if not (isinstance(k, str) and isinstance(v, str))]:
            raise ValueError(f"cluster.env values must be strings; quote {', '.join(map(str, bad))}")
        object.__setattr__(self, "env", env)

    @property
    def devices(self) -> int:
        """JAX devices of one trial (all its slices)."""
        return self.hosts_per_trial * self.devices_per_host

    @property
    def hosts_per_trial(self) -> int:
        """Host processes of one trial: `hosts` per slice times the slices it spans."""
        return self.hosts * self.slices_per_trial

    def host_env(self) -> dict[str, str]:
        """Environment a host's JAX process needs before its backend starts: the platform's own (CPU: simulated
        devices) and `env`; a user's XLA_FLAGS come after the platform's, so both hold."""
        flags = f"--xla_force_host_platform_device_count={self.devices_per_host}"
        own = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags} if self.platform == "cpu" else {}
        user = dict(self.env)
        if "XLA_FLAGS" in own and "XLA_FLAGS" in user:
            user["XLA_FLAGS"] = f"{flags} {user['XLA_FLAGS']}"
        return own | user


PROFILE_HOSTS = ("first", "all")  # run.profile_hosts: process 0 traces, or every process does


@dataclass(frozen=True)
class RunSpec:
    """Execution details of one trial: where to checkpoint, how often to report, which steps to trace."""

    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    # jax.profiler traces of these steps (jobs/profile/trace.py); never step 0, the warm-up. Tracing changes no
    # result, so like the rest of this block it stays out of the trial id.
    profile_steps: tuple[int, ...] = ()
    profile_hosts: str = "first"


_CLUSTER_KEYS = frozenset(f.name for f in dataclasses.fields(ClusterSpec))


@dataclass(frozen=True)
class TrialSpec:
    model: ModelSpec
    mesh: MeshSpec
    strategy: StrategySpec
    context_length: int
    train: TrainSpec = field(default_factory=TrainSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    run: RunSpec = field(default_factory=RunSpec)
    axes: tuple[tuple[str, Any], ...] = ()  # the grid point's own axis values, for display and params

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.train.memory == MemorySpec():
            # Added after many trials ran: left out at its default, so every earlier run's id (MLflow
            # resume, the regression gate's baselines) and the cached AOT compiles stay valid.
            del d["train"]["memory"]
        if not self.mesh.dcn:
            del d["mesh"]["dcn"]  # likewise: a one-slice mesh keeps its id
        for f in dataclasses.fields(DataSpec):
            # likewise the documents fields, which came after kind, path and dtype
            if f.name not in ("kind", "path", "dtype") and getattr(self.train.data, f.name) == f.default:
                del d["train"]["data"][f.name]
        return {k: d[k] for k in ("model", "mesh", "strategy", "context_length", "train")}

    @functools.cached_property
    def trial_id(self) -> str:
        """Stable across sweeps and clusters; cached (frozen dataclasses allow cached_property)."""
        canon = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch * self.context_length

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["axes"] = [list(a) for a in self.axes]
        return json.dumps(d, sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialSpec:
        train = dict(d.get("train", {}))
        train["data"] = DataSpec(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in train.get("data", {}).items()}
        )
        train["memory"] = MemorySpec(**{k: tuple(v) for k, v in train.get("memory", {}).items()})
        return cls(
            model=ModelSpec(**d["model"]),
            mesh=MeshSpec(**d.get("mesh", {})),
            strategy=StrategySpec(**d.get("strategy", {})),
            context_length=int(d["context_length"]),
            train=TrainSpec(**train),
            # keys ClusterSpec lacks (the planner's own, which specs recorded by older versions carry) are dropped
            cluster=ClusterSpec(**{k: v for k, v in d.get("cluster", {}).items() if k in _CLUSTER_KEYS}),
            run=RunSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.get("run", {}).items()}),
            # a list value (an axis over train.memory.save) as a tuple: specs are hashed (planner caches)
            axes=tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in d.get("axes", ())),
        )

    @classmethod
    def from_json(cls, s: str) -> TrialSpec:
        return cls.from_dict(json.loads(s))
