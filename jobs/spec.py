"""The seam: a frozen, JSON-serialisable TrialSpec in; typed metric records (jobs/records.py) out.

Pure Python (no jax, ray or mlflow) so both planes import it. The trial id hashes only the
identity block (what changes the result); the execution block (cluster, paths) never enters it. Each field of a
trial's sections is its config key's one declaration (jobs.fields.key: default, range or names, meaning).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs import fields, strategies, tuning
from jobs.fields import key
from jobs.strategies.base import LAYOUTS, MESH_AXES

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
# platform -> the kernel of its own that `auto` runs there (elsewhere: xla)
OWN_KERNEL = {platform: name for name, platform in KERNEL_PLATFORM.items() if platform}
# Bytes of one unembedding chunk's fp32 logits on a device (jobs/model.loss_fn; the planner's memory model sizes
# the loss phase by it): a chunk's tokens are this over 4 x the vocabulary a device holds, so a 262K vocabulary
# (Gemma 3) takes 256-token chunks where a fixed 8,192 tokens needed 8 GiB of fp32 logits and twice that with
# their gradient, more than a 16 GiB chip holds. Unchunked, the logits are the largest term at 14M tokens.
LOSS_CHUNK_BYTES = 2**28


def loss_chunk_tokens(local_length: int, rows: int, vocab: int) -> int:
    """Tokens per row of one unembedding chunk on a device holding `rows` sequences of `local_length` tokens and
    `vocab` entries of the table: the largest divisor of local_length whose fp32 logits (rows x chunk x vocab)
    stay within LOSS_CHUNK_BYTES; at least one token."""
    c = max(min(local_length, LOSS_CHUNK_BYTES // (4 * max(vocab, 1) * max(rows, 1))), 1)
    while local_length % c:
        c -= 1
    return c


# model.attention_pattern's layer types and the mask each gives its layers' attention (jobs/model.py)
LAYER_TYPES = ("global", "local", "chunked")


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder (RMSNorm, RoPE, GQA, gated MLP): Llama's, and with the keys after `tie_embeddings`
    Gemma 3's and Qwen3's (per-layer attention pattern, sinks, QK-norm, GeGLU, embedding scale)."""

    name: str = key(doc="Model name, shown in params, plan rows and plot titles.", nonempty=True)
    vocab: int = key(doc="Vocabulary size V (tokens); the unembedding is E x V.", ge=1)
    embed: int = key(doc="Hidden width E.", ge=1)
    layers: int = key(doc="Decoder layers N.", ge=1)
    q_heads: int = key(doc="Query heads Hq; a Ulysses degree must divide Hq / tensor.", ge=1)
    kv_heads: int = key(
        doc="Key/value heads Hkv (grouped-query attention: Hq is a multiple of it); `mesh.tensor` must divide it.",
        ge=1,
    )
    head_dim: int = key(doc="Head dimension D.", ge=1)
    mlp: int = key(doc="Gated MLP (SwiGLU or GeGLU) hidden width M.", ge=1)
    rope_theta: float = key(
        500_000.0,
        doc="RoPE base frequency theta (positions are the tokens' true positions, also under zigzag).",
        gt=0,
    )
    norm_eps: float = key(1e-5, doc="RMSNorm epsilon.", gt=0)
    tie_embeddings: bool = key(
        False, doc="Share one V x E table between the input embedding and the unembedding."
    )
    attention_pattern: tuple[str, ...] = key(
        ("global",),
        doc="Each layer's attention, as a pattern repeated over the layers: `global` (causal over the whole "
        "row), `local` (a sliding window of `window` tokens) or `chunked` (causal inside fixed chunks of `chunk` "
        "tokens); e.g. Gemma 3's `[local, local, local, local, local, global]`, Llama 4's `[chunked, chunked, "
        "chunked, global]`. Its length must divide `layers` unless `partial_pattern`.",
        choices=LAYER_TYPES,
        repeats=True,
        id_at_default=False,
    )
    partial_pattern: bool = key(
        False,
        doc="Let the last repeat of `attention_pattern` stop short, as Hugging Face's `layer_types` and "
        "MaxText's remaining layers do (Gemma 3 1B, 4B and 27B: 26, 34 and 62 layers over a 6-layer pattern); "
        "false: a pattern that does not divide `layers` is a config error.",
        id_at_default=False,
    )
    window: int = key(
        0,
        doc="Sliding window W of the `local` layers, in tokens, counting the query itself (a query at p sees "
        "p-W+1 .. p; Hugging Face's and MaxText's `sliding_window`); 0: no `local` layers.",
        ge=0,
        id_at_default=False,
    )
    chunk: int = key(
        0,
        doc="Chunk C of the `chunked` layers, in tokens: a query at p sees the keys of its own chunk p // C up to "
        "p (Llama 4's attention_chunk_size); 0: no `chunked` layers.",
        ge=0,
        id_at_default=False,
    )
    local_rope_theta: float = key(
        0.0,
        doc="RoPE theta of the `local` and `chunked` layers (Gemma 3: 10,000 there, `rope_theta` 1,000,000 on "
        "its global layers); 0: `rope_theta`.",
        ge=0,
        id_at_default=False,
    )
    global_rope: bool = key(
        True,
        doc="RoPE on the `global` layers; false: no positional encoding there (NoPE, Llama 4's global layers).",
        id_at_default=False,
    )
    sinks: bool = key(
        False,
        doc="Attention sinks (gpt-oss): a learnable fp32 logit per query head and layer that joins every "
        "softmax denominator and brings no value.",
        id_at_default=False,
    )
    qk_norm: bool = key(
        False,
        doc="RMS-normalise each head's queries and keys (learned scale per head dim) before RoPE: Qwen3, Gemma 3.",
        id_at_default=False,
    )
    mlp_activation: str = key(
        "silu",
        doc="Activation of the gated MLP: `silu` (SwiGLU: Llama, Qwen) or `gelu` (GeGLU, tanh approximation: "
        "Gemma); the same FLOPs.",
        choices=("silu", "gelu"),
        id_at_default=False,
    )
    embed_scale: bool = key(
        False,
        doc="Multiply the input embeddings by sqrt(E) (Gemma); the unembedding is not scaled.",
        id_at_default=False,
    )

    def __post_init__(self) -> None:
        # a JSON spec (TrialSpec.from_dict) carries the pattern as a list: a tuple keeps the spec hashable
        object.__setattr__(self, "attention_pattern", tuple(self.attention_pattern))
        if problem := pattern_problem(
            self.layers, self.attention_pattern, self.partial_pattern, self.window, self.chunk
        ):
            key, value, wrong, allowed, fix = problem
            raise ValueError(f"model.{key}={value!r} {wrong}; allowed: {allowed} — {fix}")

    def layer_types(self) -> tuple[str, ...]:
        """Each layer's type, first to last: the pattern repeated, the last repeat cut at `layers`."""
        return _layer_types(self.attention_pattern, self.layers)

    def layer_counts(self) -> tuple[tuple[str, int], ...]:
        """(layer type, how many layers have it) in first-seen order: a fixed order, so sums over the types
        come out the same in every process."""
        return _layer_counts(self.attention_pattern, self.layers)

    def n_params(self) -> int:
        attn = self.embed * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)
        ffn = 3 * self.embed * self.mlp
        extra = (2 * self.head_dim if self.qk_norm else 0) + (self.q_heads if self.sinks else 0)
        per_layer = attn + ffn + 2 * self.embed + extra
        emb = self.vocab * self.embed * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + emb + self.embed


# The planner asks for a model's layer types for every candidate it prices (~750,000 times in a recommend over
# the published points); one answer per (pattern, layers).
@functools.cache
def _layer_types(pattern: tuple[str, ...], layers: int) -> tuple[str, ...]:
    return tuple(pattern[i % len(pattern)] for i in range(layers))


@functools.cache
def _layer_counts(pattern: tuple[str, ...], layers: int) -> tuple[tuple[str, int], ...]:
    kinds = _layer_types(pattern, layers)
    return tuple((k, kinds.count(k)) for k in dict.fromkeys(kinds))


def pattern_problem(
    layers: int, pattern: tuple[str, ...], partial: bool, window: int, chunk: int
) -> tuple[str, Any, str, str, str] | None:
    """What is wrong with a model's layer pattern as (key, value, what, allowed, fix); None: nothing. The
    driver's config check (orchestrator/config/keys.py) reports it before anything launches; a ModelSpec
    built in code raises it."""
    k = len(pattern)
    if k and layers % k and not partial:
        return (
            "attention_pattern",
            list(pattern),
            f"has {k} layer types, which do not divide model.layers={layers}",
            f"a pattern whose length divides {layers}",
            f"make model.layers a multiple of {k}, or set model.partial_pattern=true to cut the last repeat short",
        )
    for kind, name, size in (("local", "window", window), ("chunked", "chunk", chunk)):
        if kind in pattern and size < 1:
            return (
                name,
                size,
                f"is not set but model.attention_pattern has {kind} layers",
                "an integer >= 1",
                f"set model.{name}, e.g. model.{name}=1024",
            )
    return None


@dataclass(frozen=True)
class MeshSpec:
    """Sizes of the fixed mesh axes. Two-axis strategies shard the sequence over context (outer, major) x
    context_ulysses (inner): usp's Ulysses groups, double_ring's inner rings (the name is usp's)."""

    data: int = 1
    fsdp: int = 1
    context: int = 1
    context_ulysses: int = 1
    tensor: int = 1
    # declared here, not in orchestrator/config/schema.py's MeshConfig (which takes this field), for its id flag;
    # the rest of the mesh stays inside one slice (ICI)
    dcn: str = key(
        "",
        doc="The axis laid across slices over DCN when `cluster.slices_per_trial` > 1 (its outer factor indexes "
        'the slice); "": one slice.',
        choices=("", *MESH_AXES),
        id_at_default=False,
    )

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

    name: str = key(
        "ring",
        doc="CP strategy from the registry (jobs/strategies); `none` is the dense reference (context axes of "
        "size 1).",
        choices=strategies.NAMES,
    )
    layout: str = key(
        "zigzag",
        doc="Token order over the context shards: `zigzag` (2R chunks, device r holds r and 2R-1-r: equal causal "
        "work, needs context_length % 2R == 0), `contiguous` (natural order), or `balanced` (packed documents "
        "only: each row's document pieces assigned by their attention work, xla kernel).",
        choices=LAYOUTS,
    )
    kernel: str = key(
        "auto",
        doc="Local attention kernel: `auto` (splash on TPU, flash on GPU, xla elsewhere), `xla` (blockwise, "
        "every backend), `splash` (Pallas, TPU only), `flash` (GPU only).",
        choices=KERNELS,
    )
    block_q: int | str = key(
        tuning.AUTO,
        doc="Query block of the local kernel, in tokens; `auto`: the block measured fastest for the chip, kernel, "
        "head_dim and tokens per call (jobs/tuning.py, docs/results/v5e.md), 512 where none was measured.",
        ge=1,
        auto=True,
    )
    block_kv: int | str = key(
        tuning.AUTO, doc="Key/value block of the local kernel, in tokens; `auto` as block_q.", ge=1, auto=True
    )
    local: str = key(
        "",
        doc="CP strategy of the model's `local` and `chunked` layers (\"\": `name`'s, as every layer's). It shares "
        "`name`'s mesh and token order: all_gather, ulysses and ring mix on a `context` mesh in any layout, usp "
        "and double_ring only in the contiguous one. E.g. `name=ulysses local=all_gather layout=contiguous`: "
        "the global layers swap heads, the windowed ones fetch only their halo.",
        choices=("", *strategies.CP_NAMES),
        id_at_default=False,
    )

    def for_layer(self, kind: str) -> str:
        """The strategy a layer of type `kind` (global, local, chunked) runs."""
        return self.local if self.local and kind != "global" else self.name


PACKS, LONG_DOCS = (
    ("first_fit", "concat"),
    ("split", "truncate"),
)  # train.data.pack, long_docs (jobs/data/documents)


def _tuples(d: Mapping[str, Any]) -> dict[str, Any]:
    """A section's dict form with its lists (JSON's, the config's) as tuples: specs are hashed."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


@dataclass(frozen=True)
class DataSpec:
    kind: str = key(
        "recall",
        doc="`recall`: a synthetic key-value recall task whose answers sit ~L/2 tokens back (the loss beats ln 8 "
        "only if attention across devices is right); `tokens`: the token file at `path`; `documents`: "
        "pre-tokenized documents packed into rows (`sources`), attention never crossing a document.",
        choices=("recall", "tokens", "documents"),
    )
    path: str = key(
        "",
        doc="Flat token file, local or `gs://bucket/object`, memory-mapped (each host reads its own shards); "
        '"" with `recall`.',
    )
    # jobs/data/__init__.py memory-maps a flat file of these
    dtype: str = key("uint16", doc="Element type of the token file.", choices=("uint16", "uint32"))
    # kind=documents (jobs/data/documents/)
    sources: tuple[str, ...] = key(
        (),
        doc="With `documents`: ArrayRecord or Parquet shard files, or directories / `gs://` prefixes of them (one "
        "format each), as `python -m jobs.data.documents.corpus` writes (empty: `path` alone).",
        id_at_default=False,
    )
    weights: tuple[float, ...] = key(
        (),
        doc="With `documents`: the sources' mixture weights, one per source (empty: uniform).",
        id_at_default=False,
    )
    pack: str = key(
        "first_fit",
        doc="With `documents`: `first_fit` (each document into the first row with room) or `concat` "
        "(concatenated, then cut into rows).",
        choices=PACKS,
        id_at_default=False,
    )
    long_docs: str = key(
        "split",
        doc="With `documents`: a document longer than a row is `split` into row-sized documents, or `truncate`d "
        "to one row.",
        choices=LONG_DOCS,
        id_at_default=False,
    )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DataSpec:
        """From its dict form (a JSON line's, the composed config's)."""
        return cls(**_tuples(d))


@dataclass(frozen=True)
class MemorySpec:
    """What the step keeps where, on top of the train.remat preset."""

    save: tuple[str, ...] = key(
        (),
        doc="Residuals kept in HBM between forward and backward instead of recomputed.",
        choices=REMAT_NAMES,
    )
    offload: tuple[str, ...] = key(
        (), doc="Residuals kept in pinned host memory between forward and backward.", choices=REMAT_NAMES
    )
    host: tuple[str, ...] = key(
        (),
        doc="Train state kept in pinned host memory between steps (a TPU feature for now: on GPU it raised the "
        "compiled peak).",
        choices=HOST_STATE,
    )


def residuals(remat: str, memory: MemorySpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(saved, offloaded) residual names: the preset's plus memory's, in REMAT_NAMES order."""
    saved, offloaded = REMAT_PRESETS.get(remat, ((), ()))
    keep = set(saved) | set(memory.save)
    move = set(offloaded) | set(memory.offload)
    return tuple(n for n in REMAT_NAMES if n in keep), tuple(n for n in REMAT_NAMES if n in move)


@dataclass(frozen=True)
class TrainSpec:
    steps: int = key(
        10,
        doc="Optimizer steps per trial; each attempt's first step is warm-up, left out of the median step time.",
        ge=1,
    )
    batch: int = key(
        1,
        doc="Global batch, in sequences of `context_length` tokens; a multiple of data x fsdp x grad_accum.",
        ge=1,
    )
    dtype: str = key(
        "bfloat16", doc="Compute dtype; parameters and AdamW state stay float32.", choices=DTYPES
    )
    remat: str = key(
        "full",
        doc="Rematerialisation preset: `none` (keep every residual), `full` (recompute each layer in backward, "
        "keep its input), `save_attn` (also keep attention outputs), `offload` (layer inputs in pinned host "
        "memory), or `auto`: per grid point the planner's fastest memory policy that fits (a preset plus "
        "`train.memory`), resolved before launch, so the trial id, params and tags name the policy, never "
        "`auto`.",
        choices=REMATS,
        auto=True,
    )
    # ge=0: a negative rate climbs the loss
    lr: float = key(
        3e-3,
        doc="AdamW peak learning rate: linear warm-up from 0, then cosine decay to lr/10 at the last step (0: a "
        "throughput-only run).",
        ge=0,
    )
    warmup: int = key(5, doc="Warm-up steps of the learning rate.", ge=0)
    weight_decay: float = key(0.1, doc="AdamW decoupled weight decay.", ge=0)
    # optax clips to this global norm: 0 would zero every update
    grad_clip: float = key(1.0, doc="Global gradient norm the update is clipped to.", gt=0)
    grad_accum: int = key(
        1, doc="Micro-batches accumulated per step (the batch is split into this many).", ge=1
    )
    # numpy's default_rng rejects negative seeds, on the host, mid-trial
    seed: int = key(
        0, doc="Seed of the parameter init and the data (a batch is a pure function of seed and step).", ge=0
    )
    data: DataSpec = key(doc="What a trial trains on.", factory=DataSpec)
    memory: MemorySpec = key(
        doc="What the step keeps where, on top of the `train.remat` preset; left out of the trial id while all "
        "three lists are empty.",
        factory=MemorySpec,
        id_at_default=False,
    )


@dataclass(frozen=True)
class ClusterSpec:
    """Where a trial runs; execution only, never part of the trial id. What the planner alone needs of the
    same cluster (capacities, link rates, fitted step-time constants, budgets) is
    orchestrator/plan/cluster_model.py's ClusterModel, read from the same conf/cluster/*.yaml, never sent to a host."""

    name: str = key(
        "local",
        doc="Cluster name: param and parent-run tag `cluster`; the regression gate compares runs of the same "
        "cluster only.",
        nonempty=True,
    )
    kind: str = key(
        "local",
        doc="How Ray is reached: `local` (a Ray started here), `local_multihost` (several JAX processes here, "
        "joined by jax.distributed), `fake_tpu` (local nodes posing as TPU hosts), `tpu` (real slices reserved "
        "with ray.util.tpu), `gpu` (an existing Ray cluster of GPU nodes at `cluster.address`; a node is a "
        "one-host slice, `hosts: 1`, its GPUs `devices_per_host`, so `slices_per_trial` nodes make a trial and "
        "`mesh.dcn` names the axis across them; each trial reserves its nodes whole in one STRICT_SPREAD "
        "placement group), `fake_gpu` (local nodes advertising `devices_per_host` GPUs, simulated CPU devices "
        "underneath), `address` (an existing Ray cluster at `cluster.address`).",
        choices=("local", "local_multihost", "fake_tpu", "tpu", "address", "fake_gpu", "gpu"),
    )
    platform: str = key(
        "cpu",
        doc="JAX backend of the hosts; `cpu` simulates `devices_per_host` devices per process.",
        choices=("cpu", "gpu", "tpu"),
    )
    accelerator: str = key(
        "cpu",
        doc="Chip name (`v5p`, `tpu7x`, `cpu`): the spec-sheet peak when `peak_tflops_per_device` is 0, and the "
        "TPU generation of slice reservations and AOT compiles.",
    )
    hosts: int = key(1, doc="Hosts per slice, one JAX process each (1 on GPU: a node is a slice).", ge=1)
    devices_per_host: int = key(
        8, doc="JAX devices per host (a v5p chip is one device, a tpu7x chip two).", ge=1
    )
    slices: int = key(
        1,
        doc="Slices in the cluster: trials at once are slices // slices_per_trial (on TPU, counted from the "
        "slices Ray sees, on GPU the nodes); a fake_tpu or fake_gpu cluster starts this many.",
        ge=1,
    )
    slices_per_trial: int = key(
        1,
        doc="Slices one trial spans (multislice over DCN; `mesh.dcn` names the axis across them).",
        ge=1,
    )
    topology: str = key(
        "",
        doc='TPU slice topology, e.g. `4x4x4`, for slice reservations and AOT compiles ("": not a TPU).',
    )
    peak_tflops_per_device: float = key(
        0.0,
        doc="Peak bf16 TFLOP/s per JAX device, MFU's denominator; 0: the accelerator's spec-sheet peak, or on "
        "CPU a matmul measured on the spot (labelled `cpu_measured_<dtype>`; `CP_PLAN_CPU_TFLOPS` pins it: "
        "`cpu_pinned_<dtype>`).",
        ge=0,
    )
    concurrency: int = key(
        0,
        doc="Trials at once (0: one per `slices_per_trial` slices; on TPU the slices Ray sees, on GPU its nodes).",
        ge=0,
    )
    address: str = key(
        "",
        doc='Ray address: "" starts a local Ray (or the fake TPU or GPU cluster), `auto` joins the cluster this '
        "machine belongs to, `ray://host:port` connects.",
    )
    # YAML's mapping, kept as sorted pairs (hashable)
    env: tuple[tuple[str, str], ...] = key(
        (),
        doc="Extra environment of every host process, name -> string (quote numbers), set per attempt before "
        "JAX starts, e.g. `NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`, or `XLA_FLAGS` (appended to the platform's own "
        "flags, never replacing them).",
    )

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

    checkpoint_dir: str = key(
        "",
        doc="Checkpoint root, local or `gs://`; a trial saves under `<root>/<sweep_id>/<trial_id>` "
        '("": `./.cache/checkpoints`).',
    )
    checkpoint_every: int = key(
        0,
        doc="Steps between orbax checkpoints (0: none); a retry or a rerun of the sweep resumes from the last one.",
        ge=0,
    )
    # jax.profiler traces (jobs/profile/trace.py); which steps may be traced is jobs.profile.steps_problem's.
    # Tracing changes no result, so like the rest of this block it stays out of the trial id.
    profile_steps: tuple[int, ...] = key(
        (),
        doc="Steps to trace with `jax.profiler`, e.g. `[2,3]` (consecutive steps share one trace; never step 0, "
        "the warm-up); the trace files go to the trial's run under `profile/`, its breakdown to `measured/*` "
        "metrics, and the traced steps stay out of the median step time ([]: off).",
        ge=0,
    )
    profile_hosts: str = key(
        "first",
        doc="Which processes trace `run.profile_steps`: `first` (process 0) or `all` (each process's files under "
        "its own `profile/` folder; the metrics are process 0's).",
        choices=PROFILE_HOSTS,
    )


_CLUSTER_KEYS = frozenset(f.name for f in dataclasses.fields(ClusterSpec))


def _identity(value: Any) -> Any:
    """A section as the trial id hashes it: each key, less those at their default that enter the id only off it."""
    if not dataclasses.is_dataclass(value):
        return value
    pairs = ((f, getattr(value, f.name)) for f in dataclasses.fields(value))
    return {f.name: _identity(v) for f, v in pairs if fields.id_at_default(f) or v != fields.default(f)}


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

    def __post_init__(self) -> None:
        s = self.strategy
        if tuning.AUTO in (s.block_q, s.block_kv):  # what the planner prices and the job runs: integers
            b = tuning.block(self.kernel, self.cluster.accelerator, self.model.head_dim, self.call_tokens)
            q, kv = (b if v == tuning.AUTO else v for v in (s.block_q, s.block_kv))
            object.__setattr__(self, "strategy", dataclasses.replace(s, block_q=q, block_kv=kv))

    @property
    def kernel(self) -> str:
        """The local kernel that runs: `auto` is the platform's own (splash on TPU, flash on GPU), else xla."""
        k = self.strategy.kernel
        if k != "auto":
            return k
        return OWN_KERNEL.get(self.cluster.platform, "xla")

    @property
    def call_tokens(self) -> int:
        """Queries per device along the sequence (context_length over the context axes): a kernel call's length."""
        return max(self.context_length // max(self.mesh.cp, 1), 1)

    def identity(self) -> dict[str, Any]:
        """What the trial id hashes: the keys that change the result (never the cluster, paths or tracing),
        each at its value, but a key declared `id_at_default=False` (jobs/fields.py) only off its default."""
        return {
            k: _identity(getattr(self, k)) for k in ("model", "mesh", "strategy", "context_length", "train")
        }

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
        train["data"] = DataSpec.from_dict(train.get("data", {}))
        train["memory"] = MemorySpec(**{k: tuple(v) for k, v in train.get("memory", {}).items()})
        return cls(
            model=ModelSpec(**d["model"]),
            mesh=MeshSpec(**d.get("mesh", {})),
            strategy=StrategySpec(**d.get("strategy", {})),
            context_length=int(d["context_length"]),
            train=TrainSpec(**train),
            # keys ClusterSpec lacks (the planner's own, which specs recorded by older versions carry) are dropped
            cluster=ClusterSpec(**{k: v for k, v in d.get("cluster", {}).items() if k in _CLUSTER_KEYS}),
            run=RunSpec(**_tuples(d.get("run", {}))),
            # a list value (an axis over train.memory.save) as a tuple: specs are hashed (planner caches)
            axes=tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in d.get("axes", ())),
        )

    @classmethod
    def from_json(cls, s: str) -> TrialSpec:
        return cls.from_dict(json.loads(s))
