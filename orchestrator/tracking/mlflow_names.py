"""Every MLflow name a trial becomes: its label and run name, its params, and its records as metric points
and tags (a step, start or summary record); the `measured/*` and `predicted/*` names of its step breakdown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.records import Record, StartRecord, StepRecord, SummaryRecord
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
    "runtime_peak_bytes",
    "runtime_bytes_in_use",
)
MEMORY_METRICS = (
    "argument_bytes",
    "output_bytes",
    "alias_bytes",
    "temp_bytes",
    "compiled_bytes_per_device",
    "program_peak_bytes",
)
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
    "runtime_peak_bytes",
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
    """A trial's memory per device: the program's own peak where the compiler gives it (TPU), else its
    argument + output - alias + temp (CPU). Never the runtime's counter, which on TPU misses the temporaries."""
    return summary.program_peak_bytes or summary.compiled_bytes_per_device


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


# The MLflow names, spelled out so docs/reference/mlflow.md is checked against them (tests/test_reference_pages.py).
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
