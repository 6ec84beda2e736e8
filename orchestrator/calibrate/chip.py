"""Our own runs on a real chip as measured steps: the table a chip's constants are fitted on, point by point.

The points live in orchestrator/calibrate/chip_<cluster>.json, written by benchmarks/chip_page.py from what
benchmarks/chip.py measured on the chip (one TrialSpec and its median step per point). Every point is its own
table here, so the calibration's leave-one-table-out is leave-one-point-out: each point is predicted by the fit
on all the others, and the band on this chip's predictions is the spread of those held-out errors (all of them:
the band covers every measured point held out of its own fit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from jobs.spec import TrialSpec
from orchestrator import REPO
from orchestrator.calibrate.fit import Knob, Measured
from orchestrator.plan import cluster_model
from orchestrator.plan.cluster_model import ClusterModel

HERE = REPO / "orchestrator" / "calibrate"
CHIPS = ("v5e_1",)
# One chip, so every knob is its own. What a single chip with CP = 1 pins: the matmuls' rate, splash's rate on
# its tiles, the remat replay of attention, the fixed cost per step and the host link's exposed share. The xla
# kernel's rate relative to splash's and the block effect come from the kernel sweep itself (`fixed`), so that a
# point held out keeps them; collectives do not occur on one chip.
KNOBS = (
    Knob("matmul_efficiency", 0.3, 1.0, per_chip=True),
    Knob("attention_efficiency", 0.05, 1.0, per_chip=True),
    Knob("attention_recompute", 1.0, 4.0, per_chip=True),
    Knob("layer_overhead_s", 0.0, 0.05, per_chip=True),
    Knob("step_overhead_s", 0.0, 1.0, per_chip=True),
    Knob("offload_exposed", 0.0, 1.0, per_chip=True),
)
# What these points cannot tell apart, folded into the knobs above: one head_dim (128), so no head_dim effect;
# one kernel call per layer and pass, so no per-call cost apart from the layer's
UNPINNED = {"attention_head_dim_half": 0.0, "call_overhead_s": 0.0}
COVERAGE = 1.0  # the band holds every held-out point (the claim: each one inside its band)


@dataclass(frozen=True)
class Point:
    """One measured train step on the chip."""

    name: str
    spec: TrialSpec
    step_s: float  # median step of the run (jobs.train's summary)
    program_peak_bytes: int | None  # the compiler's peak in device memory
    mfu: float
    measured: str  # when and where, e.g. "tpu v5e chip, 2026-12-07"


def path(cluster: str):
    return HERE / f"chip_{cluster}.json"


@cache
def _file(cluster: str) -> dict:
    p = path(cluster)
    return json.loads(p.read_text()) if p.exists() else {}


def fixed() -> dict[str, dict[str, float]]:
    """The kernel constants the chip's splash sweep measured (benchmarks/chip_page.py --write-table)."""
    return {c: UNPINNED | dict(_file(c).get("kernel", {})) for c in CHIPS if _file(c)}


@cache
def points(cluster: str = "v5e_1") -> tuple[Point, ...]:
    """The chip's measured points (empty where none were measured)."""
    return tuple(
        Point(
            name=d["name"],
            spec=TrialSpec.from_dict(d["spec"]),
            step_s=float(d["step_s"]),
            program_peak_bytes=d.get("program_peak_bytes"),
            mfu=float(d["mfu"]),
            measured=d["measured"],
        )
        for d in _file(cluster).get("points", [])
    )


def measured() -> list[Measured]:
    """Every chip point as a measured step, each its own table (leave one point out)."""
    out = []
    for c in CHIPS:
        for p in points(c):
            s = p.spec
            label = (
                f"{p.name} {s.model.name} {s.context_length // 1024}K b{s.train.batch} {s.kernel} "
                f"{s.train.remat}{'+host ' + ','.join(s.train.memory.host) if s.train.memory.host else ''}"
            )
            out.append(
                Measured(label=label, table=label, chip=c, spec=s, step_s=p.step_s, point="", choice="")
            )
    return out


def base() -> dict[str, ClusterModel]:
    return {c: cluster_model.load(c)[1] for c in CHIPS}
