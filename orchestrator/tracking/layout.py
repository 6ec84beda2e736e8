"""Every MLflow name a trial's records become: a step, start or summary record as points, params and tags; a
trial's label and run name; the trial log, read back from a child run (so a sweep's plots cover what an earlier
or another driver finished, and a resumed trial's log holds every driver's records); a trial's profiles (trace
files under `profile/`, `measured/*` beside the planner's `predicted/*`).

The profile files keep the layout jax.profiler wrote (`plugins/profile/<session>/`), one session per traced
window and process, so the downloaded `profile/` folder is a log directory TensorBoard's profile plugin or xprof
opens.
"""

from __future__ import annotations

import json
import logging
import tempfile
import typing
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from jobs.records import ProfileRecord, Record, StartRecord, StepRecord, SummaryRecord, parse_known
from jobs.spec import TrialSpec

if TYPE_CHECKING:
    from mlflow.entities import Metric

# Which fields of each record become MLflow metrics (docs/reference/mlflow.md lists them; tests/test_records.py
# checks every numeric field of a record is here). A key a newer job sends is kept in the trial log only.
STEP_METRICS = (
    "loss",
    "grad_norm",
    "step_time_s",
    "tokens_per_s",
    "tflops_per_s_per_device",
    "mfu",
    "peak_bytes_in_use",
    "bytes_in_use",
)
MEMORY_METRICS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "compiled_bytes_per_device")
START_METRICS = (
    "devices",
    "processes",
    "compile_s",
    "restore_s",
    "peak_tflops_per_device",
    "tflops_per_device_per_step",
    "resumed_from_step",
    *MEMORY_METRICS,
    "slices",
)
POSITION_METRIC = (
    "loss_by_position"  # + "/<bucket>": a step's loss per position bucket (jobs.spec.bucket_labels)
)
DISTANCE_METRIC = (
    "accuracy_by_distance"  # + "/<bucket>": recall, queries answered right by distance to the key
)
FINAL = ("step_time_median_s", "tokens_per_s", "tflops_per_s_per_device", "mfu")  # logged as final_<name>
SUMMARY_METRICS = (
    "final_loss",
    "steps_run",
    "attempt_from_step",
    "timed_from_step",
    "timed_to_step",
    *FINAL,
    "peak_bytes_in_use",
    *MEMORY_METRICS,
)
GIB = 2**30  # bytes per GiB, the unit of the memory metrics, plots and tables
# How people read a trial: "ring L=1024 context8" (the gate, the trial log); in aligned columns (the progress
# lines); as an MLflow run name, "ring-L1024-context8" (docs/reference/mlflow.md). A sweep over models adds the
# model: "ring L=1024 context8 tiny_gemma", "ring-L1024-context8-tiny_gemma".
LABELS = {"text": "{s} L={L} {m}", "column": "{s:<10} L={L:<9} {m}", "run": "{s}-L{L}-{m}"}
MODEL_SEP = {"text": " ", "column": " ", "run": "-"}


def trial_label(
    strategy: str, context_length: int | str, mesh: str, style: str = "text", model: str = ""
) -> str:
    """A trial's name for people, in one of the LABELS styles; `model` where the sweep has a model axis."""
    label = LABELS[style].format(s=strategy, L=context_length, m=mesh)
    return f"{label}{MODEL_SEP[style]}{model}" if model else label


def spec_label(spec: TrialSpec, style: str = "text") -> str:
    """trial_label of a trial, naming its model only where the sweep varies the model (so a one-model sweep's
    names stay what they always were)."""
    model = spec.model.name if "model" in dict(spec.axes) else ""
    return trial_label(spec.strategy.name, spec.context_length, spec.mesh.label(), style, model)


def trial_params(spec: TrialSpec) -> dict[str, str]:
    p = {
        "model": spec.model.name,
        "strategy": spec.strategy.name,
        "layout": spec.strategy.layout,
        "mesh": spec.mesh.label(),
        "cp": spec.mesh.cp,
        "cp_ring": spec.mesh.context,
        "cp_ulysses": spec.mesh.context_ulysses,
        "context_length": spec.context_length,
        "batch": spec.train.batch,
        "steps": spec.train.steps,
        "dtype": spec.train.dtype,
        "remat": spec.train.remat,
        "devices": spec.mesh.size,
        "cluster": spec.cluster.name,
    }
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


def record_points(r: Record, now: int, attempt: int = 1) -> list[Metric]:
    """One metric record as MLflow points: step records per step (at the job's own time, so a copy re-sent
    after a resume is the same point), start records per attempt, summary ones at step 0."""
    from mlflow.entities import Metric  # only a tracker that records gets here

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
    return [Metric(k, v, now, step) for k, v in ok.items() if v == v]


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
    """What the drivers saw of one trial: records per attempt and status lines (the trial log artifact)."""

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


log = logging.getLogger(__name__)
LOG_ARTIFACT = "trial_log.txt"  # the trial log: one JSON record per line, between "[time] status" lines


def parse_trial_log(text: str) -> list[Record]:
    """The records of a trial log, in the order its drivers saw them (status lines skipped)."""
    return parse_known(json.loads(ln) for ln in text.splitlines() if ln.startswith("{"))


def _log_text(client: Any, run_id: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        with open(client.download_artifacts(run_id, LOG_ARTIFACT, d)) as f:
            return f.read()


def stored_records(client: Any, run_id: str) -> list[Record]:
    """A trial's records from its child run's trial log; [] (logged) where the run has none or the store fails,
    since a plot must never cost a sweep its exit code."""
    try:
        return parse_trial_log(_log_text(client, run_id))
    except Exception as e:  # noqa: BLE001
        log.warning("run %s: its trial log could not be read back (%s: %s)", run_id, type(e).__name__, e)
        return []


def stored_log(client: Any, run_id: str) -> TrialLog:
    """What the store holds of a trial an earlier or another driver began: the trial log one of them wrote when
    it ended the trial, and the start and step records behind the metrics logged since (a driver killed
    mid-trial writes no log). A driver that takes the trial over goes on from this, so the log the trial ends
    with holds every driver's records."""
    logged = any(a.path == LOG_ARTIFACT for a in client.list_artifacts(run_id))
    text = _log_text(client, run_id) if logged else ""
    held = TrialLog(attempts=[parse_trial_log(text)], lines=text.splitlines())
    have = {r.step for r in held.records if isinstance(r, StepRecord)}
    rebuilt = records_from_metrics(client, run_id, starts=not logged)
    held.add([r for r in rebuilt if not (isinstance(r, StepRecord) and r.step in have)])
    return held


def _casts(cls: type) -> dict[str, type]:
    """Field -> int or float, for the numeric fields of a record (MLflow keeps every metric as a float)."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: int if hints[f.name] in (int, int | None) else float
        for f in fields(cls)
        if hints[f.name] in (int, float, int | None, float | None)
    }


def records_from_metrics(client: Any, run_id: str, starts: bool = True) -> list[Record]:
    """The start records (one per attempt, with `starts`) and step records a child run's metrics hold, in
    that order; only what MLflow keeps of them (the numbers, at the step or attempt they were logged at)."""
    names = client.get_run(run_id).data.metrics
    by_step: dict[int, dict[str, Metric]] = defaultdict(dict)
    buckets = (POSITION_METRIC + "/", DISTANCE_METRIC + "/")
    for k in [k for k in names if k in STEP_METRICS or k.startswith(buckets)]:
        for m in client.get_metric_history(run_id, k):
            by_step[m.step][k] = m
    by_attempt: dict[int, dict[str, float]] = defaultdict(dict)
    for k in [k for k in names if k in START_METRICS] if starts else []:
        for m in client.get_metric_history(run_id, k):
            if m.step > 0:  # step 0 is the summary's
                by_attempt[m.step][k] = m.value
    out: list[Record] = []
    cast = _casts(StartRecord)
    for _, values in sorted(by_attempt.items()):
        out.append(StartRecord(**{k: cast[k](v) for k, v in values.items()}))
    cast = _casts(StepRecord)
    for step, ms in sorted(by_step.items()):
        at: dict[str, dict[str, float]] = defaultdict(dict)  # loss_by_position -> bucket -> value, ...
        for k, m in ms.items():
            head, _, bucket = k.partition("/")
            if bucket:
                at[head][bucket] = m.value
        out.append(
            StepRecord(
                step=step,
                t_ms=min(m.timestamp for m in ms.values()),
                **{k: cast[k](m.value) for k, m in ms.items() if k in STEP_METRICS},
                loss_by_position=at.get(POSITION_METRIC),
                accuracy_by_distance=at.get(DISTANCE_METRIC),
            )
        )
    return out


# The MLflow names, spelled out so docs/reference/mlflow.md is checked against them (tests/test_reference.py).
MEASURED = {
    "matmul": "measured/matmul_s",
    "attention": "measured/attention_s",
    "all_gather": "measured/all_gather_s",
    "all_to_all": "measured/all_to_all_s",
    "collective_permute": "measured/collective_permute_s",
    "reduce_scatter": "measured/reduce_scatter_s",
    "all_reduce": "measured/all_reduce_s",
    "host_transfer": "measured/host_transfer_s",
    "other_compute": "measured/other_compute_s",
    "idle": "measured/idle_s",
    "step_s": "measured/step_s",
    "collective_exposed_s": "measured/collective_exposed_s",
    "collective_overlapped_s": "measured/collective_overlapped_s",
}
PREDICTED = {  # orchestrator/plan/steptime.py StepTime field -> metric
    "matmul_s": "predicted/matmul_s",
    "attention_s": "predicted/attention_s",
    "exposed_ring_s": "predicted/exposed_ring_s",
    "collectives_s": "predicted/collectives_s",
    "exposed_fsdp_s": "predicted/exposed_fsdp_s",
    "tensor_s": "predicted/tensor_s",
    "exposed_offload_s": "predicted/exposed_offload_s",
    "dcn_exposed_s": "predicted/dcn_exposed_s",
    "overhead_s": "predicted/overhead_s",
    "step_s": "predicted/step_s",
}


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


def log_profile(tracker: Any, key: str, p: ProfileRecord) -> None:
    """The files as artifacts; process 0's breakdown as metrics at the window's first step, its limiter."""
    for name, data in sorted(p.file_bytes().items()):
        tracker.log_bytes(key, data, f"profile/plugins/profile/{session(p)}/{name}")
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


def log_predicted(tracker: Any, key: str, terms: Any) -> None:
    """The planner's step-time terms for this trial (the plan's StepTime, orchestrator/plan/steptime.py) and
    its limiter, next to what a profile measures."""
    tracker.log_metrics(key, {m: getattr(terms, f) for f, m in PREDICTED.items()})
    tracker.set_tags(key, {"predicted_limiter": terms.limiter})
