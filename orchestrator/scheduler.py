"""Ray scheduling: a trial is one task per host in fresh processes, gang-started on one slice.

Host 0 streams metric-record batches back (a streaming generator task); the driver alone talks to
MLflow. Outcomes are typed so preemption and failure get separate retry budgets.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from jobs.spec import ClusterSpec, TrialSpec
from orchestrator import cluster as clusters
from orchestrator.outcomes import Outcome, classify, combine

log = logging.getLogger(__name__)
GRACE_S = 2.0  # after a host's error, how long the others get to report their own cause before we cancel
SLICE_WAIT_S = 60.0  # a reserved slice head whose workers stay busy this long is released and re-chosen


def host_info(process_id: int) -> dict[str, Any]:
    """Who and where this host process is: the placement record, and the pid a fault test kills."""
    labels = ray.get_runtime_context().get_node_labels() or {}
    return {
        "kind": "host",
        "process_id": process_id,
        "pid": os.getpid(),
        "t": time.time(),  # when the host process started running the task (scheduling overhead)
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "slice": labels.get(clusters.SLICE_LABEL) or os.environ.get("TPU_NAME", ""),
        "worker_id": labels.get(clusters.WORKER_LABEL) or os.environ.get("TPU_WORKER_ID", ""),
    }


# max_calls=1: every trial gets fresh processes (libtpu's lockfile, a clean jax.distributed).
# max_retries=0: a lone host retried by Ray could never rejoin its gang; the executor retries the whole trial.
@ray.remote(num_returns="streaming", max_calls=1, max_retries=0)
def host_task(spec_json: str, process_id: int, num_processes: int, coordinator: str, batch_s: float = 0.5):
    """One JAX process of a trial. Every host first yields its host record; only process 0 yields metrics."""
    yield [host_info(process_id)]
    from jobs.spec import TrialSpec as _Spec
    from jobs.train import init_distributed, train

    init_distributed(coordinator, num_processes, process_id)
    buf, last, first = [], time.monotonic(), True
    for rec in train(_Spec.from_json(spec_json)):
        buf.append(rec)
        # the first step goes out at once: "submit -> first step" should not wait on batching
        if rec["kind"] != "step" or first or time.monotonic() - last > batch_s:
            first = first and rec["kind"] != "step"
            yield buf
            buf, last = [], time.monotonic()
    if buf:
        yield buf


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> dict[str, str]:
    """Runs in one bundle of the slice: the node's TPU worker id and a free port for the coordinator."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    info = host_info(-1)
    return {"address": f"{info['node_ip']}:{port}", "worker_id": info["worker_id"], "slice": info["slice"]}


@dataclass
class Event:
    trial_id: str
    attempt: int
    kind: str  # "placed" | "host" | "records" | "outcome"
    records: list[dict[str, Any]] = field(default_factory=list)
    outcome: Outcome | str = ""
    error: str = ""


class Cancelled(Exception):
    pass


_reserved: set = set()  # every placement group this driver created, to prove none outlives a cancel


def live_placement_groups() -> int:
    """How many placement groups this driver created are still reserved (not REMOVED)."""
    table = ray.util.placement_group_table()
    return sum(table.get(pid.hex(), {}).get("state", "REMOVED") != "REMOVED" for pid in _reserved)


class Attempt:
    """One attempt of one trial: its slice reservation, host tasks, and reader threads.

    Everything blocking (waiting for a free slice, the hosts' streams) happens on the trial's own thread,
    so the executor loop never waits on one trial. Every exit path releases the placement groups."""

    def __init__(self, spec: TrialSpec, attempt: int, events: queue.Queue):
        self.spec, self.attempt, self.events = spec, attempt, events
        self.lock = threading.Lock()
        self.cancelled = self.stopping = False
        self.spg = None  # SlicePlacementGroup (TPU kinds)
        self.pg = None  # plain placement group (local_multihost)
        self.refs: list = []
        self.coordinator = ""  # host 0's address for jax.distributed (multi-host only)
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
            strategies, opts = self._place()
            self._launch(strategies, opts)
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

    def _place(self) -> tuple[list, dict[str, Any]]:
        """Reserve the trial's slice whole (a placement group is all-or-nothing) and order its hosts."""
        c = self.spec.cluster
        opts: dict[str, Any] = {"num_cpus": 1}
        if c.address or c.kind not in (
            "local",
            "local_multihost",
        ):  # a local Ray has it job-wide (cluster.py)
            opts["runtime_env"] = {"env_vars": clusters.worker_env(c)}
        if c.kind in clusters.TPU_KINDS:
            pg = self._reserve_tpu_slice(c)
            res = dict(self.spg.bundle_resources)
            opts["num_cpus"] = res.pop("CPU", 1)
            opts["resources"] = res
        elif c.hosts > 1:
            with self.lock:
                self._check()
                self.pg = pg = placement_group([{"CPU": 1}] * c.hosts, strategy="PACK")
                _reserved.add(pg.id)
            while not ray.wait([pg.ready()], timeout=1.0)[0]:
                self._check()
        else:
            self._emit("placed", records=[{"slice": "", "n_hosts": 1}])
            return [None], opts
        bundles = [
            PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i) for i in range(c.hosts)
        ]
        probes = ray.get([_probe.options(scheduling_strategy=b).remote() for b in bundles])
        # On a TPU slice the process id must be the host's TPU_WORKER_ID (libtpu's own numbering).
        order = list(range(c.hosts))
        if all(p["worker_id"].isdigit() for p in probes):
            order = sorted(order, key=lambda i: int(probes[i]["worker_id"]))
        self.coordinator = probes[order[0]]["address"]
        self._emit("placed", records=[{"slice": probes[0]["slice"], "n_hosts": c.hosts}])
        return [bundles[i] for i in order], opts

    def _reserve_tpu_slice(self, c: ClusterSpec):
        from ray.util.tpu import slice_placement_group

        while True:
            self._check()
            try:
                spg = slice_placement_group(
                    topology=c.topology, accelerator_version=c.accelerator, head_reservation_timeout_s=2.0
                )
            except TimeoutError:
                continue  # every slice head is held by a running trial: keep queueing
            with self.lock:
                self.spg = spg
                _reserved.update(pg.id for pg in [spg.placement_group, *spg.head_placement_groups])
            if self.cancelled:
                raise Cancelled
            # The head reservation names a slice; its workers may still be busy (or lost): wait, then re-choose.
            deadline = time.monotonic() + SLICE_WAIT_S
            while time.monotonic() < deadline:
                if ray.wait([spg.placement_group.ready()], timeout=1.0)[0]:
                    return spg.placement_group
                self._check()
            log.warning(
                "slice %s not schedulable in %.0f s; choosing again", spg.bundle_label_selector, SLICE_WAIT_S
            )
            self.release()

    def _launch(self, strategies: list, opts: dict[str, Any]) -> None:
        n = len(strategies)
        with self.lock:
            self._check()
            for pid, strat in enumerate(strategies):
                o = dict(opts) | ({"scheduling_strategy": strat} if strat is not None else {})
                args = (self.spec.to_json(), pid, n, self.coordinator)
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
                hosts = [r for r in batch if r.get("kind") == "host"]
                rest = [r for r in batch if r.get("kind") != "host"]
                if hosts:
                    self._emit("host", records=hosts)
                if rest:
                    self._emit("records", records=rest)
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
        for r in refs:
            try:
                ray.cancel(r, force=True)
            except Exception:  # noqa: BLE001 - already finished
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
        with self.lock:
            spg, pg, self.spg, self.pg = self.spg, self.pg, None, None
        if spg is not None:
            spg.shutdown()  # the worker placement group and the slice-head reservation
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
