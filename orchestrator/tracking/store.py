"""MLflow from the driver only: a parent run per sweep, a child run per trial (the run layout), on one client.

A run is opened once, synchronously (it is rare: one per trial, before the trial runs), so its id is known to
every later write and read. Everything a sweep writes after that (metrics, params, tags, artifacts, statuses)
goes on an ordered write-behind queue (orchestrator/tracking/queue.py): the driver never waits on the store, an
outage delays writes but never loses them, and with a journal a driver killed outright loses nothing either.
Reads and leases are synchronous on the same client. Every write is idempotent (the store drops an identical
metric point; runs are found by their identity tags, orchestrator/tracking/runs.py), so one delivered twice is
harmless.

MLflow itself retries each request to a tracking server a few times (a lost answer, a 5xx while the server's
database restarts); a store away for longer is waited for by the writer thread (until it is back) and by the
synchronous calls (up to STORE_WAIT_S).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Metric
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from jobs.records import Record, StepRecord
from jobs.spec import TrialSpec
from orchestrator.provenance import code_revision
from orchestrator.tracking.layout import (
    LOG_ARTIFACT,
    TrialLog,
    record_points,
    record_tags,
    spec_label,
    stored_log,
    stored_records,
    trial_params,
)
from orchestrator.tracking.leases import Leases
from orchestrator.tracking.queue import Write, WriteQueue, transient
from orchestrator.tracking.runs import find_or_create

log = logging.getLogger(__name__)
T = TypeVar("T")
# relative to the driver's working directory, like checkpoints
JOURNAL_DIR = os.path.join(".cache", "tracking")
# MLflow's own retries of one request: a few seconds (its default backs off for minutes, which would hide an
# outage from the writer thread and hold a read far past STORE_WAIT_S).
HTTP_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
STORE_WAIT_S = 60.0  # how long a synchronous call waits for a store that does not answer


# MLflow 3's UI picks GenAI or training per browser: the URL's workflowType first, then what the browser's
# sidebar switch stored, else GenAI. The experiment tag mlflow.experimentKind does not change it (3.17).
TRAINING_VIEW = "workflowType=machine_learning"


def _waiting(state) -> None:
    e = state.outcome.exception()
    log.warning("tracking store unavailable (%s: %s); waiting", type(e).__name__, str(e)[:200])


class MlflowTracker:
    """The Tracker protocol (orchestrator/tracking/__init__.py) over an MLflow store."""

    def __init__(self, uri: str, experiment: str, artifact_location: str = ""):
        for k, v in HTTP_RETRIES.items():
            os.environ.setdefault(k, v)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = experiment
        self.artifact_location = artifact_location or None
        self.run_ids: dict[str, str] = {}  # key ("sweep" or a trial id) -> MLflow run id
        self.started: dict[str, int] = {}  # key -> its run's MLflow start time, ms (the regression gate's)
        self.logs: dict[str, TrialLog] = {}
        # Per trial: steps whose record the store has (or is queued to get), and attempts an earlier driver ran.
        # A resumed attempt re-sends its checkpoint's records and re-runs the steps after it: each step is
        # logged once, the first time it arrives.
        self.steps: dict[str, set[int]] = {}
        self.prior_attempts: dict[str, int] = {}
        self.exp_id: str | None = None
        self.owner = uuid.uuid4().hex  # marks the run reservations this tracker made (tracking/runs.py)
        self.queue = WriteQueue(self.client)

    @property
    def ops(self) -> WriteQueue:
        """The undelivered writes (len() of it is what a caller reports)."""
        return self.queue

    def flush(self, timeout: float = 0.0) -> bool:
        """Wait up to `timeout` s for every queued write to reach the store. True when none is left."""
        return self.queue.flush(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) against the store (a read, a run's creation), waiting up to STORE_WAIT_S for a store that
        does not answer."""
        wait = wait_exponential(multiplier=0.5, max=4.0)
        retrying = Retrying(
            retry=retry_if_exception(transient),
            stop=stop_after_delay(STORE_WAIT_S),
            wait=wait,
            before_sleep=_waiting,
            reraise=True,
        )
        return retrying(fn, *args)

    # --- the durable journal ------------------------------------------------------------------
    def journal_path(self, sweep_id: str) -> str:
        tag = hashlib.sha256(f"{self.uri} {self.experiment}".encode()).hexdigest()[:8]
        return os.path.join(JOURNAL_DIR, f"{sweep_id}-{tag}.jsonl")

    def use_journal(self, sweep_id: str) -> int:
        """Journal every write of this sweep (fsync'd before the caller goes on); first queue what a killed
        driver of the same sweep left undelivered. Returns how many writes are replayed."""
        n = self.queue.use_journal(self.journal_path(sweep_id))
        if n:
            log.warning(
                "replaying %d tracking writes an earlier driver of sweep %s never delivered", n, sweep_id
            )
        return n

    def close_journal(self) -> None:
        self.queue.close_journal()

    # --- runs: found or created once, synchronously -------------------------------------------
    def experiment_id(self) -> str:
        if self.exp_id is None:
            self.exp_id = self.call(self._experiment)
        return self.exp_id

    def _experiment(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                # the tag says what the experiment is, for MLflow versions whose UI reads it
                kind = {"mlflow.experimentKind": "custom_model_development"}
                self.client.create_experiment(self.experiment, self.artifact_location, tags=kind)
            except Exception:  # noqa: BLE001 - created meanwhile by another driver, or our lost answer
                pass
            exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            raise ConnectionError(f"experiment {self.experiment!r} could not be created")
        return exp.experiment_id

    def _open(self, key: str, identity: dict[str, str], tags: dict[str, str], name: str, parent: str = ""):
        """Find the run with these identity tags (a resumed sweep's, another driver's, or one whose create lost
        its answer), else create it (tracking/runs.py: one run when drivers race); a found one runs again."""
        if key in self.run_ids:
            return
        anchor = None
        if parent:
            tags = {**tags, "mlflow.parentRunId": self.run_ids[parent]}
            anchor = (self.run_ids[parent], key)
        exp = self.experiment_id()
        opened = self.call(find_or_create, self.client, exp, identity, tags, name, anchor, self.owner)
        self.run_ids[key], self.started[key] = opened.run_id, opened.start_time
        if opened.found:  # a resumed run may still say FINISHED, KILLED or FAILED from its last driver
            self.queue.put(Write(opened.run_id, status="RUNNING"))

    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        """Open (or reopen, for a resumed sweep id) the parent run."""
        all_tags = {"sweep_name": name, "cluster": cluster, "code_revision": code_revision(), **(tags or {})}
        self._open("sweep", {"sweep_id": sweep_id, "kind": "sweep"}, all_tags, sweep_id)

    def open_trial(self, spec: TrialSpec, sweep_id: str) -> None:
        """Find or create the trial's child run, nothing more (its lease is claimed before it is described)."""
        identity = {"sweep_id": sweep_id, "trial_id": spec.trial_id}
        name = spec_label(spec, "run")
        self._open(spec.trial_id, identity, {"kind": "trial"}, name, "sweep")

    # --- reads (synchronous) ------------------------------------------------------------------
    def find_runs(self, filter_string: str, max_results: int = 5000) -> list:
        """Search this experiment (a store that does not answer is waited for, up to STORE_WAIT_S)."""
        exp = self.experiment_id()
        return list(self.call(lambda: self.client.search_runs([exp], filter_string, max_results=max_results)))

    def finished_trials(self, sweep_id: str) -> dict[str, str]:
        """trial_id -> run id of trials already finished in this sweep instance (for resume)."""
        runs = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.status = 'finished'")
        runs = [r for r in runs if "trial_id" in r.data.tags]
        self.started |= {r.data.tags["trial_id"]: r.info.start_time for r in runs}
        return {r.data.tags["trial_id"]: r.info.run_id for r in runs}

    def resume(self, sweep_id: str) -> None:
        """Before re-running a sweep: which steps (and attempts) its unfinished trials already have in the store."""
        for r in self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'"):
            tid = r.data.tags.get("trial_id")
            if tid and r.data.tags.get("status") not in ("finished", "infeasible", "invalid"):
                self.refresh(tid, r.info.run_id)

    def refresh(self, key: str, run_id: str | None = None) -> None:
        """Re-read what the store has of trial `key` (steps, attempts): before taking over another driver's."""
        rid = run_id or self.run_ids[key]
        self.steps[key] = {m.step for m in self.call(self.client.get_metric_history, rid, "loss")}
        attempts = self.call(self.client.get_metric_history, rid, "compile_s")
        self.prior_attempts[key] = max((m.step for m in attempts), default=0)

    def leases(self) -> Leases:
        """This driver's trial leases (orchestrator/tracking/leases.py), on the parent run."""
        return Leases(self.client, self.run_ids)

    def records(self, key: str) -> list[Record]:
        """A trial's records as its drivers logged them, every attempt in order (each step once)."""
        j = self.logs.get(key)
        return [r for attempt in j.attempts for r in attempt] if j else []

    def stored_records(self, run_id: str) -> list[Record]:
        """A finished trial's records as its child run's trial log holds them (another driver's, or earlier)."""
        return stored_records(self.client, run_id)

    def _held(self, key: str) -> TrialLog:
        """The trial log this driver goes on with: what the store has where an earlier driver logged steps or
        attempts of the trial, else a fresh one."""
        if not (self.steps.get(key) or self.prior_attempts.get(key)):
            return TrialLog()
        try:
            return self.call(stored_log, self.client, self.run_ids[key])
        except Exception as e:  # noqa: BLE001 - the log then starts here; the metrics are in the store
            log.warning("trial %s: the store's records could not be read (%s: %s)", key, type(e).__name__, e)
            return TrialLog()

    # --- writes (write-behind) ----------------------------------------------------------------
    def _put(self, key: str, **write: Any) -> None:
        rid = self.run_ids.get(key)
        if rid is None:  # a bug: a write to a run never opened must not stop the sweep
            log.error("tracking write dropped: no run was opened for %r", key)
            return
        self.queue.put(Write(rid, **write))

    def start_trial(
        self,
        spec: TrialSpec,
        sweep_id: str,
        status: str = "queued",
        reason: str = "",
        predicted_bytes: int | None = None,
    ) -> None:
        """Describe the trial's child run (opened here unless it is already): grid axes as params, the resolved
        spec as an artifact, its status and the planner's memory."""
        key = spec.trial_id
        self.open_trial(spec, sweep_id)
        self.logs[key] = held = self._held(key)
        label = spec_label(spec)
        held.lines.append(f"trial {key} {label} cluster={spec.cluster.name}")
        self._put(key, params=trial_params(spec))
        self.log_text(key, spec.to_json(), "trial_spec.json")
        self.set_status(key, status, reason)
        if predicted_bytes is not None:
            self.log_metrics(key, {"predicted_bytes_per_device": predicted_bytes})

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        """Status tag (queued, running, retrying, finished, failed, infeasible, invalid, cancelled) and why;
        `terminal`: the MLflow status the run ends with."""
        j = self.logs.setdefault(key, TrialLog())
        j.lines.append(f"[{time.strftime('%H:%M:%S')}] status {status}" + (f": {reason}" if reason else ""))
        if status == "retrying":
            j.attempts.append([])
        if terminal:  # the log lands before the status another driver acts on (it reads the log back)
            self.log_text(key, j.text(), LOG_ARTIFACT)
        # "running" reopens it: a resumed run may still say KILLED or FAILED from its last driver
        run_status = terminal or ("RUNNING" if status == "running" else "")
        self._put(key, tags={"status": status, "reason": reason[:5000]}, status=run_status)

    def log_records(self, key: str, records: list[Record], attempt: int = 1) -> None:
        """Step records become step metrics (a step already logged is dropped); start records become
        per-attempt metrics, summary records summary metrics."""
        seen = self.steps.setdefault(key, set())
        fresh = [r for r in records if not isinstance(r, StepRecord) or r.step not in seen]
        seen.update(r.step for r in fresh if isinstance(r, StepRecord))
        attempt += self.prior_attempts.get(key, 0)
        self.logs.setdefault(key, TrialLog()).add(fresh)
        now = int(time.time() * 1000)
        if points := tuple(p for r in fresh for p in record_points(r, now, attempt)):
            self._put(key, metrics=points)
        if tags := record_tags(fresh, attempt):
            self.set_tags(key, tags)

    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        if points := tuple(Metric(k, float(v), now, int(step)) for k, v in values.items() if v == v):
            self._put(key, metrics=points)

    def log_text(self, key: str, text: str, path: str) -> None:
        self.log_bytes(key, text.encode(), path)

    def log_figure(self, key: str, fig: Any, path: str) -> None:
        """Render now (the caller may close the figure), upload later."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        self.log_bytes(key, buf.getvalue(), path)

    def log_bytes(self, key: str, data: bytes, path: str) -> None:
        """`data` as the run's artifact `path`: kept in a local file (which the journal names) until uploaded."""
        folder, name = os.path.split(path)
        self._put(key, file=self.queue.spool(name, data), folder=folder)

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        self._put(key, tags={k: str(v) for k, v in tags.items()})

    def end(self, key: str, status: str = "FINISHED") -> None:
        self._put(key, status=status)

    def run_id(self, key: str) -> str | None:
        return self.run_ids.get(key)

    def ui_base(self) -> str:
        """Where the MLflow UI answers: the server itself, or `mlflow ui`'s default over a local store."""
        return (
            self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
        )

    def run_url(self, run_id: str) -> str:
        """A run's page in the UI, on its training view (MLflow 3's UI opens on GenAI unless told)."""
        return f"{self.ui_base()}/#/experiments/{self.experiment_id()}/runs/{run_id}?{TRAINING_VIEW}"

    def dashboard_url(self) -> str:
        """The experiment's runs as charts, on the training view: the link a fresh browser opens right."""
        return f"{self.ui_base()}/#/experiments/{self.experiment_id()}/runs?{TRAINING_VIEW}&compareRunsMode=CHART"

    def report_dir(self) -> str:
        """Where the sweep's HTML page is written: next to a local store (sqlite or file), else ./reports."""
        for scheme in ("sqlite:///", "file://"):
            if self.uri.startswith(scheme):
                return os.path.join(os.path.dirname(self.uri[len(scheme) :]) or ".", "reports")
        return "reports"

    def dashboard_hint(self) -> str:
        if self.uri.startswith(("http://", "https://")):
            return self.dashboard_url()
        return f"mlflow ui --backend-store-uri {self.uri}, then open {self.dashboard_url()}"


Tracker = MlflowTracker  # for callers that build the MLflow tracker directly (benchmarks/tracking.py, tests)
