"""`recommend=true`: the ranked answer for one point, as a rich table or JSON, and the exit code."""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING

from jobs.spec import ClusterSpec, TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.hardware import ClusterModel
from orchestrator.plan.search import Answer, search

if TYPE_CHECKING:
    from orchestrator.config.schema import Options, Search
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


def show(a: Answer, output: str, aot_options: Options | None = None) -> int:
    """Print the answer; nothing fits: one `error:` line naming what comes closest, exit 2. With `aot_options`
    (aot=true) the listed configurations are compiled for the TPU topology first."""
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
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    table = Table(title=f"fastest of {a.searched:,} strategy x layout x mesh x memory-policy candidates")
    cols = (
        "#",
        "strategy",
        "layout",
        "mesh",
        "memory policy",
        "batch",
        "step s",
        "MFU",
        "MFU ≤",
        "HBM/device",
        "chip-h",
        "limiter",
    )
    left = ("strategy", "layout", "mesh", "memory policy", "limiter")
    for col in cols:
        table.add_column(col, justify="left" if col in left else "right")
    for i, c in enumerate(a.top, 1):
        r, t = c.row, c.spec.train
        size = f"{t.batch}" + (f"/{t.grad_accum}" if t.grad_accum > 1 else "")  # global batch / microbatches
        table.add_row(
            str(i),
            r.strategy,
            c.spec.strategy.layout,
            r.mesh,
            escape(c.policy.label()),
            size,
            f"{r.predicted_step_s:,.4g}",
            f"{r.predicted_mfu:.3f}",
            f"{r.roofline_mfu:.2f}",
            memory.gib(r.predicted_hbm_bytes_per_device),
            f"{r.chip_hours:,.3g}",
            r.limiter,
        )
    console.print(table)
    for i, c in enumerate(a.top, 1):
        console.print(f"{i}. {c.command}", soft_wrap=True, markup=False, highlight=False)
    console.print("why the others lose:", markup=False)
    for line in a.losers:
        console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)
    if compiled is not None:
        from orchestrator.plan import render

        render.render_comparison(compiled, console)
    return 0
