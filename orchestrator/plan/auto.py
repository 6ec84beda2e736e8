"""`train.remat=auto`: each grid point gets the memory policy the planner expects fastest among those that fit.

Resolved before the plan and the launch, so what a trial runs, what its id hashes and what its params say is
the policy itself, never "auto": a point whose choice does not change keeps its trial id.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from jobs.spec import TrialSpec
from orchestrator.plan import memory, policies, resources, steptime, validity
from orchestrator.plan.cluster_model import ClusterModel, model_of

AUTO = "auto"
# Steps within TIE of each other are a tie: the step-time model is not that precise. A tie prefers policies
# predicted at most HEADROOM of HBM (docs/results/aot.md: the planner sits within about 5-15 % of the
# compiler's peak, either side).
TIE, HEADROOM = 0.005, 0.8


Run = tuple[float, int, TrialSpec, policies.Policy]  # (predicted step s, HBM bytes/device, spec, policy)


def pick(runs: list[Run], hbm: int = 0) -> Run:
    """Of runs that fit: among those within TIE of the fastest step, the simplest policy (fewest override words)
    that leaves HEADROOM of HBM free, else the leanest. Simplest, because an extra offload in a tie buys nothing
    the model can see and costs host RAM and host-link time; headroom, because the planner's HBM is an estimate
    the real compile may exceed."""
    t0 = min(r[0] for r in runs)
    tied = [r for r in runs if r[0] <= t0 * (1 + TIE)]
    roomy = [r for r in tied if r[1] <= HEADROOM * (hbm or float("inf"))]
    if roomy:
        return min(roomy, key=lambda r: (len(r[3].words()), r[1], r[0]))
    return min(tied, key=lambda r: (r[1], r[0]))


def rank(runs: list[Run], hbm: int = 0) -> list[Run]:
    """Fastest first, where a tie (within TIE of the fastest left) goes to the leaner: pick, repeatedly."""
    left, out = list(runs), []
    while left:
        out.append(pick(left, hbm))
        left.remove(out[-1])
    return out


def resolve(spec: TrialSpec, model: ClusterModel | None = None) -> TrialSpec:
    """The spec under its fastest fitting policy (policies.candidates for its platform). Nothing fits: the
    leanest, so the plan says infeasible with the smallest figure. An invalid point keeps train.remat=full and
    train.memory empty, so the plan names its real problem."""
    if spec.train.remat != AUTO:
        return spec
    base = replace(spec, train=replace(spec.train, remat="full"))
    chosen = base if validity.problems(base) else _fastest(spec, model or model_of(spec.cluster))
    # a remat axis names the resolved preset too: params and point labels never say "auto"
    axes = tuple((k, chosen.train.remat if k == "train.remat" else v) for k, v in spec.axes)
    return replace(chosen, axes=axes)


def resolve_all(specs: list[TrialSpec], models: list[ClusterModel]) -> list[TrialSpec]:
    """Each point under its own policy, before anything plans, hashes or records it."""
    return [resolve(s, m) for s, m in zip(specs, models, strict=True)]


def _fastest(spec: TrialSpec, model: ClusterModel) -> TrialSpec:
    limit, budget = int(model.hbm_bytes_per_device), float(model.max_step_seconds)
    runs, lean = [], None
    host = int(model.host_memory_bytes) if spec.cluster.platform != "cpu" else 0
    for p in _candidates(spec.cluster.platform):
        s = replace(spec, train=p.apply(spec.train))
        mem = memory.breakdown(s)
        hbm = memory.peak(mem)
        if lean is None or hbm < lean[0]:
            lean = (hbm, s)
        if limit and hbm > limit:
            continue
        if host and resources.host_memory_bytes(s, mem) > host:
            continue
        step = steptime.step_time(s, model=model).step_s
        if budget <= 0 or step <= budget:
            runs.append((step, hbm, s, p))
    return pick(runs, limit)[2] if runs else lean[1]


@cache
def _candidates(platform: str) -> tuple[policies.Policy, ...]:
    return tuple(policies.candidates(platform))
