"""Drive launched trials to a typed outcome: concurrency, retry budgets, record forwarding, Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import signal
import time
from collections import deque
from dataclasses import dataclass

from jobs.spec import TrialSpec
from orchestrator import scheduler as sched
from orchestrator.progress import Progress
from orchestrator.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budgets:
    preemption: int = 3
    failure: int = 1


def summary_metrics(summary: dict) -> dict[str, float]:
    """Per-strategy figures the parent run charts against context length."""
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


def with_checkpoint_dir(spec: TrialSpec, sweep_id: str) -> TrialSpec:
    """A per-trial checkpoint directory in the execution block (not the id), so a retry or a rerun of the
    sweep resumes where the last attempt saved. Only for trials that checkpoint at all."""
    if not sweep_id or spec.run.checkpoint_every <= 0:
        return spec
    root = spec.run.checkpoint_dir or os.path.join(os.getcwd(), ".cache", "checkpoints")
    path = f"{root.rstrip('/')}/{sweep_id}/{spec.trial_id}"
    return dataclasses.replace(spec, run=dataclasses.replace(spec.run, checkpoint_dir=path))


def placement_note(hosts: list[dict]) -> str:
    """Where an attempt runs, e.g. "fake-slice-0: 0=pid 123@10.0.0.2, 1=pid 456@10.0.0.3"."""
    hs = sorted(hosts, key=lambda h: h["process_id"])
    where = ", ".join(f"{h['process_id']}=pid {h['pid']}@{h['node_ip']}" for h in hs)
    slices = sorted({h["slice"] for h in hs if h["slice"]})
    return f"{'+'.join(slices)}: {where}" if slices else where


def execute(
    specs: list[TrialSpec],
    tracker: Tracker,
    progress: Progress,
    concurrency: int,
    budgets: Budgets,
    sweep_id: str = "",
) -> dict[str, str]:
    """Run trials (at most `concurrency` at once) with retries; returns trial_id -> final outcome.
    With a sweep id, trials that checkpoint get a per-trial checkpoint directory under it."""
    events: queue.Queue = queue.Queue()
    pending = deque(specs)
    running: dict[str, sched.Trial] = {}
    used = {s.trial_id: {"preempted": 0, "failed": 0} for s in specs}
    attempts = {s.trial_id: 0 for s in specs}
    outcomes: dict[str, str] = {}
    summaries: dict[str, dict] = {}
    by_id = {s.trial_id: s for s in specs}
    history: dict[str, list[dict]] = {s.trial_id: [] for s in specs}  # per attempt: where, when, how it ended
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
                history[spec.trial_id].append(
                    {"attempt": attempts[spec.trial_id], "submitted": time.time(), "hosts": []}
                )
                run_spec = with_checkpoint_dir(spec, sweep_id)
                running[spec.trial_id] = sched.Trial(run_spec, attempts[spec.trial_id], events)
            try:
                ev = events.get(timeout=0.5)
            except queue.Empty:
                tracker.flush()
                continue
            if ev.attempt != attempts.get(ev.trial_id):
                if ev.kind == "records":  # a late batch of an ended attempt: still data (steps dedup)
                    tracker.log_records(ev.trial_id, ev.records, ev.attempt)
                continue
            spec = by_id[ev.trial_id]
            att = history[ev.trial_id][-1]
            if ev.kind == "placed":
                att |= {"placed": time.time(), **ev.records[0]}
                progress.update(ev.trial_id, state="running", note=f"on {ev.records[0]['slice'] or 'local'}")
                continue
            if ev.kind == "host":
                att["hosts"] += ev.records
                if len(att["hosts"]) == spec.cluster.hosts:
                    progress.event(ev.trial_id, f"attempt {ev.attempt} on {placement_note(att['hosts'])}")
                continue
            if ev.kind == "records":
                att.setdefault("first_record", time.time())
                if "first_step" not in att and any(r["kind"] == "step" for r in ev.records):
                    att["first_step"] = time.time()
                tracker.log_records(ev.trial_id, ev.records, ev.attempt)
                for r in ev.records:
                    if r["kind"] == "step":
                        progress.update(ev.trial_id, state="running", step=r["step"] + 1, loss=r["loss"],
                                        tokens_per_s=r["tokens_per_s"])  # fmt: skip
                    elif r["kind"] == "summary":
                        summaries[ev.trial_id] = r
                    elif r["kind"] == "start":
                        progress.update(
                            ev.trial_id, state="running", note=f"compiled in {r['compile_s']:.1f} s"
                        )
                continue
            running.pop(ev.trial_id, None)
            att |= {"ended": time.time(), "outcome": ev.outcome, "error": ev.error[-1000:]}
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
            tracker.log_text(ev.trial_id, json.dumps(history[ev.trial_id], indent=1), "attempts.json")
            slices = sorted({h["slice"] for a in history[ev.trial_id] for h in a["hosts"] if h["slice"]})
            tracker.set_tags(
                ev.trial_id, {"attempts": str(attempts[ev.trial_id]), "slices": ",".join(slices)}
            )
            # the store hears first: a driver killed right after this line must not rerun a finished trial
            tracker.set_status(
                ev.trial_id,
                ev.outcome,
                ev.error,
                terminal="FINISHED" if ev.outcome == "finished" else "FAILED",
            )
            final = {"finished": "done"}.get(ev.outcome, ev.outcome)
            progress.update(ev.trial_id, state=final, note=ev.error[-120:] if ev.error else "")
            if ev.outcome == "finished" and ev.trial_id in summaries:
                for k, v in summary_metrics(summaries[ev.trial_id]).items():
                    tracker.log_metrics("sweep", {f"{k}/{spec.strategy.name}": v}, step=spec.context_length)
            tracker.flush()
    finally:
        signal.signal(signal.SIGINT, old)
        if interrupted:
            for trial in running.values():  # all at once: each waits for its slice to be freed
                trial.request_cancel()
            for tid, trial in running.items():
                trial.cancel()
                outcomes[tid] = "cancelled"
                tracker.set_status(tid, "cancelled", "interrupted by the user", terminal="KILLED")
                progress.update(tid, state="cancelled")
            for spec in pending:
                outcomes[spec.trial_id] = "cancelled"
                tracker.set_status(
                    spec.trial_id, "cancelled", "interrupted before it started", terminal="KILLED"
                )
                progress.update(spec.trial_id, state="cancelled")
            print(f"interrupted: {len(running)} running and {len(pending)} queued trials cancelled; "
                  f"placement groups still reserved: {sched.live_placement_groups()}", flush=True)  # fmt: skip
    return outcomes
