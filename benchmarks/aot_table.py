"""What the AOT cache already holds: analytic vs compiled GiB per device, term by term, without compiling.

python benchmarks/aot_table.py [--model llama3_1_8b_long] [--remat full offload] [--ulysses auto 4] [--markdown
[--at-plan] [--at-mib N ...] [--band]]

python benchmarks/aot_table.py --page      # docs/results/aot.md from the cache: both models, the band table
python benchmarks/aot_table.py --page --from OLD.md --measured-at COMMIT --measured-on DATE --measured-by CMD ...
    # no cache here: the tables of OLD.md, headed with the commit, date and commands they were measured by
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks import aot_page, page
from benchmarks.aot import LENGTHS, at_plan_cell, band_cell, cap_cell, head, row_cells, spec_for
from jobs import strategies
from orchestrator import REPO, provenance
from orchestrator.plan import aot, memory, validity

# The page's models, each with the context_ulysses degrees looked up (mesh=auto's, and one more split).
PAGE_MODELS = [("llama3_1_8b_long", ["auto", "2"]), ("llama3_1_8b", ["auto", "4"])]
PROG = "python benchmarks/aot_table.py"


def cached(model: str, remats: list[str], ulysses: list[str]):
    """(cluster, spec, compare row) for every cached compile of the program this commit lowers."""
    seen = set()
    for cluster in ("tpu7x_128", "v5p_128"):
        for name in strategies.CP_NAMES:
            for length in LENGTHS:
                for remat in remats:
                    for u in ulysses:
                        spec = spec_for(model, cluster, name, length, remat, ulysses=u)
                        if validity.problems(spec) or not aot.cached_any(spec):
                            continue  # an invalid point has no program; an uncached one need not be lowered
                        path = aot.cache_path(spec)
                        if not path.exists() or path in seen:
                            continue
                        seen.add(path)
                        yield cluster, spec, aot.compare([spec])[0]  # cached: reads, compiles nothing


def page_rows() -> tuple[list[aot_page.Row], list[aot_page.Row]]:
    """The page's two tables from the cache: every cached row, and the capped compiles of host-peak rows."""
    rows, band = [], []
    for model, ulysses in PAGE_MODELS:
        for cluster, spec, r in cached(model, ["full", "offload"], ulysses):
            label = cluster if model == aot_page.DEFAULT_MODEL else f"{cluster}, {model}"
            rows.append(aot_page.Row(dict(zip(aot_page.HEAD, row_cells(label, r), strict=True))))
            caps = aot.cached_caps(spec)
            if r.result.host_temp_bytes and r.status == "compiled" and caps:
                ok = {m: aot.cache.fits(spec, m, compile=False).status == "compiled" for m in caps}
                gib = r.analytic_bytes / 2**30
                cells = [label, r.strategy, r.mesh, f"{gib:.1f}", *aot_page.band_cells(gib, ok)]
                band.append(aot_page.Row(dict(zip(aot_page.BAND_HEAD, cells, strict=True))))
    return rows, band


def read(source: str) -> str:
    """A file, or a git object like 52e8041:README.md (the tables as they were at that commit)."""
    if Path(source).exists() or ":" not in source:
        return Path(source).read_text()
    return subprocess.run(
        ["git", "show", source], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def write_page(a: argparse.Namespace, argv: list[str]) -> int:
    now = provenance.current(PROG, argv)
    if a.from_:
        text = read(a.from_)
        rows, band = aot_page.rows_from(text, aot_page.HEAD), aot_page.rows_from(text, aot_page.BAND_HEAD)
        if not (a.measured_at and a.measured_on and a.measured_by):
            print("error: --from needs --measured-at, --measured-on and --measured-by", file=sys.stderr)
            return 2
        made = provenance.Provenance(
            "\n".join(a.measured_by), a.measured_on, a.measured_at, a.measured_machine
        )
        refresh = (
            f"these rows (the analytic column too: the planner of that commit) were copied from `{a.from_}` by "
            f"`{now.command}` on {now.date} at commit {now.commit}, "
            f"where the `.cache/aot` compile cache was absent; `{PROG} --page` on a machine with the cache "
            "regenerates the page from it"
        )
    else:
        rows, band = page_rows()
        made, refresh = now, None
    if not rows:
        print(
            f"error: no cached compiles under {aot.cache_dir()} or in the --from tables: nothing to write; "
            "compile with benchmarks/aot.py, or give --from",
            file=sys.stderr,
        )
        return 1
    body = aot_page.body(rows, band)
    path = page.write(a.page, aot_page.TITLE, made, aot_page.NOTE, body, refresh=refresh)
    print(f"wrote {path} ({len(rows)} rows, {len(band)} band rows)")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_1_8b_long")
    ap.add_argument("--remat", nargs="+", default=["full", "offload"])
    ap.add_argument("--ulysses", nargs="+", default=["auto"], help="context_ulysses degrees to look up")
    ap.add_argument("--terms", action="store_true", help="print the planner's terms next to each row")
    ap.add_argument("--markdown", action="store_true", help="benchmarks/aot.py's markdown table")
    ap.add_argument(
        "--at-plan", action="store_true", help="with --markdown: the cached compile at the planner's HBM"
    )
    ap.add_argument(
        "--at-mib", nargs="*", type=int, default=[], help="with --markdown: cached capped compiles"
    )
    ap.add_argument("--band", action="store_true", help="with --markdown: the cached capped compiles' band")
    page.add_argument(ap, "aot")
    ap.add_argument(
        "--from", dest="from_", metavar="FILE", help="with --page: take the tables from this markdown"
    )
    ap.add_argument("--measured-at", help="with --from: the commit the rows were measured at")
    ap.add_argument("--measured-on", help="with --from: the date(s) they were measured on")
    ap.add_argument(
        "--measured-by", nargs="+", metavar="CMD", help="with --from: the commands that made them"
    )
    ap.add_argument("--measured-machine", default="", help="with --from: the machine they were measured on")
    a = ap.parse_args(argv)
    if a.page:
        return write_page(a, argv)
    rows = []
    for cluster, spec, row in cached(a.model, a.remat, a.ulysses):
        if a.markdown:
            cells = row_cells(cluster, row)
            if a.at_plan:
                cells.append(at_plan_cell(spec, row, compile=False))
            cells += [cap_cell(spec, row, m, compile=False) for m in a.at_mib]
            cells += [band_cell(spec, row, compile=False)] if a.band else []
            rows.append(cells)
            continue
        comp = row.compiled_bytes or 0
        print(
            f"{cluster:10} {spec.strategy.name:11} {spec.mesh.label():28} {spec.context_length:>10,} "
            f"{spec.train.remat:8} analytic {row.analytic_bytes / 2**30:6.1f} compiled {comp / 2**30:6.1f} "
            f"({row.status:10}) ratio {row.ratio or float('nan'):.2f}"
        )
        if a.terms:
            b = memory.breakdown(spec)
            print("    " + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in b.items() if v > 2**28))
    if a.markdown:
        print(page.table(head(a.at_plan, a.at_mib, a.band), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
