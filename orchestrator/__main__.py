"""`python -m orchestrator [-m] [+sweep=NAME] [group=option ...] [key=value ...]`: parse, compose, plan, run.

`--help`, `--cfg job` and `--info` (orchestrator/cli/args.py, orchestrator/cli/help.py) print and start nothing;
`recommend=true`, `dry_run=true`, `specs=DIR` and the refusals before a launch are orchestrator/cli/'s
recommend.py, dry_run.py, spec_files.py and refusal.py."""

from __future__ import annotations

import logging
import sys

from orchestrator.cli.args import compose, parse_args, search_dirs, show
from orchestrator.cli.help import help_text
from orchestrator.config.grid import expand_points
from orchestrator.config.schema import ConfigError


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        if args.help:
            print(help_text())
            return 0
        loaded = compose(args)  # composed, resolved and its options typed, once
        if args.cfg or args.info:
            print(show(loaded, args), end="")
            return 0
        # a grid axis's group options come from the same directories composing read (--config-dir)
        options, points = loaded.options, expand_points(loaded.tree, search_dirs(args))
        from orchestrator.cli import dry_run, recommend, refusal, spec_files
        from orchestrator.plan import auto, plan

        if options.recommend:
            return recommend.main(points, args.overrides, options)
        models = [p.cluster for p in points]
        specs = auto.resolve_all([p.spec for p in points], models)  # train.remat=auto: each point's own
        rows = plan(specs, models)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if options.specs:  # each point as the hosts would get it, policy resolved above; nothing starts
        return spec_files.write(options.specs, specs, rows)
    if options.dry_run:
        return dry_run.main(options, specs, rows)
    refused = refusal.check(options, specs, rows)  # an invalid point, the budget, a start-up fault
    if refused is not None:
        return refused
    from orchestrator.driver import run

    return run(options, specs, rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
