"""The refusals before a launch: an invalid point (unless skip_invalid=true), a plan over the budget, or a fault
of the environment (tracking server, Ray head, gs:// credentials), each printed with its fix."""

from __future__ import annotations

import sys

from jobs.spec import TrialSpec
from orchestrator.config.schema import ConfigError, Options
from orchestrator.launch import preflight
from orchestrator.plan import PlanRow
from orchestrator.plan.cost import over_budget
from orchestrator.plan.validity import point_label


def check(options: Options, specs: list[TrialSpec], rows: list[PlanRow]) -> int | None:
    """Why a sweep must not launch, printed, as its exit code (2): an invalid point (unless skip_invalid=true),
    a plan over the budget, or a fault of the environment (tracking server, Ray head, gs:// credentials).
    None: launch."""
    if any(r.verdict == "invalid" for r in rows) and not options.skip_invalid:
        report_invalid(specs, rows)
        return 2
    if over := over_budget(specs, rows, options.budget.chip_hours):
        print(f"error: {over}; nothing launched", file=sys.stderr)
        return 2
    try:  # the environment's faults, before anything starts
        preflight.check(options.tracking, [s for s, r in zip(specs, rows, strict=True) if r.verdict == "run"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return None


def report_invalid(specs: list[TrialSpec], rows: list[PlanRow]) -> None:
    """One `error:` line (the first invalid point, the count, the fix); the other points below it, indented,
    so a script reads one error and a person still sees every problem at once."""
    bad = [
        f"grid point {point_label(s)} (trial {r.trial_id}) is invalid: {r.reason}"
        for s, r in zip(specs, rows, strict=True)
        if r.verdict == "invalid"
    ]
    print(
        f"error: {bad[0]}; {len(bad)} of {len(rows)} grid points are invalid, nothing launched — fix them, "
        "or pass skip_invalid=true to run the valid ones",
        file=sys.stderr,
    )
    for line in bad[1:]:
        print(f"  also {line}", file=sys.stderr)
