"""For a model, cluster and context length: the strategy and mesh expected fastest among those that fit."""

from __future__ import annotations

from dataclasses import dataclass, replace

from jobs import strategies
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.plan import PlanRow, memory, plan


@dataclass(frozen=True)
class Recommendation:
    spec: TrialSpec | None  # None: nothing fits
    row: PlanRow | None
    reason: str
    candidates: tuple[PlanRow, ...]
    dcn: str = ""  # the mesh axis the winner lays across slices ("" on one slice)


def _pow2_divisors(n: int) -> list[int]:
    return [d for d in (2**i for i in range(n.bit_length())) if n % d == 0]


def dcn_choices(strategy: str, mesh: MeshSpec, slices: int) -> list[str]:
    """Axes to lay across slices: the strategy's allowed ones whose size the slices divide. None fitting: its
    first sequence axis anyway, so the plan says why it may not cross (ulysses' all-to-all)."""
    if slices <= 1:
        return [""]
    s = strategies.get(strategy)
    ok = [a for a in s.dcn_axes if getattr(mesh, a) % slices == 0]
    return ok or list(s.axes[:1])


def candidate_meshes(
    strategy: str, devices: int, batch: int, max_tensor: int = 8, slices: int = 1
) -> list[MeshSpec]:
    """Every power-of-two split of the devices into fsdp (dividing the batch), tensor and the context axes;
    across slices, once per axis that may cross them."""
    out = []
    for fsdp in _pow2_divisors(min(devices, batch) if batch > 0 else 1):
        if batch % fsdp:
            continue
        for tensor in _pow2_divisors(devices // fsdp):
            if tensor > max_tensor:
                continue
            cp = devices // (fsdp * tensor)
            if cp < 2:
                continue
            for c, u in strategies.get(strategy).mesh_splits(cp):
                mesh = MeshSpec(fsdp=fsdp, tensor=tensor, context=c, context_ulysses=u)
                out += [replace(mesh, dcn=a) for a in dcn_choices(strategy, mesh, slices)]
    return out


def candidates(
    model: ModelSpec, cluster: ClusterSpec, context_length: int, train: TrainSpec | None = None
) -> list[TrialSpec]:
    train = train or TrainSpec()
    out = []
    for name in strategies.CP_NAMES:
        strat = StrategySpec(name=name, layout=strategies.get(name).default_layout)
        for mesh in candidate_meshes(name, cluster.devices, train.batch, slices=cluster.slices_per_trial):
            out.append(TrialSpec(model, mesh, strat, context_length, train=train, cluster=cluster))
    return out


def recommend(
    model: ModelSpec, cluster: ClusterSpec, context_length: int, train: TrainSpec | None = None
) -> Recommendation:
    """Plan every candidate; pick the fastest step the model predicts among the `run` verdicts, and say why.

    Ranked by the calibrated step-time model (steptime.py), not the roofline: the roofline prices attention
    at peak, so it cannot see that a small ring hop or a head_dim of 128 costs a layout its lead."""
    specs = candidates(model, cluster, context_length, train)
    rows = plan(specs)
    ok = [(r, s) for r, s in zip(rows, specs, strict=True) if r.verdict == "run"]
    if not ok:
        fitting = [r for r in rows if r.predicted_hbm_bytes_per_device is not None]
        least = min(fitting, key=lambda r: r.predicted_hbm_bytes_per_device, default=None)
        why = f"nothing fits {model.name} at {context_length:,} tokens on {cluster.name}"
        if least is not None:
            why += f"; the leanest is {least.strategy} on {least.mesh}: {least.reason}"
        return Recommendation(None, None, why, tuple(rows))
    ok.sort(key=lambda rs: rs[0].predicted_step_s)
    best, spec = ok[0]
    hbm = memory.gib(best.predicted_hbm_bytes_per_device)
    why = (
        f"{best.strategy} on {best.mesh}: fastest of {len(ok)} feasible layouts, predicted {best.predicted_step_s:,.3g} s"
        f"/step at MFU {best.predicted_mfu:.2f} (roofline ≤ {best.roofline_mfu:.2f}) using {hbm}/device; "
        f"limited by {best.limiter}"
    )
    others = {}
    for r, _ in ok[1:]:
        others.setdefault(r.strategy, r)  # each other strategy's own best
    if others:
        why += "; next: " + ", ".join(
            f"{r.strategy} {r.mesh} {r.predicted_step_s / best.predicted_step_s:.2f}x slower"
            for r in others.values()
        )
    missing = [n for n in strategies.CP_NAMES if n != best.strategy and n not in others]
    for name in missing:
        mine = [r for r in rows if r.strategy == name]
        top = min(
            mine,
            key=lambda r: (r.verdict != "infeasible", r.predicted_hbm_bytes_per_device or 0),
            default=None,
        )
        if top is not None:
            why += f"; {name} never {'fits' if top.verdict == 'infeasible' else 'is valid'}: {top.reason}"
    if cluster.slices_per_trial > 1:
        rivals = [next(rs for rs in ok if rs[0] is r) for r in others.values() if r.strategy != best.strategy]
        why += "; " + _across_slices(cluster.slices_per_trial, [(best, spec), *rivals])
    return Recommendation(spec, best, why, tuple(rows), dcn=spec.mesh.dcn)


def _across_slices(slices: int, ranked: list[tuple[PlanRow, TrialSpec]]) -> str:
    """Which axis crosses the slices and why, for the winner and each other strategy's best layout."""
    words = []
    for r, s in ranked:
        what = strategies.get(s.strategy.name).dcn_words(s.mesh.shape(), s.mesh.dcn)
        words.append(f"{r.strategy} with dcn={s.mesh.dcn}: {what}, exposed {r.dcn_exposed_s:,.3g} s/step")
    return f"across {slices} slices, {words[0]}" + "".join(f"; {w}" for w in words[1:])
