"""The CLI's commands besides running a sweep, each printing its result and returning the exit code:
`recommend=true` (the ranked answer for one point, as a rich table or JSON), `dry_run=true` (the plan, with
`aot=true` its compiles and `record=true` its planned runs), and the refusals before a launch (invalid points,
the budget, the environment's faults)."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobs.spec import ClusterSpec, TrialSpec
from orchestrator.config.grid import GridPoint
from orchestrator.config.schema import ConfigError, Options
from orchestrator.plan import memory
from orchestrator.plan.hardware import ClusterModel
from orchestrator.plan.search import Answer, search

if TYPE_CHECKING:
    from orchestrator.config.schema import Search
    from orchestrator.plan import PlanRow
    from orchestrator.plan.aot import Comparison

log = logging.getLogger(__name__)
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


def join_ray(cluster: ClusterSpec) -> None:
    """The Ray an AOT pool compiles on: the cluster's, joined as a sweep joins it, when it names an address
    (address=auto only when one is running); otherwise the pool starts a local one."""
    if not cluster.address:
        return
    from orchestrator.launch import cluster as clusters

    try:
        clusters.connect(cluster)
    except ConnectionError:
        if cluster.address != "auto":  # an address that was named must answer
            raise
        log.info("address=auto: no Ray running; compiling on a local Ray")


def confirm(a: Answer, options: Options, console) -> list[Comparison]:
    """aot=true: compile the listed configurations for the cluster's TPU topology on the Ray pool (aot.pool),
    so each answer says whether the compiler fits it too."""
    from orchestrator.plan import aot

    if a.top:
        join_ray(a.top[0].spec.cluster)
    return aot.compare(
        [c.spec for c in a.top],
        options.aot_topology or None,
        workers=options.aot_workers,
        cache=options.aot_cache,
        progress=options.progress,
        console=console,
        draws=options.aot_draws,
    )


def _compiled(r: Comparison) -> dict:
    res = r.result
    return {
        "status": res.status,
        "verdict": r.verdict,
        "reason": r.reason,
        "compiled_bytes": res.compiled_bytes,
        "compiler_peak_bytes": res.compiler_peak_bytes,
        "compile_s": res.compile_s,
    }


def to_json(a: Answer, compiled: list[Comparison] | None = None) -> str:
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


def show(a: Answer, output: str, aot_options: Options | None = None, wide: bool = False) -> int:
    """Print the answer (to fit the terminal, or every column in one table with `wide`); nothing fits: one
    `error:` line naming what comes closest, exit 2. With `aot_options` (aot=true) the listed configurations
    are compiled for the TPU topology first."""
    if not a.top:
        print(f"error: {a.closest}", file=sys.stderr)
        return 2
    from rich.console import Console

    compiled = None
    if aot_options is not None:
        from orchestrator.plan import aot

        if not aot.available():
            print("error: aot=true needs libtpu on this host: pip install -e '.[tpu]'", file=sys.stderr)
            return 2
        # the progress bar on stderr, so `output=json` stays one JSON document on stdout
        compiled = confirm(a, aot_options, Console(stderr=True))
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
        from orchestrator.plan import render

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
    from orchestrator.plan import render

    return render.step_band(r.predicted_step_s, r.predicted_step_low_s, r.predicted_step_high_s)


def _mfu_band(r: PlanRow) -> str:
    from orchestrator.plan import render

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
    from rich.markup import escape
    from rich.table import Table

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


def recommend(points: list[GridPoint], overrides: Sequence[str], options: Options) -> int:
    """recommend=true: the fastest configurations for the one point, printed; exit 2 when nothing fits."""
    if options.sweep is not None or len(points) != 1:
        raise ConfigError(
            "recommend=true answers for one point: drop +sweep=... and -m sweep overrides, "
            "or run dry_run=true to plan the grid"
        )
    spec, model = points[0]
    found = answer(spec, model, list(overrides), options.top, options.search)
    return show(found, options.output, options if options.aot else None, options.wide)


def dry_run(options: Options, specs: list[TrialSpec], rows: list[PlanRow]) -> int:
    """dry_run=true: print the plan (then, with aot=true, compile it; with record=true, record it); exit 2 for
    an invalid point (unless skip_invalid=true) or a plan over the budget."""
    from orchestrator.plan import render_table, to_json
    from orchestrator.plan.cost import over_budget

    over = over_budget(specs, rows, options.budget.chip_hours)  # checked after the plan is printed
    if options.output == "json":
        print(to_json(rows))
    else:
        from rich.console import Console

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


def refusal(options: Options, specs: list[TrialSpec], rows: list[PlanRow]) -> int | None:
    """Why a sweep must not launch, printed, as its exit code (2): an invalid point (unless skip_invalid=true),
    a plan over the budget, or a fault of the environment (tracking server, Ray head, gs:// credentials).
    None: launch."""
    from orchestrator.launch import preflight
    from orchestrator.plan.cost import over_budget

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


def compile_plan(specs: list[TrialSpec], rows: list[PlanRow], options: Options) -> tuple[dict, int]:
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
        if valid:
            join_ray(valid[0].cluster)  # the cluster's Ray for the pool, before the planner asks for compiles
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


def record_plan(options: Options, specs: list[TrialSpec], rows: list[PlanRow], compiled: dict) -> None:
    """dry_run=true record=true: the plan as planned MLflow runs (tag planned=true), with plots."""
    from orchestrator.config.schema import sweep_identity
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
