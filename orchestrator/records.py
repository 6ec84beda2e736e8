"""Metric records from the jobs as MLflow points and params: what a step, start or summary record becomes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from jobs.records import Record, StartRecord, StepRecord, SummaryRecord
from jobs.spec import TrialSpec

# Which fields of each record become MLflow metrics (docs/reference/mlflow.md lists them; tests/test_records.py
# checks every numeric field of a record is here). A key a newer job sends is kept in the trial log only.
STEP_METRICS = ("loss", "grad_norm", "step_time_s", "tokens_per_s", "tflops_per_s_per_device", "mfu",
                "peak_bytes_in_use", "bytes_in_use")  # fmt: skip
MEMORY_METRICS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "compiled_bytes_per_device")
START_METRICS = ("devices", "processes", "compile_s", "restore_s", "peak_tflops_per_device",
                 "tflops_per_device_per_step", "resumed_from_step", *MEMORY_METRICS, "slices")  # fmt: skip
POSITION_METRIC = (
    "loss_by_position"  # + "/<bucket>": a step's loss per position bucket (jobs.spec.bucket_labels)
)
DISTANCE_METRIC = (
    "accuracy_by_distance"  # + "/<bucket>": recall, queries answered right by distance to the key
)
FINAL = ("step_time_median_s", "tokens_per_s", "tflops_per_s_per_device", "mfu")  # logged as final_<name>
SUMMARY_METRICS = ("final_loss", "steps_run", "attempt_from_step", "timed_from_step", "timed_to_step", *FINAL,
                   "peak_bytes_in_use", *MEMORY_METRICS)  # fmt: skip
Point = list  # [key, value, timestamp_ms, step]: JSON-able, for the tracking journal


def trial_params(spec: TrialSpec) -> dict[str, str]:
    p = {
        "model": spec.model.name, "strategy": spec.strategy.name, "layout": spec.strategy.layout,
        "mesh": spec.mesh.label(), "cp": spec.mesh.cp, "cp_ring": spec.mesh.context,
        "cp_ulysses": spec.mesh.context_ulysses, "context_length": spec.context_length, "batch": spec.train.batch,
        "steps": spec.train.steps, "dtype": spec.train.dtype, "remat": spec.train.remat, "devices": spec.mesh.size,
        "cluster": spec.cluster.name,
    }  # fmt: skip
    mem = spec.train.memory  # train.memory on top of the remat preset (empty: the preset alone)
    p.update(
        {f"memory_{k}": ",".join(getattr(mem, k)) for k in ("save", "offload", "host") if getattr(mem, k)}
    )
    p.update({k: v for k, v in spec.axes})
    return {k: str(v) for k, v in p.items()}


def memory_bytes(summary: SummaryRecord) -> int | None:
    """A trial's memory per device: the runtime peak where the backend reports one (TPU/GPU), else the
    compiler's figure (CPU reports no runtime peak)."""
    return summary.peak_bytes_in_use or summary.compiled_bytes_per_device


def record_points(r: Record, now: int, attempt: int = 1) -> list[Point]:
    """One metric record as MLflow points: step records per step (at the job's own time, so a copy re-sent
    after a resume is the same point), start records per attempt, summary ones at step 0."""
    if isinstance(r, StepRecord):
        vals = {m: getattr(r, m) for m in STEP_METRICS}
        step, now = r.step, int(r.t_ms or now)
    elif isinstance(r, StartRecord):  # compile and restore time of this attempt, never mixed into steps
        vals, step = {m: getattr(r, m) for m in START_METRICS}, attempt
    elif isinstance(r, SummaryRecord):  # end-of-trial figures get final_; memory keeps its names
        vals = {("final_" + k if k in FINAL else k): getattr(r, k) for k in SUMMARY_METRICS}
        if mem := memory_bytes(r):
            vals["memory_bytes_per_device"] = mem
        step = 0
    else:
        return []
    if isinstance(r, StepRecord):  # one metric per position bucket, e.g. loss_by_position/1K-4K
        vals |= {f"{POSITION_METRIC}/{k}": v for k, v in (r.loss_by_position or {}).items()}
        vals |= {f"{DISTANCE_METRIC}/{k}": v for k, v in (r.accuracy_by_distance or {}).items()}
    ok = {k: float(v) for k, v in vals.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return [[k, v, now, step] for k, v in ok.items() if v == v]


def summary_covers(r: SummaryRecord, attempt: int) -> str:
    """Which steps a summary's step time and MFU come from, e.g. "steps 7-11 of attempt 2 (resumed at 6)"."""
    if r.timed_from_step is None:
        return ""
    text = f"steps {r.timed_from_step}-{r.timed_to_step} of attempt {attempt}"
    return text + (f" (resumed at step {r.attempt_from_step})" if r.attempt_from_step else "")


def record_tags(records: list[Record], attempt: int) -> dict[str, str]:
    """Tags a batch of records sets on its trial: which steps the summary covers, and why the attention
    kernel ran the xla one instead (a GPU's cuDNN refusing a shape), per attempt's start record."""
    tags = {}
    if covers := [c for r in records if isinstance(r, SummaryRecord) and (c := summary_covers(r, attempt))]:
        tags["summary_covers"] = covers[-1]
    if falls := [f for r in records if isinstance(r, StartRecord) for f in (r.kernel_fallbacks or [])]:
        tags["kernel_fallback"] = "; ".join(dict.fromkeys(falls))
    return tags


@dataclass
class TrialLog:
    """What the driver saw of one trial: records per attempt and status lines (the trial log artifact)."""

    attempts: list[list[Record]] = field(default_factory=lambda: [[]])
    lines: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[Record]:
        return self.attempts[-1]

    def add(self, records: list[Record]) -> None:
        self.records.extend(records)
        self.lines.extend(json.dumps(r.to_dict(), default=str) for r in records)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
