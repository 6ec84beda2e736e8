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

log = logging.getLogger(__name__)
FINISHED, PREEMPTED, FAILED, INFEASIBLE, CANCELLED = "finished", "preempted", "failed", "infeasible", "cancelled"
INFEASIBLE_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


@ray.remote(num_returns="streaming", max_calls=1)
def host_task(spec_json: str, process_id: int, num_processes: int, coordinator: str, batch_s: float = 0.5):
    """One JAX process of a trial (fresh worker: max_calls=1). Only process 0 yields record batches."""
    from jobs.spec import TrialSpec as _Spec
    from jobs.train import init_distributed, train

    init_distributed(coordinator, num_processes, process_id)
    buf, last = [], time.monotonic()
    for rec in train(_Spec.from_json(spec_json)):
        buf.append(rec)
        if rec["kind"] != "step" or time.monotonic() - last > batch_s:
            yield buf
            buf, last = [], time.monotonic()
    if buf:
        yield buf


@ray.remote(num_cpus=0)
def _host_address() -> str:
    """Runs on host 0's node: a free port there for the jax.distributed coordinator."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


def worker_env(cluster: ClusterSpec) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    if cluster.platform == "cpu":
        env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={cluster.devices_per_host}"}
    return env


def classify(err: BaseException) -> str:
    """Typed outcome of an exception from a host task."""
    text = str(err)
    if any(m in text for m in INFEASIBLE_MARKERS):
        return INFEASIBLE
    if isinstance(err, ray.exceptions.RayTaskError):
        return FAILED
    # worker or node died, task lost with its node: the slice is gone, not the code
    return PREEMPTED


@dataclass
class Event:
    trial_id: str
    attempt: int
    kind: str  # "records" | "outcome"
    records: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = ""
    error: str = ""


class Trial:
    """A launched attempt of one trial: host tasks, their placement group, a reader thread."""

    def __init__(self, spec: TrialSpec, attempt: int, events: queue.Queue):
        self.spec, self.attempt, self.events = spec, attempt, events
        self.pg = None
        self.refs: list = []
        self.cancelled = False
        c = spec.cluster
        opts: dict[str, Any] = {"runtime_env": {"env_vars": worker_env(c)}, "num_cpus": 1}
        if c.hosts > 1 or c.kind in ("tpu", "fake_tpu"):
            self.pg = self._reserve_slice(c)
            strategies = [PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i) for i in range(c.hosts)]
            coordinator = ray.get(_host_address.options(scheduling_strategy=strategies[0]).remote())
        else:
            strategies, coordinator = [None], ""
        if c.kind in ("tpu", "fake_tpu"):
            opts["resources"] = {"TPU": c.devices_per_host if c.platform == "tpu" else 4}
        for pid, strat in enumerate(strategies):
            o = dict(opts)
            if strat is not None:
                o["scheduling_strategy"] = strat
            self.refs.append(host_task.options(**o).remote(spec.to_json(), pid, c.hosts, coordinator))
        self.thread = threading.Thread(target=self._read, daemon=True, name=f"trial-{spec.trial_id}")
        self.thread.start()

    @staticmethod
    def _reserve_slice(c: ClusterSpec):
        if c.kind in ("tpu", "fake_tpu"):
            from ray.util.tpu import slice_placement_group

            spg = slice_placement_group(topology=c.topology, accelerator_version=c.accelerator)
            pg = spg.placement_group
        else:
            pg = placement_group([{"CPU": 1}] * c.hosts, strategy="PACK")
        ray.get(pg.ready())
        return pg

    def _read(self) -> None:
        outcome, error = FINISHED, ""
        try:
            for ref in self.refs[0]:
                self.events.put(Event(self.spec.trial_id, self.attempt, "records", records=ray.get(ref)))
            for other in self.refs[1:]:
                for ref in other:  # non-lead hosts yield nothing; this waits for them and raises their errors
                    ray.get(ref)
        except Exception as e:  # noqa: BLE001 - every failure becomes a typed outcome
            outcome = CANCELLED if self.cancelled else classify(e)
            error = " ".join(str(e).split())[-2000:]
        finally:
            self.release()
        self.events.put(Event(self.spec.trial_id, self.attempt, "outcome", outcome=outcome, error=error))

    def cancel(self) -> None:
        self.cancelled = True
        for r in self.refs:
            try:
                ray.cancel(r, force=True)
            except Exception:  # noqa: BLE001 - already finished
                pass
        self.release()

    def release(self) -> None:
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
            self.pg = None


def connect(cluster: ClusterSpec) -> None:
    """Start a local Ray (cluster.address == "") or join an existing one."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if cluster.address:
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        ray.init(num_cpus=max(os.cpu_count() or 2, cluster.hosts + 1), include_dashboard=False, log_to_driver=False)
