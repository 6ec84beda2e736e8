"""aot=true: the points' compiles for the cluster's TPU topology on a Ray pool (orchestrator/plan/aot/pool.py),
analytic vs compiled memory; on the cluster's Ray where it names an address, else on a local one."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from jobs.spec import TrialSpec
from orchestrator.config.schema import Options
from orchestrator.plan import aot

if TYPE_CHECKING:
    from rich.console import Console


def missing_libtpu() -> bool:
    """True, with the `error:` line printed, where this host cannot compile for a TPU (no libtpu)."""
    if aot.available():
        return False
    print("error: aot=true needs libtpu on this host: pip install -e '.[tpu]'", file=sys.stderr)
    return True


def compare(specs: list[TrialSpec], options: Options, console: Console) -> list[aot.Comparison]:
    """aot.compare's rows for `specs`: `options.aot_workers` compiles at once on the shared cache
    `options.aot_cache`, the progress on `console`. Raises ConnectionError where the cluster names a Ray
    address that does not answer."""
    if specs:
        from orchestrator.launch import cluster  # imports ray (~0.7 s): only a command that compiles pays it

        cluster.join_or_start(specs[0].cluster, options.aot_workers)
    return aot.compare(
        specs,
        options.aot_topology or None,
        workers=options.aot_workers,
        cache=options.aot_cache,
        progress=options.progress,
        console=console,
        draws=options.aot_draws,
    )
