"""The spread of libtpu's peak over draws: each long point compiled k times, each draw in a fresh process made to
differ (orchestrator.plan.aot.draws, as `aot_draws=k` does), plus, with --callers, the two calling scripts that
first gave one lowered step two peaks (`python -c` printing one field vs the whole result).

Run by hand (libtpu, no TPU; minutes per compile, every draw cached under .cache/aot, so a rerun prints at once):

    python benchmarks/aot_draws.py --draws 3 --workers 2
    python benchmarks/aot_draws.py --points tpu7x_128:double_ring:14680064 --draws 3 --callers

Prints a markdown table: per point, the planner's figure, each draw's compiler's peak, the spread, and what
`aot_draws=k` would judge the point by.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/...` finds the repo

from benchmarks.aot import spec_for  # noqa: E402
from orchestrator.plan import aot, memory  # noqa: E402
from orchestrator.plan.aot import draws  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
POINTS = ["tpu7x_128:double_ring:14680064", "tpu7x_128:ring:14680064", "v5p_128:usp:4194304",
          "tpu7x_128:ring:1048576"]  # fmt: skip
# The two calling scripts of docs/results/aot.md: the same module, compiled to different peaks.
CALLERS = {
    "python -c, one field": "print(aot.compile_memory(s).compiler_peak_bytes)",
    "python -c, whole result": "g = aot.compile_memory(s); print(g); print(g.compiler_peak_bytes)",
}
_PRELUDE = (
    "import sys; sys.path.insert(0, {root!r}); from benchmarks.aot import spec_for; "
    "from orchestrator.plan import aot; s = spec_for({model!r}, {cluster!r}, {strategy!r}, {length}, {remat!r}); "
)


def caller_peak(model: str, cluster: str, strategy: str, length: int, remat: str, line: str) -> int:
    """The compiler's peak as one calling script sees it (its last line; uncached: a fresh `python -c`)."""
    code = _PRELUDE.format(root=str(ROOT), model=model, cluster=cluster, strategy=strategy, length=length,
                           remat=remat) + line  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(done.stdout.strip().splitlines()[-1])


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
    a = ap.parse_args(argv)
    specs = []
    for p in a.points:
        cluster, strategy, length = p.split(":")
        specs.append(
            (cluster, strategy, int(length), spec_for(a.model, cluster, strategy, int(length), a.remat))
        )
    t0 = time.perf_counter()
    rows = aot.compare([s for *_, s in specs], workers=a.workers, progress="plain", draws=a.draws)
    heads = ["cluster", "strategy", "context", "planner GiB", *(f"draw {d}" for d in range(1, a.draws + 1))]
    heads += [*(CALLERS if a.callers else []), "spread", "judged (worst)", "verdict"]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for (cluster, strategy, length, spec), r in zip(specs, rows, strict=True):
        each = list(r.result.draw_bytes) or [draws.judged_bytes(r.result)]
        if a.callers:
            each += [
                caller_peak(a.model, cluster, strategy, length, a.remat, line) for line in CALLERS.values()
            ]
        figures = [b for b in each if b]
        spread = f"{max(figures) / min(figures) - 1:.1%}" if figures else "-"
        cells = [cluster, strategy, f"{length:,}", gib(memory.total(spec)), *(gib(b) for b in each), spread,
                 gib(draws.judged_bytes(r.result)), r.verdict]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    print("\n".join(out))
    print(f"\n{len(specs)} points x {a.draws} draws in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
