"""Tier 1: the job's typed records (jobs/records.py) and how the driver reads them.

The dict form is the wire format of a Ray batch, of `python -m jobs.train` and of a checkpoint's step history,
so its keys and their order are pinned here; old dicts (a checkpoint written before a field existed) and newer
ones (a key this code does not know) both load.
"""

import dataclasses
import json
import math
import typing

import pytest
from test_report import fake_records, make_spec

from jobs.records import StartRecord, StepRecord, SummaryRecord, as_record, parse, parse_known
from orchestrator.config.schema import Retries
from orchestrator.launch import attempt, executor
from orchestrator.launch.attempt import Event
from orchestrator.tracking import NullTracker
from orchestrator.tracking.mlflow_names import START_METRICS, STEP_METRICS, SUMMARY_METRICS, record_points

MEM = {
    "argument_bytes": 10,
    "output_bytes": 20,
    "alias_bytes": 5,
    "temp_bytes": 100,
    "compiled_bytes_per_device": 125,
}
# The keys jobs/train.py writes, in its order (checkpoints and the standalone output hold these).
START = {
    "kind": "start",
    "trial_id": "abc",
    "devices": 8,
    "processes": 2,
    "platform": "cpu",
    "compile_s": 3.5,
    "restore_s": 0.0,
    "peak_tflops_per_device": 0.02,
    "peak_source": "cpu_measured_float32",
    "tflops_per_device_per_step": 0.001,
    "resumed_from_step": 0,
    **MEM,
    "slices": 2,
    "dcn_processes": [[0], [1]],
}
STEP = {
    "kind": "step",
    "step": 3,
    "t_ms": 1_700_000_000_000,
    "loss": 5.5,
    "grad_norm": 1.25,
    "step_time_s": 0.5,
    "tokens_per_s": 512.0,
    "tflops_per_s_per_device": 0.002,
    "mfu": 0.1,
    "runtime_peak_bytes": None,
}
SUMMARY = {
    "kind": "summary",
    "steps": 4,
    "final_loss": 5.0,
    "steps_run": 4,
    "attempt_from_step": 0,
    "timed_from_step": 1,
    "timed_to_step": 3,
    "step_time_median_s": 0.5,
    "tokens_per_s": 512.0,
    "tflops_per_s_per_device": 0.002,
    "mfu": 0.1,
    "runtime_peak_bytes": None,
    **MEM,
}


@pytest.mark.parametrize("d", [START, STEP, SUMMARY], ids=["start", "step", "summary"])
def test_the_dict_and_json_forms_round_trip_with_the_jobs_keys_in_order(d):
    rec = parse(d)
    assert rec.kind == d["kind"] and rec.extra == {}
    assert list(rec.to_dict().items()) == list(d.items())  # same keys, values and order
    assert rec.to_json() == json.dumps(d)
    assert type(rec).from_json(rec.to_json()) == rec and as_record(rec) is rec


def test_what_the_job_leaves_out_stays_out():
    bare = {k: v for k, v in START.items() if k not in (*MEM, "slices", "dcn_processes")}  # CPU, one slice
    assert parse(bare).to_dict() == bare and parse(bare).compiled_bytes_per_device is None
    assert StepRecord(step=0).to_dict()["runtime_peak_bytes"] is None  # a None the job writes is kept


def test_an_old_checkpoints_step_record_loads():
    old = {k: v for k, v in STEP.items() if k != "t_ms"}  # step records before they carried their own time
    rec = parse(old)
    assert rec.t_ms is None and rec.to_dict() == old
    assert record_points(rec, now=42)[0].timestamp == 42  # logged at the driver's time instead


def test_a_newer_jobs_keys_are_kept_and_a_newer_kind_is_skipped():
    newer = {**SUMMARY, "eval_loss": 4.9}
    rec = parse(newer)
    assert rec.extra == {"eval_loss": 4.9} and rec.to_dict() == newer
    with pytest.raises(ValueError, match="unknown record kind 'eval'"):
        parse({"kind": "eval", "loss": 1.0})
    assert parse_known([STEP, {"kind": "eval"}, rec]) == [parse(STEP), rec]


def test_a_sparse_record_reads_its_missing_fields_as_defaults():
    rec = parse({"kind": "summary", "mfu": 0.1})  # e.g. a hand-written record in a test or a notebook
    assert rec.mfu == 0.1 and math.isnan(rec.step_time_median_s) and rec.timed_from_step is None


def numeric_fields(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    numbers = (int, float, int | None, float | None)
    return {f.name for f in dataclasses.fields(cls) if hints[f.name] in numbers}


def test_every_numeric_field_of_a_record_is_an_mlflow_metric():
    assert numeric_fields(StepRecord) - {"step", "t_ms"} == set(STEP_METRICS)  # the step and time of a point
    assert numeric_fields(StartRecord) == set(START_METRICS)
    assert numeric_fields(SummaryRecord) - {"steps"} == set(SUMMARY_METRICS)


def generic_points(d: dict, now: int, attempt: int) -> dict[str, tuple[float, int, int]]:
    """The points the driver logged from a record's dict: every number of it (steps: the STEP_METRICS)."""
    if d["kind"] == "step":
        vals, step, now = {m: d.get(m) for m in STEP_METRICS}, d["step"], d["t_ms"]
    elif d["kind"] == "start":
        vals, step = d, attempt
    else:
        fin = ("step_time_median_s", "tokens_per_s", "tflops_per_s_per_device", "mfu")
        vals = {("final_" + k if k in fin else k): v for k, v in d.items() if k != "steps"}
        vals["memory_bytes_per_device"] = d.get("program_peak_bytes") or d["compiled_bytes_per_device"]
        step = 0
    nums = {k: v for k, v in vals.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return {k: (float(v), now, step) for k, v in nums.items() if v == v}


@pytest.mark.parametrize("d", [START, STEP, SUMMARY], ids=["start", "step", "summary"])
def test_a_typed_record_logs_the_points_its_dict_did(d):
    got = {m.key: (m.value, m.timestamp, m.step) for m in record_points(parse(d), now=7, attempt=2)}
    assert got == generic_points(d, 7, 2)


class Recorder(NullTracker):
    def __init__(self):
        self.logged: list = []

    def log_records(self, key, records, attempt=1):
        self.logged.append((key, records, attempt))


class Quiet:
    def __init__(self):
        self.updates: list[dict] = []

    def update(self, key, **kw):
        self.updates.append(kw)


def test_the_executor_gets_a_batch_typed_once_at_the_seam():
    spec = make_spec("ring", 512, steps=2)
    tracker, progress = Recorder(), Quiet()
    ex = executor.Executor([spec], tracker, progress, 1, Retries(), "")
    batch = parse_known([*fake_records(spec), {"kind": "eval", "loss": 1.0}])  # a newer job's kind: skipped
    ex._on_records(Event(spec.trial_id, 1, "records", records=batch), spec, {})
    ((_, logged, _),) = tracker.logged
    assert [type(r) for r in logged] == [StartRecord, StepRecord, StepRecord, SummaryRecord]
    assert ex.summaries[spec.trial_id] == logged[-1]
    assert progress.updates[0]["note"] == "compiled in 3.0 s" and progress.updates[-1]["step"] == 2
    metrics = executor.summary_metrics(logged[-1])
    assert metrics["step_time_s"] == 0.5 and metrics["memory_gib"] == 2**26 / 2**30


def test_retry_budgets_have_one_declaration():
    """The config's Retries is the budget the executor spends: no second declaration to keep equal."""
    assert not hasattr(executor, "Budgets") and not hasattr(attempt, "RetryBudgets")
    budgets = Retries(preemption=2, failure=0)
    assert [attempt.budget(budgets, o) for o in attempt.Outcome] == [0, 2, 0, 0, 0]


def test_record_tags_say_what_the_summary_covers_and_why_a_kernel_fell_back():
    from orchestrator.tracking.mlflow_names import record_tags

    why = "float32 inputs (cuDNN flash is bf16/fp16 only)"
    start = parse({**START, "kernel_fallbacks": [why]})
    assert StartRecord.from_json(start.to_json()).kernel_fallbacks == [why]
    tags = record_tags([start, parse(STEP), parse(SUMMARY)], attempt=2)
    assert tags == {"summary_covers": "steps 1-3 of attempt 2", "kernel_fallback": why}
    assert record_tags([parse(START), parse(STEP)], attempt=1) == {}  # nothing fell back, no summary yet
