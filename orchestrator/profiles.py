"""A trial's profiles on its MLflow run: the trace files under `profile/`, the measured breakdown as `measured/*`
metrics beside the planner's `predicted/*` terms, and each side's limiter as a tag.

The files keep the layout jax.profiler wrote (`plugins/profile/<session>/`), one session per traced window and
process, so the downloaded `profile/` folder is a log directory TensorBoard's profile plugin or xprof opens.
"""

from __future__ import annotations

from jobs.records import ProfileRecord, Record
from jobs.spec import TrialSpec
from orchestrator.plan import steptime

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
    values = {**p.seconds, "step_s": p.step_s, "collective_exposed_s": p.collective_exposed_s,
              "collective_overlapped_s": p.collective_overlapped_s}  # fmt: skip
    return {MEASURED[k]: v for k, v in values.items() if k in MEASURED}


def log_profile(tracker, key: str, p: ProfileRecord) -> None:
    """The files as artifacts; process 0's breakdown as metrics at the window's first step, its limiter."""
    for name, data in sorted(p.file_bytes().items()):
        tracker.log_bytes(key, data, f"profile/plugins/profile/{session(p)}/{name}")
    if p.process == 0 and p.seconds:  # one host's view: every host runs the same program
        tracker.log_metrics(key, metrics(p), step=p.first_step)
        tracker.set_tags(key, {"measured_limiter": p.limiter})


def log_predicted(tracker, spec: TrialSpec) -> None:
    """The planner's step-time terms for this trial, and its limiter, next to what a profile measures."""
    st = steptime.step_time(spec)  # what the plan computed (its peak is cached): no device, no compile
    tracker.log_metrics(spec.trial_id, {m: getattr(st, f) for f, m in PREDICTED.items()})
    tracker.set_tags(spec.trial_id, {"predicted_limiter": st.limiter})
