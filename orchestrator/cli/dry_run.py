"""`dry_run=true`: the plan, printed as a rich table or JSON; with `aot=true` its points compiled for the TPU
topology (analytic vs compiled), with `record=true` recorded as planned MLflow runs. Nothing is launched."""

from __future__ import annotations

import sys

from rich.console import Console

from jobs.spec import TrialSpec
from orchestrator.cli import compiles
from orchestrator.config.schema import Options, sweep_identity
from orchestrator.plan import PlanRow, render, render_table, to_json
from orchestrator.plan.cost import over_budget
from orchestrator.tracking import open_tracker, recording


def main(options: Options, specs: list[TrialSpec], rows: list[PlanRow]) -> int:
    """Print the plan (then, with aot=true, compile it; with record=true, record it); exit 2 for an invalid
    point (unless skip_invalid=true) or a plan over the budget."""
    over = over_budget(specs, rows, options.budget.chip_hours)  # checked after the plan is printed
    if options.output == "json":
        print(to_json(rows))
    else:
        console = Console(width=max(Console().width, 180)) if options.wide else Console()
        render_table(rows, console, wide=options.wide)
    compiled, code = compile_plan(specs, rows, options) if options.aot else ({}, 0)
    if options.record and code == 0:
        record_plan(options, specs, rows, compiled)
    if over:
        print(f"error: {over}", file=sys.stderr)
        return 2
    if options.aot:
        return code
    return 2 if any(r.verdict == "invalid" for r in rows) and not options.skip_invalid else 0


def compile_plan(specs: list[TrialSpec], rows: list[PlanRow], options: Options) -> tuple[dict, int]:
    """aot=true: compile the valid points for the cluster's TPU topology, analytic vs compiled — the planner's
    infeasible ones too, since the compiler may fit what the planner's estimate does not. Returns (trial id ->
    aot.Comparison, exit code)."""
    if compiles.missing_libtpu():
        return {}, 2
    valid = [s for s, r in zip(specs, rows, strict=True) if r.verdict != "invalid"]
    console = Console(width=max(Console().width, 140))
    try:
        compared = compiles.compare(valid, options, console)
    except ConnectionError as e:  # a cluster.address that was named and does not answer
        print(f"error: aot=true: no Ray to compile on: {e}", file=sys.stderr)
        return {}, 2
    render.render_comparison(compared, console)
    return {r.trial_id: r for r in compared}, 0


def record_plan(options: Options, specs: list[TrialSpec], rows: list[PlanRow], compiled: dict) -> None:
    """record=true: the plan as planned MLflow runs (tag planned=true), with plots."""
    if not recording(options.tracking):
        print("record=true with tracking=none: the plan was printed, not recorded", file=sys.stderr)
        return
    # imports matplotlib (~0.5 s): only a plan that is recorded pays it
    from orchestrator.results import planned

    name, sweep_id = sweep_identity(options)
    tracker = open_tracker(options.tracking)
    sid = planned.record(tracker, name, sweep_id, specs, rows, compiled)
    if left := tracker.finish(timeout=300):
        print(f"warning: {left} planned-run writes not delivered", file=sys.stderr)
    print(f"recorded the plan as sweep {sid} (tag planned=true): {tracker.dashboard_hint()}")
