"""Rules across a trial's keys and against its cluster and model, per grid point, before any device is asked
for: all points at once, one line per problem. A key's own type, range and allowed names are the schema's
(orchestrator/config/schema.py, checked by orchestrator/config/keys.py), never restated here."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import KERNEL_PLATFORM, REMAT_PRESETS, TrialSpec
from jobs.strategies import rules

__all__ = ["KERNEL_PLATFORM", "Problem", "point_label", "problems", "validate"]


@dataclass(frozen=True)
class Problem:
    """One broken rule at one grid point: the numbers and the fix are in `message`."""

    trial_id: str
    point: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.trial_id} ({self.point}) [{self.rule}] {self.message}"


def point_label(spec: TrialSpec) -> str:
    """The grid point in its own words: its axis values, then the resolved mesh."""
    axes = [f"{k}={v}" for k, v in spec.axes]
    names = {k for k, _ in spec.axes}
    if "strategy" not in names:
        axes.insert(0, f"strategy={spec.strategy.name}")
    if "context_length" not in names:
        axes.append(f"context_length={spec.context_length}")
    return " ".join([*axes, f"mesh={spec.mesh.label()}"])


def _kernel(spec: TrialSpec) -> list[tuple[str, str]]:
    s, c, m = spec.strategy, spec.cluster, spec.model
    needs = KERNEL_PLATFORM.get(s.kernel)
    if needs not in (None, c.platform):
        return [
            (
                "kernel vs platform",
                f"kernel {s.kernel} needs platform {needs}, cluster {c.name} is {c.platform}; use kernel=xla",
            )
        ]
    # a window or chunk shorter than the row is a mask splash takes only where a call holds the whole sequence
    limited = {"local": 0 < m.window < spec.context_length, "chunked": 0 < m.chunk < spec.context_length}
    if s.kernel == "splash" and any(
        limited.get(kind) and s.for_layer(kind) not in rules.SPLASH_SPAN_STRATEGIES
        for kind in m.attention_pattern
    ):
        return [("kernel vs mask", rules.SPLASH_SPAN)]
    return []


def _memory(spec: TrialSpec) -> list[tuple[str, str]]:
    """train.memory against train.remat: extra saves and offloads need a policy; a residual is saved or
    offloaded, not both (jax.checkpoint_policies refuses the overlap, and which one was meant is unclear)."""
    remat, mem = spec.train.remat, spec.train.memory
    lists = {"save": list(mem.save), "offload": list(mem.offload)}

    def line(k: str, wrong: str, allowed: str, fix: str) -> list[tuple[str, str]]:
        return [("memory policy", f"train.memory.{k}={lists[k]!r} {wrong}; allowed: {allowed} — {fix}")]

    if remat == "none":
        if k := next((k for k, names in lists.items() if names), None):
            return line(
                k,
                "needs a remat policy, but train.remat=none keeps every residual in HBM",
                "train.memory.save/offload with train.remat=full, save_attn or offload",
                f"set train.remat=full, or drop train.memory.{k}",
            )
        return []
    preset = dict(zip(("save", "offload"), REMAT_PRESETS.get(remat, ((), ())), strict=True))
    verb = {"save": "saves it in HBM", "offload": "offloads it to host memory"}
    for k, other in (("save", "offload"), ("offload", "save")):
        for n in lists[k]:
            if n in lists[other]:
                why, fix = f"train.memory.{other} also names it", f"drop {n} from one of the two lists"
            elif n in preset[other]:
                why, fix = f"train.remat={remat} already {verb[other]}", "drop it, or use train.remat=full"
            else:
                continue
            return line(k, f"names {n}, but {why}", "each residual saved or offloaded, not both", fix)
    return []


def _data(spec: TrialSpec) -> list[tuple[str, str]]:
    """train.data.kind against train.data.path (the path itself is the schema's: a readable file)."""
    kind, path = spec.train.data.kind, spec.train.data.path
    if kind == "tokens" and not path:
        return [
            (
                "data kind vs path",
                "train.data.path='' is empty but train.data.kind=tokens reads a token "
                "file; allowed: a local file or gs://bucket/object — set train.data.path=..., or "
                "train.data.kind=recall for the synthetic task",
            )
        ]
    if kind == "recall" and path:
        return [
            (
                "data kind vs path",
                f"train.data.path={path!r} is ignored by train.data.kind=recall; "
                "allowed: a path only with train.data.kind=tokens — set train.data.kind=tokens to train on "
                "it, or drop the path",
            )
        ]
    if spec.strategy.layout == "balanced" and kind != "documents":
        return [
            (
                "layout vs data",
                f"strategy.layout=balanced balances packed documents, but train.data.kind="
                f"{kind} has one causal row; allowed: balanced with train.data.kind=documents — use "
                "strategy.layout=zigzag",
            )
        ]
    if spec.strategy.layout == "balanced" and spec.strategy.kernel == "splash":
        return [
            (
                "layout vs kernel",
                "strategy.layout=balanced is a per-row token order that splash's static "
                "masks cannot express; allowed: kernel xla or auto (xla for balanced) — set "
                "strategy.kernel=auto",
            )
        ]
    return []


def _mesh(spec: TrialSpec) -> list[tuple[str, str]]:
    mesh, c, out = spec.mesh, spec.cluster, []
    if mesh.size != c.devices:
        shape = "*".join(f"{a}{v}" for a, v in mesh.shape().items() if v > 1) or "1"
        slices = f" x {c.slices_per_trial} slices" if c.slices_per_trial > 1 else ""
        out.append(
            (
                "mesh vs cluster",
                f"mesh {shape} = {mesh.size} devices but cluster {c.name} has {c.devices} "
                f"({c.hosts} hosts x {c.devices_per_host}{slices}); make the product {c.devices} or use mesh=auto",
            )
        )
    if spec.strategy.name == "none" and mesh.cp > 1:
        out.append(
            (
                "no CP with context axes",
                f"strategy none runs attention unsharded but the mesh has "
                f"context*context_ulysses = {mesh.cp}; set them to 1 or pick a CP strategy",
            )
        )
    return out


def _batch(spec: TrialSpec) -> list[tuple[str, str]]:
    t, m = spec.train, spec.mesh
    problem = rules.batch_problem(t.batch, m.data, m.fsdp, t.grad_accum)
    return [("batch vs data*fsdp", problem)] if problem else []


def _attention(spec: TrialSpec) -> list[tuple[str, str]]:
    """The CP rules of jobs/strategies/rules (the data plane raises the same words).

    rules.validate stops at the first problem; two probes that neutralise the length (a multiple of every ring
    size) and then the heads (a multiple of every split) report head and length problems independently.
    """
    s, m, mesh = spec.strategy, spec.model, spec.mesh.shape()
    big = 2 * spec.mesh.size
    probes = {
        "heads per strategy": dict(context_length=big, q_heads=m.q_heads, kv_heads=m.kv_heads),
        "sequence divisibility": dict(
            context_length=spec.context_length, q_heads=big * m.q_heads, kv_heads=big
        ),
    }
    out: list[tuple[str, str]] = []
    names = [s.name] + [s.local] * (s.local not in ("", s.name))
    for name in names:
        for rule, kw in probes.items():
            try:
                rules.validate(name, mesh=mesh, layout=s.layout, **kw)
            except ValueError as e:
                if all(str(e) != msg for _, msg in out):
                    out.append((rule, str(e)))
    if not out:  # a rule the probes cannot see apart (both passed): ask once with the real numbers
        for name in names:
            try:
                rules.validate(
                    name,
                    context_length=spec.context_length,
                    q_heads=m.q_heads,
                    kv_heads=m.kv_heads,
                    mesh=mesh,
                    layout=s.layout,
                )
            except ValueError as e:
                out.append(("attention", str(e)))
    return out + _local(spec)


def _local(spec: TrialSpec) -> list[tuple[str, str]]:
    """strategy.local: layers it applies to, and a mesh and token order it shares with strategy.name."""
    s, pattern = spec.strategy, spec.model.attention_pattern
    if not s.local:
        return []
    if "local" not in pattern and "chunked" not in pattern:
        return [
            (
                "strategy per layer type",
                f"strategy.local={s.local} names the strategy of local and chunked layers, but model "
                f"{spec.model.name} has only global ones (attention_pattern={list(pattern)}); drop strategy.local",
            )
        ]
    problem = rules.mix_problem(s.name, s.local, spec.mesh.shape(), s.layout)
    return [("strategy per layer type", problem)] if problem else []


def _multislice(spec: TrialSpec) -> list[tuple[str, str]]:
    """Which axis crosses slices (DCN), and whether this strategy may lay it there (jobs/strategies/rules)."""
    try:
        rules.validate_dcn(
            spec.strategy.name,
            mesh=spec.mesh.shape(),
            dcn=spec.mesh.dcn,
            slices=spec.cluster.slices_per_trial,
        )
    except ValueError as e:
        return [("multislice", str(e))]
    return []


def problems(spec: TrialSpec) -> list[Problem]:
    """Every broken rule of one trial."""
    found = _kernel(spec) + _memory(spec) + _data(spec) + _mesh(spec) + _batch(spec)
    found += _multislice(spec) + _attention(spec)
    if not found:
        return []
    tid, point = spec.trial_id, point_label(spec)
    return [Problem(tid, point, rule, msg) for rule, msg in found]


def validate(specs: list[TrialSpec]) -> list[Problem]:
    """Problems of every point, in grid order (empty: all valid)."""
    return [p for spec in specs for p in problems(spec)]
