"""Reserving a trial's hosts on Ray, all or nothing: whole TPU slices (one or several, for a multislice
trial), whole GPU nodes (one bundle per node), or one placement group of local processes; then the hosts'
process ids, coordinator and environment.

Every placement group created here is recorded, so tests (and Ctrl-C) can prove none outlives its trial.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    stop_never,
)

from jobs.spec import ClusterSpec
from orchestrator.launch.cluster import (
    GPU_KINDS,
    SLICE_LABEL,
    TPU_KINDS,
    WORKER_LABEL,
    gpu_nodes,
    slice_names,
)

log = logging.getLogger(__name__)
SLICE_WAIT_S = 60.0  # a reserved slice head whose workers stay busy this long is released and re-chosen
MEGASCALE_PORT = "8081"  # Ray's DEFAULT_MEGASCALE_PORT (what Ray Train's JaxTrainer sets)

_reserved: set = set()  # every placement group this driver created, to prove none outlives a cancel


def reserved() -> frozenset:
    """The ids of every placement group this driver has created."""
    return frozenset(_reserved)


def live_placement_groups(ids: Iterable | None = None) -> int:
    """How many placement groups this driver created (or of `ids`, some of them) are still reserved (not
    REMOVED)."""
    table = ray.util.placement_group_table()
    among = _reserved if ids is None else ids
    return sum(table.get(pid.hex(), {}).get("state", "REMOVED") != "REMOVED" for pid in among)


# Set per attempt, never inherited: a node's environment can hold them from an earlier job or a `ray start` under
# an old multislice config, and a stale MEGASCALE_* makes the TPU runtime wait for slices that are gone (Ray
# #62893). JAX_COORDINATOR_* and friends would steer jax.distributed's auto-detection likewise, and a stale
# JAX_LOCAL_DEVICE_IDS would hide a GPU node's other devices.
ATTEMPT_ENV_PREFIXES = (
    "MEGASCALE_",
    "JAX_COORDINATOR_",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "JAX_LOCAL_DEVICE_IDS",
)


def clean_env(own: dict[str, str]) -> list[str]:
    """Drop the per-attempt variables this process inherited but its attempt did not set (`own`); returns
    their names. Runs first in a host task, before jax and its backend start."""
    stale = sorted(k for k in os.environ if k.startswith(ATTEMPT_ENV_PREFIXES) and k not in own)
    for k in stale:
        del os.environ[k]
    os.environ.update(own)
    return stale


def host_info(process_id: int, slice_id: int = 0, scrubbed: list[str] | None = None) -> dict[str, Any]:
    """Who and where this host process is: the placement record, and the pid a fault test kills."""
    labels = ray.get_runtime_context().get_node_labels() or {}
    return {
        "kind": "host",
        "process_id": process_id,
        "slice_id": slice_id,  # the trial's slice this process belongs to (0 on a one-slice trial)
        "pid": os.getpid(),
        "t": time.time(),  # when the host process started running the task (scheduling overhead)
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "slice": labels.get(SLICE_LABEL) or os.environ.get("TPU_NAME", ""),
        "worker_id": labels.get(WORKER_LABEL) or os.environ.get("TPU_WORKER_ID", ""),
        # what the TPU runtime will read to join the slices over DCN (empty on one slice)
        "megascale": {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")},
        "gpus": ray.get_runtime_context().get_accelerator_ids().get("GPU", []),  # the GPUs Ray gave this task
        "scrubbed": scrubbed or [],  # inherited per-attempt variables removed before jax started
    }


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> dict[str, str]:
    """Runs in one bundle: the node's address with a free port (the coordinator's), TPU worker id and slice."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    info = host_info(-1)
    return {
        "address": f"{info['node_ip']}:{port}",
        "ip": info["node_ip"],
        "worker_id": info["worker_id"],
        "slice": info["slice"],
        "node_id": info["node_id"],
    }


@dataclass
class Placed:
    """Where a trial's processes run, indexed by JAX process id (slice-major, TPU worker id within a slice)."""

    strategies: list  # scheduling strategy per process (None: no placement group, one local process)
    coordinator: str = ""  # process 0's ip:port for jax.distributed (multi-host only)
    envs: list[dict[str, str]] = field(default_factory=list)  # extra env per process (MEGASCALE_* on TPUs)
    options: dict[str, Any] = field(default_factory=dict)  # task resources of one bundle (TPU slices)
    record: dict[str, Any] = field(default_factory=dict)  # the attempt's "placed" event


def megascale_env(coordinator_ip: str, slices: int, slice_id: int) -> dict[str, str]:
    """What a TPU runtime needs to join `slices` slices over DCN (as ray.util.tpu.get_tpu_coordinator_env_vars,
    with the port on the address as well)."""
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:{MEGASCALE_PORT}",
        "MEGASCALE_PORT": MEGASCALE_PORT,
        "MEGASCALE_NUM_SLICES": str(slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }


def gpu_env(devices: int) -> dict[str, str]:
    """A GPU host's attempt variables: its local devices (all Ray gave the task, renumbered from 0 under
    CUDA_VISIBLE_DEVICES). With them jax.distributed has all four parameters and skips cluster auto-detection,
    whose SLURM or Open MPI variables on a node would give each process only the GPU of its local rank."""
    return {"JAX_LOCAL_DEVICE_IDS": ",".join(map(str, range(devices)))}


def gpu_bundles(cluster: ClusterSpec) -> tuple[list[dict[str, float]], str]:
    """A GPU trial's placement group: one bundle per node holding all its GPUs, each on its own node
    (STRICT_SPREAD), which Ray grants whole or not at all."""
    return [{"GPU": cluster.devices_per_host, "CPU": 1}] * cluster.hosts_per_trial, "STRICT_SPREAD"


def host_order(probes: list[dict[str, str]], hosts: int) -> list[int]:
    """Bundle index of each process id: slices in bundle order (the order they were reserved), and within a
    slice by TPU_WORKER_ID where the nodes have one (libtpu's own numbering), else in bundle order."""
    order = []
    for s in range(len(probes) // hosts):
        in_slice = list(range(s * hosts, (s + 1) * hosts))
        if all(probes[i]["worker_id"].isdigit() for i in in_slice):
            in_slice.sort(key=lambda i: int(probes[i]["worker_id"]))
        order += in_slice
    return order


class Reservation:
    """The placement groups of one attempt. `check` raises when the attempt is cancelled; release() may be
    called from any thread, any number of times, and frees whatever was reserved so far."""

    def __init__(self, cluster: ClusterSpec, check: Callable[[], None]):
        self.cluster, self.check = cluster, check
        self.lock = threading.Lock()
        self.spg = None  # SlicePlacementGroup over slices_per_trial slices (TPU kinds)
        self.pg = None  # plain placement group (local_multihost, GPU nodes)

    def place(self) -> Placed:
        """Reserve the trial's hosts whole, then order them and give each its environment."""
        c = self.cluster
        n = c.hosts_per_trial
        options: dict[str, Any] = {}
        if c.kind in TPU_KINDS:
            pg, res = self._reserve_tpu_slices()
            options = {"num_cpus": res.pop("CPU", 1), "resources": res}
        elif c.kind in GPU_KINDS:
            pg = self._reserve_gpu_nodes()
            options = {"num_gpus": c.devices_per_host}
        elif n > 1:
            pg = self._reserve([{"CPU": 1}] * n, "PACK")
        else:
            return Placed([None], envs=[{}], record={"slice": "", "n_hosts": 1})
        bundles = [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i) for i in range(n)]
        probes = ray.get([_probe.options(scheduling_strategy=b).remote() for b in bundles])
        order = host_order(probes, c.hosts)
        first = probes[order[0]]
        envs: list[dict[str, str]] = [{} for _ in order]
        if c.kind in TPU_KINDS and c.slices_per_trial > 1:
            envs = [megascale_env(first["ip"], c.slices_per_trial, pid // c.hosts) for pid in range(n)]
        names = list(dict.fromkeys(probes[i]["slice"] for i in order if probes[i]["slice"]))
        if c.kind in GPU_KINDS:  # a GPU node is one of its trial's slices: named by the node
            envs = [gpu_env(c.devices_per_host) for _ in order]
            names = [f"node-{probes[i]['node_id'][:8]}" for i in order]
        # probed afresh for every attempt: a retry never dials the coordinator port of the attempt it replaces
        record = {
            "slice": "+".join(names),
            "n_hosts": n,
            "n_slices": c.slices_per_trial,
            "coordinator": first["address"],
        }
        return Placed([bundles[i] for i in order], first["address"], envs, options, record)

    def _reserve(self, bundles: list[dict[str, float]], strategy: str):
        """One placement group, granted whole or not at all: queue (checking for cancel) until it is."""
        with self.lock:
            self.check()
            self.pg = pg = placement_group(bundles, strategy=strategy)
            _reserved.add(pg.id)
        self._until_ready(pg)
        return pg

    def _until_ready(self, pg, within_s: float | None = None) -> bool:
        """Wait for Ray to grant `pg`, looking for a cancel every second; False when `within_s` s pass first."""
        granted = lambda: bool(ray.wait([pg.ready()], timeout=1.0)[0])  # noqa: E731
        stop = stop_never if within_s is None else stop_after_delay(within_s)
        looks = Retrying(retry=retry_if_result(lambda ok: not ok), stop=stop, before=lambda _: self.check())
        try:
            return looks(granted)
        except RetryError:
            return False

    def _reserve_gpu_nodes(self):
        """hosts_per_trial whole GPU nodes (gpu_bundles), queueing while other trials hold them."""
        c = self.cluster
        # more nodes than the cluster has: the group would stay pending forever
        if c.hosts_per_trial > (have := gpu_nodes(c.devices_per_host)):
            raise ValueError(
                f"a trial needs {c.hosts_per_trial} GPU nodes of {c.devices_per_host} GPUs "
                f"(slices_per_trial={c.slices_per_trial}) but the cluster has {have}; "
                f"lower cluster.slices_per_trial or add nodes"
            )
        return self._reserve(*gpu_bundles(c))

    def _reserve_tpu_slices(self):
        """slices_per_trial whole slices in one placement group: Ray reserves each slice's head (one slice at
        a time, releasing those it got if one times out), then one group of every host of those slices, which
        it grants whole or not at all."""
        from ray.util.tpu import slice_placement_group

        c = self.cluster
        # more slices than the cluster has: the head reservations would time out and retry forever
        if c.slices_per_trial > 1 and c.slices_per_trial > (have := len(slice_names())):
            raise ValueError(
                f"a trial needs slices_per_trial={c.slices_per_trial} slices but the cluster has {have}; "
                f"lower cluster.slices_per_trial or add slices"
            )
        # not enough free slice heads (running trials hold them): keep queueing
        heads = Retrying(retry=retry_if_exception_type(TimeoutError), before=lambda _: self.check())
        while True:
            spg = heads(
                slice_placement_group,
                topology=c.topology,
                accelerator_version=c.accelerator,
                num_slices=c.slices_per_trial,
                head_reservation_timeout_s=2.0,
            )
            with self.lock:
                self.spg = spg
                _reserved.update(pg.id for pg in [spg.placement_group, *spg.head_placement_groups])
            # The heads name the slices; their workers may still be busy (or lost): wait, then re-choose.
            if self._until_ready(spg.placement_group, SLICE_WAIT_S):
                return spg.placement_group, dict(spg.bundle_resources)
            log.warning(
                "slices %s not schedulable in %.0f s; choosing again", spg.bundle_label_selector, SLICE_WAIT_S
            )
            self.release()

    def release(self) -> None:
        with self.lock:
            spg, pg, self.spg, self.pg = self.spg, self.pg, None, None
        if spg is not None:
            spg.shutdown()  # the worker placement group and every slice-head reservation
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
