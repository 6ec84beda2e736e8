"""Where trials run: a local Ray, a local Ray whose nodes pose as TPU slices or GPU nodes, or an existing
cluster (TPU slices, GPU nodes). The one place a Ray is started or joined: for a sweep's trials (`connect`) and
for work that needs CPUs, not slices, such as the AOT compile pool (`join_or_start`)."""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from jobs import faults
from jobs.hardware import CPU_PEAK_ENV
from jobs.spec import ClusterSpec
from orchestrator import REPO

log = logging.getLogger(__name__)
ROOT = REPO
TPU_KINDS = ("tpu", "fake_tpu")
GPU_KINDS = ("gpu", "fake_gpu")  # a GPU node is a one-host slice: NVLink inside it, the network between nodes
FAKE_KINDS = ("fake_tpu", "fake_gpu")  # this driver starts the cluster itself
LOCAL_KINDS = ("local", "local_multihost")  # one local Ray, the trial's hosts its processes

# Ray's own settings, unless the environment sets them, for the Ray this driver starts or joins. Ray's log
# monitor (of a Ray this driver starts) streams workers' output to drivers, and no driver here takes it
# (log_to_driver=False); left at its defaults it globs the log folder ten times a second, 3.6 of an idle local
# Ray's 6 CPU-seconds a minute. It looks for new files every 10 s instead.
RAY_ENV_DEFAULTS = {
    "RAY_DEDUP_LOGS": "0",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "10",
}

SLICE_LABEL = "ray.io/tpu-slice-name"
WORKER_LABEL = "ray.io/tpu-worker-id"

_fake = None  # the fake-TPU or fake-GPU ray.cluster_utils.Cluster this driver started, if any
_job_env: dict[str, str] | None = None  # the workers' environment of the local Ray this driver started


def fake_slice_env(cluster: ClusterSpec, slice_index: int, worker: int) -> dict[str, str]:
    """What GKE sets on a TPU host; Ray derives the TPU resources and slice labels from it."""
    from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology

    pod_type = infer_tpu_pod_type_from_topology(cluster.topology, cluster.accelerator)
    return {
        "TPU_ACCELERATOR_TYPE": pod_type,
        "TPU_TOPOLOGY": cluster.topology,
        "TPU_NAME": f"fake-slice-{slice_index}",
        "TPU_WORKER_ID": str(worker),
    }


def start_fake_tpu(cluster: ClusterSpec):
    """A local multi-node Ray cluster: `slices` x `hosts` nodes advertising TPU resources and labels
    exactly as GKE TPU hosts do, so the real slice-reservation path runs on CPU."""
    from ray.cluster_utils import Cluster

    with _no_address_file():
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    saved = {
        k: os.environ.get(k) for k in ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_NAME", "TPU_WORKER_ID")
    }
    try:
        for s in range(cluster.slices):
            for w in range(cluster.hosts):
                env = fake_slice_env(cluster, s, w)
                # Ray's TPU detection reads the node starter's environment; env_vars reaches the raylet.
                os.environ.update(env)
                c.add_node(num_cpus=1, resources={"TPU": _chips_per_host(cluster)}, env_vars=env)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return c


def start_fake_gpu(cluster: ClusterSpec):
    """A local multi-node Ray cluster: `slices` nodes, each advertising `devices_per_host` GPUs, so the real
    GPU placement path (one STRICT_SPREAD bundle per node) runs on CPU; the hosts simulate the devices."""
    from ray.cluster_utils import Cluster

    with _no_address_file():
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(cluster.slices):
        c.add_node(num_cpus=1, num_gpus=cluster.devices_per_host)
    return c


@contextmanager
def _no_address_file() -> Iterator[None]:
    """ray.cluster_utils.Cluster writes /tmp/ray/ray_current_cluster, which would make every plain ray.init()
    on this machine (other users, other tests) join our fake slices. Ray has no public switch for it: the one
    private hook is swapped here (tests/test_scheduler.py fails loudly if it moves)."""
    utils = ray._private.utils
    real = utils.write_ray_address
    utils.write_ray_address = lambda *a, **k: None
    try:
        yield
    finally:
        utils.write_ray_address = real


def worker_env(cluster: ClusterSpec) -> dict[str, str]:
    """The environment of a trial's host processes: the cluster's host env, a shared compilation cache, the
    driver's pinned CPU matmul rate on a CPU cluster (its trials divide by the rate it plans with), and the
    driver's test-only fault injection (jobs/faults.py), if any."""
    # A persistent compilation cache: retries, resumed sweeps and nightly re-runs skip identical compiles.
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "cp-orchestrator-jax-cache"
    )
    injected = {k: os.environ[k] for k in faults.ENV if k in os.environ}
    if cluster.platform == "cpu" and CPU_PEAK_ENV in os.environ:
        injected[CPU_PEAK_ENV] = os.environ[CPU_PEAK_ENV]
    return {"PYTHONUNBUFFERED": "1", "JAX_COMPILATION_CACHE_DIR": cache} | injected | cluster.host_env()


def task_env(cluster: ClusterSpec) -> dict[str, str]:
    """What a trial's host task carries in its own runtime_env. A local Ray this driver started has the workers'
    environment job-wide, so Ray can start worker processes ahead of the trials (a per-task runtime_env makes
    every fresh max_calls=1 worker start cold): there, only what differs from it, usually nothing. Any other
    Ray (a remote or fake cluster, or one that was up before, as in a notebook or a test session): all of it."""
    env = worker_env(cluster)
    if _job_env is not None and not cluster.address and cluster.kind in LOCAL_KINDS:
        return {k: v for k, v in env.items() if _job_env.get(k) != v}
    return env


def _chips_per_host(cluster: ClusterSpec) -> int:
    from ray._private.accelerators.tpu import get_chips_per_host

    return get_chips_per_host(cluster.topology, cluster.accelerator)


def _prepare() -> None:
    """This driver's environment for a Ray it starts or joins: RAY_ENV_DEFAULTS, and PYTHONPATH naming the
    repository, since workers import jobs/ and orchestrator/ (host_task lives there) and a local Ray's workers
    inherit it."""
    for name, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths if str(ROOT) in paths else [str(ROOT), *paths])


def _start_local(cpus: int, env: dict[str, str] | None = None) -> None:
    """A local Ray of `cpus` CPUs, its workers' environment `env` job-wide. address="local": never whichever
    cluster /tmp/ray/ray_current_cluster names."""
    runtime_env = {"env_vars": env} if env else None
    ray.init(
        address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env
    )


def connect(cluster: ClusterSpec) -> None:
    """Start (local, local_multihost, fake_tpu, fake_gpu) or join (tpu, gpu, address) the Ray cluster for
    `cluster`."""
    global _fake, _job_env
    if ray.is_initialized():
        return
    _prepare()
    if cluster.kind in FAKE_KINDS and not cluster.address:
        _fake = (start_fake_tpu if cluster.kind == "fake_tpu" else start_fake_gpu)(cluster)
        atexit.register(shutdown)  # the driver must leave the cluster before its head node can go
        ray.init(address=_fake.address, log_to_driver=False)
    elif cluster.address:
        # A remote cluster gets this checkout's code; its own environment supplies the packages.
        import jobs
        import orchestrator

        mods = [str(Path(m.__file__).parent) for m in (jobs, orchestrator)]
        ray.init(address=cluster.address, log_to_driver=False, runtime_env={"py_modules": mods})
    else:
        cpus = max(os.cpu_count() or 2, cluster.hosts_per_trial * max(cluster.concurrency, 1))
        # The workers' environment is the job's, so Ray can start worker processes ahead of the trials
        # (a per-task runtime_env would make every fresh max_calls=1 worker start cold).
        env = worker_env(cluster)
        _start_local(cpus, env)
        _job_env = env


def join_or_start(cluster: ClusterSpec, cpus: int = 0) -> None:
    """The Ray for work that needs CPUs, not slices (the AOT compile pool, orchestrator/plan/aot/pool.py): the
    one this process is connected to; else the cluster's, joined as a sweep joins it, where it names an address
    (address=auto only when one is running); else a local Ray of `cpus` CPUs (0: one per core). Never a fake
    cluster of slices."""
    if ray.is_initialized():
        return
    if cluster.address:
        try:
            connect(cluster)
            return
        except ConnectionError:
            if cluster.address != "auto":  # an address that was named must answer
                raise
            log.info("address=auto: no Ray running; starting a local one")
    _prepare()
    _start_local(cpus or os.cpu_count() or 1)


def shutdown() -> None:
    global _fake, _job_env
    ray.shutdown()
    _job_env = None
    if _fake is not None:
        _fake.shutdown()
        _fake = None


def slice_names() -> list[str]:
    """Distinct TPU slices among the cluster's alive nodes (by the label Ray sets from TPU_NAME)."""
    names = set()
    for n in ray.nodes():
        if n.get("Alive"):
            name = (n.get("Labels") or {}).get(SLICE_LABEL)
            if name:
                names.add(name)
    return sorted(names)


def gpu_nodes(gpus: int = 1) -> int:
    """Alive nodes of the cluster with at least `gpus` GPUs (a trial's host takes a whole node's)."""
    return sum(1 for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("GPU", 0) >= gpus)


def concurrency(cluster: ClusterSpec) -> int:
    """Trials at once: the configured number, else one per slices_per_trial slices (TPU) or nodes (GPU),
    counted on the cluster once Ray is up."""
    if cluster.concurrency:
        return cluster.concurrency
    slices = cluster.slices
    if cluster.kind in TPU_KINDS and ray.is_initialized():
        slices = len(slice_names())
    elif cluster.kind in GPU_KINDS and ray.is_initialized():
        slices = gpu_nodes(cluster.devices_per_host)
    return max(slices // cluster.slices_per_trial, 1)
