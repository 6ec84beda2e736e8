"""`python -m orchestrator [-m] [+sweep=NAME] [group=option ...] [key=value ...]`: compose, plan, run.

`--help`, `--cfg job` and `--info` (orchestrator/cli/args.py, orchestrator/cli/help.py) print and start nothing."""

from __future__ import annotations

import logging
import sys

from orchestrator.cli import args as cli
from orchestrator.cli import help as helptext
from orchestrator.config.grid import expand_points
from orchestrator.config.schema import ConfigError, Options


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = cli.parse_args(argv)
        if args.help:
            print(helptext.help_text())
            return 0
        loaded = cli.compose(args)  # composed, resolved and its options typed, once
        if args.cfg or args.info:
            print(cli.show(loaded, args), end="")
            return 0
        options, points = loaded.options, expand_points(loaded.tree)
        models = [p.cluster for p in points]
        if options.recommend:
            if options.sweep is not None or len(points) != 1:
                raise ConfigError(
                    "recommend=true answers for one point: drop +sweep=... and -m sweep overrides, "
                    "or run dry_run=true to plan the grid"
                )
            from orchestrator.cli import commands

            spec, model = points[0]
            found = commands.answer(spec, model, list(args.overrides), options.top, options.search)
            return commands.show(found, options.output, options if options.aot else None)
        from orchestrator.plan import auto, plan, render_table, to_json

        specs = auto.resolve_all([p.spec for p in points], models)  # train.remat=auto: each point's own
        rows = plan(specs, models)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from orchestrator.plan.cost import over_budget

    over = over_budget(specs, rows, options.budget.chip_hours)  # checked after a dry run prints its plan too
    invalid = [r for r in rows if r.verdict == "invalid"]
    if options.dry_run:
        if options.output == "json":
            print(to_json(rows))
        else:
            from rich.console import Console

            render_table(rows, Console(width=max(Console().width, 180)))
        compiled, code = _aot(specs, rows, options) if options.aot else ({}, 0)
        if options.record and code == 0:
            _record(options, specs, rows, compiled)
        if over:
            print(f"error: {over}", file=sys.stderr)
            return 2
        if options.aot:
            return code
        return 2 if invalid and not options.skip_invalid else 0
    if invalid and not options.skip_invalid:
        _report_invalid(specs, rows)
        return 2
    if over:
        print(f"error: {over}; nothing launched", file=sys.stderr)
        return 2
    from orchestrator.driver import run
    from orchestrator.launch import preflight

    try:  # the environment's faults (tracking server, Ray head, gs:// credentials), before anything starts
        preflight.check(options.tracking, [s for s, r in zip(specs, rows, strict=True) if r.verdict == "run"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run(options, specs, rows)


def _report_invalid(specs: list, rows: list) -> None:
    """One `error:` line (the first invalid point, the count, the fix); the other points below it, indented,
    so a script reads one error and a person still sees every problem at once."""
    from orchestrator.plan.rules import point_label

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


def _aot(specs: list, rows: list, options: Options) -> tuple[dict, int]:
    """dry_run=true aot=true: compile the valid points for the cluster's TPU topology, analytic vs compiled —
    the planner's infeasible ones too, since the compiler may fit what the planner's estimate does not.
    Returns (trial id -> aot.Comparison, exit code)."""
    from orchestrator.plan import aot, render

    if not aot.available():
        print("error: aot=true needs libtpu on this host: pip install -e '.[tpu]'", file=sys.stderr)
        return {}, 2
    valid = [s for s, r in zip(specs, rows, strict=True) if r.verdict != "invalid"]
    from rich.console import Console

    console = Console(width=max(Console().width, 140))
    # on a Ray pool (aot.pool): options.aot_workers at once, on the shared cache options.aot_cache
    try:
        compared = aot.compare(
            valid,
            options.aot_topology or None,
            workers=options.aot_workers,
            cache=options.aot_cache,
            progress=options.progress,
            console=console,
            draws=options.aot_draws,
        )
    except ConnectionError as e:  # a cluster.address that was named and does not answer
        print(f"error: aot=true: no Ray to compile on: {e}", file=sys.stderr)
        return {}, 2
    render.render_comparison(compared, console)
    return {r.trial_id: r for r in compared}, 0


def _record(options: Options, specs: list, rows: list, compiled: dict) -> None:
    """dry_run=true record=true: the plan as planned MLflow runs (tag planned=true), with plots."""
    from orchestrator.driver import sweep_identity
    from orchestrator.results import planned as planrecord
    from orchestrator.tracking import open_tracker, recording

    if not recording(options.tracking):
        print("record=true with tracking=none: the plan was printed, not recorded", file=sys.stderr)
        return

    name, sweep_id = sweep_identity(options)
    tracker = open_tracker(options.tracking)
    sid = planrecord.record(tracker, name, sweep_id, specs, rows, compiled)
    if not tracker.flush(timeout=300):
        print(f"warning: {len(tracker.ops)} planned-run writes not delivered", file=sys.stderr)
    print(f"recorded the plan as sweep {sid} (tag planned=true): {tracker.dashboard_hint()}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
