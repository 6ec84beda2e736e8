"""`recommend=true`: the fastest configurations for one point, ranked (orchestrator/plan/search.py), printed to
fit the terminal, as one wide rich table, or as JSON; with `aot=true` each compiled for the TPU topology too."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobs.spec import TrialSpec
from orchestrator.cli import compiles
from orchestrator.config.grid import GridPoint
from orchestrator.config.schema import ConfigError, Options, Search
from orchestrator.plan import PlanRow, aot, memory, render
from orchestrator.plan.cluster_model import ClusterModel
from orchestrator.plan.search import Answer, search

# Words the answer's command lines set themselves, or that only ask for the answer: left out of their tail.
_OWN = (
    "strategy",
    "mesh",
    "train.remat",
    "train.memory",
    "recommend",
    "top",
    "output",
    "dry_run",
    "aot",
    "aot_topology",
    "aot_workers",
    "aot_cache",
    "aot_draws",
    "search",
)
_SIZES = ("train.batch", "train.grad_accum")  # set by the command lines too once `search` chose them


def tail(overrides: list[str], sized: bool = False) -> list[str]:
    """The user's overrides that the command lines keep (model, cluster, length, anything else they set)."""
    own, keep = _OWN + (_SIZES if sized else ()), []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if not any(key == k or key.startswith(f"{k}.") for k in own):
            keep.append(f"'{o}'" if any(c in o for c in "[], ") else o)
    return keep


def answer(
    spec: TrialSpec, model: ClusterModel, overrides: list[str], top: int, sizes: Search | None = None
) -> Answer:
    """The ranked answer for the point on `model` (its cluster as the planner prices it); `sizes` (the
    `search` switches) widens batch and grad_accum."""
    b, a = (tuple(sizes.batch), tuple(sizes.grad_accum)) if sizes else ((), ())
    return search(
        spec.model,
        spec.cluster,
        spec.context_length,
        spec.train,
        top=top,
        tail=tail(overrides, sized=bool(b or a)),
        batch=b,
        grad_accum=a,
        cluster_model=model,
    )


def _compiled(r: aot.Comparison) -> dict:
    res = r.result
    return {
        "status": res.status,
        "verdict": r.verdict,
        "reason": r.reason,
        "compiled_bytes": res.compiled_bytes,
        "compiler_peak_bytes": res.compiler_peak_bytes,
        "compile_s": res.compile_s,
    }


def to_json(a: Answer, compiled: list[aot.Comparison] | None = None) -> str:
    # the row's short policy cell gives way to the words that select it
    top = [
        {
            "rank": i + 1,
            **c.row.as_dict(),
            "layout": c.spec.strategy.layout,
            "local": c.spec.strategy.local,
            "batch": c.spec.train.batch,
            "grad_accum": c.spec.train.grad_accum,
            "policy": c.policy.label(),
            "command": c.command,
        }
        for i, c in enumerate(a.top)
    ]
    for t, r in zip(top, compiled or [], strict=False):
        t["aot"] = _compiled(r)
    return json.dumps(
        {"top": top, "losers": list(a.losers), "closest": a.closest, "searched": a.searched}, indent=1
    )


def print_answer(a: Answer, output: str, aot_options: Options | None = None, wide: bool = False) -> int:
    """Print the answer (to fit the terminal, or every column in one table with `wide`); nothing fits: one
    `error:` line naming what comes closest, exit 2. With `aot_options` (aot=true) the listed configurations
    are compiled for the TPU topology first, so each answer says whether the compiler fits it too."""
    if not a.top:
        print(f"error: {a.closest}", file=sys.stderr)
        return 2
    compiled = None
    if aot_options is not None:
        if compiles.missing_libtpu():
            return 2
        # the progress bar on stderr, so `output=json` stays one JSON document on stdout
        compiled = compiles.compare([c.spec for c in a.top], aot_options, Console(stderr=True))
    if output == "json":
        print(to_json(a, compiled))
        return 0
    console = Console(width=max(Console().width, 160)) if wide else Console()
    (_wide if wide else _compact)(a, console)
    console.print("why the others lose:", markup=False)
    for line in a.losers:
        for part in _wrap(line, console.width, "  ", "    "):
            console.print(part, soft_wrap=True, markup=False, highlight=False)
    if compiled is not None:
        render.render_comparison(compiled, console)
    return 0


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width=max(width, 40), initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    )


def _command_lines(command: str, width: int, indent: str) -> list[str]:
    """A command line wrapped for a shell: each continued line ends with a backslash, none wider than `width`."""
    words, lines, line = command.split(" "), [], indent
    for w in words:
        if line.strip() and len(line) + 1 + len(w) + 2 > width:
            lines.append(line + " \\")
            line = indent + "    " + w
        else:
            line = f"{line} {w}" if line.strip() else line + w
    return [*lines, line]


def _band(r: PlanRow) -> str:
    return render.step_band(r.predicted_step_s, r.predicted_step_low_s, r.predicted_step_high_s)


def _mfu_band(r: PlanRow) -> str:
    return render.mfu_band(r.predicted_mfu, r.predicted_mfu_low, r.predicted_mfu_high, digits=3)


def _resources(r: PlanRow) -> str:
    return "; ".join(x.words() for x in r.resources)


def _compact(a: Answer, console) -> None:
    """Each answer's figures on one line, its policy, limiter, resources and command line on their own."""
    console.print(
        f"fastest of {a.searched:,} strategy x layout x mesh x memory-policy candidates", markup=False
    )
    for i, c in enumerate(a.top, 1):
        r, t = c.row, c.spec.train
        size = f"batch {t.batch}" + (f"/{t.grad_accum}" if t.grad_accum > 1 else "")
        local = f" (local layers: {c.spec.strategy.local})" if c.spec.strategy.local else ""
        head = (
            f"{i}. {r.strategy}{local} {c.spec.strategy.layout} on {r.mesh}, {size}: step {_band(r)} s, "
            f"MFU {_mfu_band(r)}, {memory.gib(r.predicted_hbm_bytes_per_device)}/device"
        )
        for part in _wrap(head, console.width, "", "   "):
            console.print(part, style="bold", markup=False, highlight=False, soft_wrap=True)
        for label, text in (("policy", c.policy.label()), ("limited by", r.limiter), ("uses", _resources(r))):
            for part in _wrap(f"{label}: {text}", console.width, "   ", "     "):
                console.print(part, markup=False, highlight=False, soft_wrap=True)
        for part in _command_lines(c.command, console.width, "   "):
            console.print(part, markup=False, highlight=False, soft_wrap=True, style="dim")


def _wide(a: Answer, console) -> None:
    """Every column in one rich table, the command lines after it."""
    table = Table(title=f"fastest of {a.searched:,} strategy x layout x mesh x memory-policy candidates")
    cols = (
        "#",
        "strategy",
        "layout",
        "mesh",
        "memory policy",
        "batch",
        "step s (band)",
        "MFU (band)",
        "MFU ≤",
        "HBM/device",
        "chip-h",
        "limiter",
        "resources",
    )
    left = ("strategy", "layout", "mesh", "memory policy", "limiter", "resources")
    for col in cols:
        table.add_column(col, justify="left" if col in left else "right")
    for i, c in enumerate(a.top, 1):
        r, t = c.row, c.spec.train
        size = f"{t.batch}" + (f"/{t.grad_accum}" if t.grad_accum > 1 else "")  # global batch / microbatches
        table.add_row(
            str(i),
            r.strategy + (f" (local layers: {c.spec.strategy.local})" if c.spec.strategy.local else ""),
            c.spec.strategy.layout,
            r.mesh,
            escape(c.policy.label()),
            size,
            _band(r),
            _mfu_band(r),
            f"{r.roofline_mfu:.2f}",
            memory.gib(r.predicted_hbm_bytes_per_device),
            f"{r.chip_hours:,.3g}",
            r.limiter,
            _resources(r),
        )
    console.print(table)
    for i, c in enumerate(a.top, 1):
        console.print(f"{i}. {c.command}", soft_wrap=True, markup=False, highlight=False)


def main(points: list[GridPoint], overrides: Sequence[str], options: Options) -> int:
    """recommend=true: the fastest configurations for the one point, printed; exit 2 when nothing fits."""
    if options.sweep is not None or len(points) != 1:
        raise ConfigError(
            "recommend=true answers for one point: drop +sweep=... and -m sweep overrides, "
            "or run dry_run=true to plan the grid"
        )
    spec, model = points[0]
    found = answer(spec, model, list(overrides), options.top, options.search)
    return print_answer(found, options.output, options if options.aot else None, options.wide)
