"""Run a planned sweep: record every point in MLflow, launch the runnable ones on Ray, stream their metrics."""

from __future__ import annotations

import json
import logging
import time

from jobs.spec import TrialSpec
from orchestrator import cluster as clusters
from orchestrator import regress, report
from orchestrator.executor import execute
from orchestrator.outcomes import RetryBudgets
from orchestrator.progress import Progress
from orchestrator.schema import Options, SweepConfig
from orchestrator.tracker import open_tracker, recording

log = logging.getLogger(__name__)


def sweep_identity(options: Options) -> tuple[str, str]:
    """(sweep name, sweep id): "single" without a sweep; a fresh timestamped id unless the sweep fixes one."""
    sweep = options.sweep or SweepConfig()
    name = sweep.name or "single"
    return name, sweep.id or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(options: Options, specs: list[TrialSpec], rows: list) -> int:
    """Record every planned point, launch the runnable ones, and return the exit code. `options`: the driver's
    typed options (config.Loaded.options)."""
    name, sweep_id = sweep_identity(options)
    cluster = specs[0].cluster
    tracker = open_tracker(options.tracking)
    if tracker.use_journal(sweep_id):  # an earlier driver was killed: what it never delivered lands first
        tracker.flush(timeout=120)
    done = tracker.finished_trials(sweep_id)
    tracker.resume(sweep_id)  # steps an earlier driver of this sweep already logged are not logged twice
    tracker.start_sweep(name, sweep_id, cluster.name)
    grid = [{"spec": json.loads(s.to_json()), "plan": r.as_dict()} for s, r in zip(specs, rows, strict=True)]
    tracker.log_text("sweep", json.dumps(grid, indent=1), "grid.json")

    todo: list[TrialSpec] = []
    seen: set[str] = set()
    with Progress(options.progress) as progress:
        for spec, row in zip(specs, rows, strict=True):
            tid = spec.trial_id
            if tid in seen:
                continue
            seen.add(tid)
            label = f"{spec.strategy.name:<10} L={spec.context_length:<9} {spec.mesh.label()}"
            if tid in done:
                progress.add(tid, label, spec.train.steps, "skipped", "finished earlier in this sweep")
            elif row.verdict != "run":
                progress.add(tid, label, spec.train.steps, row.verdict, row.reason)
                tracker.start_trial(
                    spec, sweep_id, row.verdict, row.reason, row.predicted_hbm_bytes_per_device
                )
                tracker.end(tid, "FINISHED")
            else:
                progress.add(tid, label, spec.train.steps)
                tracker.start_trial(spec, sweep_id, predicted_bytes=row.predicted_hbm_bytes_per_device)
                if row.predicted_step_s is not None:  # next to the measured final_step_time_median_s
                    tracker.log_metrics(tid, {"predicted_step_time_s": row.predicted_step_s})
                todo.append(spec)
        tracker.flush(timeout=30)
        outcomes: dict[str, str] = {}
        if todo:
            clusters.connect(cluster)
            conc = clusters.concurrency(cluster)
            budgets = RetryBudgets(options.retries.preemption, options.retries.failure)
            outcomes = execute(todo, tracker, progress, conc, budgets, sweep_id)
    predicted = {s.trial_id: r.predicted_hbm_bytes_per_device for s, r in zip(specs, rows, strict=True)}
    step_s = {s.trial_id: r.predicted_step_s for s, r in zip(specs, rows, strict=True)}
    try:  # a plot must never cost a sweep its exit code
        finished = [s for s in todo if outcomes.get(s.trial_id) == "finished"]
        report.publish(tracker, finished, predicted, step_s)
    except Exception:
        log.exception("sweep report failed")
    failed = [t for t, o in outcomes.items() if o not in ("finished", "infeasible")]
    tracker.set_tags(
        "sweep", {"status": "failed" if failed else "finished", "trials_failed": str(len(failed))}
    )
    tracker.end("sweep", "FAILED" if failed else "FINISHED")
    delivered = tracker.flush(timeout=300)
    tracker.close_journal()  # removed when all was delivered; else a rerun of the sweep replays it
    if not delivered:
        log.error("tracking store unreachable: %d writes not delivered (journaled for a rerun of sweep %s)",
                  len(tracker.ops), sweep_id)  # fmt: skip
        return 1
    print(f"sweep {sweep_id}: {sum(o == 'finished' for o in outcomes.values())} finished, "
          f"{len(failed)} failed, {len(done)} skipped (already finished)")  # fmt: skip
    print(f"dashboard: {tracker.dashboard_hint()}")
    if not recording(options.tracking):  # tracking=none: no store holds a baseline for the gate
        return 1 if failed else 0
    return _gate(options, sweep_id, failed=bool(failed))


def _gate(options: Options, sweep_id: str, failed: bool) -> int:
    """Exit code: 1 when a trial failed, else 3 (regress.EXIT_REGRESSION) when the regression gate trips."""
    code = 0
    if options.gate.enabled:
        try:
            code = regress.gate(
                options.tracking.uri, options.tracking.experiment, sweep_id, options.gate.max_drop
            )
        except Exception:
            log.exception("regression gate could not read the tracking store")
            code = 1
    return 1 if failed else code
