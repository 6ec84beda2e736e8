"""docs/results/aot.md: the TPU compiler's memory for the train step next to the planner's, and what each figure is.

Written by `python benchmarks/aot_table.py --page` from the compile cache (.cache/aot), or, where the cache is
absent, from the tables of an earlier page or README (`--from FILE`) with the commit, date and commands they were
measured at stated explicitly. Every figure in the prose is computed from the table rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from benchmarks import page
from benchmarks.aot import BAND, HEAD
from orchestrator.plan import cluster_model

BAND_HEAD = [
    "cluster",
    "strategy",
    "mesh",
    "analytic GiB",
    "fits at (GiB)",
    "refused at (GiB)",
    "analytic / needed",
]
TITLE = "AOT compiles vs the planner"
DEFAULT_MODEL = "llama3_1_8b_long"


@dataclass(frozen=True)
class Row:
    cells: dict[str, str]  # column -> cell, as the table prints it

    def num(self, col: str) -> float | None:
        m = re.search(r"\d[\d,]*(?:\.\d+)?", self.cells.get(col, ""))
        return float(m.group().replace(",", "")) if m else None

    @property
    def cluster(self) -> str:
        return self.cells["cluster"].split(",")[0].strip()

    @property
    def label(self) -> str:
        c = self.cells
        return f"{c['cluster']} {c['strategy']}" + (f" at {c['context']} tokens" if "context" in c else "")


def table(head: list[str], rows: list[Row]) -> str:
    return page.table(head, ([r.cells[h] for h in head] for r in rows))


def rows_from(text: str, head: list[str]) -> list[Row]:
    """Every row of every Markdown table in `text` whose header is `head`, however padded (indented tables
    too; bold dropped)."""
    out, inside = [], False
    for line in text.splitlines():
        s = line.strip()
        cells = [c.strip().replace("**", "") for c in s.strip("|").split("|")] if s.startswith("|") else None
        if cells == head:
            inside = True
        elif inside and cells is not None:
            if not set("".join(cells)) <= set("-: "):  # not the separator
                out.append(Row(dict(zip(head, cells, strict=True))))
        else:
            inside = False
    return out


def band_cells(analytic_gib: float, caps: dict[int, bool]) -> tuple[str, str, str]:
    """(fits at, refused at, analytic / needed) from capped compiles {MiB: compiled?}: the smallest cap that
    compiled, the largest refused below it, and the range of analytic / needed they bound."""
    fit = min((m for m, ok in caps.items() if ok), default=None)
    refused = max((m for m, ok in caps.items() if not ok and (fit is None or m < fit)), default=None)
    hi = analytic_gib * 1024 / refused if refused else math.inf  # needed > refused cap
    lo = analytic_gib * 1024 / fit if fit else 0.0  # needed <= fitting cap
    ratio = f"{lo:.2f}–{hi:.2f}" if fit and refused else (f"≥ {lo:.2f}" if fit else f"< {hi:.2f}")
    gib = lambda m: f"{m / 1024:.1f}" if m else "–"
    return gib(fit), gib(refused), ratio


def _range(vals: list[tuple[float, Row]]) -> str:
    lo, hi = min(vals, key=lambda v: v[0]), max(vals, key=lambda v: v[0])
    return f"{lo[0]:.2f}–{hi[0]:.2f} (lowest: {lo[1].label}; highest: {hi[1].label})"


def _band_bounds(r: Row) -> tuple[float, float]:
    cell = r.cells["analytic / needed"]
    nums = [float(x) for x in re.findall(r"\d+\.\d+", cell)]
    if "≥" in cell or ">" in cell:  # only a fit: needed <= the cap
        return nums[0], math.inf
    if "<" in cell:
        return 0.0, nums[0]
    return nums[0], nums[-1]


def summary(rows: list[Row], band: list[Row]) -> str:
    hbm = {c: cluster_model.load(c)[1].hbm_bytes_per_device / 2**30 for c in {r.cluster for r in rows}}
    full = [r for r in rows if r.cells["remat"] == "full"]
    compiled = [r for r in full if r.cells["verdict"] == "run" and r.num("analytic / peak") is not None]
    refused = [r for r in full if r.cells["verdict"] != "run"]
    out = []
    if compiled:
        ratios = [(r.num("analytic / peak"), r) for r in compiled]
        out.append(
            f"- **Analytic / compiler's peak, remat full: {_range(ratios)}**, over the {len(compiled)} "
            "points the compiler compiled."
        )
        long = [(v, r) for v, r in ratios if r.num("context") >= 14 * 2**20]
        if long:
            out.append(f"- At 14,680,064 tokens: {_range(long)}.")
        sums = [
            (r.num("analytic GiB") / r.num("compiled GiB"), r) for r in compiled if r.num("context") >= 2**20
        ]
        if sums:
            out.append(
                f"- Against the sum (compiled GiB) the planner is {_range(sums)} at 1M tokens and more: "
                "the sum's temporaries carry allocator slack that no buffer model follows."
            )
    if refused:
        agree = [r for r in refused if r.num("analytic GiB") > hbm[r.cluster]]
        names = "; ".join(r.label for r in refused)
        if len(agree) == len(refused):
            out.append(
                f"- The compiler refuses {names}; the planner's figure is over the chip's HBM at each, so "
                "it says infeasible there too."
            )
        else:
            out.append(
                f"- The compiler refuses {names}; the planner says each fits but "
                f"{'; '.join(r.label for r in refused if r not in agree)}."
            )
    strict = [r for r in compiled if r.num("analytic GiB") > hbm[r.cluster]]
    for r in strict:
        peak, total = r.cells["compiler's peak"], r.num("compiled GiB")
        over = f" (its sum, {total:.1f} GiB, over the chip)" if total > hbm[r.cluster] else ""
        out.append(
            f"- Stricter than the compiler: {r.label}, the planner's {r.cells['analytic GiB']} GiB is over "
            f"the {hbm[r.cluster]:.0f} GiB it plans for, while the compiler fits it with a peak of {peak}"
            f"{over}; only `aot=true` says `run` there."
        )
    if band:
        bounds = [(_band_bounds(r), r) for r in band]
        lo_ok = [(lo >= BAND[0] - 0.005, hi <= BAND[1] + 0.005, r) for (lo, hi), r in bounds]  # 2-digit cells
        inside = [r for a, b, r in lo_ok if a and b]
        above = [r for a, b, r in lo_ok if a and not b]
        below = [r for a, _, r in lo_ok if not a]
        text = f"- remat=offload: {len(inside)} of {len(band)} capped rows are inside [{BAND[0]}, {BAND[1]}]"
        text += (
            f"; above it (the planner over-predicts, the safe side): {'; '.join(r.label for r in above)}"
            if above
            else ""
        )
        text += f"; below it: {'; '.join(r.label for r in below)}" if below else ""
        out.append(text + ".")
    return "\n".join(out)


NOTE = """\
What the TPU compiler says about the real train step (`jobs/step.py`), set against the planner's analytic
figure for the same point. `benchmarks/aot.py` lowers the step for the cluster's TPU topology and compiles it with
libtpu on a CPU host (no TPU needed), batch 1, every device on the sequence (the context axes split as
`mesh=auto` splits them; `--ulysses N` fixes the inner degree); compiles are cached under `.cache/aot` by trial id,
topology and the hash of the lowered program, and `benchmarks/aot_table.py` reprints the cache without compiling.
The model is llama3_1_8b_long (Llama 3.1 8B with head_dim 256, 16 query / 4 KV heads) unless the cluster cell
names another."""

COLUMNS = """\
## The columns

- *analytic GiB*: the planner's predicted peak HBM per device (`orchestrator/plan/memory.py`, `memory.peak`);
  no compile involved. How it is built: [the memory model](../explanation/memory-model.md).
- *compiled GiB*: `memory_analysis()`'s argument + output − alias + temp of the compile at the chip's real HBM
  (what MaxText prints as its total). "≥ N" where the compiler refused the program: N is what it said it needed.
- *compiler's peak*: `memory_analysis()`'s `peak_memory_in_bytes`, the high-water mark the compiler holds the
  scheduled program to. "(host)" on remat=offload rows: libtpu then reports the host's peak (arguments +
  pinned-host temporaries), so those rows have no device peak and no ratio. "-" where it refused.
- *analytic / peak*: the planner's figure over the compiler's peak (over its stated need where it refused).
- *verdict*: the compiler's, judged by its peak against the chip's HBM (by the sum where there is no device
  peak); `infeasible` where it refused.
- *compile s*: the compile's wall time on the machine above.
"""

WHY_PEAK = """\
## Why the peak and not the sum

The planner models the compiler's peak: it is the high-water mark the compiler schedules the program under the
chip's HBM, and the figure the verdict judges by. The sum is not a bound the compiler keeps: it can exceed the
chip for a program that compiles, and it shrinks when the compiler is told the chip is smaller (libtpu's
`--xla_tpu_max_hbm_size_mib`, `benchmarks/aot_capped.py`: it then packs and rematerializes tighter), since its
temporaries hold allocator slack as well as buffers. No model whose terms are buffers can follow it."""

BAND_TEXT = f"""\
## remat=offload: bounded by capped compiles

With the layer inputs in pinned host memory there is no device peak to compare with, so `benchmarks/aot.py
--band` compiles each point twice more, the chip told it has the planner's figure / {BAND[0]} and / {BAND[1]} MiB:
a fit at the first says the planner is at most {1 - BAND[0]:.0%} below what the compiler needs, a refusal at the
second that it is less than {BAND[1] - 1:.0%} above. *fits at* is the smallest cap the compiler fitted the point
into, *refused at* the largest cap below it that it refused (more caps, from `--at-mib N ...`, narrow a row), and
*analytic / needed* the range of the planner's figure over what the compiler needs that the two bound."""

LIMITS = """\
## Known limits

- remat=offload rows are bounded only by capped compiles (the table above), not measured as a peak.
- A capped compile's refusal says what the compiler would need before trying harder, not a floor: only a fit is
  evidence of what a point needs.
- One compile is one draw: libtpu's result depends on more than the module it is given. The same lowered step,
  compiled from two different calling scripts, has given compiler's peaks a few percent apart (double ring at
  14,680,064 tokens on tpu7x_128, remat full: 50.7 and 54.4 GiB, at commit 52e8041). Each row is one draw, from
  `benchmarks/aot.py`; the spread elsewhere is not measured."""


def body(rows: list[Row], band: list[Row]) -> str:
    parts = [COLUMNS, "## Analytic vs compiled", table(HEAD, rows)]
    parts += ["## How close the planner is", summary(rows, band), WHY_PEAK]
    if band:
        parts += [BAND_TEXT, table(BAND_HEAD, band)]
    return "\n\n".join([*parts, LIMITS])
