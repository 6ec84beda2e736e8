"""GPU nodes through Ray: a node is a one-host slice, a trial reserves its nodes whole (one STRICT_SPREAD
placement group, a bundle of every GPU of a node per host), and cluster.env reaches every host. On CPU through
`local_fake_gpu`: 2 local Ray nodes advertising 4 GPUs each, 4 simulated CPU devices per host process. A trial
over both nodes across a lost node is one of the two-slice trials in tests/test_multislice.py."""

import dataclasses
from types import SimpleNamespace

import pytest
from rays import PlacementGroups

from jobs.mesh import _knows_slice
from jobs.spec import ClusterSpec, TrialSpec
from orchestrator.config.grid import expand
from orchestrator.config.load import ConfigError, load
from orchestrator.launch import cluster
from orchestrator.launch.placement import gpu_bundles
from orchestrator.plan import cluster_model

FAKE_GPU = cluster_model.load("local_fake_gpu")[0]
LATENCY_HIDING = "--xla_gpu_enable_latency_hiding_scheduler=true"

# --- fast: the model of a GPU cluster, the placement group, cluster.env ------------------------------------


def test_a_gpu_node_is_a_one_host_slice_and_a_trial_reserves_whole_nodes(monkeypatch):
    c = FAKE_GPU
    # the configured arithmetic, before any Ray is up (the session's Ray may be another test's cluster)
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    assert (c.kind, c.platform, c.hosts, c.devices_per_host, c.slices, c.slices_per_trial) == (
        "fake_gpu",
        "cpu",
        1,
        4,
        2,
        1,
    )
    assert (c.hosts_per_trial, c.devices, cluster.concurrency(c)) == (1, 4, 2)  # Ray not up: slices // 1
    two = dataclasses.replace(c, slices_per_trial=2)
    assert (two.hosts_per_trial, two.devices, cluster.concurrency(two)) == (2, 8, 1)
    assert gpu_bundles(two) == ([{"GPU": 4, "CPU": 1}] * 2, "STRICT_SPREAD")
    h200s = ClusterSpec(kind="gpu", platform="gpu", hosts=1, devices_per_host=8, slices=4, slices_per_trial=3)
    assert gpu_bundles(h200s) == ([{"GPU": 8, "CPU": 1}] * 3, "STRICT_SPREAD")


def test_cluster_env_round_trips_through_the_spec_and_reaches_the_hosts():
    env = ["+cluster.env.NCCL_SOCKET_IFNAME=eth0", f"+cluster.env.XLA_FLAGS='{LATENCY_HIDING}'"]
    (spec,) = expand(load(["cluster=local_fake_gpu", *env]))
    assert spec.cluster.env == (("NCCL_SOCKET_IFNAME", "eth0"), ("XLA_FLAGS", LATENCY_HIDING))
    back = TrialSpec.from_json(spec.to_json())  # JSON holds lists: the spec gets its hashable pairs back
    assert back == spec and hash(back) == hash(spec) and back.cluster.env == spec.cluster.env
    (plain,) = expand(load(["cluster=local_fake_gpu"]))
    assert plain.cluster.env == () and plain.trial_id == spec.trial_id  # execution only: not in the id
    # CPU underneath keeps its simulated devices; the user's XLA flags come after them
    assert spec.cluster.host_env() == {
        "JAX_PLATFORMS": "cpu",
        "NCCL_SOCKET_IFNAME": "eth0",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {LATENCY_HIDING}",
    }
    assert cluster.worker_env(spec.cluster)["NCCL_SOCKET_IFNAME"] == "eth0"  # each host task's runtime_env
    gpu = dataclasses.replace(spec.cluster, platform="gpu")
    assert gpu.host_env() == {"NCCL_SOCKET_IFNAME": "eth0", "XLA_FLAGS": LATENCY_HIDING}


def test_a_non_string_env_value_is_one_line():
    with pytest.raises(ConfigError) as e:
        expand(load(["cluster=local_fake_gpu", "+cluster.env.NCCL_IB_DISABLE=1"]))
    msg = str(e.value)
    assert "cluster.env.NCCL_IB_DISABLE=1 is not a string" in msg and "\n" not in msg, msg
    assert "allowed: a mapping of names to strings" in msg


def test_only_a_tpu_device_knows_its_slice():
    # no GPU here: stand-ins with the attributes jax's devices carry (a GPU's slice_index need not be its node)
    tpu, gpu = SimpleNamespace(platform="tpu", slice_index=1), SimpleNamespace(platform="gpu", slice_index=0)
    assert _knows_slice(tpu) and not _knows_slice(gpu)
    assert not _knows_slice(SimpleNamespace(platform="cpu", slice_index=0))


# --- a real Ray cluster of fake GPU nodes -----------------------------------------------------------------


@pytest.mark.slow
# Ray starts the fake nodes with fork+exec from this process, where jax is loaded: the exec follows at once
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_gpu_nodes_are_reserved_whole_on_distinct_nodes_or_not_at_all(fake_gpu):
    import ray

    from orchestrator.launch.attempt import Cancelled
    from orchestrator.launch.placement import Reservation

    assert fake_gpu.name == FAKE_GPU.name  # the session's fake GPU cluster is conf/cluster/local_fake_gpu
    two = dataclasses.replace(FAKE_GPU, slices_per_trial=2)
    ours = PlacementGroups()  # the session's other tests' trials may hold or release theirs meanwhile
    assert cluster.gpu_nodes(4) == 2 and cluster.gpu_nodes(5) == 0
    assert cluster.concurrency(two) == 1 and cluster.concurrency(FAKE_GPU) == 2
    with pytest.raises(ValueError, match="needs 3 GPU nodes of 4 GPUs .* but the cluster has 2; lower"):
        Reservation(dataclasses.replace(two, slices_per_trial=3), lambda: None).place()
    both = Reservation(two, lambda: None)
    placed = both.place()
    pg = ray.util.placement_group_table(both.pg)
    assert pg["state"] == "CREATED" and pg["strategy"] == "STRICT_SPREAD"
    assert list(pg["bundles"].values()) == [{"GPU": 4.0, "CPU": 1.0}] * 2
    assert len(set(pg["bundles_to_node_id"].values())) == 2  # one node each
    assert placed.options == {"num_gpus": 4} and len(placed.strategies) == 2
    assert placed.envs == [{"JAX_LOCAL_DEVICE_IDS": "0,1,2,3"}] * 2
    assert len(placed.record["slice"].split("+")) == 2 and placed.record["n_slices"] == 2
    tries = []

    def give_up_after_three() -> None:  # called before and while the group waits: the queue's own events
        tries.append(1)
        if len(tries) > 3:
            raise Cancelled

    waiter = Reservation(FAKE_GPU, give_up_after_three)
    with pytest.raises(Cancelled):  # both nodes held: a one-node trial queues, granted nothing
        waiter.place()
    assert len(tries) == 4 and waiter.pg is not None and not ray.wait([waiter.pg.ready()], timeout=0)[0]
    waiter.release()  # what the attempt does on every exit path
    assert ours.live() == 1
    both.release()
    assert ours.live() == 0
