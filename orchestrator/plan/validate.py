"""Every rule a trial must pass before any device is asked for: all points at once, one line per problem."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from jobs import cp_rules, strategies
from jobs.spec import TrialSpec
from orchestrator.schema import DTYPES, REMATS

# orchestrator/schema.py owns the names (KERNELS); this adds where each kernel runs (None: everywhere).
KERNEL_PLATFORM = {"auto": None, "xla": None, "splash": "tpu", "flash": "gpu"}


@dataclass(frozen=True)
class Problem:
    """One broken rule at one grid point: the numbers and the fix are in `message`."""

    trial_id: str
    point: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.trial_id} ({self.point}) [{self.rule}] {self.message}"


@lru_cache(maxsize=65536)
def trial_id(spec: TrialSpec) -> str:
    """spec.trial_id, memoised: it hashes the canonical JSON of the spec (~1 ms), the planner's main cost."""
    return spec.trial_id


def point_label(spec: TrialSpec) -> str:
    """The grid point in its own words: its axis values, then the resolved mesh."""
    axes = [f"{k}={v}" for k, v in spec.axes]
    names = {k for k, _ in spec.axes}
    if "strategy" not in names:
        axes.insert(0, f"strategy={spec.strategy.name}")
    if "context_length" not in names:
        axes.append(f"context_length={spec.context_length}")
    return " ".join([*axes, f"mesh={spec.mesh.label()}"])


def _names(spec: TrialSpec) -> list[tuple[str, str]]:
    s, t, c = spec.strategy, spec.train, spec.cluster
    out = []
    if s.name not in strategies.NAMES:
        out.append(("unknown name", f"strategy {s.name!r} is not one of {', '.join(strategies.NAMES)}"))
    if s.layout not in cp_rules.LAYOUTS:
        out.append(("unknown name", f"layout {s.layout!r} is not one of {', '.join(cp_rules.LAYOUTS)}"))
    if s.kernel not in KERNEL_PLATFORM:
        out.append(("unknown name", f"kernel {s.kernel!r} is not one of {', '.join(KERNEL_PLATFORM)}"))
    elif KERNEL_PLATFORM[s.kernel] not in (None, c.platform):
        out.append(
            ("kernel vs platform", f"kernel {s.kernel} needs platform {KERNEL_PLATFORM[s.kernel]}, cluster "
             f"{c.name} is {c.platform}; use kernel=xla")
        )  # fmt: skip
    if t.remat not in REMATS:
        out.append(("unknown name", f"remat {t.remat!r} is not one of {', '.join(REMATS)}"))
    if t.dtype not in DTYPES:
        out.append(("unknown name", f"dtype {t.dtype!r} is not one of {', '.join(DTYPES)}"))
    return out


def _mesh(spec: TrialSpec) -> list[tuple[str, str]]:
    mesh, c, out = spec.mesh, spec.cluster, []
    bad = {a: v for a, v in mesh.shape().items() if not isinstance(v, int) or v < 1}
    if bad:
        return [("mesh axis sizes", f"mesh axes must be integers >= 1, got {bad}; use mesh=auto or integers")]
    if mesh.size != c.devices:
        shape = "*".join(f"{a}{v}" for a, v in mesh.shape().items() if v > 1) or "1"
        slices = f" x {c.slices_per_trial} slices" if c.slices_per_trial > 1 else ""
        out.append(
            ("mesh vs cluster", f"mesh {shape} = {mesh.size} devices but cluster {c.name} has {c.devices} "
             f"({c.hosts} hosts x {c.devices_per_host}{slices}); make the product {c.devices} or use mesh=auto")
        )  # fmt: skip
    if spec.strategy.name == "none" and mesh.cp > 1:
        out.append(
            ("no CP with context axes", f"strategy none runs attention unsharded but the mesh has "
             f"context*context_ulysses = {mesh.cp}; set them to 1 or pick a CP strategy")
        )  # fmt: skip
    return out


def _batch(spec: TrialSpec) -> list[tuple[str, str]]:
    t, m = spec.train, spec.mesh
    dp, accum = m.data * m.fsdp, max(t.grad_accum, 1)
    if t.batch < 1 or t.batch % (dp * accum):
        return [
            ("batch vs data*fsdp", f"batch {t.batch} is split into grad_accum={accum} microbatches sharded "
             f"over data*fsdp = {m.data}*{m.fsdp}: {t.batch} % {dp * accum} = {t.batch % (dp * accum)}; use "
             f"a batch that is a multiple of {dp * accum} or move devices to context")
        ]  # fmt: skip
    return []


def _attention(spec: TrialSpec) -> list[tuple[str, str]]:
    """The CP rules of jobs/cp_rules (the data plane raises the same words).

    cp_rules stops at the first problem; two probes that neutralise the length (a multiple of every ring
    size) and then the heads (a multiple of every split) report head and length problems independently.
    """
    s, m, mesh = spec.strategy, spec.model, spec.mesh.shape()
    if s.name not in strategies.NAMES or s.layout not in cp_rules.LAYOUTS:
        return []
    big = 2 * spec.mesh.size
    probes = {
        "heads per strategy": dict(context_length=big, q_heads=m.q_heads, kv_heads=m.kv_heads),
        "sequence divisibility": dict(
            context_length=spec.context_length, q_heads=big * m.q_heads, kv_heads=big
        ),
    }
    out: list[tuple[str, str]] = []
    for rule, kw in probes.items():
        try:
            cp_rules.validate(s.name, mesh=mesh, layout=s.layout, **kw)
        except ValueError as e:
            if all(str(e) != msg for _, msg in out):
                out.append((rule, str(e)))
    if not out:  # a rule the probes cannot see apart (both passed): ask once with the real numbers
        try:
            cp_rules.validate(
                s.name, context_length=spec.context_length, q_heads=m.q_heads, kv_heads=m.kv_heads,
                mesh=mesh, layout=s.layout,
            )  # fmt: skip
        except ValueError as e:
            out.append(("attention", str(e)))
    return out


def _multislice(spec: TrialSpec) -> list[tuple[str, str]]:
    """Which axis crosses slices (DCN), and whether this strategy may lay it there (jobs/cp_rules)."""
    if spec.strategy.name not in strategies.NAMES:
        return []
    try:
        cp_rules.validate_dcn(
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
    found = _names(spec) + _mesh(spec) + _batch(spec)
    if not any(rule == "mesh axis sizes" for rule, _ in found):
        found += _multislice(spec) + _attention(spec)
    if not found:
        return []
    tid, point = trial_id(spec), point_label(spec)
    return [Problem(tid, point, rule, msg) for rule, msg in found]


def validate(specs: list[TrialSpec]) -> list[Problem]:
    """Problems of every point, in grid order (empty: all valid)."""
    return [p for spec in specs for p in problems(spec)]
