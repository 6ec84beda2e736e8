"""The driver's tracking writes, delivered in order behind its back by one thread, each one durable first.

A write is an MLflow batch (metrics, params, tags) for one run, a file to upload as one of its artifacts, or
its status. `put` appends it to the journal and fsyncs before it returns, so a driver killed with SIGKILL
loses nothing it was told; a file is kept on local disk (the journal holds its path, not its bytes) until it
is uploaded. The writer thread delivers writes in order and marks each done in the journal. A delivery the
store does not answer stays at the head and is tried again with backoff until it lands: an outage delays
writes but never loses them. A rerun with the same journal sends what the store never received first (every
write is idempotent, so one delivered twice is harmless).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from tenacity import Retrying, retry_if_exception, wait_exponential

log = logging.getLogger(__name__)
COALESCE = 5000  # metric points per delivery; the MLflow client splits them into requests of 1,000
BACKOFF = wait_exponential(multiplier=0.5, max=4.0)  # between deliveries the store did not answer


@dataclass(frozen=True)
class Write:
    """One write to run `run_id`: a batch, a local file to upload under `folder`, a status, or several."""

    run_id: str
    metrics: tuple[Metric, ...] = ()
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    file: str = ""  # a local file, removed once uploaded
    folder: str = ""  # its artifact folder ("" for the run's root)
    status: str = ""  # RUNNING (reopen the run), or how it ended: FINISHED, FAILED, KILLED

    @property
    def only_metrics(self) -> bool:
        return bool(self.metrics) and not (self.params or self.tags or self.file or self.status)

    def to_dict(self) -> dict[str, Any]:
        """The journal's form: what is set, metrics as [key, value, timestamp, step]."""
        d: dict[str, Any] = {"run_id": self.run_id}
        if self.metrics:
            d["metrics"] = [[m.key, m.value, m.timestamp, m.step] for m in self.metrics]
        return d | {k: v for k in ("params", "tags", "file", "folder", "status") if (v := getattr(self, k))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Write:
        metrics = tuple(Metric(*m) for m in d.get("metrics", []))
        return cls(**{k: v for k, v in d.items() if k != "metrics"}, metrics=metrics)


def deliver(client: Any, writes: list[Write]) -> None:
    """Send writes through an MlflowClient: a run of metric-only ones as one batch per run, else the one write
    part by part (each part idempotent, so a retry may repeat the first ones)."""
    if len(writes) > 1:
        by_run: dict[str, list[Metric]] = {}
        for w in writes:
            by_run.setdefault(w.run_id, []).extend(w.metrics)
        for run_id, metrics in by_run.items():
            client.log_batch(run_id, metrics=metrics)
        return
    (w,) = writes
    if w.metrics or w.params or w.tags:
        params = [Param(k, v) for k, v in w.params.items()]
        tags = [RunTag(k, v) for k, v in w.tags.items()]
        client.log_batch(w.run_id, metrics=list(w.metrics), params=params, tags=tags)
    if w.file:
        client.log_artifact(w.run_id, w.file, w.folder or None)
    if w.status == "RUNNING":
        client.update_run(w.run_id, status="RUNNING")
    elif w.status:
        client.set_terminated(w.run_id, w.status)


def permanent(e: BaseException) -> bool:
    """A write the store rejected for its content (or our bug), as opposed to a store that is not answering."""
    if isinstance(e, KeyError | TypeError | ValueError | AttributeError | FileNotFoundError):
        return True
    code = getattr(e, "error_code", "")
    return code in (
        "INVALID_PARAMETER_VALUE",
        "RESOURCE_DOES_NOT_EXIST",
        "RESOURCE_ALREADY_EXISTS",
        "BAD_REQUEST",
    )


def transient(e: BaseException) -> bool:
    return isinstance(e, Exception) and not permanent(e)


class Journal:
    """Append-only JSON lines, {"seq": n, "write": ...} when queued (fsync'd) and {"done": n} when delivered,
    and beside it the folder of the files its writes upload."""

    def __init__(self, path: str):
        self.path = path
        self.files = path.removesuffix(".jsonl") + ".files"
        os.makedirs(self.files, exist_ok=True)
        writes, done = {}, set()
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by the kill: never acknowledged
                        continue
                    if "done" in rec:
                        done.add(rec["done"])
                    else:
                        writes[rec["seq"]] = rec["write"]
        self.last_seq = max(writes, default=0)
        self.pending = [(seq, Write.from_dict(w)) for seq, w in sorted(writes.items()) if seq not in done]
        self.f = open(path, "a")  # noqa: SIM115 - held for the queue's life

    def append(self, seq: int, w: Write) -> None:
        self.f.write(json.dumps({"seq": seq, "write": w.to_dict()}) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def done(self, seqs: list[int]) -> None:
        # not fsync'd: a "done" lost to a crash only means one idempotent write is delivered again
        self.f.write("".join(json.dumps({"done": s}) + "\n" for s in seqs))
        self.f.flush()

    def close(self, remove: bool) -> None:
        self.f.close()
        if remove:
            os.remove(self.path)
            shutil.rmtree(self.files, ignore_errors=True)


class WriteQueue:
    """The writes of one MlflowClient, delivered in order by a thread of its own."""

    def __init__(self, client: Any):
        self.client = client
        self.writes: deque[tuple[int, Write]] = deque()  # undelivered, head first; it stays until it lands
        self.seq = 0
        self.journal: Journal | None = None
        self.scratch = ""  # the files of writes no journal holds (made on first use, removed at exit)
        self.down_since: float | None = None
        self.cv = threading.Condition()
        threading.Thread(target=self._drain, daemon=True, name="tracking-writer").start()

    def use_journal(self, path: str) -> int:
        """Journal every write to `path` from now on (chosen before the first write); what an earlier driver
        left there undelivered is queued first. Returns how many writes that is."""
        with self.cv:
            if self.writes or self.journal is not None:
                raise RuntimeError("a tracking journal is chosen once, before the first write")
            j = self.journal = Journal(path)
            self.seq = j.last_seq
            for _, w in j.pending:
                self._append(w)
            j.done([seq for seq, _ in j.pending])  # queued again above, under new numbers
            self.cv.notify_all()
            return len(j.pending)

    def spool(self, name: str, data: bytes) -> str:
        """Keep `data` in a local file named `name` until a write uploads it; returns its path."""
        if self.journal is None and not self.scratch:
            self.scratch = tempfile.mkdtemp(prefix="cp-tracking-")
            atexit.register(shutil.rmtree, self.scratch, ignore_errors=True)
        folder = os.path.join(self.journal.files if self.journal else self.scratch, uuid.uuid4().hex)
        os.makedirs(folder)
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the journal names it
        return os.path.abspath(path)

    def _append(self, w: Write) -> None:
        self.seq += 1
        if self.journal is not None:
            self.journal.append(self.seq, w)
        self.writes.append((self.seq, w))

    def put(self, w: Write) -> None:
        with self.cv:
            self._append(w)
            self.cv.notify_all()

    def __len__(self) -> int:
        return len(self.writes)

    def _take(self) -> list[tuple[int, Write]]:
        """The head write, or the run of metric-only writes at the head (call with the lock held)."""
        if not self.writes[0][1].only_metrics:
            return [self.writes[0]]
        out, total = [], 0
        for seq, w in self.writes:
            if not w.only_metrics or (out and total + len(w.metrics) > COALESCE):
                break
            out.append((seq, w))
            total += len(w.metrics)
        return out

    def _down(self, state) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            e = state.outcome.exception()
            log.warning(
                "tracking store unavailable (%s: %s); buffering %d writes",
                type(e).__name__,
                str(e)[:200],
                len(self.writes),
            )

    def _drain(self) -> None:
        while True:
            with self.cv:
                while not self.writes:
                    self.cv.wait()
                work = self._take()
            writes = [w for _, w in work]
            try:  # the same writes again until the store answers: they stay at the head, so order is kept
                Retrying(retry=retry_if_exception(transient), wait=BACKOFF, before_sleep=self._down)(
                    deliver, self.client, writes
                )
            except Exception as e:  # noqa: BLE001 - a bug or a rejected value: retrying cannot help
                log.error("tracking write dropped: %s: %s", type(e).__name__, str(e)[:500])
            if self.down_since is not None:
                log.warning("tracking store back after %.1f s", time.monotonic() - self.down_since)
                self.down_since = None
            for w in writes:
                if w.file:
                    shutil.rmtree(os.path.dirname(w.file), ignore_errors=True)
            with self.cv:
                for _ in work:
                    self.writes.popleft()
                if self.journal is not None:
                    self.journal.done([seq for seq, _ in work])
                self.cv.notify_all()

    def flush(self, timeout: float = 0.0) -> bool:
        """Wait up to `timeout` s for every queued write to reach the store. True when none is left."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.writes and time.monotonic() < deadline:
                self.cv.wait(deadline - time.monotonic())
            return not self.writes

    def close_journal(self) -> None:
        """Stop journaling; the file goes when everything in it was delivered, else it stays for a rerun."""
        with self.cv:
            if self.journal is not None:
                self.journal.close(remove=not self.writes)
                self.journal = None
