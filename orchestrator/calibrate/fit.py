"""Fit the step-time model's constants on measured steps, and judge it honestly.

A fit is least squares on log(predicted / measured step) over every row it may see, moving the constants a
family of chips declares (`Knob`s: each either one value per chip, or one value the family shares). A table's
cells are judged only by the fit that never saw that table (leave one table out): those errors are what the
calibration page reports, what the band on every prediction is made of (`band`), and how the picks a held-out
fit would have made are scored against the measured best (`picks`). The final constants are the fit on every
table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy.optimize import least_squares

from jobs.spec import TrialSpec
from orchestrator.plan.cluster_model import ClusterModel, peak_tflops
from orchestrator.plan.steptime import SETTLED, StepTime, step_time
from orchestrator.plan.work import Work, step_work


@dataclass(frozen=True)
class Knob:
    """A constant a fit may move, within bounds: one value per chip, or one the family's chips share."""

    name: str
    lo: float
    hi: float
    per_chip: bool = False
    # A knob the family shares as a ratio to another of each chip's constants (the attention kernel's rate as a
    # multiple of the matmuls'): the fit moves the ratio, each chip's constant is ratio x its own reference.
    relative_to: str = ""
    ceiling: float = float("inf")  # what the derived constant may not exceed (an efficiency: 1)


@dataclass(frozen=True)
class Measured:
    """One measured step: a published run's, or a finished trial's."""

    label: str
    table: str  # where it was published (or the sweep it ran in): the unit held out of its own fit
    chip: str  # the conf/cluster name whose constants price it
    spec: TrialSpec
    step_s: float  # measured median step
    offload: tuple[str, ...] | None = None  # what went to host, where the remat policy does not say it
    point: str = ""  # cells of one table that compete: the same model, cluster and length
    choice: str = ""  # what the table compares at a point (e.g. usp16x4, ring)
    excluded: str = ""  # why no fit sees it ("": every fit that may see its table does)


Constants = dict[str, dict[str, float]]  # chip -> knob -> value


@dataclass(frozen=True)
class Cell:
    """A row predicted by a fit that did not see its table."""

    row: Measured
    predicted_s: float
    limiter: str
    settled: float = 1.0  # the prediction's share priced by the rates every table pins (steptime.settled)

    @property
    def error(self) -> float:
        """Predicted over measured step, minus one: + is predicted slower."""
        return self.predicted_s / self.row.step_s - 1


def model_for(row: Measured, base: dict[str, ClusterModel], constants: Constants) -> ClusterModel:
    return replace(base[row.chip], **constants.get(row.chip, {}))


@lru_cache(maxsize=4096)
def _work(row: Measured) -> tuple[Work, float]:
    """The row's step work and peak: what no constant changes, computed once per row."""
    return step_work(row.spec, row.offload), peak_tflops(row.spec)


def predict(row: Measured, base: dict[str, ClusterModel], constants: Constants) -> StepTime:
    """The row's StepTime under these constants."""
    w, peak = _work(row)
    return step_time(row.spec, offload=row.offload, peak=peak, work=w, model=model_for(row, base, constants))


def _layout(knobs: Sequence[Knob], chips: Sequence[str]) -> list[tuple[Knob, str | None]]:
    """The parameter vector: each shared knob once, then each per-chip knob per chip."""
    shared = [(k, None) for k in knobs if not k.per_chip]
    return shared + [(k, c) for c in chips for k in knobs if k.per_chip]


def _constants(vec: np.ndarray, slots: list[tuple[Knob, str | None]], chips: Sequence[str]) -> Constants:
    out: Constants = {c: {} for c in chips}
    for v, (k, chip) in zip(vec, slots, strict=True):
        for c in chips if chip is None else (chip,):
            out[c][k.name] = float(v)
    return out


def derive(constants: Constants, knobs: Sequence[Knob], base: dict[str, ClusterModel]) -> Constants:
    """Ratio knobs turned into each chip's own constant (ratio x the chip's reference, under the ceiling)."""
    out = {c: dict(v) for c, v in constants.items()}
    for k in knobs:
        if not k.relative_to:
            continue
        for c, v in out.items():
            if k.name in v:
                ref = v.get(k.relative_to, float(getattr(base[c], k.relative_to)))
                v[k.name] = min(v[k.name] * ref, k.ceiling)
    return out


NEUTRAL = ClusterModel()
PRIOR = 0.05  # weight of a per-chip knob's pull toward the family's mean, against a row's log error


def _start(k: Knob) -> float:
    """Where every fit starts a knob: the roofline's value (ClusterModel's default), never a config's, which an
    earlier fit on every table set: a held-out fit must not start from what its table taught."""
    value = float(getattr(NEUTRAL, k.name))
    return value / float(getattr(NEUTRAL, k.relative_to)) if k.relative_to else value


def fit(
    rows: Sequence[Measured],
    knobs: Sequence[Knob],
    base: dict[str, ClusterModel],
    fixed: Constants | None = None,
) -> Constants:
    """The knobs' values that best fit `rows` (excluded rows never count), each search started at the roofline's
    value; `base` holds every other constant (capacities, links). A chip without rows keeps its base values for
    its own knobs and takes the family's shared ones. `fixed`: values no fit
    moves (chip -> knob -> value), e.g. a family's shared constants borrowed from another family's fit."""
    rows = [r for r in rows if not r.excluded]
    fixed = fixed or {}
    chips = sorted({r.chip for r in rows})
    slots = [(k, c) for k, c in _layout(knobs, chips) if k.name not in fixed.get(c or chips[0], {})]
    first = chips[0]
    x0 = np.array([_start(k) for k, _ in slots])
    lo, hi = np.array([k.lo for k, _ in slots]), np.array([k.hi for k, _ in slots])
    x0 = np.clip(x0, lo + 1e-12 * (hi - lo), hi - 1e-12 * (hi - lo))

    def with_fixed(vec: np.ndarray) -> Constants:
        out = derive(_constants(vec, slots, chips), knobs, base)
        for c in chips:
            out[c].update(fixed.get(c, {}))
        return out

    # A per-chip knob is pulled weakly toward the family's mean of it: where a chip's rows pin it the data wins;
    # where they do not (a held-out table took them), it takes its siblings' value, not the search's start.
    groups = [
        [i for i, (k, c) in enumerate(slots) if k is knob and c is not None]
        for knob in knobs
        if knob.per_chip
    ]
    groups = [g for g in groups if len(g) > 1]
    span = hi - lo

    def residuals(vec: np.ndarray) -> np.ndarray:
        c = with_fixed(vec)
        fits = [math.log(predict(r, base, c).step_s / r.step_s) for r in rows]
        prior = [PRIOR * (vec[i] - np.mean(vec[g])) / span[i] for g in groups for i in g]
        return np.array(fits + prior)

    found = least_squares(residuals, x0, bounds=(lo, hi), x_scale=hi - lo, diff_step=1e-4, max_nfev=400)
    out = with_fixed(found.x)
    raw = _constants(found.x, slots, chips)[first]
    for chip in base:  # chips with no rows: their own knobs as the base has them, the shared ones fitted
        if chip not in out:
            own = {k.name: float(getattr(base[chip], k.name)) for k in knobs if k.per_chip}
            shared = {k: v for k, v in raw.items() if k not in own}
            out[chip] = derive({chip: shared | own}, knobs, base)[chip] | fixed.get(chip, {})
    return out


def in_sample(rows: Sequence[Measured], base: dict[str, ClusterModel], constants: Constants) -> list[Cell]:
    return [Cell(r, (t := predict(r, base, constants)).step_s, t.limiter, t.settled) for r in rows]


def leave_one_table_out(
    rows: Sequence[Measured],
    knobs: Sequence[Knob],
    base: dict[str, ClusterModel],
    fixed: Constants | None = None,
) -> list[Cell]:
    """Every row predicted by the fit on every other table (its own table never seen)."""
    cells: list[Cell] = []
    for table in dict.fromkeys(r.table for r in rows):
        constants = fit([r for r in rows if r.table != table], knobs, base, fixed)
        cells += in_sample([r for r in rows if r.table == table], base, constants)
    return cells


def bands(
    held_out: Sequence[Cell], fitted: Sequence[Cell], coverage: float = 0.9
) -> dict[str, tuple[float, float]]:
    """(low, high) multipliers on a predicted step that held `coverage` of the held-out cells' measured steps,
    for the cells the final fit (`fitted`, the same rows) prices mostly by its rates ("step", settled share
    steptime.SETTLED or more) and for the rest ("fixed"). Excluded rows say what the model lacks, not how
    precise it is: they are left out. A regime without cells takes the other's band."""
    settled = {(c.row.table, c.row.label): c.settled for c in fitted}
    groups: dict[str, list[float]] = {"step": [], "fixed": []}
    for c in held_out:
        if not c.row.excluded:
            regime = "step" if settled[(c.row.table, c.row.label)] >= SETTLED else "fixed"
            groups[regime].append(c.row.step_s / c.predicted_s)
    tail = (1 - coverage) / 2
    out = {}
    for regime, ratios in groups.items():
        if ratios:
            low, high = np.quantile(np.array(ratios), [tail, 1 - tail])
            out[regime] = (min(float(low), 1.0), max(float(high), 1.0))
    for regime in groups:
        out.setdefault(regime, out.get("step") or out.get("fixed") or (1.0, 1.0))
    return out


@dataclass(frozen=True)
class Pick:
    """At one point of a table that compares choices: what the held-out fit would pick, against the best."""

    table: str
    point: str
    picked: str
    picked_s: float  # measured step of the pick
    best: str
    best_s: float

    @property
    def regret(self) -> float:
        """The pick's measured step over the best measured one, minus one."""
        return self.picked_s / self.best_s - 1


def picks(cells: Sequence[Cell]) -> list[Pick]:
    """Each point with two or more choices: the fastest predicted against the fastest measured."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        if c.row.point and c.row.choice and not c.row.excluded:
            groups.setdefault((c.row.table, c.row.point), []).append(c)
    out = []
    for (table, point), group in groups.items():
        if len({c.row.choice for c in group}) < 2:
            continue
        picked = min(group, key=lambda c: c.predicted_s)
        best = min(group, key=lambda c: c.row.step_s)
        out.append(Pick(table, point, picked.row.choice, picked.row.step_s, best.row.choice, best.row.step_s))
    return out
