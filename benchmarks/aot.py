"""Planner vs TPU compiler: analytic and compiled GiB per device for strategies x context lengths x clusters.

Run by hand (libtpu, no TPU; minutes per point, one compile at a time, cached under .cache/aot by trial id
and topology, so a rerun prints at once):

    python benchmarks/aot.py
    python benchmarks/aot.py --strategies ring usp --lengths 1048576 4194304 --clusters tpu7x_128
    python benchmarks/aot.py --strategies ring usp --lengths 1048576 --clusters tpu7x_128 --documents data/stdlib

Prints a markdown table (for docs/results/aot.md) and a closing note with the 14M rows and the worst ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time

from benchmarks import page
from jobs import strategies
from jobs.spec import DataSpec, MemorySpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config import grid
from orchestrator.config.load import group_option
from orchestrator.plan import aot, cluster_model, render, validity

HEAD = [
    "cluster",
    "strategy",
    "mesh",
    "context",
    "remat",
    "analytic GiB",
    "compiled GiB",
    "compiler's peak",
    "analytic / peak",
    "verdict",
    "compile s",
]
L14M = 14_680_064
LENGTHS = [131_072, 1_048_576, 4_194_304, L14M]


def head(at_plan: bool, at_mib: list[int], band: bool) -> list[str]:
    """The table's columns: HEAD, then the extra compiles asked for (--at-plan, --at-mib, --band)."""
    extra = ["at the planner's HBM"] if at_plan else []
    extra += [f"at {m:,} MiB" for m in at_mib]
    return HEAD + extra + (["analytic / needed (capped)"] if band else [])


def conf(group: str, name: str) -> dict:
    return group_option(group, name)


def spec_for(
    model: str,
    cluster: str,
    strategy: str,
    length: int,
    remat: str,
    slices: int = 1,
    memory: MemorySpec | None = None,
    ulysses: int | str = "auto",
    documents: str = "",
    layout: str = "",
) -> TrialSpec:
    """Every device on the sequence, the context axes split as `mesh=auto` splits them (usp: 4-way Ulysses
    for the 4 KV heads of llama3_1_8b_long) unless `ulysses` fixes the inner degree (of strategies that have
    one); over `slices` slices the context axis crosses them (DCN). `documents`: packed documents from that
    source (the step then carries segment ids; the planner samples the source's lengths.npy)."""
    c, m = cluster_model.load(cluster)[0], conf("model", model)
    c = dataclasses.replace(c, slices_per_trial=slices)
    inner = (
        int(ulysses) if ulysses != "auto" and "context_ulysses" in strategies.get(strategy).axes else "auto"
    )
    auto = {"data": 1, "fsdp": 1, "tensor": 1, "context": "auto", "context_ulysses": inner}
    auto["dcn"] = "context" if slices > 1 else ""
    data = DataSpec(kind="documents", sources=(documents,)) if documents else DataSpec()
    strat = conf("strategy", strategy) | ({"layout": layout} if layout else {})
    return TrialSpec(
        model=ModelSpec(**m),
        mesh=grid.resolve_mesh(auto, strategy, m, c.devices),
        strategy=StrategySpec(**strat),
        context_length=length,
        train=TrainSpec(remat=remat, memory=memory or MemorySpec(), data=data),
        cluster=c,
    )


def row_cells(cluster: str, r: aot.Comparison) -> list[str]:
    return [
        cluster,
        r.strategy,
        r.mesh,
        f"{r.context_length:,}",
        r.remat,
        f"{r.analytic_bytes / 2**30:.1f}",
        render.compiled_cell(r),
        render.peak_cell(r),
        render.ratio_cell(r),
        r.verdict,
        f"{r.compile_s:.0f}",
    ]


def planner_mib(r: aot.Comparison, factor: float = 1.0) -> int:
    """The planner's figure / factor in whole MiB (rounded up), a cap for a capped compile."""
    return -(-int(r.analytic_bytes / factor) // 2**20)


def at_plan_cell(spec: TrialSpec, r: aot.Comparison, *, compile: bool = True) -> str:
    """Compiled again with HBM = the planner's figure (aot.cache.fits): "fits" or what it needs; "-"
    when not compiled (or, with compile=False, not cached)."""
    return cap_cell(spec, r, planner_mib(r), compile=compile)


def cap_cell(spec: TrialSpec, r: aot.Comparison, mib: int, *, compile: bool = True) -> str:
    """Compiled again as if HBM were `mib` MiB: "fits N" (GiB), or the compiler's "needs N" when it refuses (what
    it would need before trying harder, no floor: only a fit is evidence; docs/results/aot.md)."""
    got = aot.cache.fits(spec, mib, compile=compile) if r.status == "compiled" else None
    if got is None:
        return "-"
    if got.status == "compiled":
        return f"fits {mib / 1024:.1f}"
    need = got.required_bytes
    return f"needs {need / 2**30:.1f}" if need else "refused"


# The planner's band against the compiler (issue #12): never more than 5 % below, at most 15 % above.
BAND = (0.95, 1.15)


def band_cell(spec: TrialSpec, r: aot.Comparison, *, compile: bool = True) -> str:
    """Where no device peak exists (remat=offload: libtpu's peak is the host's), bound analytic / needed from
    both sides with two capped compiles: a fit at planner/0.95 MiB says the planner is at most 5 % below what the
    compiler needs; a refusal at planner/1.15 says it is less than 15 % above. "-" when not compiled (or,
    with compile=False, not cached)."""
    caps = [planner_mib(r, f) for f in BAND]
    lo, hi = (cap_cell(spec, r, mib, compile=compile) for mib in caps)
    if "-" in (lo, hi):
        return "-"
    if not lo.startswith("fits"):
        return f"< {BAND[0]} ({lo} at planner/{BAND[0]})"
    if hi.startswith("fits"):
        return f"> {BAND[1]} ({hi} at planner/{BAND[1]})"
    return f"{BAND[0]}–{BAND[1]} ({lo}, refused at {caps[1] / 1024:.1f})"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_1_8b_long")
    ap.add_argument("--strategies", nargs="+", default=list(strategies.CP_NAMES))
    ap.add_argument("--lengths", nargs="+", type=int, default=LENGTHS)
    ap.add_argument("--clusters", nargs="+", default=["tpu7x_128", "v5p_128"])
    ap.add_argument("--remat", default="full")
    ap.add_argument("--slices", type=int, default=1, help="slices per trial (the context axis crosses them)")
    ap.add_argument("--offload", nargs="*", default=[], help="train.memory.offload names")
    ap.add_argument("--host", nargs="*", default=[], help="train.memory.host parts (optimizer, params)")
    ap.add_argument(
        "--ulysses", default="auto", help="context_ulysses degree (usp, double_ring); auto: mesh=auto's"
    )
    ap.add_argument(
        "--at-plan",
        action="store_true",
        help="also compile each point as if HBM were the planner's figure: does the compiler fit it there?",
    )
    ap.add_argument(
        "--at-mib",
        nargs="*",
        type=int,
        default=[],
        help="also compile each point as if HBM were this many MiB (does it fit there?)",
    )
    ap.add_argument(
        "--band",
        action="store_true",
        help="also compile each point at planner/0.95 and planner/1.15 MiB: is analytic / needed in [0.95, 1.15]?",
    )
    ap.add_argument("--documents", default="", help="packed documents from this source (e.g. data/stdlib)")
    ap.add_argument("--layout", default="", help="strategy.layout (default: the strategy's own)")
    ap.add_argument("--refresh", action="store_true", help="compile again even if cached")
    a = ap.parse_args(argv)
    if not aot.available():
        print("error: needs libtpu: pip install -e '.[tpu]'", file=sys.stderr)
        return 2
    lines = []
    done: list[tuple[str, aot.Comparison]] = []
    for cluster in a.clusters:
        for strategy in a.strategies:
            for length in a.lengths:
                mem = MemorySpec(offload=tuple(a.offload), host=tuple(a.host))
                spec = spec_for(
                    a.model,
                    cluster,
                    strategy,
                    length,
                    a.remat,
                    a.slices,
                    mem,
                    a.ulysses,
                    a.documents,
                    a.layout,
                )
                bad = validity.problems(spec)
                if bad:  # not a compile question: say why once, in the log
                    print(f"skip {cluster} {strategy} {length:,}: {bad[0].message}", file=sys.stderr)
                    continue
                t0 = time.perf_counter()
                if a.refresh:
                    aot.compiled_memory(spec, refresh=True)
                [r] = aot.compare([spec])
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
                print(
                    f"{cluster} {strategy} {length:,}: {r.verdict} ({time.perf_counter() - t0:.0f} s; "
                    f"host peak RSS so far {rss:.1f} GiB)",
                    file=sys.stderr,
                    flush=True,
                )
                done.append((cluster, r))
                cells = row_cells(cluster, r)
                if a.at_plan:
                    cells.append(at_plan_cell(spec, r))
                cells += [cap_cell(spec, r, m) for m in a.at_mib]
                cells += [band_cell(spec, r)] if a.band else []
                lines.append(cells)
    print(page.table(head(a.at_plan, a.at_mib, a.band), lines))
    ratios = [(r.ratio, c, r) for c, r in done if r.ratio is not None and r.status == "compiled"]
    if ratios:
        worst = max(ratios, key=lambda t: abs(t[0] - 1.0))
        print(
            f"\nWorst analytic / compiler's peak: {worst[0]:.2f} ({worst[1]} {worst[2].strategy} "
            f"{worst[2].context_length:,})."
        )
    for c, r in done:
        if r.context_length == L14M:
            print(
                f"14M: {c} {r.strategy} {r.mesh}: compiled {render.compiled_cell(r)} ({r.verdict}), "
                f"analytic {r.analytic_bytes / 2**30:.1f} GiB; {r.reason}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
