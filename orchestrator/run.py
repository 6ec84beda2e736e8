"""Run a planned sweep: record every point in MLflow, launch the runnable ones on Ray, stream their metrics."""

from __future__ import annotations

import json
import logging
import queue
import signal
import time
from collections import deque
from dataclasses import dataclass

from omegaconf import DictConfig

from jobs.spec import TrialSpec
from orchestrator import scheduler as sched
from orchestrator.progress import Progress
from orchestrator.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budgets:
    preemption: int = 3
    failure: int = 1


def sweep_identity(cfg: DictConfig) -> tuple[str, str]:
    sweep = cfg.get("sweep") or {}
    name = sweep.get("name") or "single"
    sid = sweep.get("id") or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return name, str(sid)


def summary_metrics(spec: TrialSpec, summary: dict, row) -> dict[str, float]:
    out = {
        "mfu": summary.get("mfu", float("nan")),
        "tokens_per_s": summary.get("tokens_per_s", float("nan")),
        "step_time_s": summary.get("step_time_median_s", float("nan")),
        "tflops_per_s_per_device": summary.get("tflops_per_s_per_device", float("nan")),
    }
    mem = summary.get("peak_bytes_in_use") or summary.get("compiled_bytes_per_device")
    if mem:
        out["memory_gib"] = mem / 2**30
    return out


def execute(
    specs: list[TrialSpec], tracker: Tracker, progress: Progress, concurrency: int, budgets: Budgets
) -> dict[str, str]:
    """Run trials (at most `concurrency` at once) with retries; returns trial_id -> final outcome."""
    events: queue.Queue = queue.Queue()
    pending = deque(specs)
    running: dict[str, sched.Trial] = {}
    used = {s.trial_id: {"preempted": 0, "failed": 0} for s in specs}
    attempts = {s.trial_id: 0 for s in specs}
    outcomes: dict[str, str] = {}
    summaries: dict[str, dict] = {}
    by_id = {s.trial_id: s for s in specs}
    interrupted = False

    def on_sigint(*_):
        nonlocal interrupted
        interrupted = True

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        while (pending or running) and not interrupted:
            while pending and len(running) < concurrency:
                spec = pending.popleft()
                attempts[spec.trial_id] += 1
                progress.update(spec.trial_id, state="starting")
                tracker.set_status(spec.trial_id, "running")
                running[spec.trial_id] = sched.Trial(spec, attempts[spec.trial_id], events)
            try:
                ev = events.get(timeout=0.5)
            except queue.Empty:
                tracker.flush()
                continue
            if ev.attempt != attempts.get(ev.trial_id):
                continue  # a stale attempt's leftovers
            spec = by_id[ev.trial_id]
            if ev.kind == "records":
                tracker.log_records(ev.trial_id, ev.records)
                for r in ev.records:
                    if r["kind"] == "step":
                        progress.update(ev.trial_id, state="running", step=r["step"] + 1, loss=r["loss"],
                                        tokens_per_s=r["tokens_per_s"])  # fmt: skip
                    elif r["kind"] == "summary":
                        summaries[ev.trial_id] = r
                    elif r["kind"] == "start":
                        progress.update(ev.trial_id, state="running", note=f"compiled in {r['compile_s']:.1f} s")
                continue
            running.pop(ev.trial_id, None)
            budget_key = {"preempted": "preempted", "failed": "failed"}.get(ev.outcome)
            limit = {"preempted": budgets.preemption, "failed": budgets.failure}.get(ev.outcome, 0)
            if budget_key and used[ev.trial_id][budget_key] < limit:
                used[ev.trial_id][budget_key] += 1
                n = sum(used[ev.trial_id].values())
                log.warning("trial %s %s (%s); retry %d", ev.trial_id, ev.outcome, ev.error[-300:], n)
                progress.update(ev.trial_id, state="queued", retries=n, note=f"{ev.outcome}: retrying")
                tracker.set_status(ev.trial_id, "retrying", f"{ev.outcome}: {ev.error[-500:]}")
                pending.append(spec)
                continue
            outcomes[ev.trial_id] = ev.outcome
            final = {"finished": "done"}.get(ev.outcome, ev.outcome)
            progress.update(ev.trial_id, state=final, note=ev.error[-120:] if ev.error else "")
            tracker.set_status(ev.trial_id, ev.outcome, ev.error, terminal="FINISHED" if ev.outcome == "finished" else "FAILED")
            if ev.outcome == "finished" and ev.trial_id in summaries:
                for k, v in summary_metrics(spec, summaries[ev.trial_id], None).items():
                    tracker.log_metrics("sweep", {f"{k}/{spec.strategy.name}": v}, step=spec.context_length)
            tracker.flush()
    finally:
        signal.signal(signal.SIGINT, old)
        if interrupted:
            for tid, trial in running.items():
                trial.cancel()
                outcomes[tid] = "cancelled"
                tracker.set_status(tid, "cancelled", "interrupted by the user", terminal="KILLED")
    return outcomes


def run(cfg: DictConfig, specs: list[TrialSpec], rows: list) -> int:
    """Record every planned point, launch the runnable ones, and return the exit code."""
    name, sweep_id = sweep_identity(cfg)
    cluster = specs[0].cluster
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.get("artifact_location", ""))
    done = tracker.finished_trials(sweep_id)
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
                tracker.start_trial(spec, sweep_id, row.verdict, row.reason)
                tracker.end(tid, "FINISHED")
            else:
                progress.add(tid, label, spec.train.steps)
                tracker.start_trial(spec, sweep_id)
                todo.append(spec)
        tracker.flush(timeout=30)
        outcomes: dict[str, str] = {}
        if todo:
            sched.connect(cluster)
            conc = cluster.concurrency or cluster.slices
            b = cfg.get("retries") or {}
            outcomes = execute(todo, tracker, progress, conc, Budgets(b.get("preemption", 3), b.get("failure", 1)))
    failed = [t for t, o in outcomes.items() if o not in ("finished", "infeasible")]
    tracker.set_tags("sweep", {"status": "failed" if failed else "finished", "trials_failed": str(len(failed))})
    tracker.end("sweep", "FAILED" if failed else "FINISHED")
    if not tracker.flush(timeout=300):
        log.error("tracking store unreachable: %d writes not delivered", len(tracker.ops))
        return 1
    print(f"sweep {sweep_id}: {sum(o == 'finished' for o in outcomes.values())} finished, "
          f"{len(failed)} failed, {len(done)} skipped (already finished)")  # fmt: skip
    print(f"dashboard: {tracker.dashboard_hint()}")
    return 1 if failed else 0
