"""The AOT compile pool: the same four small-topology compiles with 1 worker and with 2, then again from the cache.

Run by hand (libtpu, no TPU; about two minutes on 2 cores):

    python benchmarks/aot_pool.py [--workers 1 2] [--length 4096] [--head-cores 32 --head-gib 128] [--page]

Four distinct programs (tiny model; ring and usp; tpu7x 2x2x1 and v5 2x2x1), each worker count on a fresh empty
cache, then a rerun on that cache (all hits). One local Ray serves every run, started before the clocks, so
the walls are the pool's own: task start, lowering, compile, cache writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace

from benchmarks import page
from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator import provenance
from orchestrator.config.load import group_option
from orchestrator.launch.cluster import join_or_start
from orchestrator.plan import aot, cluster_model
from orchestrator.plan.aot import pool, target

# (cluster, strategy, mesh): tpu7x 2x2x1 is 4 chips = 8 devices, v5p 2x2x1 4 megacore devices
POINTS = [
    ("tpu7x_128", "ring", MeshSpec(context=8)),
    ("tpu7x_128", "usp", MeshSpec(context=4, context_ulysses=2)),
    ("v5p_128", "ring", MeshSpec(context=4)),
    ("v5p_128", "usp", MeshSpec(context=2, context_ulysses=2)),
]
RAY_MEMORY_SHARE = 0.7  # Ray's `memory` resource: what the object store's default 30 % leaves of the node's
HEAD_POINTS = [131_072, 1_048_576, 4_194_304, 14_680_064]  # llama3_1_8b_long lengths for the head-node sum


def spec(cluster: str, strategy: str, mesh: MeshSpec, length: int, model: str = "tiny") -> TrialSpec:
    # address "": a local Ray of our own, never a running one that a TPU cluster's address=auto would join
    c = replace(cluster_model.load(cluster)[0], topology="2x2x1", address="")
    s = replace(StrategySpec(**group_option("strategy", strategy)), block_q=256, block_kv=256)
    return TrialSpec(
        model=ModelSpec(**group_option("model", model)),
        mesh=mesh,
        strategy=s,
        context_length=length,
        train=TrainSpec(remat="full"),
        cluster=c,
    )


def timed(
    specs: list[TrialSpec], workers: int, where: str
) -> tuple[float, list[tuple[aot.CompileResult, bool]]]:
    t0 = time.perf_counter()
    got = pool.compile_all(specs, workers=workers, cache_at=where, progress="plain")
    return time.perf_counter() - t0, got


def head_lines(cores: int, gib: float) -> list[str]:
    """Compiles at once on a head node: min(cores, Ray memory / per-compile estimate), for full-size points."""
    memory = gib * 2**30 * RAY_MEMORY_SHARE
    lines = [
        f"Head node: {cores} cores, {gib:.0f} GiB, Ray memory {RAY_MEMORY_SHARE:.0%} of it = "
        f"{memory / 2**30:.1f} GiB (assumed: Ray's default object store share, nothing else running)."
    ]
    for n in HEAD_POINTS:
        est = target.compile_host_bytes(spec("tpu7x_128", "ring", MeshSpec(context=8), n, "llama3_1_8b_long"))
        at_once = min(cores, int(memory // est))
        lines.append(
            f"  llama3_1_8b_long at {n:>10,} tokens: estimate {est / 2**30:.2f} GiB -> "
            f"min({cores}, {memory / 2**30:.1f} / {est / 2**30:.2f}) = {at_once} at once"
        )
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--length", type=int, default=4096, help="context length of each compile")
    ap.add_argument("--head-cores", type=int, default=32)
    ap.add_argument("--head-gib", type=float, default=128.0)
    page.add_argument(ap, "aot-pool")
    a = ap.parse_args(argv)
    if not aot.available():
        print("error: needs libtpu: pip install -e '.[tpu]'", file=sys.stderr)
        return 2
    made = provenance.current("python benchmarks/aot_pool.py", argv, load=True)
    # jax's own persistent cache would serve the later runs' compiles: every run compiles for itself
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    specs = [spec(c, s, m, a.length) for c, s, m in POINTS]
    join_or_start(specs[0].cluster, max(a.workers))
    rows, results = [], {}
    for w in a.workers:
        with tempfile.TemporaryDirectory(prefix=f"aot-pool-{w}-") as where:
            cold_s, cold = timed(specs, w, where)
            warm_s, warm = timed(specs, w, where)
        failed = [g.error for g, _ in cold if g.status == "failed"]
        if failed:
            print(f"error: {len(failed)} compiles failed: {failed[0]}", file=sys.stderr)
            return 1
        results[w] = [replace(g, compile_s=0.0) for g, _ in cold]
        compile_s = sum(g.compile_s for g, _ in cold)
        rows.append((w, cold_s, sum(h for _, h in cold), compile_s, warm_s, sum(h for _, h in warm)))
    same = all(r == results[a.workers[0]] for r in results.values())
    walls, head = table(rows, len(specs), same), head_lines(a.head_cores, a.head_gib)
    print("\n".join([*walls, "", *head]))
    if a.page:
        body = "\n".join(["## Wall times", "", *walls, "", "## A head node", "", "```", *head, "```"])
        print(f"wrote {page.write(a.page, 'AOT compile pool', made, NOTE, body)}")
    return 0 if same else 1


def table(rows: list[tuple], n: int, same: bool) -> list[str]:
    out = [
        f"{n} compiles (distinct programs), each worker count on a fresh empty cache, then rerun on it:",
        "",
        *page.table(
            ["workers", "cold wall s", "cold hits", "sum of compile s", "rerun wall s", "rerun hits"],
            ([w, f"{c:.1f}", h, f"{cs:.1f}", f"{r:.1f}", rh] for w, c, h, cs, r, rh in rows),
        ).splitlines(),
    ]
    if len(rows) > 1:
        base = rows[0]
        out.append("")
        out += [f"Cold wall, {base[0]} worker(s) / {w}: {base[1] / c:.2f}x" for w, c, *_ in rows[1:]]
    out.append(f"Same CompileResults (compile time aside) for every worker count: {same}.")
    return out


NOTE = """\
Four distinct train-step programs (the tiny model; ring and usp; tpu7x 2x2x1 and v5 2x2x1) compiled with libtpu
for their TPU topology on this CPU host, through `orchestrator.plan.aot.pool` (one Ray task per compile, a fresh
process each, reserving `aot.compile_host_bytes` of memory), once per worker count on an empty cache, then again
on that cache. *sum of compile s* adds the compiles' own times (the serial cost); the rerun only lowers each step
to find its program's entry. The head-node lines apply the pool's memory estimate to full-size points."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
