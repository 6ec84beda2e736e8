"""The planner: for each grid point, is it valid, does it fit, how fast would it run (no device needed)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jobs import strategies
from jobs.spec import REMATS, TrialSpec
from orchestrator.plan import cost, memory, packing, policies, resources, roofline, steptime, validity, work
from orchestrator.plan.cluster_model import ClusterModel, model_of
from orchestrator.plan.render import render_table, seconds, step_band, to_markdown
from orchestrator.plan.validity import Problem, point_label

VERDICTS = ("run", "infeasible", "invalid")


@dataclass(frozen=True)
class PlanRow:
    """One grid point's verdict and the predictions behind it (per device, per step)."""

    trial_id: str
    model: str
    strategy: str
    mesh: str
    context_length: int
    cluster: str
    verdict: str  # run | infeasible | invalid
    reason: str
    tflops_per_device_per_step: float
    predicted_hbm_bytes_per_device: int | None = None
    predicted_step_s: float | None = None  # the step-time model (steptime.py), calibrated on published runs
    predicted_mfu: float | None = None
    memory: dict[str, int] = field(default_factory=dict)
    comm_bytes_per_layer: int | None = None
    point: str = ""
    roofline_step_s: float | None = None  # every FLOP at peak: a bound, not a forecast
    roofline_mfu: float | None = None
    limiter: str = ""  # what the model says the step spends most of its time on
    dcn_exposed_s: float | None = None  # of predicted_step_s: slice-crossing traffic not hidden (mesh.dcn)
    policy: str = ""  # the memory policy the point runs (train.remat and train.memory), e.g. under remat=auto
    chip_hours: float | None = None  # steps x predicted step + a compile, times the chips (plan/cost.py)
    cost: float | None = None  # chip_hours x cluster.price_per_chip_hour (None without a price)
    useful_mfu: float | None = None  # packed documents: MFU counting their own attention, not the causal row
    # The band: where the fit's held-out errors (conf/cluster step_band_low/high) put the real step and MFU.
    predicted_step_low_s: float | None = None
    predicted_step_high_s: float | None = None
    predicted_mfu_low: float | None = None
    predicted_mfu_high: float | None = None
    resources: tuple[resources.Resource, ...] = ()  # every resource the step uses, with its verdict
    # The step-time terms behind predicted_step_s, carried so that nothing downstream (tracking, the report)
    # runs the model again; not part of the row's printed or JSON form.
    step: steptime.StepTime | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["step"]
        return d


def _accel(spec: TrialSpec) -> str:
    return spec.cluster.accelerator or spec.cluster.name


def plan_one(
    spec: TrialSpec, model: ClusterModel | None = None, problems: list[Problem] | None = None
) -> PlanRow:
    """One point's row; `model` is its cluster as the planner prices it (default: its conf/cluster/ file's),
    `problems` its rule breaks when the caller found them already."""
    model = model or model_of(spec.cluster)
    problems = validity.problems(spec) if problems is None else problems
    base = dict(
        trial_id=spec.trial_id,
        model=spec.model.name,
        strategy=spec.strategy.name,
        mesh=spec.mesh.label(),
        context_length=spec.context_length,
        cluster=spec.cluster.name,
        point=point_label(spec),
        policy=policies.short(spec.train),
    )
    w = None if problems else work.step_work(spec)  # one work model, priced at peak and as runs spend it
    roof = None if problems else roofline.roofline(spec, w, model)
    st = None if problems else steptime.step_time(spec, work=w, model=model)
    tflops = roof.tflops_per_device if roof else _tflops(spec)
    if problems:
        reason = "; ".join(f"{p.rule}: {p.message}" for p in problems)
        return PlanRow(**base, verdict="invalid", reason=reason, tflops_per_device_per_step=tflops)
    mem = memory.breakdown(spec)
    hbm = memory.peak(mem)
    budget = float(model.max_step_seconds)
    limit = int(model.hbm_bytes_per_device)
    why = []
    if limit and hbm > limit:
        top = max((k for k in mem if k != "host_offload"), key=mem.get)  # host memory is not HBM
        why.append(
            f"needs {memory.gib(hbm)}/device, {_accel(spec)} has {memory.gib(limit)} "
            f"(largest term: {top.replace('_', ' ')} {memory.gib(mem[top])})"
        )
        hint = strategies.get(spec.strategy.name).overflow_hint(memory.local_sizes(spec))
        if hint:
            why[-1] += f"; {hint}"
        policy = _policy_that_fits(spec, model, limit, budget)
        if policy:
            why[-1] += f"; {policy}"
    used = resources.resources(spec, model, mem, hbm, w, st)
    for r in resources.overflowing(used):
        if r.name == "host_memory":
            why.append(
                f"host RAM: needs {memory.gib(r.used)} per host ({r.note}: offloaded activations and host-resident "
                f"state {memory.gib(mem['host_offload'])}/device), the host has {memory.gib(r.capacity)}"
            )
    if budget > 0 and st.step_s > budget:
        why.append(f"predicted step {seconds(st.step_s)} s > this cluster's {budget:g} s budget")
    verdict = "infeasible" if why else "run"
    if not why:
        cap = f" of {memory.gib(limit)}" if limit else ""
        low, high = st.mfu_band
        why.append(
            f"fits: {memory.gib(hbm)}{cap}; predicted step {step_band(st.step_s, st.step_low_s, st.step_high_s)} s"
            f" at MFU {st.mfu:.2f} ({f'{low:.2f}-{high:.2f}; ' if low != high else ''}roofline ≤ {roof.mfu:.2f}), "
            f"limited by {st.limiter}"
        )
    pk = packing.of(spec)
    why += [n for n in (steptime.layer_words(spec, w, model), packing.words(pk, spec, st.mfu)) if n]
    hours = cost.chip_hours(spec, model, st.step_s)
    return PlanRow(
        **base,
        verdict=verdict,
        reason="; ".join(why),
        tflops_per_device_per_step=tflops,
        chip_hours=hours,
        cost=cost.price(model, hours),
        predicted_hbm_bytes_per_device=hbm,
        predicted_step_s=st.step_s,
        predicted_mfu=st.mfu,
        memory=mem,
        comm_bytes_per_layer=roof.attention_comm_bytes_per_layer,
        roofline_step_s=roof.step_s,
        roofline_mfu=roof.mfu,
        limiter=st.limiter,
        dcn_exposed_s=st.dcn_exposed_s,
        useful_mfu=packing.useful_mfu(spec, pk, st.mfu) if pk else None,
        predicted_step_low_s=st.step_low_s,
        predicted_step_high_s=st.step_high_s,
        predicted_mfu_low=st.mfu_band[0],
        predicted_mfu_high=st.mfu_band[1],
        resources=used,
        step=st,
    )


def _policy_that_fits(spec: TrialSpec, model: ClusterModel, limit: int, budget: float) -> str:
    """For a point over HBM: the remat preset, other than its own, that would run and is fastest by the
    step-time model (e.g. "fits with train.remat=offload (43.2 GiB)"), or the leanest when none fits. Only points
    over HBM pay for this (a breakdown per preset, a step time per one that fits). train.memory stays as given:
    the presets add to it. Host-memory policies beyond the presets are not tried: the planner does not check
    host capacity."""
    fits, over = [], []
    for remat in REMATS:
        if remat == spec.train.remat:
            continue
        alt = replace(spec, train=replace(spec.train, remat=remat))
        hbm = memory.peak(memory.breakdown(alt))
        if hbm > limit:
            over.append((hbm, remat))
            continue
        step = steptime.step_time(alt, model=model).step_s
        if budget <= 0 or step <= budget:
            fits.append((step, hbm, remat))
    if fits:
        _, hbm, remat = min(fits)
        return f"fits with train.remat={remat} ({memory.gib(hbm)})"
    if over and len(over) == len(REMATS) - (spec.train.remat in REMATS):
        hbm, remat = min(over)
        return f"no train.remat preset fits (leanest: train.remat={remat}, {memory.gib(hbm)})"
    return ""


def _tflops(spec: TrialSpec) -> float:
    from jobs.flops import train_tflops_per_device

    return train_tflops_per_device(spec.model, spec.context_length, spec.train.batch, max(spec.mesh.size, 1))


def plan(specs: list[TrialSpec], models: list[ClusterModel] | None = None) -> list[PlanRow]:
    """A row per point, in grid order; `models`: each point's cluster as the planner prices it (default: each
    spec's conf/cluster/ file's)."""
    if models is None:
        return [plan_one(s) for s in specs]
    return [plan_one(s, m) for s, m in zip(specs, models, strict=True)]


def to_json(rows: list[PlanRow]) -> str:
    return json.dumps([r.as_dict() for r in rows], indent=1)


__all__ = ["PlanRow", "plan", "plan_one", "render_table", "to_json", "to_markdown", "validity", "VERDICTS"]
