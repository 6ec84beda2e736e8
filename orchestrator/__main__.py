"""`python -m orchestrator [-m] [+sweep=NAME] [group=option ...] [key=value ...]`: parse, compose, plan, run.

`--help`, `--cfg job` and `--info` (orchestrator/cli/args.py, orchestrator/cli/help.py) print and start nothing;
`recommend=true`, `dry_run=true` and the refusals before a launch are orchestrator/cli/commands.py's."""

from __future__ import annotations

import logging
import sys

from orchestrator.cli import args as cli
from orchestrator.cli import help as helptext
from orchestrator.config.grid import expand_points
from orchestrator.config.schema import ConfigError


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
        from orchestrator.cli import commands
        from orchestrator.plan import auto, plan

        if options.recommend:
            return commands.recommend(points, args.overrides, options)
        models = [p.cluster for p in points]
        specs = auto.resolve_all([p.spec for p in points], models)  # train.remat=auto: each point's own
        rows = plan(specs, models)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if options.dry_run:
        return commands.dry_run(options, specs, rows)
    refused = commands.refusal(options, specs, rows)  # an invalid point, the budget, a start-up fault
    if refused is not None:
        return refused
    from orchestrator.driver import run

    return run(options, specs, rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
