"""The step-time model against published runs: the table the README shows, and the fit behind the constants.

`python -m orchestrator.plan.calibration` prints predicted vs published MFU for every row of
orchestrator/plan/published.py (calibration rows, then held-out rows) with the constants the cluster configs
carry; `--fit` refits the constants on the calibration rows only and prints them (to copy into
conf/cluster/*.yaml by hand: the configs, not this script, are what the planner uses).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

from jobs.spec import TrialSpec
from orchestrator.plan.published import ROWS, Published
from orchestrator.plan.steptime import step_time

# What the fit may move per chip, with bounds. SHARED ones are fitted on v5p only, whose calibration runs
# span two head_dims, full remat and all-gather / all-to-all layouts; tpu7x's (one layout, one policy) take
# v5p's values: the softmax cost relative to the MXU, the replay cost, the links a collective drives.
FITTED = {
    "matmul_efficiency": (0.3, 1.0),
    "attention_efficiency": (0.3, 1.0),
    "attention_head_dim_half": (0.0, 512.0),
    "attention_block_half": (0.0, 16384.0),
    "step_overhead_s": (0.0, 2.0),
    "attention_recompute": (1.0, 4.0),
    "collective_links": (1.0, 6.0),
}
SHARED = ("attention_head_dim_half", "attention_recompute", "collective_links")
TOLERANCE = 0.25  # held-out target: |predicted / published - 1| for every TPU row


@dataclass(frozen=True)
class Check:
    row: Published
    predicted: float  # MFU
    published: float  # MFU (midpoint of a range, or from a published step time)
    limiter: str

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def check(row: Published, spec: TrialSpec | None = None) -> Check:
    st = step_time(spec or row.spec, offload=row.offload)
    return Check(row, st.mfu, row.published_mfu(st.tflops_per_device, st.peak_tflops), st.limiter)


def table(rows: list[Published] | None = None) -> list[Check]:
    """Every row with the constants in conf/cluster: calibration rows first, then held-out rows."""
    rows = ROWS if rows is None else rows
    return [check(r) for r in sorted(rows, key=lambda r: bool(r.held_out))]


def _loss(rows: list[Published], params: dict[str, float]) -> float:
    total = 0.0
    for r in rows:
        s = r.spec
        c = check(r, replace(s, cluster=replace(s.cluster, **params)))
        total += math.log(c.predicted / c.published) ** 2
    return total


def fit(cluster: str, fixed: dict[str, float] | None = None, rounds: int = 12) -> dict[str, float]:
    """Coordinate search on the calibration rows of one cluster (held-out rows never enter)."""
    rows = [r for r in ROWS if r.cluster == cluster and not r.held_out]
    fixed = fixed or {}
    base = rows[0].spec.cluster
    params = {k: float(getattr(base, k)) for k in FITTED if k not in fixed} | fixed
    free = [k for k in FITTED if k not in fixed]
    for i in range(rounds):
        step = 0.5 / (1 + i)  # relative move, shrinking
        for k in free:
            lo, hi = FITTED[k]
            best = (_loss(rows, params), params[k])
            span = max(abs(params[k]), (hi - lo) * 0.05)
            for f in (-2, -1, -0.5, 0.5, 1, 2):
                v = min(hi, max(lo, params[k] + f * step * span))
                loss = _loss(rows, params | {k: v})
                if loss < best[0]:
                    best = (loss, v)
            params[k] = best[1]
    return params


def markdown(checks: list[Check]) -> str:
    lines = ["| run | source | published MFU | predicted MFU | error | role | limiter (model) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in checks:
        r = c.row
        role = f"held out: {r.held_out}" if r.held_out else "calibration"
        lines.append(f"| {r.label} | {r.source} | {c.published:.1%} | "
                     f"{c.predicted:.1%} | {c.error:+.0%} | {role} | {c.limiter} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        v5p = fit("v5p_128")
        tpu7x = fit("tpu7x_128", fixed={k: v5p[k] for k in SHARED})
        for name, p in (("v5p_128", v5p), ("tpu7x_128", tpu7x)):
            print(name, {k: round(v, 4) for k, v in p.items()})
        return 0
    print(markdown(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
