"""A family of chips calibrated together (the TPUs, the GPUs), and one calibration run over its tables: the
fit on every table (the constants the configs carry), every table's cells held out of their own fit, the
bands those errors give, and the picks a held-out fit would have made."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.calibrate import chip, fit, gpu, tpu
from orchestrator.calibrate.fit import Cell, Constants, Knob, Measured, Pick
from orchestrator.plan.cluster_model import ClusterModel
from orchestrator.plan.steptime import SETTLED


@dataclass(frozen=True)
class Family:
    name: str
    chips: tuple[str, ...]
    knobs: tuple[Knob, ...]
    rows: Callable[[], list[Measured]]
    base: Callable[[], dict[str, ClusterModel]]
    fixed: Callable[[], Constants] = dict  # constants no fit of this family moves
    copy: dict[str, str] = field(default_factory=dict)  # a chip without rows -> whose constants it takes
    coverage: float = 0.9  # share of the held-out cells the band holds
    flag: str = ""  # the calibrate command's switch for it


TPU = Family("tpu", tpu.CHIPS, tpu.KNOBS, tpu.measured, tpu.base)
GPU = Family("gpu", gpu.CHIPS, gpu.KNOBS, gpu.measured, gpu.base, gpu.borrowed, gpu.COPY, flag="--gpu")
# our own runs on a real chip, one point per table: leave one point out, a band over every held-out point
CHIP = Family(
    "chip",
    chip.CHIPS,
    chip.KNOBS,
    chip.measured,
    chip.base,
    chip.fixed,
    coverage=chip.COVERAGE,
    flag="--chip",
)


@dataclass(frozen=True)
class Result:
    family: Family
    constants: Constants  # per conf/cluster name: every fitted constant and the bands
    fitted: list[Cell]  # every row under the final constants
    held_out: list[Cell]  # every row under the fit that never saw its table
    picks: list[Pick]
    bands: dict[str, tuple[float, float]]
    command: str


def calibrate(f: Family) -> Result:
    rows, base, fixed = f.rows(), f.base(), f.fixed()
    final = fit.fit(rows, f.knobs, base, fixed)
    fitted = fit.in_sample(rows, base, final)
    held_out = fit.leave_one_table_out(rows, f.knobs, base, fixed)
    bands = fit.bands(held_out, fitted, f.coverage)
    # rounded outward at the configs' four digits, so a cell on the band's edge stays inside it once written
    (s_lo, s_hi), (f_lo, f_hi) = (_outward(*bands[k]) for k in ("step", "fixed"))
    band = {"step_band_low": s_lo, "step_band_high": s_hi, "fixed_band_low": f_lo, "fixed_band_high": f_hi}
    constants = {c: v | band for c, v in final.items() if c in f.chips}
    for name, source in f.copy.items():
        constants[name] = dict(constants[source])
    command = "python -m orchestrator.calibrate" + (f" {f.flag}" if f.flag else "") + " --fit --write"
    return Result(f, constants, fitted, held_out, fit.picks(held_out), bands, command)


def _outward(lo: float, hi: float) -> tuple[float, float]:
    def digits(v: float) -> float:
        return 10 ** (math.floor(math.log10(abs(v))) - 3) if v else 1.0

    return math.floor(lo / digits(lo)) * digits(lo), math.ceil(hi / digits(hi)) * digits(hi)


def header(r: Result, chip: str) -> list[str]:
    """The comment over a config's step-time section: what fitted it, on what, and where it is judged."""
    f = r.family
    shared = [
        k.name + (f" (a multiple of each chip's {k.relative_to})" if k.relative_to else "")
        for k in f.knobs
        if not k.per_chip
    ]
    own = [k.name for k in f.knobs if k.per_chip]
    borrowed = sorted(f.fixed().get(chip, {}))
    tables = ", ".join(dict.fromkeys(row.table for row in f.rows() if not row.excluded))
    if f.coverage >= 1.0:  # our own points on the chip, each its own table
        text = [
            f"Step-time model (orchestrator/plan/steptime.py), fitted by `{r.command}` on the "
            f"{len(f.rows())} train steps measured on the chip itself (orchestrator/calibrate/chip_{chip}.json, "
            "docs/results/v5e.md).",
            f"Fitted: {', '.join(own)}. From the chip's kernel sweep or not told apart by these points: "
            f"{', '.join(borrowed)}.",
            "The band: measured over predicted step of every point held out of its own fit (leave one point out), "
            "for steps the kernels and matmuls price (step_band_*) and the rest (fixed_band_*).",
        ]
        return [line for t in text for line in textwrap.wrap(t, width=108, break_on_hyphens=False)]
    text = [
        f"Step-time model (orchestrator/plan/steptime.py), fitted by `{r.command}` on every table of the "
        f"{f.name} family's published runs (orchestrator/calibrate/): {tables}.",
        f"This chip's own: {', '.join(own)}."
        + (f" The family's: {', '.join(shared)}." if shared else "")
        + (f" {chip} takes {f.copy[chip]}'s constants." if chip in f.copy else "")
        + (f" Kept at the TPU family's (v5p's): {', '.join(borrowed)}." if borrowed else ""),
        "The band: measured over predicted step of 90 % of the cells each held out of its own table's fit, for "
        "steps the kernels and matmuls price (step_band_*) and the rest (fixed_band_*): "
        "docs/results/calibration.md.",
    ]
    return [line for t in text for line in textwrap.wrap(t, width=108, break_on_hyphens=False)]


def markdown(r: Result) -> str:
    """Every cell held out of its own fit (and under the final fit), the picks, the bands."""
    lines = [
        "| table | run | measured s | predicted s (held out) | error (held out) | error (all tables) |",
        "|---|---|---|---|---|---|",
    ]
    final = {(c.row.table, c.row.label): c for c in r.fitted}
    for c in r.held_out:
        mark = f" (excluded: {c.row.excluded})" if c.row.excluded else ""
        lines.append(
            f"| {c.row.table} | {c.row.label}{mark} | {c.row.step_s:,.4g} | {c.predicted_s:,.4g} | "
            f"{c.error:+.0%} | {final[(c.row.table, c.row.label)].error:+.0%} |"
        )
    lines += [
        "",
        "| table | point | picked (held out) | best measured | pick's regret |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {p.table} | {p.point} | {p.picked} | {p.best} | {p.regret:+.1%} |" for p in r.picks]
    lines += ["", *(f"band ({k}): {lo:.3f}x - {hi:.3f}x" for k, (lo, hi) in r.bands.items())]
    held = in_band(r)
    inside, cells = (sum(v[i] for v in held.values()) for i in (0, 1))
    lines += [
        "",
        f"held-out cells inside their band: {inside} of {cells} ({inside / max(cells, 1):.0%}); by table: "
        + ", ".join(f"{t} {a}/{b}" for t, (a, b) in held.items()),
    ]
    return "\n".join(lines)


def in_band(r: Result) -> dict[str, tuple[int, int]]:
    """Per table: (held-out cells whose measured step lies in the band of their regime, cells judged)."""
    regime = {(c.row.table, c.row.label): c.settled >= SETTLED for c in r.fitted}
    out: dict[str, tuple[int, int]] = {}
    for c in r.held_out:
        if c.row.excluded:
            continue
        lo, hi = r.bands["step" if regime[(c.row.table, c.row.label)] else "fixed"]
        a, b = out.get(c.row.table, (0, 0))
        out[c.row.table] = (a + (lo <= c.row.step_s / c.predicted_s <= hi), b + 1)
    return out


def within(cells: Sequence[Cell], tolerance: float) -> tuple[int, int]:
    """(cells within `tolerance`, fitted cells): excluded rows are not counted."""
    judged = [c for c in cells if not c.row.excluded]
    return sum(abs(c.error) <= tolerance for c in judged), len(judged)
