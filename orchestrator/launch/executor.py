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

from jobs.records import Record, StartRecord, StepRecord, SummaryRecord
from jobs.spec import TrialSpec
from orchestrator.config.schema import Retries
from orchestrator.launch.attempt import (
    Attempt,
    Event,
    Outcome,
    Spare,
    budget,
    live_placement_groups,
    starts_ahead,
    stop,
)
from orchestrator.tracking import Tracker, profiles
from orchestrator.tracking.mlflow_names import GIB, memory_bytes
from orchestrator.ui.progress import SweepProgress

log = logging.getLogger(__name__)


def summary_metrics(summary: SummaryRecord) -> dict[str, float]:
    """Per-strategy figures the parent run charts against context length."""
    out = {
        "mfu": summary.mfu,
        "tokens_per_s": summary.tokens_per_s,
        "step_time_s": summary.step_time_median_s,
        "tflops_per_s_per_device": summary.tflops_per_s_per_device,
    }
    if mem := memory_bytes(summary):
        out["memory_gib"] = mem / GIB
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


class Executor:
    """The event loop of a sweep: each Attempt reports on one queue (placed, host, records, outcome), and one
    small handler per event kind updates progress, tracking and the retry state."""

    def __init__(
        self,
        specs: list[TrialSpec],
        tracker: Tracker,
        progress: SweepProgress,
        concurrency: int,
        retries: Retries,
        sweep_id: str,
    ):
        self.tracker, self.progress, self.concurrency, self.retries = tracker, progress, concurrency, retries
        self.sweep_id = sweep_id
        self.events: queue.Queue = queue.Queue()
        self.pending = deque(specs)
        self.running: dict[str, Attempt] = {}
        self.by_id = {s.trial_id: s for s in specs}
        self.used = {s.trial_id: {Outcome.PREEMPTED: 0, Outcome.FAILED: 0} for s in specs}
        self.attempts = {s.trial_id: 0 for s in specs}
        self.outcomes: dict[str, str] = {}
        self.summaries: dict[str, SummaryRecord] = {}
        self.history: dict[str, list[dict]] = {s.trial_id: [] for s in specs}  # per attempt: where, when, end
        self.interrupted = False
        self.spare = None  # a process started for the next trial while these run (attempt.Spare)

    def run(self) -> dict[str, str]:
        old = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            while (self.pending or self.running) and not self.interrupted:
                self._launch_ready()
                try:
                    ev = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if ev.attempt != self.attempts.get(ev.trial_id):
                    if ev.kind == "records":  # a late batch of an ended attempt: still data (steps dedup)
                        self._log(ev.trial_id, ev.records, ev.attempt)
                    continue
                getattr(self, f"_on_{ev.kind}")(ev, self.by_id[ev.trial_id], self.history[ev.trial_id][-1])
        finally:
            signal.signal(signal.SIGINT, old)
            if self.interrupted:
                self._cancel_all()
            if self.spare is not None:
                stop(self.spare)
        return self.outcomes

    def _on_sigint(self, *_) -> None:
        self.interrupted = True

    def _launch_ready(self) -> None:
        while self.pending and len(self.running) < self.concurrency:
            spec = self.pending.popleft()
            tid = spec.trial_id
            self.attempts[tid] += 1
            self.progress.update(tid, state="starting")
            self.tracker.set_status(tid, "running")
            self.history[tid].append({"attempt": self.attempts[tid], "submitted": time.time(), "hosts": []})
            run_spec = with_checkpoint_dir(spec, self.sweep_id)
            spare, self.spare = (self.spare, None) if starts_ahead(spec.cluster) else (None, self.spare)
            self.running[tid] = Attempt(run_spec, self.attempts[tid], self.events, spare)
        if self.pending and self.spare is None and starts_ahead(self.pending[0].cluster):
            self.spare = Spare.remote()  # its process starts now, while the running trials run

    def _on_placed(self, ev: Event, spec: TrialSpec, att: dict) -> None:
        att |= {"placed": time.time(), **ev.info[0]}
        self.progress.update(ev.trial_id, state="running", note=f"on {ev.info[0]['slice'] or 'local'}")

    def _on_host(self, ev: Event, spec: TrialSpec, att: dict) -> None:
        att["hosts"] += ev.info
        if len(att["hosts"]) == spec.cluster.hosts_per_trial:  # every host of every slice
            self.progress.event(ev.trial_id, f"attempt {ev.attempt} on {placement_note(att['hosts'])}")
            # the first record comes after XLA's compile of the step: say what the wait is
            self.progress.update(ev.trial_id, note="compiling the train step")

    def _on_records(self, ev: Event, spec: TrialSpec, att: dict) -> None:
        records = ev.records
        att.setdefault("first_record", time.time())
        first = next((r for r in records if isinstance(r, StepRecord)), None)
        if "first_step" not in att and first is not None:
            att["first_step"] = time.time()  # when the driver had it
            if first.t_ms:  # when the job finished it: the stream's round trip is the difference
                att["first_step_in_job"] = first.t_ms / 1000
        self._log(ev.trial_id, records, ev.attempt)
        for r in records:
            if isinstance(r, StepRecord):
                self.progress.update(
                    ev.trial_id, state="running", step=r.step + 1, loss=r.loss, tokens_per_s=r.tokens_per_s
                )
            elif isinstance(r, SummaryRecord):
                self.summaries[ev.trial_id] = r
            elif isinstance(r, StartRecord):
                self.progress.update(ev.trial_id, state="running", note=f"compiled in {r.compile_s:.1f} s")

    def _log(self, tid: str, records: list[Record], attempt: int) -> None:
        """Metric records to the tracker; a profile's files and breakdown to the run (orchestrator/tracking/profiles.py)."""
        records, traces = profiles.split(records)
        # the breakdown without its files joins the trial's records: the log and the end-of-sweep plots read it
        kept = [dataclasses.replace(p, files={}) for p in traces if p.process == 0 and p.seconds]
        self.tracker.log_records(tid, records + kept, attempt)
        for p in traces:
            profiles.log_profile(self.tracker, tid, p)
            where = f"steps {p.first_step}-{p.last_step}, process {p.process}"
            self.progress.event(tid, f"profiled {where}: {p.limiter or p.note or 'no breakdown'}")

    def _on_outcome(self, ev: Event, spec: TrialSpec, att: dict) -> None:
        tid, outcome = ev.trial_id, Outcome(ev.outcome)
        self.running.pop(tid, None)
        att |= {"ended": time.time(), "outcome": outcome.value, "error": ev.error[-1000:]}
        if outcome in self.used[tid] and self.used[tid][outcome] < budget(self.retries, outcome):
            self._retry(spec, outcome, ev.error)
        else:
            self._finish(spec, outcome, ev.error)

    def _retry(self, spec: TrialSpec, outcome: Outcome, error: str) -> None:
        tid = spec.trial_id
        self.used[tid][outcome] += 1
        n = sum(self.used[tid].values())
        log.warning("trial %s %s (%s); retry %d", tid, outcome.value, error[-300:], n)
        self.progress.update(tid, state="queued", retries=n, note=f"{outcome.value}: retrying")
        self.tracker.set_status(tid, "retrying", f"{outcome.value}: {error[-500:]}")
        self.pending.append(spec)

    def _finish(self, spec: TrialSpec, outcome: Outcome, error: str) -> None:
        tid, t = spec.trial_id, self.tracker
        self.outcomes[tid] = outcome.value
        t.log_artifact(tid, json.dumps(self.history[tid], indent=1), "attempts.json")
        slices = sorted({h["slice"] for a in self.history[tid] for h in a["hosts"] if h["slice"]})
        t.set_tags(tid, {"attempts": str(self.attempts[tid]), "slices": ",".join(slices)})
        # the store hears first: a driver killed right after this line must not rerun a finished trial
        terminal = "FINISHED" if outcome == Outcome.FINISHED else "FAILED"
        t.set_status(tid, outcome.value, error, terminal=terminal)
        final = "done" if outcome == Outcome.FINISHED else outcome.value
        self.progress.update(tid, state=final, note=error[-120:] if error else "")
        if outcome == Outcome.FINISHED and tid in self.summaries:
            for k, v in summary_metrics(self.summaries[tid]).items():
                t.log_metrics("sweep", {f"{k}/{spec.strategy.name}": v}, step=spec.context_length)

    def _cancel_all(self) -> None:
        for attempt in self.running.values():  # all at once: each waits for its slice to be freed
            attempt.request_cancel()
        for tid, attempt in self.running.items():
            attempt.cancel()
            self.outcomes[tid] = Outcome.CANCELLED.value
            self.tracker.set_status(tid, "cancelled", "interrupted by the user", terminal="KILLED")
            self.progress.update(tid, state="cancelled")
        for spec in self.pending:
            self.outcomes[spec.trial_id] = Outcome.CANCELLED.value
            self.tracker.set_status(
                spec.trial_id, "cancelled", "interrupted before it started", terminal="KILLED"
            )
            self.progress.update(spec.trial_id, state="cancelled")
        print(
            f"interrupted: {len(self.running)} running and {len(self.pending)} queued trials cancelled; "
            f"placement groups still reserved: {live_placement_groups()}",
            flush=True,
        )


def execute(
    specs: list[TrialSpec],
    tracker: Tracker,
    progress: SweepProgress,
    concurrency: int,
    retries: Retries,
    sweep_id: str = "",
) -> dict[str, str]:
    """Run trials (at most `concurrency` at once) with retries (`retries`: the budget per kind of outcome);
    returns trial_id -> final outcome. With a sweep id, trials that checkpoint get a per-trial checkpoint
    directory under it."""
    return Executor(specs, tracker, progress, concurrency, retries, sweep_id).run()
