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
from orchestrator.tracking.finished import SPEC_ARTIFACT
from orchestrator.tracking.leases import Leases
from orchestrator.tracking.mlflow_names import record_points, record_tags, spec_label, trial_params
from orchestrator.tracking.queue import Write, WriteQueue, transient
from orchestrator.tracking.runs import find_or_create
from orchestrator.tracking.trial_log import LOG_ARTIFACT, TrialLog, stored_log, stored_records

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
REPLAY_WAIT_S = 120.0  # how long resume() waits for the writes a killed driver left, before reading the store


# MLflow 3's UI picks GenAI or training per browser: the URL's workflowType first, then what the browser's
# sidebar switch stored, else GenAI. The experiment tag mlflow.experimentKind does not change it (3.17).
TRAINING_VIEW = "workflowType=machine_learning"


def absolute(uri: str) -> str:
    """`uri` with a relative sqlite path made absolute. MLflow keeps one store (and one database engine) per URI
    for the life of the process, so a relative one would stay bound to the first working directory it was
    opened in: a second in-process driver in another directory would write into the first one's database."""
    prefix = "sqlite:///"
    path = uri[len(prefix) :]
    if uri.startswith(prefix) and path and not path.startswith(("/", ":memory:")):
        return prefix + os.path.abspath(path)
    return uri


def _waiting(state) -> None:
    e = state.outcome.exception()
    log.warning("tracking store unavailable (%s: %s); waiting", type(e).__name__, str(e)[:200])


class MlflowTracker:
    """The Tracker protocol (orchestrator/tracking/__init__.py) over an MLflow store. Beyond it, the regression
    gate reads the store itself (`client`, `call`, `experiment_id()`, `started`), and `dashboard_url()` is the
    link `dashboard_hint()` names."""

    def __init__(self, uri: str, experiment: str, artifact_location: str = ""):
        for k, v in HTTP_RETRIES.items():
            os.environ.setdefault(k, v)
        self.uri = uri  # as given: the journal's name and the printed hints use it
        self.client = MlflowClient(tracking_uri=absolute(uri))
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

    def finish(self, timeout: float = 0.0) -> int:
        """Wait up to `timeout` s for every queued write to reach the store; once all have, the journal goes.
        Returns how many have not: a journal keeps them for a rerun of the sweep."""
        if self.queue.flush(timeout):
            self.queue.close_journal()
        return len(self.queue)

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

    # --- resuming a sweep: the durable journal, then what the store has ---------------------------
    def _journal_path(self, sweep_id: str) -> str:
        tag = hashlib.sha256(f"{self.uri} {self.experiment}".encode()).hexdigest()[:8]
        return os.path.join(JOURNAL_DIR, f"{sweep_id}-{tag}.jsonl")

    def resume(self, sweep_id: str) -> dict[str, str]:
        """Journal every write of this sweep (fsync'd before the caller goes on), first delivering what a
        killed driver of the same sweep left undelivered; then read the trials the sweep finished (trial id ->
        run id) and the steps and attempts its unfinished ones logged, so a rerun logs none twice."""
        if n := self.queue.use_journal(self._journal_path(sweep_id)):
            log.warning(
                "replaying %d tracking writes an earlier driver of sweep %s never delivered", n, sweep_id
            )
            self.queue.flush(REPLAY_WAIT_S)
        finished = self._find_runs(f"tags.sweep_id = '{sweep_id}' and tags.status = 'finished'")
        finished = [r for r in finished if "trial_id" in r.data.tags]
        self.started |= {r.data.tags["trial_id"]: r.info.start_time for r in finished}
        for r in self._find_runs(f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'"):
            tid = r.data.tags.get("trial_id")
            if tid and r.data.tags.get("status") not in ("finished", "infeasible", "invalid"):
                self._read_steps(tid, r.info.run_id)
        return {r.data.tags["trial_id"]: r.info.run_id for r in finished}

    def refresh(self, key: str) -> None:
        """Re-read what the store has of trial `key` (steps, attempts): before taking over another driver's."""
        self._read_steps(key, self.run_ids[key])

    def _read_steps(self, key: str, run_id: str) -> None:
        self.steps[key] = {m.step for m in self.call(self.client.get_metric_history, run_id, "loss")}
        attempts = self.call(self.client.get_metric_history, run_id, "compile_s")
        self.prior_attempts[key] = max((m.step for m in attempts), default=0)

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

    def open_trial(self, spec: TrialSpec, sweep_id: str, status: str = "", reason: str = "") -> None:
        """Find or create the trial's child run (its lease is claimed before it is described); with a
        `status`, describe it: grid axes as params, the resolved spec as an artifact, the status."""
        key = spec.trial_id
        identity = {"sweep_id": sweep_id, "trial_id": key}
        self._open(key, identity, {"kind": "trial"}, spec_label(spec, "run"), "sweep")
        if not status:
            return
        self.logs[key] = held = self._held(key)
        held.lines.append(f"trial {key} {spec_label(spec)} cluster={spec.cluster.name}")
        self._put(key, params=trial_params(spec))
        self.log_artifact(key, spec.to_json(), SPEC_ARTIFACT)
        self.set_status(key, status, reason)

    # --- reads (synchronous) ------------------------------------------------------------------
    def _find_runs(self, filter_string: str, max_results: int = 5000) -> list:
        """Search this experiment (a store that does not answer is waited for, up to STORE_WAIT_S)."""
        exp = self.experiment_id()
        return list(self.call(lambda: self.client.search_runs([exp], filter_string, max_results=max_results)))

    def leases(self) -> Leases:
        """This driver's trial leases (orchestrator/tracking/leases.py), on the parent run."""
        return Leases(self.client, self.run_ids)

    def records(self, key: str, run_id: str = "") -> list[Record]:
        """A trial's records as this driver's log holds them, every attempt in order (each step once); given
        `run_id`, as that child run's trial log holds them (another driver's, or an earlier one's)."""
        if run_id:
            return stored_records(self.client, run_id)
        j = self.logs.get(key)
        return [r for attempt in j.attempts for r in attempt] if j else []

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

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        """Status tag (queued, running, retrying, finished, failed, infeasible, invalid, cancelled) and why;
        `terminal`: the MLflow status the run ends with."""
        j = self.logs.setdefault(key, TrialLog())
        j.lines.append(f"[{time.strftime('%H:%M:%S')}] status {status}" + (f": {reason}" if reason else ""))
        if status == "retrying":
            j.attempts.append([])
        if terminal:  # the log lands before the status another driver acts on (it reads the log back)
            self.log_artifact(key, j.text(), LOG_ARTIFACT)
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

    def log_metrics(self, key: str, values: dict[str, float | None], step: int = 0) -> None:
        now = int(time.time() * 1000)
        kept = {k: float(v) for k, v in values.items() if v is not None and v == v}
        if points := tuple(Metric(k, v, now, int(step)) for k, v in kept.items()):
            self._put(key, metrics=points)

    def log_artifact(self, key: str, data: str | bytes, path: str) -> None:
        """`data` as the run's artifact `path`: kept in a local file (which the journal names) until uploaded."""
        folder, name = os.path.split(path)
        raw = data.encode() if isinstance(data, str) else data
        self._put(key, file=self.queue.spool(name, raw), folder=folder)

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        self._put(key, tags={k: str(v) for k, v in tags.items()})

    def end(self, key: str, status: str = "FINISHED") -> None:
        self._put(key, status=status)

    def run_id(self, key: str) -> str | None:
        return self.run_ids.get(key)

    def _ui_base(self) -> str:
        """Where the MLflow UI answers: the server itself, or `mlflow ui`'s default over a local store."""
        return (
            self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
        )

    def run_url(self, run_id: str) -> str:
        """A run's page in the UI, on its training view (MLflow 3's UI opens on GenAI unless told)."""
        return f"{self._ui_base()}/#/experiments/{self.experiment_id()}/runs/{run_id}?{TRAINING_VIEW}"

    def dashboard_url(self) -> str:
        """The experiment's runs as charts, on the training view: the link a fresh browser opens right."""
        return f"{self._ui_base()}/#/experiments/{self.experiment_id()}/runs?{TRAINING_VIEW}&compareRunsMode=CHART"

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
