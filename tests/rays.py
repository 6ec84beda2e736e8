"""One Ray at a time for the whole test session, each kind started once: the local Ray the in-process drivers
run their trials on (cluster=local, local_multihost and local_multislice alike), a fake TPU cluster and a fake
GPU cluster (ray.cluster_utils.Cluster nodes posing as TPU slices / GPU nodes).

A process is connected to one Ray at a time, so asking for another kind shuts the current one down first;
conftest.py orders the tests so that each kind starts once. Tests on a shared Ray assert on what they create
(their placement groups, their runs), never on a pristine cluster.
"""

from __future__ import annotations

import dataclasses
import os

import ray

from jobs.spec import ClusterSpec
from orchestrator.launch import placement
from orchestrator.launch.cluster import connect, shutdown
from orchestrator.plan import cluster_model

KINDS = ("local", "fake_tpu", "fake_gpu")  # the order conftest.py runs their tests in

# What a node can inherit from an old multislice job or `ray start` (Ray #62893): the fake nodes start with it in
# their environment, and an attempt must not see what it does not set itself.
FAKE_TPU_STALE_ENV = {
    "MEGASCALE_COORDINATOR_ADDRESS": "10.9.9.9:8081",
    "MEGASCALE_NUM_SLICES": "4",
    "MEGASCALE_SLICE_ID": "1",
    "MEGASCALE_TRANSPORT_TYPE": "grpc",
    "JAX_COORDINATOR_ADDRESS": "10.9.9.9:1234",
}
FAKE_GPU_STALE_ENV = {"JAX_COORDINATOR_ADDRESS": "10.9.9.9:1234", "JAX_LOCAL_DEVICE_IDS": "0"}


def cluster(kind: str) -> ClusterSpec:
    """The cluster a kind's Ray is started for: conf/cluster's local (with CPUs for local_multislice's four
    processes: connect() counts hosts_per_trial x concurrency), local_fake_tpu, local_fake_gpu."""
    if kind == "local":
        return dataclasses.replace(cluster_model.load("local")[0], concurrency=4)
    return cluster_model.load(f"local_{kind}")[0]


class PlacementGroups:
    """The placement groups this process creates from now on (orchestrator/launch/placement.py records each):
    `live()` counts those still reserved, so a test on the shared Ray counts its own, whatever an earlier
    test's trials hold or release meanwhile."""

    def __init__(self) -> None:
        self.before = placement.reserved()

    def live(self) -> int:
        return placement.live_placement_groups(placement.reserved() - self.before)


class Rays:
    """The session's Ray: `use(kind)` connects this process to that kind's (starting it if another kind, or
    nothing, is up) and returns its cluster; `release()` leaves none up."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.address = ""

    def use(self, kind: str) -> ClusterSpec:
        spec = cluster(kind)
        if self.kind == kind and ray.is_initialized() and self._address() == self.address:
            return spec
        self.release()
        stale = {"fake_tpu": FAKE_TPU_STALE_ENV, "fake_gpu": FAKE_GPU_STALE_ENV}.get(kind, {})
        saved = dict(os.environ)
        os.environ.update(stale)  # the fake nodes' raylets start with this process's environment
        try:
            connect(spec)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.kind, self.address = kind, self._address()
        return spec

    def release(self) -> None:
        """No Ray up in this process: ours shut down, and one a test started too (join_or_start's)."""
        shutdown()
        self.kind, self.address = None, ""

    @staticmethod
    def _address() -> str:
        return ray.get_runtime_context().gcs_address
