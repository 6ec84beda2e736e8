"""MLflow from the driver only: a parent run per sweep, a child run per trial, batched and outage-proof.

Every write goes through an ordered write-behind queue drained by one background thread, so the
driver never waits on the store. A failed write stays at the head of the queue and is retried with
backoff until the store answers: an outage delays records but never loses them and never fails the
sweep. Every write is idempotent (the store drops an identical metric point; runs are found by their
identity tags before being created), so a request that reached the store but lost its answer can
safely be sent again.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Our queue retries; MLflow's own HTTP retries (minutes of backoff) would stall the queue instead.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402

from jobs.spec import TrialSpec  # noqa: E402

log = logging.getLogger(__name__)
STEP_METRICS = ("loss", "grad_norm", "step_time_s", "tokens_per_s", "tflops_per_s_per_device", "mfu",
                "peak_bytes_in_use")  # fmt: skip
FINAL = ("final_loss", "step_time_median_s", "tokens_per_s", "tflops_per_s_per_device", "mfu")
COALESCE = 5000  # metric points per drain; the client splits them into requests of 1,000
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)


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
        "model": spec.model.name, "strategy": spec.strategy.name, "layout": spec.strategy.layout,
        "mesh": spec.mesh.label(), "cp": spec.mesh.cp, "cp_ring": spec.mesh.context,
        "cp_ulysses": spec.mesh.context_ulysses, "context_length": spec.context_length, "batch": spec.train.batch,
        "steps": spec.train.steps, "dtype": spec.train.dtype, "remat": spec.train.remat, "devices": spec.mesh.size,
        "cluster": spec.cluster.name,
    }  # fmt: skip
    p.update({k: v for k, v in spec.axes})
    return {k: str(v) for k, v in p.items()}


def record_metrics(r: dict[str, Any], now: int, attempt: int = 1) -> list[Metric]:
    """One metric record as MLflow points: step records per step (at the job's own time, so a copy re-sent
    after a resume is the same point), start records per attempt, summary ones at step 0."""
    if r.get("kind") == "step":
        vals = {m: r.get(m) for m in STEP_METRICS}
        step, now = int(r["step"]), int(r.get("t_ms") or now)
    elif r.get("kind") == "start":  # compile and restore time of this attempt, never mixed into steps
        vals, step = dict(r), attempt
    elif r.get("kind") == "summary":  # end-of-trial figures get final_; memory keeps its names
        vals = {("final_" + k if k in FINAL else k): v for k, v in r.items() if k != "steps"}
        mem = r.get("peak_bytes_in_use") or r.get("compiled_bytes_per_device")
        if mem:  # runtime peak where the backend reports one (TPU/GPU), else the compiler's figure (CPU)
            vals["memory_bytes_per_device"] = mem
        step = 0
    else:
        return []
    ok = {k: float(v) for k, v in vals.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return [Metric(k, v, now, step) for k, v in ok.items() if v == v]


def summary_covers(r: dict[str, Any], attempt: int) -> str:
    """Which steps a summary's step time and MFU come from, e.g. "steps 7-11 of attempt 2 (resumed at 6)"."""
    if "timed_from_step" not in r:
        return ""
    text = f"steps {r['timed_from_step']}-{r['timed_to_step']} of attempt {attempt}"
    return text + (f" (resumed at step {r['attempt_from_step']})" if r.get("attempt_from_step") else "")


def _permanent(e: Exception) -> bool:
    """A write the store rejected for its content (or our bug), as opposed to a store that is not answering."""
    if isinstance(e, KeyError | TypeError | ValueError | AttributeError):
        return True
    code = getattr(e, "error_code", "")
    return code in (
        "INVALID_PARAMETER_VALUE",
        "RESOURCE_DOES_NOT_EXIST",
        "RESOURCE_ALREADY_EXISTS",
        "BAD_REQUEST",
    )


@dataclass
class _Op:
    fn: Callable[[], None] | None = None  # a store call, or ...
    key: str = ""  # ... metric points for this run, merged with neighbours when drained
    metrics: list[Metric] = field(default_factory=list)


@dataclass
class TrialJournal:
    """What the driver saw of one trial: records per attempt and status lines (the trial log artifact)."""

    attempts: list[list[dict[str, Any]]] = field(default_factory=lambda: [[]])
    lines: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.attempts[-1]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Tracker:
    def __init__(self, uri: str, experiment: str, artifact_location: str = ""):
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = experiment
        self.artifact_location = artifact_location or None
        self.ops: deque[_Op] = deque()  # undelivered writes, head first; the head stays until it succeeds
        self.run_ids: dict[str, str] = {}  # key ("sweep" or a trial id) -> MLflow run id
        self.journals: dict[str, TrialJournal] = {}
        # Per trial: steps whose record the store has (or is queued to get), and attempts an earlier driver ran.
        # A resumed attempt re-sends its checkpoint's records and re-runs the steps after it: each step is
        # logged once, the first time it arrives.
        self.steps: dict[str, set[int]] = {}
        self.prior_attempts: dict[str, int] = {}
        self.exp_id: str | None = None
        self.down_since: float | None = None
        self.failures = 0
        self.cv = threading.Condition()
        self.writer = threading.Thread(target=self._drain, daemon=True, name="tracking-writer")
        self.writer.start()

    # --- the write-behind queue -------------------------------------------------------------
    def _enqueue(self, op: _Op) -> None:
        with self.cv:
            self.ops.append(op)
            self.cv.notify_all()

    def _take(self) -> tuple[int, _Op | dict[str, list[Metric]]]:
        """The head op, or a run of consecutive metric ops merged per run (call with the lock held)."""
        if self.ops[0].fn is not None:
            return 1, self.ops[0]
        n, total, merged = 0, 0, {}
        for op in self.ops:
            if op.fn is not None or (n and total + len(op.metrics) > COALESCE):
                break
            merged.setdefault(op.key, []).extend(op.metrics)
            n, total = n + 1, total + len(op.metrics)
        return n, merged

    def _drain(self) -> None:
        while True:
            with self.cv:
                while not self.ops:
                    self.cv.wait()
                n, work = self._take()
            err = self._write(work)
            if err is not None and not _permanent(err):
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    log.warning("tracking store unavailable (%s: %s); buffering %d writes",
                                type(err).__name__, str(err)[:200], len(self.ops))  # fmt: skip
                time.sleep(BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)])
                self.failures += 1
                continue  # the same write again: it stays at the head, so order is kept
            if (
                err is not None
            ):  # a bug or a rejected value: retrying cannot help, and must not block the queue
                log.error("tracking write dropped: %s: %s", type(err).__name__, str(err)[:500])
            if self.down_since is not None:
                log.warning("tracking store back after %.1f s", time.monotonic() - self.down_since)
            self.down_since, self.failures = None, 0
            with self.cv:
                for _ in range(n):
                    self.ops.popleft()
                self.cv.notify_all()

    def _write(self, work: _Op | dict[str, list[Metric]]) -> Exception | None:
        try:
            if isinstance(work, _Op):
                work.fn()
            else:
                for key, ms in work.items():
                    self.client.log_batch(self.run_ids[key], metrics=ms)
        except Exception as e:  # noqa: BLE001 - sorted into transient and permanent by the caller
            return e
        return None

    def flush(self, timeout: float = 0.0) -> bool:
        """Wait up to `timeout` s for every queued write to reach the store. True when none is left."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.ops and time.monotonic() < deadline:
                self.cv.wait(deadline - time.monotonic())
            return not self.ops

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
        runs = self.find_runs(f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'")
        for r in runs:
            tid = r.data.tags.get("trial_id")
            if not tid or r.data.tags.get("status") in ("finished", "infeasible", "invalid"):
                continue
            rid = r.info.run_id
            self.steps[tid] = {m.step for m in self.client.get_metric_history(rid, "loss")}
            self.prior_attempts[tid] = max(
                (m.step for m in self.client.get_metric_history(rid, "compile_s")), default=0
            )

    # --- writes -----------------------------------------------------------------------------
    def _open(
        self, key: str, identity: dict[str, str], tags: dict[str, str], name: str, parent: str = ""
    ) -> None:
        """Find the run with these identity tags (a resumed sweep, or a create whose answer was lost), else create it."""

        def op():
            if parent:
                tags["mlflow.parentRunId"] = self.run_ids[parent]
            filt = " and ".join(f"tags.{k} = '{v}'" for k, v in identity.items())
            found = self.client.search_runs([self._exp()], filt, max_results=1)
            if found:
                self.run_ids[key] = found[0].info.run_id
                self.client.update_run(self.run_ids[key], status="RUNNING")
            else:
                run = self.client.create_run(self._exp(), tags={**identity, **tags}, run_name=name)
                self.run_ids[key] = run.info.run_id

        self._enqueue(_Op(op))

    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        """Open (or reopen, for a resumed sweep id) the parent run."""
        all_tags = {"sweep_name": name, "cluster": cluster, "code_revision": code_revision(), **(tags or {})}
        self._open("sweep", {"sweep_id": sweep_id, "kind": "sweep"}, all_tags, sweep_id)

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
        self.journals[key] = TrialJournal(lines=[f"trial {key} {spec.strategy.name} L={spec.context_length} "
                                                 f"mesh={spec.mesh.label()} cluster={spec.cluster.name}"])  # fmt: skip
        name = f"{spec.strategy.name}-L{spec.context_length}-{spec.mesh.label()}"
        self._open(key, {"sweep_id": sweep_id, "trial_id": key}, {"kind": "trial"}, name, parent="sweep")
        params = [Param(k, v) for k, v in trial_params(spec).items()]

        def setup():
            self.client.log_batch(self.run_ids[key], params=params)
            self.client.log_text(self.run_ids[key], spec.to_json(), "trial_spec.json")

        self._enqueue(_Op(setup))
        self.set_status(key, status, reason)
        if predicted_bytes is not None:
            self.log_metrics(key, {"predicted_bytes_per_device": predicted_bytes})

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        """Status tag (queued, running, retrying, finished, failed, infeasible, invalid, cancelled) and why."""
        j = self.journals.setdefault(key, TrialJournal())
        j.lines.append(f"[{time.strftime('%H:%M:%S')}] status {status}" + (f": {reason}" if reason else ""))
        if status == "retrying":
            j.attempts.append([])
        log_text = j.text() if terminal else None

        def op():
            rid = self.run_ids[key]
            self.client.log_batch(rid, tags=[RunTag("status", status), RunTag("reason", reason[:5000])])
            if status == "running":  # a resumed run may still say KILLED or FAILED from its last driver
                self.client.update_run(rid, status="RUNNING")
            if log_text is not None:
                self.client.log_text(rid, log_text, "trial_log.txt")
                self.client.set_terminated(rid, terminal)

        self._enqueue(_Op(op))

    def log_records(self, key: str, records: list[dict[str, Any]], attempt: int = 1) -> None:
        """Step records become step metrics (a step already logged is dropped); start records become
        per-attempt metrics, summary records summary metrics."""
        seen = self.steps.setdefault(key, set())
        fresh = [r for r in records if r.get("kind") != "step" or r["step"] not in seen]
        seen.update(r["step"] for r in fresh if r.get("kind") == "step")
        attempt += self.prior_attempts.get(key, 0)
        j = self.journals.setdefault(key, TrialJournal())
        j.records.extend(fresh)
        j.lines.extend(json.dumps(r, default=str) for r in fresh)
        now = int(time.time() * 1000)
        metrics = [m for r in fresh for m in record_metrics(r, now, attempt)]
        if metrics:
            self._enqueue(_Op(key=key, metrics=metrics))
        covers = [summary_covers(r, attempt) for r in fresh if r.get("kind") == "summary"]
        if any(covers):
            self.set_tags(key, {"summary_covers": covers[-1]})

    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, int(step)) for k, v in values.items() if v == v]
        if ms:
            self._enqueue(_Op(key=key, metrics=ms))

    def log_text(self, key: str, text: str, path: str) -> None:
        self._enqueue(_Op(lambda: self.client.log_text(self.run_ids[key], text, path)))

    def log_figure(self, key: str, fig, path: str) -> None:
        """Render now (the caller may close the figure), upload later."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        self.log_bytes(key, buf.getvalue(), path)

    def log_bytes(self, key: str, data: bytes, path: str) -> None:
        def op():
            with tempfile.TemporaryDirectory() as d:
                local = os.path.join(d, os.path.basename(path))
                with open(local, "wb") as f:
                    f.write(data)
                self.client.log_artifact(self.run_ids[key], local, os.path.dirname(path) or None)

        self._enqueue(_Op(op))

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        rt = [RunTag(k, str(v)) for k, v in tags.items()]
        self._enqueue(_Op(lambda: self.client.log_batch(self.run_ids[key], tags=rt)))

    def end(self, key: str, status: str = "FINISHED") -> None:
        self._enqueue(_Op(lambda: self.client.set_terminated(self.run_ids[key], status)))

    def run_id(self, key: str) -> str | None:
        return self.run_ids.get(key)

    def records(self, key: str) -> list[dict[str, Any]]:
        """The last attempt's metric records of a trial, as the driver received them."""
        j = self.journals.get(key)
        return list(j.records) if j else []

    def dashboard_hint(self) -> str:
        if self.uri.startswith(("http://", "https://")):
            return f"open {self.uri} (experiment {self.experiment!r})"
        return f"mlflow ui --backend-store-uri {self.uri}  # then open http://127.0.0.1:5000"
