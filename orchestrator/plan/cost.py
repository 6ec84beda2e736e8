"""What a point costs before it runs: chip-hours (and money, with cluster.price_per_chip_hour), and the
budget.chip_hours check that refuses an over-budget sweep before anything launches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.spec import TrialSpec
from orchestrator.plan.cluster_model import (  # not via plan.aot: the plan must not import the compile pool
    CHIPS,
    ClusterModel,
)

if TYPE_CHECKING:
    from orchestrator.plan import PlanRow


def chips(spec: TrialSpec) -> float:
    """Chips a trial holds: its devices over the accelerator's JAX devices per chip (a tpu7x chip is two)."""
    per_chip = CHIPS.get(spec.cluster.accelerator, (None, None, 1))[2]
    return spec.mesh.size / per_chip


def chip_hours(spec: TrialSpec, model: ClusterModel, step_s: float) -> float:
    """Steps at the predicted step time plus one compile, while the trial holds its chips."""
    seconds = spec.train.steps * step_s + float(model.compile_seconds)
    return chips(spec) * seconds / 3600


def price(model: ClusterModel, hours: float) -> float | None:
    """The chip-hours at cluster.price_per_chip_hour; None without a price (no default: contracts differ)."""
    p = float(model.price_per_chip_hour)
    return hours * p if p > 0 else None


def total(rows: list[PlanRow]) -> float:
    """Chip-hours of the points that would launch (invalid and infeasible ones cost nothing)."""
    return sum(r.chip_hours or 0.0 for r in rows if r.verdict == "run")


def over_budget(specs: list[TrialSpec], rows: list[PlanRow], budget: float) -> str:
    """ "" when the sweep fits `budget` chip-hours (0: no budget), else one line: the total, the most expensive
    points, and what would fit (fewer steps, or the lengths up to some cutoff)."""
    spent = total(rows)
    if budget <= 0 or spent <= budget:
        return ""
    run = [(s, r) for s, r in zip(specs, rows, strict=True) if r.verdict == "run" and r.chip_hours]
    run.sort(key=lambda sr: -sr[1].chip_hours)
    top = ", ".join(f"{r.strategy} L={r.context_length:,} ({r.chip_hours:,.3g})" for _, r in run[:3])
    fixes = [f for f in (_fewer_steps(run, budget), _shorter(run, budget)) if f]
    fix = " or ".join(fixes) if fixes else "raise budget.chip_hours, or plan fewer points"
    return (
        f"the sweep is predicted at {spent:,.4g} chip-hours, over budget.chip_hours={budget:g}; most "
        f"expensive (chip-hours): {top}; would fit: {fix}"
    )


def _fewer_steps(run: list[tuple[TrialSpec, PlanRow]], budget: float) -> str:
    """The most train.steps every point could take within the budget (compiles are paid regardless)."""
    per_step = sum(chips(s) * r.predicted_step_s / 3600 for s, r in run)
    fixed = sum(
        r.chip_hours - chips(s) * s.train.steps * r.predicted_step_s / 3600 for s, r in run
    )  # compiles
    steps = int((budget - fixed) / per_step) if per_step > 0 else 0
    current = min(s.train.steps for s, _ in run)
    return f"train.steps={steps}" if 1 <= steps < current else ""


def _shorter(run: list[tuple[TrialSpec, PlanRow]], budget: float) -> str:
    """The longest context length such that the points up to it fit the budget."""
    fits = ""
    for cut in sorted({r.context_length for _, r in run}):
        if sum(r.chip_hours for _, r in run if r.context_length <= cut) > budget:
            break
        fits = f"context_length up to {cut:,} ({sum(r.context_length <= cut for _, r in run)} points)"
    return fits
