"""The step-time calibration page: every published table held out of its own fit, for the TPU and GPU families,
with the picks a held-out fit makes, the bands, and the constants the configs carry (no device, no jax):

    python benchmarks/calibration.py          # print the page
    python benchmarks/calibration.py --page   # docs/results/calibration.md, through orchestrator.provenance
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import page
from orchestrator import provenance
from orchestrator.calibrate import family
from orchestrator.calibrate.published_gpu import SOURCES as GPU_SOURCES
from orchestrator.calibrate.published_tpu import SOURCES as TPU_SOURCES
from orchestrator.plan.steptime import SETTLED

PROG = "python benchmarks/calibration.py"
GOAL, PICK = 0.20, 0.05

NOTE = f"""\
Each row is one published training step (orchestrator/calibrate/published_tpu.py and published_gpu.py, each
with its source) against the planner's step-time model. Its table is the unit held out: *predicted (held out)*
is the model with the constants fitted on every *other* table of its family (the table's own cells never seen;
each fit starts from the roofline's values, never from a config an earlier fit wrote), *error (held out)* its
predicted / measured step − 1; *error (all tables)* is the fit on every table, whose constants
`conf/cluster/*.yaml` carry. *Excluded* rows are never fitted: the model has no term for what made them differ
(they are shown, not judged). The model and its terms: [the step-time model](../explanation/step-time-model.md).

The band on every prediction comes from the held-out errors: measured over predicted step for 90 % of the
held-out cells, apart for steps the kernels and matmuls price ({SETTLED:.0%} of the step or more, under the
final fit) and the rest, where fixed costs and exposed transfers weigh and fewer tables measure them. A pick is
the fastest predicted of a table's strategies at one point, by the fit that never saw the table, against the
fastest measured. Goals: every held-out cell within {GOAL:.0%}; every pick within {PICK:.0%} of the best."""


def section(r: family.Result, sources: dict[str, str]) -> str:
    ok, n = family.within(r.held_out, GOAL)
    worst = max((c for c in r.held_out if not c.row.excluded), key=lambda c: abs(c.error))
    picks_ok = sum(p.regret <= PICK for p in r.picks)
    constants = "\n".join(
        f"- {chip}: " + ", ".join(f"`{k}` {v:.4g}" for k, v in values.items())
        for chip, values in r.constants.items()
    )
    return f"""\
{ok} of {n} held-out cells within {GOAL:.0%}; the largest miss is {worst.row.label} ({worst.row.table}),
{worst.error:+.0%}. {picks_ok} of {len(r.picks)} picks within {PICK:.0%} of the best measured step.

{family.markdown(r)}

Constants (`conf/cluster/`, written by `{r.command}`):

{constants}

Sources:

""" + "\n".join(f"- {tag}: {where}" for tag, where in sources.items())


def page_body() -> str:
    tpu, gpu, chip = (family.calibrate(f) for f in (family.TPU, family.GPU, family.CHIP))
    return f"""\
## TPU: v5p and Ironwood

{section(tpu, TPU_SOURCES)}

## GPU: H100, H200 and B200

H200 has no published row: its constants are H100's. Every GPU row the fit sees is ring CP; the tables with
per-strategy cells are TPU ones, so no GPU pick is scored. The shared constants no GPU row pins (head_dim, attention
replay, per-call, per-layer and collective fixed costs) are the TPU family's v5p values.

{section(gpu, GPU_SOURCES)}

## Our own runs on a TPU v5e chip

Each point is its own table (leave one point out), and the band holds every held-out point: it is the spread of
those errors. The points, the kernel sweep and the verdicts: [a real TPU v5e chip](v5e.md).

{section(chip, {"chip": "orchestrator/calibrate/chip_v5e_1.json, measured by benchmarks/chip.py on the chip"})}
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    page.add_argument(ap, "calibration")
    a = ap.parse_args(argv)
    page.publish(a.page, "Step-time calibration", provenance.current(PROG, argv), NOTE, page_body())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
