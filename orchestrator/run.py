"""Run a planned sweep: record every point in MLflow, launch the runnable ones on Ray, stream their metrics."""

from __future__ import annotations

import json
import logging
import time

from omegaconf import DictConfig

from jobs.spec import TrialSpec
from orchestrator import cluster as clusters
from orchestrator import regress, report
from orchestrator.executor import Budgets, execute
from orchestrator.progress import Progress
from orchestrator.tracking import Tracker

log = logging.getLogger(__name__)


def sweep_identity(cfg: DictConfig) -> tuple[str, str]:
    sweep = cfg.get("sweep") or {}
    name = sweep.get("name") or "single"
    sid = sweep.get("id") or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return name, str(sid)


def run(cfg: DictConfig, specs: list[TrialSpec], rows: list) -> int:
    """Record every planned point, launch the runnable ones, and return the exit code."""
    name, sweep_id = sweep_identity(cfg)
    cluster = specs[0].cluster
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.get("artifact_location", ""))
    if tracker.use_journal(sweep_id):  # an earlier driver was killed: what it never delivered lands first
        tracker.flush(timeout=120)
    done = tracker.finished_trials(sweep_id)
    tracker.resume(sweep_id)  # steps an earlier driver of this sweep already logged are not logged twice
    tracker.start_sweep(name, sweep_id, cluster.name)
    grid = [{"spec": json.loads(s.to_json()), "plan": r.as_dict()} for s, r in zip(specs, rows, strict=True)]
    tracker.log_text("sweep", json.dumps(grid, indent=1), "grid.json")

    todo: list[TrialSpec] = []
    seen: set[str] = set()
    with Progress(cfg.get("progress", "auto")) as progress:
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
            b = cfg.get("retries") or {}
            outcomes = execute(
                todo, tracker, progress, conc, Budgets(b.get("preemption", 3), b.get("failure", 1)), sweep_id
            )
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
    return _gate(cfg, sweep_id, failed=bool(failed))


def _gate(cfg: DictConfig, sweep_id: str, failed: bool) -> int:
    """Exit code: 1 when a trial failed, else 3 (regress.EXIT_REGRESSION) when the regression gate trips."""
    g = cfg.get("gate") or {}
    code = 0
    if g.get("enabled", False):
        try:
            code = regress.gate(
                cfg.tracking.uri, cfg.tracking.experiment, sweep_id, float(g.get("max_drop", 0.10))
            )
        except Exception:
            log.exception("regression gate could not read the tracking store")
            code = 1
    return 1 if failed else code
