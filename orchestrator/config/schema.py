"""The config schema: every key a dataclass field declared once with jobs.fields.key (type, default, range or
allowed values, meaning), and the error bad input raises (ConfigError, one Problem per line).

A trial's sections are the seam's own dataclasses (jobs/spec.py) and the planner's ClusterModel
(orchestrator/plan/cluster_model.py), so a field added there is checked and documented without a second list; the
driver's switches are the small dataclasses here, whose defaults are the switches' only defaults
(orchestrator/config/load.py composes them into the config). orchestrator/config/keys.py holds a composed
config against this before Ray or a tracking store starts; docs/gen/reference_pages.py renders it into
docs/reference/config.md, orchestrator/cli/help.py into --help.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.fields import MISSING, key
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, RunSpec, StrategySpec, TrainSpec
from orchestrator.plan.cluster_model import ClusterModel

# mesh.dcn's one declaration is the spec's (its id flag with it); the other axes are sizes here, "auto" allowed
_SPEC_DCN = next(f for f in dataclasses.fields(MeshSpec) if f.name == "dcn")


@dataclass(frozen=True)
class MeshConfig:
    """conf/mesh/: fixed axis sizes; the context axes may be "auto" until grid.resolve_mesh fills them."""

    data: int = key(doc="Data-parallel axis: the batch is split over data x fsdp.", ge=1)
    fsdp: int = key(
        doc="Fully-sharded data-parallel axis: splits the batch; parameters and AdamW state are sharded over "
        "every axis but tensor.",
        ge=1,
    )
    tensor: int = key(doc="Tensor-parallel axis: splits the heads and the MLP.", ge=1)
    context: int | str = key(
        "auto",
        doc="Context (sequence) axis: the whole CP degree for single-axis strategies, the ring of usp, the outer "
        "ring of double_ring; `auto`: every device not on data, fsdp or tensor, split as the strategy says.",
        ge=1,
        auto=True,
    )
    context_ulysses: int | str = key(
        "auto",
        doc="Inner context axis: usp's Ulysses degree, double_ring's inner ring (1 for the others); `auto`: "
        "chosen by the strategy (usp: the largest the heads allow).",
        ge=1,
        auto=True,
    )
    dcn: str = field(default=_SPEC_DCN.default, metadata=_SPEC_DCN.metadata)


_SPEC_ENV = next(f for f in dataclasses.fields(ClusterSpec) if f.name == "env")


@dataclass(frozen=True)
class ClusterConfig(ClusterModel, ClusterSpec):
    """conf/cluster/: ClusterSpec's keys (what the hosts get) and ClusterModel's (what the planner prices with),
    with `env` as YAML writes it, a mapping of names to strings (the frozen spec keeps it as sorted pairs, to
    stay hashable)."""

    env: dict[str, str] = field(default_factory=dict, metadata=_SPEC_ENV.metadata)


@dataclass(frozen=True)
class PointConfig:
    """One grid point before it becomes a TrialSpec: the only keys a sweep may set."""

    model: ModelSpec = key(
        doc="The model: a dense decoder (RMSNorm, RoPE, GQA, gated MLP; Llama 3.1, Gemma 3, Qwen3), layers "
        "stacked and scanned, each layer's attention global, sliding-window or chunked by `attention_pattern`."
    )
    strategy: StrategySpec = key(
        doc="Which context-parallel (CP) attention, its token layout and its local kernel."
    )
    mesh: MeshConfig = key(
        doc="Device mesh axis sizes (jobs/mesh.py owns the axes); their product must equal the trial's devices "
        "(`mesh=auto` fills the context axes)."
    )
    cluster: ClusterConfig = key(
        doc="Where trials run, and the hardware and step-time constants the planner prices them with; execution "
        "only, never part of the trial id."
    )
    context_length: int = key(
        doc="Tokens per sequence (L): what the context-parallel strategies split over the context axes.", ge=1
    )
    train: TrainSpec = key(doc="Training settings of a trial.")
    run: RunSpec = key(
        doc="Execution details of a trial (where it checkpoints, how often, which steps it traces); not part of "
        "the trial id."
    )


@dataclass(frozen=True)
class Tracking:
    uri: str = key(
        doc="MLflow tracking URI: `sqlite:///mlflow.db` (a file in the working directory), a server's "
        "`http(s)://` URL, or `none` (no store: nothing recorded, no regression gate).",
        nonempty=True,
    )
    experiment: str = key(doc="MLflow experiment of the sweep's runs (created when missing).", nonempty=True)
    artifact_location: str = key(
        "",
        doc='Artifact root of the experiment when this driver creates it, e.g. `gs://bucket/prefix` ("": the '
        "store's default).",
    )


@dataclass(frozen=True)
class Search:
    """recommend=true: sizes the search may choose besides the point's own (empty: the point's value only)."""

    batch: tuple[int, ...] = key(
        (),
        doc="With `recommend`: global batches it may choose, e.g. `[1,2,4]` (empty: the point's `train.batch` "
        "only). Each is in sequences per step and must divide over the mesh's data x fsdp axes.",
        ge=1,
    )
    grad_accum: tuple[int, ...] = key(
        (),
        doc="With `recommend`: microbatches per step it may choose, e.g. `[1,2]` (empty: the point's "
        "`train.grad_accum` only). More of them hold less activation memory, each repeating the step's "
        "collectives.",
        ge=1,
    )


@dataclass(frozen=True)
class Retries:
    """Separate budgets: a lost host (preemption) is not a bug (failure)."""

    preemption: int = key(
        3,
        doc="Reruns of a trial whose host was lost (preempted, node or slice died). With `run.checkpoint_every` "
        "> 0 each resumes from the last checkpoint.",
        ge=0,
    )
    failure: int = key(
        1,
        doc="Reruns of a trial whose job raised: a separate budget, since a lost host is not a bug. Out of "
        "memory (`infeasible`) is never retried.",
        ge=0,
    )


@dataclass(frozen=True)
class Budget:
    # 0, not 0.0: the composed config shows it as conf/config.yaml always did
    chip_hours: float = key(
        0,
        doc="Refuse (exit 2) a sweep the planner prices above this many chip-hours (0: no budget). A runnable "
        "point costs steps x predicted step time plus `cluster.compile_seconds`, times the trial's chips; the "
        "error names the most expensive points and what would fit.",
        ge=0,
    )


@dataclass(frozen=True)
class Gate:
    """The regression gate (orchestrator.results.gate): baseline, the median of the last `window` runs; band,
    max(max_drop, noise_k x their ± spread)."""

    enabled: bool = key(
        True,
        doc="Run the regression gate when the sweep ends (not with `tracking=none`: no baseline).",
    )
    # le=1: above 1 it could never trip
    max_drop: float = key(
        0.10,
        doc="The narrowest band: a drop of MFU or tokens/s past this fraction of the baseline tags the sweep "
        "`regression=true`, and the CLI exits 3. It is the drop of `final_mfu` or `final_tokens_per_s` allowed "
        "however quiet the baseline runs were (the whole band with one earlier run).",
        ge=0,
        le=1,
    )
    window: int = key(
        5,
        doc="The baseline: the median of the last this many finished runs of each trial, one per earlier sweep.",
        ge=1,
    )
    noise_k: float = key(
        1.5,
        doc="The band widens to this many times the baseline runs' ± spread, (max - min) / (2 median) (0: the "
        "band is `gate.max_drop`). With 1.5 a quiet rerun passes half as far again below the median as the runs "
        "strayed, and a 30 % drop is still caught while they stray under ±20 %.",
        ge=0,
    )


@dataclass(frozen=True)
class SweepConfig:
    """conf/sweep/: the grid's shape (axes, zip, set) is checked by grid.points."""

    name: str = key(
        "", doc="Sweep name: the parent run's `sweep_name` tag, and the start of a fresh sweep id."
    )
    id: str = key(
        "",
        doc='Sweep instance: "" makes a fresh `<name>-<YYYYmmdd-HHMMSS>`; a fixed id resumes it, skipping its '
        "finished trials.",
    )
    axes: dict = key(
        doc="Grid axes, axis -> list of values: `model`, `strategy`, `mesh`, `cluster` take option names, any other "
        "axis is a dotted trial key; `${cp_strategies:}` is every registered CP strategy.",
        factory=dict,
    )
    zip: list = key(
        doc="Lists of axis names whose values move together (equal lengths) instead of being crossed.",
        factory=list,
    )
    set: dict = key(doc="Dotted trial key -> value, set on every grid point.", factory=dict)


@dataclass(frozen=True)
class Options:
    """The driver's switches: one value for the whole sweep, never part of a trial. Their defaults are these
    fields' (conf/config.yaml composes them in); `tracking` and `sweep` are config groups."""

    tracking: Tracking = key(
        doc="The MLflow store the driver writes to (workers never talk to MLflow); `tracking=none` records "
        "nothing."
    )
    dry_run: bool = key(
        False,
        doc="Plan and print the grid; start no Ray, train nothing. The plan gives each point's verdict, predicted "
        "memory, step time and MFU.",
    )
    output: str = key(
        "table",
        doc="How `dry_run` prints the plan and `recommend` its answer: a rich `table`, or `json`. A plan in JSON "
        "is one row per grid point.",
        choices=("table", "json"),
    )
    wide: bool = key(
        False,
        doc="Print every column of the plan and of `recommend`'s answer in one wide table (the default fits the "
        "terminal: the main figures a line, the reason and the long fields on lines of their own).",
    )
    aot: bool = key(
        False,
        doc="With `dry_run`: also compile the valid points for the cluster's TPU topology (needs libtpu: `pip "
        "install -e '.[tpu]'`). The plan then shows analytic vs compiled memory.",
    )
    aot_topology: str = key(
        "", doc='With `aot`: compile for this topology, e.g. `2x2x1` ("": `cluster.topology`).'
    )
    aot_workers: int = key(
        0,
        doc="With `aot`: compiles at once, as Ray tasks (0: one per CPU of the Ray cluster). Each task reserves "
        "the host memory a compile of its size needs.",
        ge=0,
    )
    aot_cache: str = key(
        "",
        doc='With `aot`: the shared compile cache, a directory or `gs://bucket/prefix` ("": `$CP_AOT_CACHE`, else '
        "`.cache/aot`). Every user and the nightly sweep share it, keyed by the program's hash.",
    )
    aot_draws: int = key(
        1,
        doc="With `aot`: compiles per point, each in its own process; the worst draw decides. The draws are made "
        "to differ, and the verdict states their spread (libtpu's peak for one program varies by process).",
        ge=1,
    )
    record: bool = key(
        False,
        doc="With `dry_run`: record the plan in MLflow as planned runs (tag `planned=true`), with plots. Their "
        "sweep id is `<id>-plan`.",
    )
    specs: str = key(
        "",
        doc="Write each runnable grid point's TrialSpec to `DIR/<trial_id>.json` instead of launching: the file "
        "`python -m jobs.train FILE` runs on one host, its memory policy resolved as a launch resolves it "
        "(`train.remat=auto`). No Ray and no MLflow start; a point the planner rejects gets a line with its "
        'reason ("": launch as usual; a directory or `gs://bucket/prefix`).',
    )
    skip_invalid: bool = key(
        False,
        doc="Launch the valid grid points even when some are invalid (else an invalid point means exit 2, "
        "nothing launched).",
    )
    progress: str = key(
        "auto",
        doc="The sweep's live display: `rich` (a table), `plain` (a log line per state change), or `auto` (rich "
        "on a terminal, else plain).",
        choices=("auto", "rich", "plain"),
    )
    recommend: bool = key(
        False,
        doc="For one point: print the `top` fastest strategy x mesh x memory policy that fit, with their command "
        "lines; start nothing. Each comes with its predicted step time, MFU and HBM, and the answer says why the "
        "other strategies and policy families lose; when nothing fits, exit 2.",
    )
    top: int = key(
        5,
        doc="With `recommend`: how many configurations to list (each a strategy and mesh under its best policy).",
        ge=1,
    )
    search: Search = key(
        doc="With `recommend`: sizes the search may choose besides the point's own, ranked by predicted seconds "
        "per token so a larger batch wins only if it raises throughput.",
        factory=Search,
    )
    retries: Retries = key(
        doc="Retry budgets per trial, one per outcome kind: a lost host is not a bug.", factory=Retries
    )
    budget: Budget = key(doc="Refusals before launch, on the plan's predicted cost.", factory=Budget)
    gate: Gate = key(
        doc="The regression gate after a sweep: each finished trial against the median of the last `gate.window` "
        "finished runs of its trial id on the same cluster, one per earlier sweep (planned runs never count).",
        factory=Gate,
    )
    sweep: SweepConfig | None = key(
        None, doc="The grid: absent (a single trial) unless added with `+sweep=NAME`."
    )


def sweep_identity(options: Options) -> tuple[str, str]:
    """(sweep name, sweep id): "single" without a sweep; a fresh timestamped id unless the sweep fixes one."""
    sweep = options.sweep or SweepConfig()
    name = sweep.name or "single"
    return name, sweep.id or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


TRIAL_KEYS = tuple(f.name for f in dataclasses.fields(PointConfig))


class ConfigError(ValueError):
    """Bad input found before anything starts: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Problem:
    """One bad key: what is wrong and what is allowed; `line(where)` adds the grid point (a ConfigError's text)."""

    key: str
    value: Any  # MISSING: the key itself is the problem (unknown or missing)
    wrong: str
    allowed: str
    fix: str

    def line(self, where: str) -> str:
        shown = self.key if self.value is MISSING else f"{self.key}={self.value!r}"
        return f"{shown} {self.wrong} ({where}); allowed: {self.allowed} — {self.fix}"
