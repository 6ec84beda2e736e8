"""A trial's step time, broken down: a profile's trace files under `profile/` and its `measured/*` seconds,
beside the planner's `predicted/*` terms and band (the names: orchestrator/tracking/mlflow_names.py).

The profile files keep the layout jax.profiler wrote (`plugins/profile/<session>/`), one session per traced
window and process, so the downloaded `profile/` folder is a log directory TensorBoard's profile plugin or xprof
opens.
"""

from __future__ import annotations

from typing import Any

from jobs.records import ProfileRecord, Record
from orchestrator.tracking import Tracker
from orchestrator.tracking.mlflow_names import MEASURED, PREDICTED


def split(records: list[Record]) -> tuple[list[Record], list[ProfileRecord]]:
    """(the metric records, the profiles): a profile's files go to artifacts, never into the trial log."""
    rest = [r for r in records if not isinstance(r, ProfileRecord)]
    return rest, [r for r in records if isinstance(r, ProfileRecord)]


def session(p: ProfileRecord) -> str:
    """The trace's folder under profile/plugins/profile/ (TensorBoard lists each as a run)."""
    return f"steps_{p.first_step}-{p.last_step}.process_{p.process}"


def metrics(p: ProfileRecord) -> dict[str, float]:
    """Seconds per step of each category, and of the step, exposed and overlapped collectives."""
    values = {
        **p.seconds,
        "step_s": p.step_s,
        "collective_exposed_s": p.collective_exposed_s,
        "collective_overlapped_s": p.collective_overlapped_s,
    }
    return {MEASURED[k]: v for k, v in values.items() if k in MEASURED}


def log_profile(tracker: Tracker, key: str, p: ProfileRecord) -> None:
    """The files as artifacts; process 0's breakdown as metrics at the window's first step, its limiter."""
    for name, data in sorted(p.file_bytes().items()):
        tracker.log_artifact(key, data, f"profile/plugins/profile/{session(p)}/{name}")
    if p.process == 0 and p.seconds:  # one host's view: every host runs the same program
        tracker.log_metrics(key, metrics(p), step=p.first_step)
        tracker.set_tags(key, {"measured_limiter": p.limiter})


def band_metrics(row: Any) -> dict[str, float]:
    """A plan row's band (where the fit's held-out errors put the real step and MFU) as metrics; none where the
    planner gave none."""
    fields = {
        "predicted_step_time_low_s": "predicted_step_low_s",
        "predicted_step_time_high_s": "predicted_step_high_s",
        "predicted_mfu": "predicted_mfu",
        "predicted_mfu_low": "predicted_mfu_low",
        "predicted_mfu_high": "predicted_mfu_high",
    }
    names = {metric: getattr(row, field, None) for metric, field in fields.items()}
    return {k: float(v) for k, v in names.items() if v is not None}


def log_predicted(tracker: Tracker, key: str, terms: Any) -> None:
    """The planner's step-time terms for this trial (the plan's StepTime, orchestrator/plan/steptime.py) and
    its limiter, next to what a profile measures."""
    tracker.log_metrics(key, {m: getattr(terms, f) for f, m in PREDICTED.items()})
    tracker.set_tags(key, {"predicted_limiter": terms.limiter})
