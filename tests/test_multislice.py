"""One trial over two slices: the hybrid mesh (mesh.dcn across slices), the gang of every slice's hosts, and the
two-slice trial across a lost host on CPU: 2 fake slices x 2 processes x 2 devices training exactly like one
process, 2 fake TPU slices, and 2 fake GPU nodes (a GPU node is a one-host slice)."""

import dataclasses
import json

import mlflow_lookup
import numpy as np
import pytest
from drivers import fault_env
from rays import PlacementGroups
from servers import jax_processes

from jobs.mesh import make_mesh
from jobs.spec import MeshSpec
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.launch.placement import host_order, megascale_env

# --- the mesh -------------------------------------------------------------------------------------------------

# 4 CPU processes x 2 devices posing as 2 slices (processes 0,1 and 2,3), devices handed over in reverse: where
# the dcn axis lands must come from the devices' slices, not from the order they arrive in.
MESH_WORKER = r"""
import json, sys
import jax, numpy as np
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=4, process_id=int(sys.argv[1]))
from jobs.mesh import make_mesh
from jobs.train import train
from orchestrator.config.load import load
from orchestrator.config.grid import expand
from jobs.spec import MeshSpec
from orchestrator.plan import cluster_model
shapes = {"context": MeshSpec(context=8, dcn="context"), "data": MeshSpec(data=2, context=4, dcn="data"),
          "usp": MeshSpec(context=4, context_ulysses=2, dcn="context")}
out = {}
for name, shape in shapes.items():
    mesh = make_mesh(shape, jax.devices()[::-1], slices=2)
    out[name] = np.vectorize(lambda d: d.process_index)(mesh.devices).tolist()
if jax.process_index() == 0:
    print("MESH " + json.dumps(out), flush=True)
"""


def _processes_along(grid: list, axis: int) -> list[set[int]]:
    """Per position along `axis` of a [data, fsdp, context, context_ulysses, tensor] grid, its processes."""
    a = np.moveaxis(np.array(grid), axis, 0)
    return [set(a[i].flat) for i in range(a.shape[0])]


def test_hybrid_mesh_lays_the_dcn_axis_across_slices():
    outs = jax_processes(MESH_WORKER, 4)
    (line,) = [ln for ln in outs[0].splitlines() if ln.startswith("MESH ")]
    got = json.loads(line[5:])
    slice0, slice1 = {0, 1}, {2, 3}
    # context 8 over DCN: positions 0..3 on slice 0's processes, 4..7 on slice 1's
    along = _processes_along(got["context"], 2)
    assert all(p <= slice0 for p in along[:4]) and all(p <= slice1 for p in along[4:]), along
    assert set().union(*along[:4]) == slice0 and set().union(*along[4:]) == slice1
    # data 2 over DCN: one data replica per slice; the context axis stays inside each slice
    assert _processes_along(got["data"], 0) == [slice0, slice1]
    # usp: the outer ring (context) crosses slices, the Ulysses groups never do
    along = _processes_along(got["usp"], 2)
    assert all(p <= slice0 for p in along[:2]) and all(p <= slice1 for p in along[2:]), along


def test_one_slice_mesh_is_unchanged_and_bad_multislice_meshes_are_one_line_errors():
    shape = MeshSpec(context=8)
    assert make_mesh(shape).devices.tolist() == make_mesh(shape, slices=1).devices.tolist()
    assert make_mesh(MeshSpec(context=8, dcn="context")).devices.tolist() == make_mesh(shape).devices.tolist()
    bad = [
        (MeshSpec(context=8), 2, "needs mesh.dcn naming the axis"),
        (MeshSpec(data=8, dcn="context"), 2, "mesh.dcn=context has size 1, not divisible by 2 slices"),
        (MeshSpec(context=8, dcn="context"), 2, "1 processes cannot pose as 2 slices"),  # one CPU process
    ]
    for spec, slices, msg in bad:
        with pytest.raises(ValueError, match=msg) as e:
            make_mesh(spec, slices=slices)
        assert "\n" not in str(e.value)


def test_hybrid_mesh_on_tpu_topology_devices_matches_jax():
    """AOT devices of a two-slice TPU topology carry slice_index; the mesh is jax's own hybrid mesh."""
    pytest.importorskip("libtpu")
    from jax.experimental import mesh_utils

    from orchestrator.plan.aot.target import slice_devices

    devices = slice_devices("v5:2x2x1", "megacore", (2, 2, 1), slices=2)
    assert sorted({d.slice_index for d in devices}) == [0, 1]
    ids = lambda grid: np.vectorize(lambda d: d.id)(grid).tolist()
    for shape, dcn in [
        (MeshSpec(context=8, dcn="context"), (1, 1, 2, 1, 1)),
        (MeshSpec(data=2, context=4, dcn="data"), (2, 1, 1, 1, 1)),
    ]:
        ici = tuple(n // d for n, d in zip(shape.shape().values(), dcn, strict=True))
        want = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
        assert ids(make_mesh(shape, devices[::-1], slices=2).devices) == ids(want)
    with pytest.raises(ValueError, match="do not split evenly into 4 slices"):
        make_mesh(MeshSpec(context=8, dcn="context"), devices, slices=4)


# --- placement ------------------------------------------------------------------------------------------------


def test_hosts_are_numbered_slice_major_by_tpu_worker_id():
    probes = [{"worker_id": w, "slice": s} for s, w in [("b", "1"), ("b", "0"), ("a", "1"), ("a", "0")]]
    assert host_order(probes, 2) == [1, 0, 3, 2]  # slices in reservation order, worker ids within each
    assert host_order([{"worker_id": "", "slice": ""}] * 4, 2) == [0, 1, 2, 3]  # local: bundle order
    assert megascale_env("10.0.0.2", 2, 1) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8081",
        "MEGASCALE_PORT": "8081",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }


# --- a trial over two slices, through the CLI, across a lost host -----------------------------------------------

TRIAL = [
    "strategy=ring",
    "context_length=512",
    "train.steps=3",
    "train.dtype=float32",
    "progress=plain",
    "gate.enabled=false",
]


def _two_slice_trial(cli, tmp_path, cluster: list[str], process: int, sweep_id: str) -> tuple:
    """One trial over two slices (`cluster`), ring over the context axis across the slices; process
    `process`'s host is SIGKILLed after step 1 (an injected fault, once), so the trial is preempted as a whole,
    re-queued and gang-started again. Returns (client, the trial's run, its attempts, its log's start record),
    once the trial finished with every step in the store once across its attempts."""
    fault = f"kill:{process}:1:after_report"
    args = [*TRIAL, *cluster, "mesh.dcn=context", f"+sweep.id={sweep_id}"]
    res = cli(args, cwd=tmp_path, env=fault_env(tmp_path, fault))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    marker = tmp_path / "faults" / fault.replace(":", "-")
    assert "preempted: retrying" in res.stdout and marker.exists()
    client = mlflow_lookup.client(tmp_path)
    run = mlflow_lookup.trial(client, sweep_id)
    assert run.data.tags["status"] == "finished"
    attempts = json.loads(mlflow_lookup.artifact_text(client, run, "attempts.json", tmp_path))
    # the kill, then the finish; more preemptions only if gloo timed out a CPU-starved host
    assert attempts[0]["outcome"] == "preempted" and attempts[-1]["outcome"] == "finished"
    assert all(a["outcome"] == "preempted" for a in attempts[:-1])
    assert mlflow_lookup.steps(client, run) == [0, 1, 2]  # every step once across the attempts
    log = mlflow_lookup.artifact_text(client, run, "trial_log.txt", tmp_path)
    start = next(json.loads(ln) for ln in log.splitlines() if ln.startswith('{"kind": "start"'))
    return client, run, attempts, start


def _trains_like_one_process(client, run) -> None:
    """The run's loss curve is the same trial's without the dcn axis on this process's 8 devices, no Ray."""
    (spec,) = expand(load([*TRIAL, "cluster=local"]))
    assert spec.mesh.label() == "context8"
    want = [r.loss for r in train(spec) if r.kind == "step"]
    # fp32; gloo's cross-process reductions may sum in another order than in-process ones
    got = mlflow_lookup.values(client, run)
    assert len(want) == 3 and got == pytest.approx(want, rel=1e-5, abs=1e-5), (want, got)


@pytest.mark.slow
def test_two_slice_trial_trains_like_one_process_across_a_lost_host(tmp_path, local_ray, store, cli):
    """local_multislice: 4 processes (2 fake slices x 2 hosts x 2 devices), ring over context 8 with the context
    axis across the slices. Process 3 (slice 1, not the reporting one) is SIGKILLed after step 1: the trial is
    preempted as a whole, re-queued, the retry gang-starts all four processes again, and the loss curve is the
    8-device single-process run's, in fp32, every step once."""
    client, run, attempts, start = _two_slice_trial(
        cli, tmp_path, ["cluster=local_multislice"], 3, "two-slices"
    )
    assert run.data.params["mesh"] == "context8/dcn:context"
    # all four processes of every attempt, numbered slice-major
    for att in attempts:
        assert att["n_hosts"] == 4 and att["n_slices"] == 2
        assert sorted((h["process_id"], h["slice_id"]) for h in att["hosts"]) == [
            (0, 0),
            (1, 0),
            (2, 1),
            (3, 1),
        ]
    # the job's own report of its mesh: context positions 0..3 on slice 0's processes, 4..7 on slice 1's
    assert start["processes"] == 4 and start["slices"] == 2
    assert start["dcn_processes"] == [[0], [0], [1], [1], [2], [2], [3], [3]]
    _trains_like_one_process(client, run)


@pytest.mark.slow
def test_fake_tpu_trial_spans_two_slices_and_its_retry_starts_clean(tmp_path, fake_tpu, store, cli):
    """local_fake_tpu (2 fake v5p-16 slices x 2 hosts) with slices_per_trial=2: Ray reserves both slices for
    one trial; the four hosts are numbered slice-major by TPU_WORKER_ID and each got the MEGASCALE_* env.
    The nodes inherit stale per-attempt variables (Ray #62893, tests/rays.py), and host 3 is SIGKILLed after
    step 1: the retry gang-starts all four again, and every attempt's hosts see only that attempt's MEGASCALE_*
    and coordinator."""
    cluster = ["cluster=local_fake_tpu", "cluster.slices_per_trial=2", "retries.preemption=6"]
    _, run, attempts, start = _two_slice_trial(cli, tmp_path, cluster, 3, "fake-two-slices")
    assert run.data.params["mesh"] == "context16/dcn:context"
    assert run.data.tags["slices"] == "fake-slice-0,fake-slice-1"
    for att in attempts:
        hosts = sorted(att["hosts"], key=lambda h: h["process_id"])
        assert [h["process_id"] for h in hosts] == [0, 1, 2, 3] and len({h["node_id"] for h in hosts}) == 4
        # slice-major: processes 0,1 on one fake slice, 2,3 on the other, TPU_WORKER_ID order within each
        assert hosts[0]["slice"] == hosts[1]["slice"] != hosts[2]["slice"] == hosts[3]["slice"]
        assert [h["worker_id"] for h in hosts] == ["0", "1", "0", "1"]
        assert [h["slice_id"] for h in hosts] == [0, 0, 1, 1]
        coordinator = f"{hosts[0]['node_ip']}:8081"  # slice 0's worker 0 in THIS attempt
        for h in hosts:
            assert h["megascale"] == {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
                "MEGASCALE_PORT": "8081",
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": str(h["slice_id"]),
            }
            # inherited and not the attempt's own: removed before jax started (the rest were overridden)
            assert h["scrubbed"] == ["JAX_COORDINATOR_ADDRESS", "MEGASCALE_TRANSPORT_TYPE"], h
    # jax.distributed's coordinator is probed per attempt: the retry never dials the killed attempt's port
    coordinators = [a["coordinator"] for a in attempts]
    assert all(c.rpartition(":")[2].isdigit() for c in coordinators), coordinators
    assert len(set(coordinators)) == len(coordinators), coordinators
    assert start["dcn_processes"] == [[p] for p in range(4) for _ in range(4)]  # 4 devices per host


@pytest.mark.slow
def test_two_node_gpu_trial_trains_like_one_process_across_a_lost_node(tmp_path, fake_gpu, store, cli):
    """local_fake_gpu (tests/test_gpu_cluster.py) with slices_per_trial=2: one trial over both fake nodes, each
    a one-host slice (2 processes x 4 devices), ring over context 8 with the context axis across the nodes.
    Process 1 (the second node's host) is SIGKILLed after step 1: preempted, re-queued, both nodes reserved
    again, and the loss curve is the 8-device single process run's in fp32, every step once. The nodes started
    with a stale JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS (tests/rays.py): an attempt must not see
    them."""
    cluster = ["cluster=local_fake_gpu", "cluster.slices_per_trial=2", "retries.preemption=6"]
    client, run, attempts, start = _two_slice_trial(cli, tmp_path, cluster, 1, "fake-gpu")
    assert run.data.params["mesh"] == "context8/dcn:context"
    for att in attempts:
        hosts = sorted(att["hosts"], key=lambda h: h["process_id"])
        assert (att["n_hosts"], att["n_slices"]) == (2, 2)
        assert [(h["process_id"], h["slice_id"]) for h in hosts] == [(0, 0), (1, 1)]  # a node per slice
        assert len({h["node_id"] for h in hosts}) == 2  # both fake nodes, every attempt
        assert att["slice"] == "+".join(f"node-{h['node_id'][:8]}" for h in hosts)
        assert all(len(h["gpus"]) == 4 for h in hosts), hosts  # each host task holds its node's GPU bundle
        assert all(h["scrubbed"] == ["JAX_COORDINATOR_ADDRESS"] for h in hosts), hosts  # inherited: removed
    coordinators = [a["coordinator"] for a in attempts]  # probed per attempt on process 0's node
    assert len(set(coordinators)) == len(coordinators), coordinators
    assert start["processes"] == 2 and start["slices"] == 2
    assert start["dcn_processes"] == [[0]] * 4 + [[1]] * 4  # context 0..3 on node 0's host, 4..7 on node 1's
    _trains_like_one_process(client, run)


@pytest.mark.slow
# Ray starts the fake nodes with fork+exec from this process, where jax is loaded: the exec follows at once
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_two_slice_reservation_is_all_or_nothing(fake_tpu):
    """While one slice is held, a two-slice reservation gets neither (Ray releases the head it took); once
    both are free it gets both, and every placement group is released afterwards."""
    from orchestrator.launch.attempt import Cancelled
    from orchestrator.launch.placement import Reservation

    # the session's fake TPU cluster: 2 v5p-16 slices (topology 2x2x2) x 2 hosts of 4 chips
    assert (fake_tpu.slices, fake_tpu.hosts, fake_tpu.topology) == (2, 2, "2x2x2")
    c = dataclasses.replace(fake_tpu, slices_per_trial=2)
    ours = PlacementGroups()  # the session's other tests' trials may hold or release theirs meanwhile
    with pytest.raises(ValueError, match="needs slices_per_trial=3 slices but the cluster has 2"):
        Reservation(dataclasses.replace(c, slices_per_trial=3), lambda: None).place()
    held = Reservation(dataclasses.replace(c, slices_per_trial=1), lambda: None)
    held_slice = held.place().record["slice"]
    tries = []

    def give_up_after_three() -> None:  # called before each try: the reservation's own events
        tries.append(1)
        if len(tries) > 3:
            raise Cancelled

    both = Reservation(c, give_up_after_three)
    with pytest.raises(Cancelled):
        both.place()
    assert ours.live() == 2  # only the held slice's worker group and head
    held.release()
    assert ours.live() == 0
    both = Reservation(c, lambda: None)
    placed = both.place()
    assert set(placed.record["slice"].split("+")) == {"fake-slice-0", "fake-slice-1"}, held_slice
    assert [e["MEGASCALE_SLICE_ID"] for e in placed.envs] == ["0", "0", "1", "1"]
    both.release()
    assert ours.live() == 0


def test_local_multislice_config_is_two_slices_of_two_hosts():

    from orchestrator.launch.cluster import concurrency
    from orchestrator.plan import cluster_model

    c = cluster_model.load("local_multislice")[0]
    assert (c.kind, c.platform, c.hosts, c.slices_per_trial) == ("local_multihost", "cpu", 2, 2)
    assert (c.hosts_per_trial, c.devices, concurrency(c)) == (4, 8, 1)
