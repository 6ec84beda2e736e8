"""The planner's verdicts for the four published strategies at 131,072 and 14,680,064 tokens, as markdown tables
(no device, no jax):

    python benchmarks/plan_table.py cluster=v5p_128 model=llama3_1_8b train.remat=offload   # one table
    python benchmarks/plan_table.py --page                                                # docs/results/plans.md

With `--page`, one table per `--section` (default: v5p_128 remat full, v5p_128 remat offload, tpu7x_128 remat
full; Llama 3.1 8B), each under the overrides given, written through orchestrator.provenance.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from omegaconf import OmegaConf

from orchestrator import grid, provenance
from orchestrator.config import load
from orchestrator.plan import VERDICTS, PlanRow, plan, to_markdown

STRATEGIES = ["all_gather", "ulysses", "ring", "usp"]
LENGTHS = [131_072, 14_680_064]
SECTIONS = [
    "cluster=v5p_128 model=llama3_1_8b train.remat=full",
    "cluster=v5p_128 model=llama3_1_8b train.remat=offload",
    "cluster=tpu7x_128 model=llama3_1_8b train.remat=full",
]

NOTE = """\
What the planner (`orchestrator/plan/`) says about each point before asking for a device: per device and per
step, from the analytic memory model and the step-time model calibrated on published runs
([calibration](calibration.md)). No compile, no jax: the compiler's own figures for the same kind of points are on
[AOT compiles vs the planner](aot.md).

Columns: *verdict* is `run` (fits the chip's HBM and any step-time budget), `infeasible` (valid, but over HBM or
the budget) or `invalid` (breaks a rule; the reason names it and the fix). *HBM/device* is the planner's predicted
peak HBM per device (the figure it holds against the compiler's peak). *step s* and *MFU* are the step-time
model's prediction; *MFU ≤ (roofline)* is the bound with every FLOP at the chip's peak and only unhidden ICI
traffic added. *TFLOP/dev* is model FLOPs per device per step (MaxText's causal count; remat recompute not
counted). *reason* says why the verdict, what limits the step, and for a point over HBM the `train.remat`
preset that would fit."""


def rows_for(overrides: list[str]) -> list[PlanRow]:
    cfg = load(["+sweep=cp_scaling", *overrides])
    OmegaConf.update(cfg, "sweep.axes.strategy", STRATEGIES, force_add=True)
    OmegaConf.update(cfg, "sweep.axes.context_length", LENGTHS, force_add=True)
    return plan(grid.expand(cfg))


def section(overrides: list[str], rows: list[PlanRow]) -> str:
    counts = ", ".join(f"{sum(r.verdict == v for r in rows)} {v}" for v in VERDICTS)
    title = ", ".join(f"`{o}`" for o in overrides)
    return f"## {title}\n\n{to_markdown(rows)}\n\n{counts}.\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every table, e.g. model=llama3_1_8b")
    ap.add_argument(
        "--section", action="append", default=None, metavar="OVERRIDES",
        help="with --page: one table under these space-separated overrides (repeatable; default: SECTIONS, "
        "v5p_128 remat full and offload, tpu7x_128 remat full)",
    )  # fmt: skip
    provenance.add_page_argument(ap, "plans")
    a = ap.parse_args(argv)
    if not a.page:
        print(to_markdown(rows_for(a.overrides)))
        return 0
    parts = []
    for s in a.section or SECTIONS:
        overrides = [*shlex.split(s), *a.overrides]
        parts.append(section(overrides, rows_for(overrides)))
    made = provenance.current("python benchmarks/plan_table.py", argv)
    path = provenance.write_page(a.page, "Plan tables", made, NOTE, "\n".join(parts))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
