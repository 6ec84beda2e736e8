"""What the AOT cache already holds: analytic vs compiled GiB per device, term by term, without compiling.

python benchmarks/aot_table.py [--model llama3_1_8b_long] [--remat full offload] [--ulysses auto 4] [--markdown
[--at-plan] [--at-mib N ...] [--band]]
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.aot import LENGTHS, at_plan_cell, band_cell, cap_cell, row_cells, spec_for
from jobs import strategies
from orchestrator.plan import aot, memory, validate


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_1_8b_long")
    ap.add_argument("--remat", nargs="+", default=["full", "offload"])
    ap.add_argument("--ulysses", nargs="+", default=["auto"], help="context_ulysses degrees to look up")
    ap.add_argument("--terms", action="store_true", help="print the planner's terms next to each row")
    ap.add_argument("--markdown", action="store_true", help="rows as benchmarks/aot.py's markdown table")
    ap.add_argument(
        "--at-plan", action="store_true", help="with --markdown: the cached compile at the planner's HBM"
    )
    ap.add_argument(
        "--at-mib", nargs="*", type=int, default=[], help="with --markdown: cached capped compiles"
    )
    ap.add_argument("--band", action="store_true", help="with --markdown: the cached capped compiles' band")
    a = ap.parse_args(argv)
    seen = set()
    for cluster in ("tpu7x_128", "v5p_128"):
        for name in strategies.CP_NAMES:
            for length in LENGTHS:
                for remat in a.remat:
                    for u in a.ulysses:
                        spec = spec_for(a.model, cluster, name, length, remat, ulysses=u)
                        if validate.problems(spec) or not aot.cached_any(spec):
                            continue  # an invalid point has no program; an uncached one need not be lowered
                        path = aot._cache_path(spec, None)
                        if not path.exists() or path in seen:
                            continue
                        seen.add(path)
                        row = aot.compare([spec])[0]  # cached, so this reads the cache and compiles nothing
                        if a.markdown:
                            cells = row_cells(cluster, row)
                            if a.at_plan:
                                cells.append(at_plan_cell(spec, row, compile=False))
                            cells += [cap_cell(spec, row, m, compile=False) for m in a.at_mib]
                            cells += [band_cell(spec, row, compile=False)] if a.band else []
                            print("| " + " | ".join(cells) + " |")
                            continue
                        comp = row["compiled_bytes"] or 0
                        print(f"{cluster:10} {name:11} {spec.mesh.label():28} {length:>10,} {remat:8} analytic "
                              f"{row['analytic_bytes'] / 2**30:6.1f} compiled {comp / 2**30:6.1f} "
                              f"({row['status']:10}) ratio {row['ratio'] or float('nan'):.2f}")  # fmt: skip
                        if a.terms:
                            b = memory.breakdown(spec)
                            print(
                                "    " + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in b.items() if v > 2**28)
                            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
