"""MLflow from the driver only: a parent run per sweep, a child run per trial (the run layout).

Every write is a small JSON-able op put on an ordered write-behind queue (orchestrator/tracking/queue.py), so
the driver never waits on the store, an outage delays writes but never loses them, and with a journal a
driver killed outright loses nothing either. Every op is idempotent (the store drops an identical metric
point; runs are found by their identity tags, orchestrator/tracking/runs.py), so one delivered twice is harmless."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import tempfile
import time
import uuid

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from jobs.records import Record, StepRecord
from jobs.spec import TrialSpec
from orchestrator.provenance import code_revision
from orchestrator.tracking.layout import (
    LOG_ARTIFACT,
    TrialLog,
    record_points,
    record_tags,
    stored_records,
    trial_params,
)
from orchestrator.tracking.leases import Leases
from orchestrator.tracking.queue import Op, WriteQueue
from orchestrator.tracking.runs import find_or_create

log = logging.getLogger(__name__)
# relative to the driver's working directory, like checkpoints
JOURNAL_DIR = os.path.join(".cache", "tracking")


class MlflowTracker:
    """The Tracker protocol (orchestrator/tracking/__init__.py) over an MLflow store."""

    def __init__(self, uri: str, experiment: str, artifact_location: str = ""):
        # Our queue retries; MLflow's own HTTP retries (minutes of backoff) would stall the queue instead.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = experiment
        self.artifact_location = artifact_location or None
        self.run_ids: dict[str, str] = {}  # key ("sweep" or a trial id) -> MLflow run id
        self.logs: dict[str, TrialLog] = {}
        # Per trial: steps whose record the store has (or is queued to get), and attempts an earlier driver ran.
        # A resumed attempt re-sends its checkpoint's records and re-runs the steps after it: each step is
        # logged once, the first time it arrives.
        self.steps: dict[str, set[int]] = {}
        self.prior_attempts: dict[str, int] = {}
        self.exp_id: str | None = None
        self.owner = (
            uuid.uuid4().hex
        )  # marks the run reservations this tracker made (orchestrator/tracking/runs.py)
        self.queue = WriteQueue(self._deliver)

    @property
    def ops(self) -> WriteQueue:
        """The undelivered writes (len() of it is what a caller reports)."""
        return self.queue

    def flush(self, timeout: float = 0.0) -> bool:
        """Wait up to `timeout` s for every queued write to reach the store. True when none is left."""
        return self.queue.flush(timeout)

    # --- the durable journal ------------------------------------------------------------------
    def journal_path(self, sweep_id: str) -> str:
        tag = hashlib.sha256(f"{self.uri} {self.experiment}".encode()).hexdigest()[:8]
        return os.path.join(JOURNAL_DIR, f"{sweep_id}-{tag}.jsonl")

    def use_journal(self, sweep_id: str) -> int:
        """Journal every write of this sweep (fsync'd before the caller goes on); first queue what a killed
        driver of the same sweep left undelivered. Returns how many writes are replayed."""
        # runs the earlier driver opened are found again (never reopened: one may be finished)
        redo = lambda op: {**op, "reopen": False} if op["kind"] == "open" else None
        n = self.queue.use_journal(self.journal_path(sweep_id), redo)
        if n:
            log.warning(
                "replaying %d tracking writes an earlier driver of sweep %s never delivered", n, sweep_id
            )
        return n

    def close_journal(self) -> None:
        self.queue.close_journal()

    # --- delivery (the writer thread) ---------------------------------------------------------
    def _deliver(self, ops: list[Op]) -> None:
        if ops[0]["kind"] == "metrics":  # a run of metric ops: one batch per run
            by_run: dict[str, list[Metric]] = {}
            for op in ops:
                by_run.setdefault(self.run_ids[op["key"]], []).extend(Metric(*p) for p in op["metrics"])
            for rid, ms in by_run.items():
                self.client.log_batch(rid, metrics=ms)
            return
        (op,) = ops
        if op["kind"] == "open":
            return self._open(op)
        rid = self.run_ids[op["key"]]
        if op["kind"] == "batch":
            params = [Param(k, v) for k, v in op.get("params", {}).items()]
            tags = [RunTag(k, v) for k, v in op.get("tags", {}).items()]
            self.client.log_batch(rid, params=params, tags=tags)
        elif op["kind"] == "run_status":
            self.client.update_run(rid, status=op["status"])
        elif op["kind"] == "text":
            self.client.log_text(rid, op["text"], op["path"])
        elif op["kind"] == "bytes":
            with tempfile.TemporaryDirectory() as d:
                local = os.path.join(d, os.path.basename(op["path"]))
                with open(local, "wb") as f:
                    f.write(base64.b64decode(op["data"]))
                self.client.log_artifact(rid, local, os.path.dirname(op["path"]) or None)
        elif op["kind"] == "end":
            self.client.set_terminated(rid, op["status"])
        else:
            raise ValueError(f"unknown tracking op {op['kind']!r}")

    def _open(self, op: Op) -> None:
        """Find the run with these identity tags (a resumed sweep, another driver's, or a create whose answer
        was lost), else create it (orchestrator/tracking/runs.py: one run when drivers race)."""
        tags = dict(op["tags"])
        if op.get("parent"):
            tags["mlflow.parentRunId"] = self.run_ids[op["parent"]]
        rid, found = self.run_ids.get(op["key"]), True
        if rid is None:
            anchor = (tags["mlflow.parentRunId"], op["key"]) if op.get("parent") else None
            args = (self.client, self._exp(), op["identity"], tags, op["name"], anchor, self.owner)
            rid, found = find_or_create(*args)
            self.run_ids[op["key"]] = rid
        if found and op.get("reopen", True):
            self.client.update_run(rid, status="RUNNING")

    # --- reads (direct; used before launch and after the sweep) ------------------------------
    def _exp(self) -> str:
        if self.exp_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                try:
                    self.client.create_experiment(self.experiment, self.artifact_location)
                except Exception:  # noqa: BLE001 - created meanwhile by another driver, or our lost answer
                    pass
                exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise ConnectionError(f"experiment {self.experiment!r} could not be created")
            self.exp_id = exp.experiment_id
        return self.exp_id

    def find_runs(self, filter_string: str, max_results: int = 5000, wait_s: float = 60.0) -> list:
        """Search this experiment; a store that is down is waited for up to `wait_s` before giving up."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return list(self.client.search_runs([self._exp()], filter_string, max_results=max_results))
            except Exception as e:
                if time.monotonic() >= deadline:
                    raise
                log.warning("tracking store unavailable (%s); waiting", type(e).__name__)
                time.sleep(1.0)

    def finished_trials(self, sweep_id: str) -> dict[str, str]:
        """trial_id -> run id of trials already finished in this sweep instance (for resume)."""
        runs = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.status = 'finished'")
        return {r.data.tags["trial_id"]: r.info.run_id for r in runs if "trial_id" in r.data.tags}

    def resume(self, sweep_id: str) -> None:
        """Before re-running a sweep: which steps (and attempts) its unfinished trials already have in the store."""
        for r in self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'"):
            tid = r.data.tags.get("trial_id")
            if tid and r.data.tags.get("status") not in ("finished", "infeasible", "invalid"):
                self.refresh(tid, r.info.run_id)

    def refresh(self, key: str, run_id: str | None = None) -> None:
        """Re-read what the store has of trial `key` (steps, attempts): before taking over another driver's."""
        rid = run_id or self.run_ids[key]
        self.steps[key] = {m.step for m in self.client.get_metric_history(rid, "loss")}
        attempts = self.client.get_metric_history(rid, "compile_s")
        self.prior_attempts[key] = max((m.step for m in attempts), default=0)

    def leases(self) -> Leases:
        """This driver's trial leases (orchestrator/tracking/leases.py); needs the parent run delivered (a flush)."""
        return Leases(self.client, self.run_ids)

    # --- writes -----------------------------------------------------------------------------
    def _put_open(
        self, key: str, identity: dict[str, str], tags: dict[str, str], name: str, parent: str = ""
    ):
        self.queue.put(
            {"kind": "open", "key": key, "identity": identity, "tags": tags, "name": name, "parent": parent}
        )

    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        """Open (or reopen, for a resumed sweep id) the parent run."""
        all_tags = {"sweep_name": name, "cluster": cluster, "code_revision": code_revision(), **(tags or {})}
        self._put_open("sweep", {"sweep_id": sweep_id, "kind": "sweep"}, all_tags, sweep_id)

    def open_trial(self, spec: TrialSpec, sweep_id: str) -> None:
        """Find or create the trial's child run, nothing more (its lease is claimed before it is described)."""
        identity = {"sweep_id": sweep_id, "trial_id": spec.trial_id}
        self._put_open(spec.trial_id, identity, {"kind": "trial"}, self._name(spec), "sweep")

    @staticmethod
    def _name(spec: TrialSpec) -> str:
        return f"{spec.strategy.name}-L{spec.context_length}-{spec.mesh.label()}"

    def start_trial(
        self,
        spec: TrialSpec,
        sweep_id: str,
        status: str = "queued",
        reason: str = "",
        predicted_bytes: int | None = None,
    ) -> None:
        """Open the trial's child run: grid axes as params, the resolved spec as an artifact."""
        key = spec.trial_id
        self.logs[key] = TrialLog(
            lines=[
                f"trial {key} {spec.strategy.name} L={spec.context_length} "
                f"mesh={spec.mesh.label()} cluster={spec.cluster.name}"
            ]
        )
        self.open_trial(spec, sweep_id)
        self.queue.put({"kind": "batch", "key": key, "params": trial_params(spec)})
        self.log_text(key, spec.to_json(), "trial_spec.json")
        self.set_status(key, status, reason)
        if predicted_bytes is not None:
            self.log_metrics(key, {"predicted_bytes_per_device": predicted_bytes})

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        """Status tag (queued, running, retrying, finished, failed, infeasible, invalid, cancelled) and why."""
        j = self.logs.setdefault(key, TrialLog())
        j.lines.append(f"[{time.strftime('%H:%M:%S')}] status {status}" + (f": {reason}" if reason else ""))
        if status == "retrying":
            j.attempts.append([])
        if terminal:  # the log lands before the status another driver acts on (it reads the log back)
            self.log_text(key, j.text(), LOG_ARTIFACT)
        self.set_tags(key, {"status": status, "reason": reason[:5000]})
        if status == "running":  # a resumed run may still say KILLED or FAILED from its last driver
            self.queue.put({"kind": "run_status", "key": key, "status": "RUNNING"})
        if terminal:
            self.end(key, terminal)

    def log_records(self, key: str, records: list[Record], attempt: int = 1) -> None:
        """Step records become step metrics (a step already logged is dropped); start records become
        per-attempt metrics, summary records summary metrics."""
        seen = self.steps.setdefault(key, set())
        fresh = [r for r in records if not isinstance(r, StepRecord) or r.step not in seen]
        seen.update(r.step for r in fresh if isinstance(r, StepRecord))
        attempt += self.prior_attempts.get(key, 0)
        self.logs.setdefault(key, TrialLog()).add(fresh)
        now = int(time.time() * 1000)
        points = [p for r in fresh for p in record_points(r, now, attempt)]
        if points:
            self.queue.put({"kind": "metrics", "key": key, "metrics": points})
        if tags := record_tags(fresh, attempt):
            self.set_tags(key, tags)

    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        points = [[k, float(v), now, int(step)] for k, v in values.items() if v == v]
        if points:
            self.queue.put({"kind": "metrics", "key": key, "metrics": points})

    def log_text(self, key: str, text: str, path: str) -> None:
        self.queue.put({"kind": "text", "key": key, "text": text, "path": path})

    def log_figure(self, key: str, fig, path: str) -> None:
        """Render now (the caller may close the figure), upload later."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        self.log_bytes(key, buf.getvalue(), path)

    def log_bytes(self, key: str, data: bytes, path: str) -> None:
        self.queue.put({"kind": "bytes", "key": key, "data": base64.b64encode(data).decode(), "path": path})

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        self.queue.put({"kind": "batch", "key": key, "tags": {k: str(v) for k, v in tags.items()}})

    def end(self, key: str, status: str = "FINISHED") -> None:
        self.queue.put({"kind": "end", "key": key, "status": status})

    def run_id(self, key: str) -> str | None:
        return self.run_ids.get(key)

    def records(self, key: str) -> list[Record]:
        """A trial's metric records as the driver logged them, every attempt in order (each step once)."""
        j = self.logs.get(key)
        return [r for attempt in j.attempts for r in attempt] if j else []

    def stored_records(self, run_id: str) -> list[Record]:
        """A finished trial's records as its child run's trial log holds them (another driver's, or earlier)."""
        return stored_records(self.client, run_id)

    def dashboard_hint(self) -> str:
        if self.uri.startswith(("http://", "https://")):
            return f"open {self.uri} (experiment {self.experiment!r})"
        return f"mlflow ui --backend-store-uri {self.uri}  # then open http://127.0.0.1:5000"


Tracker = MlflowTracker  # for callers that build the MLflow tracker directly (benchmarks/tracking.py, tests)
