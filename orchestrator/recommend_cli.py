"""`recommend=true`: the ranked answer for one point, as a rich table or JSON, and the exit code."""

from __future__ import annotations

import json
import sys

from jobs.spec import TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.recommend import Answer, search

# Words the answer's command lines set themselves, or that only ask for the answer: left out of their tail.
_OWN = ("strategy", "mesh", "train.remat", "train.memory", "recommend", "top", "output", "dry_run")


def tail(overrides: list[str]) -> list[str]:
    """The user's overrides that the command lines keep (model, cluster, length, anything else they set)."""
    keep = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if not any(key == k or key.startswith(f"{k}.") for k in _OWN):
            keep.append(f"'{o}'" if any(c in o for c in "[], ") else o)
    return keep


def answer(spec: TrialSpec, overrides: list[str], top: int) -> Answer:
    return search(spec.model, spec.cluster, spec.context_length, spec.train, top=top, tail=tail(overrides))


def to_json(a: Answer) -> str:
    # the row's short policy cell gives way to the words that select it
    top = [{"rank": i + 1, **c.row.as_dict(), "policy": c.policy.label(), "command": c.command}
           for i, c in enumerate(a.top)]  # fmt: skip
    return json.dumps(
        {"top": top, "losers": list(a.losers), "closest": a.closest, "searched": a.searched}, indent=1
    )


def show(a: Answer, output: str) -> int:
    """Print the answer; nothing fits: one `error:` line naming what comes closest, exit 2."""
    if not a.top:
        print(f"error: {a.closest}", file=sys.stderr)
        return 2
    if output == "json":
        print(to_json(a))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    table = Table(title=f"fastest of {a.searched:,} strategy x mesh x memory-policy candidates")
    cols = (
        "#",
        "strategy",
        "mesh",
        "memory policy",
        "step s",
        "MFU",
        "MFU ≤",
        "HBM/device",
        "chip-h",
        "limiter",
    )
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("strategy", "mesh", "memory policy", "limiter") else "right"
        )
    for i, c in enumerate(a.top, 1):
        r = c.row
        table.add_row(str(i), r.strategy, r.mesh, escape(c.policy.label()), f"{r.predicted_step_s:,.4g}",
                      f"{r.predicted_mfu:.3f}", f"{r.roofline_mfu:.2f}",
                      memory.gib(r.predicted_hbm_bytes_per_device), f"{r.chip_hours:,.3g}", r.limiter)  # fmt: skip
    console.print(table)
    for i, c in enumerate(a.top, 1):
        console.print(f"{i}. {c.command}", soft_wrap=True, markup=False, highlight=False)
    console.print("why the others lose:", markup=False)
    for line in a.losers:
        console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)
    return 0
