"""One attempt of a trial on Ray: one task per host in fresh processes, gang-started on its slices
(placement.py), and its typed outcome (finished / preempted / failed / infeasible / cancelled).

Host 0 streams metric-record batches back (a streaming generator task): typed records in the job, their dict
form across Ray, typed again once on the driver's side; the driver alone talks to MLflow.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import ray

from jobs.records import Record, StepRecord, parse_known
from jobs.spec import TrialSpec
from orchestrator.launch.cluster import task_env
from orchestrator.launch.placement import Placed, Reservation, clean_env, host_info, live_placement_groups

__all__ = [
    "Attempt",
    "Cancelled",
    "Event",
    "Outcome",
    "Spare",
    "budget",
    "host_task",
    "live_placement_groups",
    "starts_ahead",
    "stop",
]
log = logging.getLogger(__name__)
GRACE_S = 2.0  # after a host's error, how long the others get to report their own cause before we cancel


def _host(
    spec_json: str,
    process_id: int,
    num_processes: int,
    coordinator: str,
    env: dict[str, str] | None = None,
    batch_s: float = 0.5,
):
    """One JAX process of a trial. Every host first yields its host record; only process 0 yields metrics.
    `env`: the attempt's own variables (MEGASCALE_* on a multislice TPU trial); inherited ones it lacks go."""
    from jobs.spec import TrialSpec as _Spec

    scrubbed = clean_env(env or {})
    spec = _Spec.from_json(spec_json)
    yield [host_info(process_id, process_id // spec.cluster.hosts, scrubbed)]  # process ids are slice-major
    from jobs.peers import init_distributed
    from jobs.train import train

    init_distributed(coordinator, num_processes, process_id)
    buf, last, first = [], time.monotonic(), True
    for rec in train(spec):
        buf.append(rec.to_dict())  # the Ray boundary: the records' dict form
        step = isinstance(rec, StepRecord)
        # the first step goes out at once: "submit -> first step" should not wait on batching
        if not step or first or time.monotonic() - last > batch_s:
            first = first and not step
            yield buf
            buf, last = [], time.monotonic()
    if buf:
        yield buf


# max_calls=1: every trial gets fresh processes (libtpu's lockfile, a clean jax.distributed).
# max_retries=0: a lone host retried by Ray could never rejoin its gang; the executor retries the whole trial.
@ray.remote(num_returns="streaming", max_calls=1, max_retries=0)
def host_task(*args):
    """One host of a trial, in a worker process Ray starts for it."""
    yield from _host(*args)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class Spare:
    """A process started ahead, while other trials run, for the next trial's one host on the local Ray this
    driver started (starts_ahead): that trial does not wait for a Python process and Ray to start. It runs that
    one host and nothing else, and goes with its attempt: a fresh process per trial, as host_task's. It takes
    no CPU from Ray's count: on the local Ray the executor's concurrency bounds the trials."""

    @ray.method(num_returns="streaming")
    def host(self, *args):
        yield from _host(*args)


def starts_ahead(cluster: Any) -> bool:
    """Whether a trial's host may run in a Spare: one host, no placement group, on a Ray this driver started."""
    return cluster.kind == "local" and not cluster.address and cluster.hosts_per_trial == 1


def stop(spare: Any) -> None:
    """End a Spare's process (its trial's, or one no trial took)."""
    try:
        ray.kill(spare)
    except Exception:  # noqa: BLE001 - gone already
        pass


@dataclass
class Event:
    trial_id: str
    attempt: int
    kind: str  # "placed" | "host" | "records" | "outcome"
    records: list[Record] = field(default_factory=list)  # "records": the job's, typed
    info: list[dict[str, Any]] = field(default_factory=list)  # "placed": the placement; "host": host records
    outcome: Outcome | str = ""
    error: str = ""


class Cancelled(Exception):
    pass


class Attempt:
    """One attempt of one trial: its slice reservation(s), host tasks, and reader threads.

    Everything blocking (waiting for a free slice, the hosts' streams) happens on the trial's own thread,
    so the executor loop never waits on one trial. Every exit path releases the placement groups."""

    def __init__(self, spec: TrialSpec, attempt: int, events: queue.Queue, spare: Any = None):
        self.spec, self.attempt, self.events = spec, attempt, events
        self.spare = spare  # a Spare to run the one host in (starts_ahead), else Ray starts a process
        self.lock = threading.Lock()
        self.cancelled = self.stopping = False
        self.reservation = Reservation(spec.cluster, self._check)
        self.refs: list = []
        self.errors: list[tuple[int, BaseException]] = []
        self.first_error = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"trial-{spec.trial_id}")
        self.thread.start()

    def _emit(self, kind: str, **kw) -> None:
        self.events.put(Event(self.spec.trial_id, self.attempt, kind, **kw))

    # --- the attempt, on its own thread -----------------------------------------------------------
    def _run(self) -> None:
        outcome, error = Outcome.FINISHED, ""
        try:
            self._launch(self._place())
            outcome, error = self._wait()
        except Cancelled:
            outcome = Outcome.CANCELLED
        except Exception as e:  # noqa: BLE001 - every failure becomes a typed outcome
            # ValueError: no such topology / accelerator here; anything else from placement is Ray's
            outcome = (
                Outcome.CANCELLED
                if self.cancelled
                else Outcome.INFEASIBLE
                if isinstance(e, ValueError)
                else classify(e)
            )
            error = f"{type(e).__name__}: {e}"
        finally:
            self.release()
        self._emit(
            "outcome",
            outcome=Outcome.CANCELLED if self.cancelled else outcome,
            error=" ".join(error.split())[-4000:],
        )

    def _check(self) -> None:
        if self.cancelled:
            raise Cancelled

    def _place(self) -> Placed:
        """Reserve the trial's slices whole (all-or-nothing placement groups) and order its hosts."""
        placed = self.reservation.place()
        self._emit("placed", info=[placed.record])
        return placed

    def _launch(self, placed: Placed) -> None:
        c, n = self.spec.cluster, len(placed.strategies)
        opts: dict[str, Any] = {"num_cpus": 1, **placed.options}
        env = task_env(c)  # nothing on the local Ray this driver started: it has it job-wide
        with self.lock:
            self._check()
            for pid, strat in enumerate(placed.strategies):
                o = dict(opts) | ({"scheduling_strategy": strat} if strat is not None else {})
                # set at process start, before jax: a TPU runtime reads MEGASCALE_* when its backend starts
                if host_env := env | placed.envs[pid]:
                    o["runtime_env"] = {"env_vars": host_env}
                args = (self.spec.to_json(), pid, n, placed.coordinator, placed.envs[pid])
                if self.spare is not None and placed.strategies == [None] and not host_env:
                    self.refs.append(self.spare.host.remote(*args))
                else:
                    self.refs.append(host_task.options(**o).remote(*args))
        self.readers = [
            threading.Thread(target=self._drain, args=(pid, gen), daemon=True, name=f"host-{pid}")
            for pid, gen in enumerate(self.refs)
        ]
        for t in self.readers:
            t.start()

    def _drain(self, pid: int, gen) -> None:
        try:
            for ref in gen:
                batch = ray.get(ref)
                if hosts := [r for r in batch if r.get("kind") == "host"]:
                    self._emit("host", info=hosts)
                # typed at this seam, once; a newer job's kinds are skipped
                if records := parse_known(r for r in batch if r.get("kind") != "host"):
                    self._emit("records", records=records)
        except Exception as e:  # noqa: BLE001 - judged in _wait
            with self.lock:
                if not self.stopping:  # errors after our own cancel are ours, not the cause
                    self.errors.append((pid, e))
            self.first_error.set()

    def _wait(self) -> tuple[Outcome, str]:
        while not self.first_error.wait(0.5) and any(t.is_alive() for t in self.readers):
            pass
        if self.first_error.is_set():
            deadline = time.monotonic() + GRACE_S
            for t in self.readers:
                t.join(max(deadline - time.monotonic(), 0))
            self._stop_hosts()
            for t in self.readers:
                t.join(30)
        if not self.errors:
            return Outcome.FINISHED, ""
        outcome = combine([classify(e) for _, e in self.errors])
        error = "; ".join(f"host {pid}: {type(e).__name__}: {e}" for pid, e in self.errors)
        return outcome, error

    # --- control, from the executor's thread ------------------------------------------------------
    def _stop_hosts(self) -> None:
        with self.lock:
            self.stopping = True
            refs = list(self.refs)
        if self.spare is not None:  # an actor's task is not force-cancelled: its process goes
            stop(self.spare)
        for r in refs:
            try:
                ray.cancel(r, force=True)
            except Exception:  # noqa: BLE001 - already finished, or the Spare's
                pass

    def request_cancel(self) -> None:
        self.cancelled = True
        self._stop_hosts()

    def cancel(self, wait_s: float = 10.0) -> None:
        """Stop the attempt and free its slice (waits briefly so no placement group outlives Ctrl-C)."""
        self.request_cancel()
        self.thread.join(wait_s)
        self.release()

    def release(self) -> None:
        self.reservation.release()
        if self.spare is not None:
            stop(self.spare)


class Outcome(StrEnum):
    FINISHED = "finished"
    PREEMPTED = "preempted"  # a host or node died, or a host failed only because its peer vanished
    FAILED = "failed"  # an exception in the job
    INFEASIBLE = "infeasible"  # out of memory: never retried
    CANCELLED = "cancelled"  # Ctrl-C


INFEASIBLE_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
# A job exception caused by a lost peer (gloo / coordination service) is the peer's preemption, not a bug. So is
# a peer that came too late to a new gloo communicator: XLA's CPU runtime gives it a fixed 30 s (no flag), which
# a host starved of CPU can miss.
PEER_LOST_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "stopped sending heartbeats",
    "Gloo context initialization failed",
)


def classify(err: BaseException) -> Outcome:
    """Typed outcome of an exception from a host task."""
    text = f"{err} {getattr(err, 'cause', '')}"
    if isinstance(err, ray.exceptions.OutOfMemoryError) or any(m in text for m in INFEASIBLE_MARKERS):
        return Outcome.INFEASIBLE
    if isinstance(err, ray.exceptions.TaskCancelledError):
        return Outcome.CANCELLED
    if isinstance(err, ray.exceptions.RayTaskError):
        return Outcome.PREEMPTED if any(m in text for m in PEER_LOST_MARKERS) else Outcome.FAILED
    # worker or node died, task lost with its node: the slice is gone, not the code
    return Outcome.PREEMPTED


def combine(outcomes: list[Outcome]) -> Outcome:
    """One trial outcome from its hosts': a lost host explains its peers' errors; OOM beats a crash."""
    for o in (Outcome.PREEMPTED, Outcome.INFEASIBLE, Outcome.FAILED, Outcome.CANCELLED):
        if o in outcomes:
            return o
    return Outcome.FINISHED


def budget(retries: Any, outcome: Outcome) -> int:
    """Retries a trial may take for this kind of outcome: `retries` is the config's (config/schema.Retries)."""
    return {Outcome.PREEMPTED: retries.preemption, Outcome.FAILED: retries.failure}.get(outcome, 0)
