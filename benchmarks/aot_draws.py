"""The spread of libtpu's peak over draws: each long point compiled k times, each draw in a fresh process made to
differ (orchestrator.plan.aot.result, as `aot_draws=k` does), plus, with --callers, the two calling scripts that
first gave one lowered step two peaks (`python -c` printing one field vs the whole result).

Run by hand (libtpu, no TPU; minutes per compile, every draw cached under .cache/aot, so a rerun prints at once):

    python benchmarks/aot_draws.py --draws 3 --workers 2
    python benchmarks/aot_draws.py --points tpu7x_128:double_ring:14680064 --draws 3 --callers --page

Prints a markdown table: per point, the planner's figure, each draw's compiler's peak, the spread, and what
`aot_draws=k` would judge the point by.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import page
from benchmarks.aot import spec_for
from jobs import storage
from orchestrator import provenance
from orchestrator.plan import aot, memory
from orchestrator.plan.aot import cache, result

ROOT = Path(__file__).resolve().parent.parent
POINTS = [
    "tpu7x_128:double_ring:14680064",
    "tpu7x_128:ring:14680064",
    "v5p_128:usp:4194304",
    "tpu7x_128:ring:1048576",
]
# The two calling scripts of docs/results/aot.md: the same module, compiled to different peaks.
CALLERS = {
    "python -c, one field": "print(aot.compile_memory(s).compiler_peak_bytes)",
    "python -c, whole result": "g = aot.compile_memory(s); print(g); print(g.compiler_peak_bytes)",
}
_PRELUDE = (
    "from benchmarks.aot import spec_for; "
    "from orchestrator.plan import aot; s = spec_for({model!r}, {cluster!r}, {strategy!r}, {length}, {remat!r}); "
)


def caller_peak(spec, model: str, cluster: str, strategy: str, length: int, remat: str, caller: int) -> int:
    """The compiler's peak as calling script `caller` (of CALLERS) sees it: its last line, from a fresh
    `python -c`, cached next to the point's draws as `.caller<n>.json`."""
    path = str(cache.cache_path(spec)).removesuffix(".json") + f".caller{caller}.json"
    if (text := storage.read_text(path)) is not None:
        return int(json.loads(text)["compiler_peak_bytes"])
    code = (
        _PRELUDE.format(model=model, cluster=cluster, strategy=strategy, length=length, remat=remat)
        + list(CALLERS.values())[caller]
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    peak = int(done.stdout.strip().splitlines()[-1])
    storage.write_text(path, json.dumps({"compiler_peak_bytes": peak, "caller": list(CALLERS)[caller]}))
    return peak


NOTE = """Each point is Llama 3.1 8B (`llama3_1_8b_long`, remat full) on the cluster's whole slice, compiled for its
TPU topology by libtpu on this CPU host. *draw d* is the compiler's peak per device (GiB) of the d-th compile,
each in a fresh Ray worker process made to differ from the others (orchestrator/plan/aot/result.py: draw d > 1
holds d x 13 MiB more Python objects before tracing and has its own PYTHONHASHSEED), as `aot_draws=3` compiles
them. The caller columns compile the same point from two `python -c` scripts that differ only in what they
print, the pair that first gave one lowered step two different peaks. *spread*: the largest figure over the
smallest, minus 1. *planner*: the analytic figure (orchestrator/plan/memory.py)."""


def gib(b: int | None) -> str:
    return f"{b / 2**30:.1f}" if b else "-"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", default=POINTS, help="cluster:strategy:context_length")
    ap.add_argument("--model", default="llama3_1_8b_long")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="compiles at once on the Ray pool")
    ap.add_argument("--callers", action="store_true", help="also compile from the two calling scripts")
    ap.add_argument("--callers-for", nargs="*", default=[], help="points (as --points) to run the callers on")
    page.add_argument(ap, "aot-draws")
    a = ap.parse_args(argv)
    made = provenance.current("python benchmarks/aot_draws.py", argv)
    callers_for = set(a.points if a.callers else a.callers_for)
    specs = []
    for p in a.points:
        cluster, strategy, length = p.split(":")
        specs.append(
            (cluster, strategy, int(length), spec_for(a.model, cluster, strategy, int(length), a.remat))
        )
    import ray

    # its own Ray: the pool would join any Ray running here (a sweep's), and that one may go away mid-compile
    ray.init(address="local", num_cpus=a.workers, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    rows = aot.compare([s for *_, s in specs], workers=a.workers, progress="plain", draws=a.draws)
    heads = ["cluster", "strategy", "context", "planner GiB", *(f"draw {d}" for d in range(1, a.draws + 1))]
    heads += [*(CALLERS if callers_for else []), "spread", "judged (worst)", "verdict"]
    out = []
    for p, (cluster, strategy, length, spec), r in zip(a.points, specs, rows, strict=True):
        each = list(r.result.draw_bytes) or [result.judged_bytes(r.result)] * (r.status != "failed")
        each += [None] * (a.draws - len(each))  # a failed point: no figure per draw
        if callers_for:
            run = p in callers_for
            each += [
                caller_peak(spec, a.model, cluster, strategy, length, a.remat, c) if run else None
                for c in range(len(CALLERS))
            ]
        figures = [b for b in each if b]
        spread = f"{max(figures) / min(figures) - 1:.1%}" if figures else "-"
        cells = [
            cluster,
            strategy,
            f"{length:,}",
            gib(memory.total(spec)),
            *(gib(b) for b in each),
            spread,
            gib(result.judged_bytes(r.result)),
            r.verdict if r.status != "failed" else r.reason[:80],
        ]
        out.append(cells)
    took = f"{len(specs)} points x {a.draws} draws in {time.perf_counter() - t0:.0f} s (cache hits included)"
    table = page.table(heads, out)
    if a.page:
        path = page.write(a.page, "Compile draws", made, NOTE, f"{table}\n\n{took}.")
        print(f"wrote {path}")
    else:
        print(f"{table}\n\n{took}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
