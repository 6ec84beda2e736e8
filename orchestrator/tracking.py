"""MLflow from the driver only: a parent run per sweep, a child run per trial, batched and outage-proof.

Every write goes through an ordered queue that is retried until the store answers, so a tracking
outage delays records but never loses them and never fails the sweep. Runs are referred to by trial
key until the store has created them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections import deque
from collections.abc import Callable
from typing import Any

# Our queue retries; MLflow's own HTTP retries (minutes of backoff) would block the driver instead.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402

from jobs.spec import TrialSpec  # noqa: E402

log = logging.getLogger(__name__)
STEP_METRICS = (
    "loss",
    "grad_norm",
    "step_time_s",
    "tokens_per_s",
    "tflops_per_s_per_device",
    "mfu",
    "peak_bytes_in_use",
)
BATCH = 1000  # MLflow's per-request metric limit


def code_revision() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=here)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def trial_params(spec: TrialSpec) -> dict[str, str]:
    p = {
        "model": spec.model.name,
        "strategy": spec.strategy.name,
        "layout": spec.strategy.layout,
        "mesh": spec.mesh.label(),
        "cp": spec.mesh.cp,
        "cp_ring": spec.mesh.context,
        "cp_ulysses": spec.mesh.context_ulysses,
        "context_length": spec.context_length,
        "batch": spec.train.batch,
        "steps": spec.train.steps,
        "dtype": spec.train.dtype,
        "remat": spec.train.remat,
        "devices": spec.mesh.size,
        "cluster": spec.cluster.name,
    }
    p.update({k: v for k, v in spec.axes})
    return {k: str(v) for k, v in p.items()}


class Tracker:
    def __init__(self, uri: str, experiment: str, artifact_location: str = ""):
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = experiment
        self.artifact_location = artifact_location or None
        self.ops: deque[Callable[[], None]] = deque()
        self.run_ids: dict[str, str] = {}  # key ("sweep" or a trial id) -> MLflow run id
        self.exp_id: str | None = None
        self.down_since: float | None = None
        self.next_try = 0.0

    # --- the write-behind queue -------------------------------------------------------------
    def _enqueue(self, op: Callable[[], None]) -> None:
        self.ops.append(op)
        self.flush()

    def flush(self, timeout: float = 0.0) -> bool:
        """Run queued writes in order; on a store error keep them for later. True when the queue is empty."""
        deadline = time.monotonic() + timeout
        while self.ops:
            if time.monotonic() < self.next_try:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
                continue
            try:
                self.ops[0]()
                self.ops.popleft()
                if self.down_since is not None:
                    log.warning("tracking store back after %.1f s", time.monotonic() - self.down_since)
                    self.down_since = None
            except Exception as e:  # connection refused, 5xx, sqlite locked: all transient for us
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    log.warning(
                        "tracking store unavailable (%s); buffering %d writes",
                        type(e).__name__,
                        len(self.ops),
                    )
                self.next_try = time.monotonic() + 1.0
                if time.monotonic() >= deadline:
                    return False
        return True

    def _exp(self) -> str:
        if self.exp_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            self.exp_id = (
                exp.experiment_id
                if exp
                else self.client.create_experiment(self.experiment, self.artifact_location)
            )
        return self.exp_id

    # --- reads (direct; used before launch, when the store must be up) ----------------------
    def find_runs(self, filter_string: str, max_results: int = 5000) -> list:
        return list(self.client.search_runs([self._exp()], filter_string, max_results=max_results))

    def finished_trials(self, sweep_id: str) -> dict[str, str]:
        """trial_id -> run id of trials already finished in this sweep instance (for resume)."""
        runs = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.status = 'finished'")
        return {r.data.tags["trial_id"]: r.info.run_id for r in runs if "trial_id" in r.data.tags}

    # --- writes -----------------------------------------------------------------------------
    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        """Open (or reopen, for a resumed sweep id) the parent run."""
        existing = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.kind = 'sweep'", 1)
        if existing:
            self.run_ids["sweep"] = existing[0].info.run_id
            self._enqueue(lambda: self.client.update_run(self.run_ids["sweep"], status="RUNNING"))
            return
        all_tags = {"kind": "sweep", "sweep_name": name, "sweep_id": sweep_id, "cluster": cluster}
        all_tags |= {"code_revision": code_revision(), **(tags or {})}

        def create():
            self.run_ids["sweep"] = self.client.create_run(
                self._exp(), tags=all_tags, run_name=sweep_id
            ).info.run_id

        self._enqueue(create)

    def start_trial(self, spec: TrialSpec, sweep_id: str, status: str = "queued", reason: str = "") -> None:
        key = spec.trial_id
        existing = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.trial_id = '{key}'", 1)
        if existing:
            self.run_ids[key] = existing[0].info.run_id
            self.set_status(key, status, reason)
            return
        params = [Param(k, v) for k, v in trial_params(spec).items()]
        name = f"{spec.strategy.name}-L{spec.context_length}-{spec.mesh.label()}"

        def create():
            tags = {"mlflow.parentRunId": self.run_ids["sweep"], "kind": "trial", "trial_id": key}
            tags |= {"sweep_id": sweep_id, "status": status, "reason": reason}
            run = self.client.create_run(self._exp(), tags=tags, run_name=name)
            self.run_ids[key] = run.info.run_id
            self.client.log_batch(run.info.run_id, params=params)
            self.client.log_text(run.info.run_id, spec.to_json(), "trial_spec.json")

        self._enqueue(create)

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        def op():
            rid = self.run_ids[key]
            self.client.log_batch(rid, tags=[RunTag("status", status), RunTag("reason", reason[:5000])])
            if terminal:
                self.client.set_terminated(rid, terminal)

        self._enqueue(op)

    def log_records(self, key: str, records: list[dict[str, Any]]) -> None:
        """Step records become step metrics; start/summary records become summary metrics."""
        now = int(time.time() * 1000)
        metrics: list[Metric] = []
        for r in records:
            if r.get("kind") == "step":
                for m in STEP_METRICS:
                    v = r.get(m)
                    if isinstance(v, int | float) and v == v:
                        metrics.append(Metric(m, float(v), now, int(r["step"])))
            elif r.get("kind") in ("start", "summary"):
                summary = r["kind"] == "summary"
                for m, v in r.items():
                    if isinstance(v, int | float) and not isinstance(v, bool) and v == v and m != "steps":
                        # memory and per-step constants keep their names; end-of-trial figures get final_
                        plain = (
                            not summary
                            or m.startswith("final_")
                            or m.endswith("_bytes")
                            or m == "peak_bytes_in_use"
                        )
                        name = m if plain else "final_" + m
                        metrics.append(Metric(name, float(v), now, 0))
        for i in range(0, len(metrics), BATCH):
            chunk = metrics[i : i + BATCH]
            self._enqueue(lambda chunk=chunk: self.client.log_batch(self.run_ids[key], metrics=chunk))

    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, int(step)) for k, v in values.items() if v == v]
        self._enqueue(lambda: self.client.log_batch(self.run_ids[key], metrics=ms))

    def log_text(self, key: str, text: str, path: str) -> None:
        self._enqueue(lambda: self.client.log_text(self.run_ids[key], text, path))

    def log_figure(self, key: str, fig, path: str) -> None:
        self._enqueue(lambda: self.client.log_figure(self.run_ids[key], fig, path))

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        self._enqueue(
            lambda: self.client.log_batch(self.run_ids[key], tags=[RunTag(k, v) for k, v in tags.items()])
        )

    def end(self, key: str, status: str = "FINISHED") -> None:
        self._enqueue(lambda: self.client.set_terminated(self.run_ids[key], status))

    def run_id(self, key: str) -> str | None:
        return self.run_ids.get(key)

    def dashboard_hint(self) -> str:
        if self.uri.startswith(("http://", "https://")):
            return f"open {self.uri} (experiment {self.experiment!r})"
        return f"mlflow ui --backend-store-uri {self.uri}  # then open http://127.0.0.1:5000"
