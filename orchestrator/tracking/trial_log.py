"""A trial's log: the records its drivers saw, attempt by attempt, between status lines; the child run's
`trial_log.txt`, and read back from the store (so a sweep's plots cover what an earlier or another driver
finished, and a trial taken over goes on with every driver's records)."""

from __future__ import annotations

import json
import logging
import tempfile
import typing
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from jobs.records import Record, StartRecord, StepRecord, parse_known
from orchestrator.tracking.mlflow_names import DISTANCE_METRIC, POSITION_METRIC, START_METRICS, STEP_METRICS

if TYPE_CHECKING:
    from mlflow.entities import Metric

log = logging.getLogger(__name__)
LOG_ARTIFACT = "trial_log.txt"  # the trial log: one JSON record per line, between "[time] status" lines


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
