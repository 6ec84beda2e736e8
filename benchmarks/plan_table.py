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

from benchmarks import page
from orchestrator import provenance
from orchestrator.config import grid
from orchestrator.config.load import load
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
counted). *policy* is the memory policy the point runs (`train.remat`, then any `train.memory` lists).
*chip-h* is what the point would cost: `train.steps` (8 in cp_scaling) at the predicted step time plus
`cluster.compile_seconds`, times the trial's chips. *reason* says why the verdict, what limits the step, and for a
point over HBM the `train.remat` preset that would fit.

The last sections are the whole cp_scaling grid under `train.remat=auto`: per point, the policy the planner chose
(the fastest that fits; a tie within 0.5 % goes to the simplest policy leaving 20 % of HBM free) and its
predicted MFU, one row per context length and one column per strategy."""


def rows_for(overrides: list[str]) -> list[PlanRow]:
    cfg = load(["+sweep=cp_scaling", *overrides])
    OmegaConf.update(cfg, "sweep.axes.strategy", STRATEGIES, force_add=True)
    OmegaConf.update(cfg, "sweep.axes.context_length", LENGTHS, force_add=True)
    return plan(grid.expand(cfg))


def section(overrides: list[str], rows: list[PlanRow]) -> str:
    counts = ", ".join(f"{sum(r.verdict == v for r in rows)} {v}" for v in VERDICTS)
    title = ", ".join(f"`{o}`" for o in overrides)
    return f"## {title}\n\n{to_markdown(rows)}\n\n{counts}.\n"


AUTO = ["cluster=tpu7x_128 model=llama3_1_8b_long", "cluster=v5p_128 model=llama3_1_8b_long"]


def auto_section(overrides: list[str]) -> str:
    """cp_scaling under train.remat=auto: the chosen policy and predicted MFU per strategy and length."""
    rows = plan(grid.expand(load(["+sweep=cp_scaling", *overrides, "train.remat=auto"])))
    names = list(dict.fromkeys(r.strategy for r in rows))
    cell = {(r.strategy, r.context_length): r for r in rows}
    what = lambda r: (
        r.verdict if r.verdict == "invalid" else f"{r.policy}: {r.verdict}, MFU {r.predicted_mfu:.2f}"
    )
    lengths = sorted({r.context_length for r in rows})
    table = page.table(
        ["context", *names], ([f"{length:,}", *(what(cell[n, length]) for n in names)] for length in lengths)
    )
    title = ", ".join(f"`{o}`" for o in [*overrides, "train.remat=auto"])
    hours = sum(r.chip_hours or 0 for r in rows if r.verdict == "run")
    return f"## {title} (cp_scaling)\n\n" + table + f"\n\nRunnable points: {hours:,.4g} chip-hours.\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every table, e.g. model=llama3_1_8b")
    ap.add_argument(
        "--section",
        action="append",
        default=None,
        metavar="OVERRIDES",
        help="with --page: one table under these space-separated overrides (repeatable; default: SECTIONS, "
        "v5p_128 remat full and offload, tpu7x_128 remat full)",
    )
    page.add_argument(ap, "plans")
    a = ap.parse_args(argv)
    if not a.page:
        print(to_markdown(rows_for(a.overrides)))
        return 0
    parts = []
    for s in a.section or SECTIONS:
        overrides = [*shlex.split(s), *a.overrides]
        parts.append(section(overrides, rows_for(overrides)))
    parts += [auto_section([*shlex.split(s), *a.overrides]) for s in AUTO]
    made = provenance.current("python benchmarks/plan_table.py", argv)
    path = page.write(a.page, "Plan tables", made, NOTE, "\n".join(parts))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
