"""An ordered write-behind queue of tracking writes, durable in a local journal, drained by one thread.

Every write is a small JSON-able op. `put` appends it to the journal and fsyncs before it returns, so a
driver killed with SIGKILL loses nothing it was told; the writer thread delivers ops in order and marks each
one done in the journal. A failed delivery stays at the head of the queue and is retried with backoff until
the store answers: an outage delays writes but never loses them. A rerun with the same journal replays what
the store never received (every op is idempotent, so one delivered twice is harmless).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
Op = dict[str, Any]
COALESCE = 5000  # metric points per delivery; the MLflow client splits them into requests of 1,000
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)


class Journal:
    """Append-only JSON lines: {"seq": n, "op": ...} when queued (fsync'd), {"done": n} when delivered."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        ops, done = {}, set()
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
                        ops[rec["seq"]] = rec["op"]
        self.last_seq = max(ops, default=0)
        self.pending = [(seq, op) for seq, op in sorted(ops.items()) if seq not in done]
        self.delivered = [op for seq, op in sorted(ops.items()) if seq in done]
        self.f = open(path, "a")  # noqa: SIM115 - held for the queue's life

    def append(self, seq: int, op: Op) -> None:
        self.f.write(json.dumps({"seq": seq, "op": op}) + "\n")
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


class WriteQueue:
    """`deliver(ops)` gets one op, or a run of consecutive "metrics" ops to send as one batch."""

    def __init__(self, deliver: Callable[[list[Op]], None]):
        self.deliver = deliver
        self.ops: deque[tuple[int, Op]] = deque()  # undelivered, head first; the head stays until it succeeds
        self.seq = 0
        self.journal: Journal | None = None
        self.down_since: float | None = None
        self.failures = 0
        self.cv = threading.Condition()
        threading.Thread(target=self._drain, daemon=True, name="tracking-writer").start()

    def use_journal(self, path: str, redo: Callable[[Op], Op | None]) -> int:
        """Journal every write to `path` from now on. What an earlier driver left there undelivered is queued
        first, after `redo(op)` of each op it did deliver (e.g. finding a run again); returns how many."""
        with self.cv:
            j = self.journal = Journal(path)
            self.ops = deque(
                (j.last_seq + i + 1, op) for i, (_, op) in enumerate(self.ops)
            )  # may be in flight
            self.seq = j.last_seq + len(self.ops)
            for seq, op in self.ops:  # queued before the journal existed: journaled now, in place
                j.append(seq, op)
            again = [op for op in map(redo, j.delivered) if op is not None]
            for op in again + [op for _, op in j.pending]:
                self._append(op)
            j.done([seq for seq, _ in j.pending])  # now queued again under new numbers
            self.cv.notify_all()
            return len(j.pending)

    def _append(self, op: Op) -> None:
        self.seq += 1
        if self.journal is not None:
            self.journal.append(self.seq, op)
        self.ops.append((self.seq, op))

    def put(self, op: Op) -> None:
        with self.cv:
            self._append(op)
            self.cv.notify_all()

    def __len__(self) -> int:
        return len(self.ops)

    def _take(self) -> list[tuple[int, Op]]:
        """The head op, or the run of consecutive metric ops at the head (call with the lock held)."""
        if self.ops[0][1]["kind"] != "metrics":
            return [self.ops[0]]
        out, total = [], 0
        for seq, op in self.ops:
            if op["kind"] != "metrics" or (out and total + len(op["metrics"]) > COALESCE):
                break
            out.append((seq, op))
            total += len(op["metrics"])
        return out

    def _drain(self) -> None:
        while True:
            with self.cv:
                while not self.ops:
                    self.cv.wait()
                work = self._take()
            try:
                self.deliver([op for _, op in work])
                err = None
            except Exception as e:  # noqa: BLE001 - sorted into transient and permanent below
                err = e
            if err is not None and not _permanent(err):
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    log.warning(
                        "tracking store unavailable (%s: %s); buffering %d writes",
                        type(err).__name__,
                        str(err)[:200],
                        len(self.ops),
                    )
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
                for _ in work:
                    self.ops.popleft()
                if self.journal is not None:
                    self.journal.done([seq for seq, _ in work])
                self.cv.notify_all()

    def flush(self, timeout: float = 0.0) -> bool:
        """Wait up to `timeout` s for every queued write to reach the store. True when none is left."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.ops and time.monotonic() < deadline:
                self.cv.wait(deadline - time.monotonic())
            return not self.ops

    def close_journal(self) -> None:
        """Stop journaling; the file goes when everything in it was delivered, else it stays for a rerun."""
        with self.cv:
            if self.journal is not None:
                self.journal.close(remove=not self.ops)
                self.journal = None
