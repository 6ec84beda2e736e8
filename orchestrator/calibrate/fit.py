"""The coordinate search behind the step-time constants, shared by the published-run fit
(orchestrator/calibrate/tpu.py) and a sweep's refit (orchestrator/calibrate/refit.py): which constants a fit may
move, within what bounds, and the search itself over any loss of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from jobs.spec import TrialSpec
from orchestrator.plan.hardware import ClusterModel, model_of
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

Bounds = dict[str, tuple[float, float]]
# A trial as it ran and what it measured: its spec (cluster.peak_tflops_per_device the rate the run divided
# by) and its median step in seconds.
Measured = tuple[TrialSpec, float]


def search(
    loss: Callable[[dict[str, float]], float],
    params: dict[str, float],
    free: Sequence[str],
    rounds: int = 12,
    bounds: Bounds | None = None,
) -> dict[str, float]:
    """Coordinate search from `params`: each `free` key in turn takes the best of six moves within its bounds
    (FITTED's unless given), in relative steps that shrink every round."""
    bounds = FITTED if bounds is None else bounds
    params = dict(params)
    for i in range(rounds):
        step = 0.5 / (1 + i)  # relative move, shrinking
        for k in free:
            lo, hi = bounds[k]
            best = (loss(params), params[k])
            span = max(abs(params[k]), (hi - lo) * 0.05)
            for f in (-2, -1, -0.5, 0.5, 1, 2):
                v = min(hi, max(lo, params[k] + f * step * span))
                value = loss(params | {k: v})
                if value < best[0]:
                    best = (value, v)
            params[k] = best[1]
    return params


def with_constants(spec: TrialSpec, params: dict[str, float]) -> ClusterModel:
    """The trial's cluster as the planner prices it, with these step-time constants replaced."""
    return replace(model_of(spec.cluster), **params)


def step_loss(rows: Sequence[Measured], params: dict[str, float]) -> float:
    """Squared log error of the predicted step against the measured one: a 10 % miss on a 0.2 s step counts as
    much as on a 2 s one, as the published fit counts MFU."""
    total = 0.0
    for spec, measured_s in rows:
        total += math.log(step_time(spec, model=with_constants(spec, params)).step_s / measured_s) ** 2
    return total
