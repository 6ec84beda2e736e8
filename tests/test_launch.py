"""Scheduling: typed outcomes, per-trial execution details, and gang launch on (fake) TPU slices."""

import json
import subprocess
import sys
from pathlib import Path

import mlflow_lookup
import pytest
import ray
from drivers import THREE_TRIALS
from rays import FAKE_TPU_STALE_ENV

from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, RunSpec, StrategySpec, TrialSpec
from orchestrator.launch import cluster
from orchestrator.launch.attempt import classify, combine
from orchestrator.launch.executor import placement_note, with_checkpoint_dir
from orchestrator.ui.progress import SweepProgress


def _spec(**run) -> TrialSpec:
    model = ModelSpec("tiny", 256, 64, 2, 8, 4, 16, 192)
    return TrialSpec(model, MeshSpec(context=8), StrategySpec("ring"), 512, run=RunSpec(**run))


def _task_error(text: str) -> ray.exceptions.RayTaskError:
    return ray.exceptions.RayTaskError(
        "host_task", f"Traceback ...\nRuntimeError: {text}", RuntimeError(text)
    )


@pytest.mark.parametrize(
    "err, outcome",
    [
        (_task_error("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 12 GiB"), "infeasible"),
        (_task_error("ValueError: bad shape"), "failed"),
        (_task_error("Gloo: Connection closed by peer [127.0.0.1]:4455"), "preempted"),
        (
            _task_error("Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue() timed out"),
            "preempted",
        ),
        (ray.exceptions.WorkerCrashedError(), "preempted"),
        (ray.exceptions.NodeDiedError("node 1 died"), "preempted"),
        (ray.exceptions.TaskCancelledError(), "cancelled"),
    ],
)
def test_classify(err, outcome):
    assert classify(err) == outcome


def test_combine_prefers_the_lost_host_over_its_peers_errors():
    assert combine(["failed", "preempted"]) == "preempted"
    assert combine(["failed", "infeasible"]) == "infeasible"
    assert combine([]) == "finished"


def test_rays_private_address_hook_is_still_there():
    """cluster._no_address_file swaps this private Ray function (no public switch): fail loudly if it moves."""
    assert callable(ray._private.utils.write_ray_address)
    with cluster._no_address_file():
        assert ray._private.utils.write_ray_address("x") is None


def test_a_started_rays_log_monitor_looks_for_new_files_every_10_s(local_ray):
    """The log monitor of a Ray the driver starts runs with cluster.connect's two settings, and they are still
    the names Ray's log monitor reads (it rescans the log folder every 0.1 s without them)."""
    gcs = ray.get_runtime_context().gcs_address
    monitors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_log_monitor(p, gcs)]
    assert len(monitors) == 1, monitors
    environ = (monitors[0] / "environ").read_text(errors="replace").split("\0")
    env = dict(kv.split("=", 1) for kv in environ if "=" in kv)
    # what Ray's log monitor module makes of that environment
    read = (
        "from ray._private import log_monitor as m; "
        "print(m.RAY_LOG_MONITOR_MANY_FILES_THRESHOLD, m.LOG_NAME_UPDATE_INTERVAL_S)"
    )
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "10.0"], out


def _is_log_monitor(proc: Path, gcs: str) -> bool:
    try:
        args = (proc / "cmdline").read_text(errors="replace").split("\0")
    except OSError:  # gone meanwhile
        return False
    return any(a.endswith("/log_monitor.py") for a in args) and f"--gcs-address={gcs}" in args


def test_checkpoint_dir_is_execution_only():
    spec = _spec(checkpoint_every=2)
    placed = with_checkpoint_dir(spec, "sweep-1")
    assert placed.run.checkpoint_dir.endswith(f"/.cache/checkpoints/sweep-1/{spec.trial_id}")
    assert placed.trial_id == spec.trial_id  # a retry resumes under the same id
    assert with_checkpoint_dir(_spec(checkpoint_every=0), "sweep-1").run.checkpoint_dir == ""
    gcs = with_checkpoint_dir(_spec(checkpoint_every=2, checkpoint_dir="gs://b/ck/"), "s")
    assert gcs.run.checkpoint_dir == f"gs://b/ck/s/{spec.trial_id}"


def test_fake_slice_env_matches_gke():
    c = ClusterSpec(
        kind="fake_tpu", accelerator="v5p", hosts=2, devices_per_host=4, slices=2, topology="2x2x2"
    )
    env = cluster.fake_slice_env(c, 1, 0)
    assert env == {
        "TPU_ACCELERATOR_TYPE": "v5p-16",
        "TPU_TOPOLOGY": "2x2x2",
        "TPU_NAME": "fake-slice-1",
        "TPU_WORKER_ID": "0",
    }


def test_placement_note_and_plain_progress(capsys):
    hosts = [
        {"process_id": 1, "pid": 22, "node_ip": "10.0.0.3", "slice": "s0"},
        {"process_id": 0, "pid": 11, "node_ip": "10.0.0.2", "slice": "s0"},
    ]
    assert placement_note(hosts) == "s0: 0=pid 11@10.0.0.2, 1=pid 22@10.0.0.3"
    with SweepProgress("plain") as p:
        p.add("t", "ring L=512", steps=4)
        p.update("t", state="running")
        p.event("t", "attempt 1 on s0")
        p.update("t", step=2, loss=5.5, tokens_per_s=100.0)  # quiet: a step line at most every 30 s
        p.update("t", state="done", note="")
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("] ", 1)[1] for ln in lines] == [
        "ring L=512: running",
        "ring L=512: attempt 1 on s0",
        "ring L=512: done loss=5.5000",
    ]


@pytest.mark.slow
def test_fake_tpu_slices_gang_schedule_trials(tmp_path, fake_tpu, store, cli):
    """3 trials on 2 fake v5p-16 slices (2 hosts x 4 devices): at most 2 at once, each on one whole slice, the
    third waiting for a slice. The fake nodes inherit a stale multislice environment (Ray #62893,
    tests/rays.py): one-slice hosts run without it."""
    args = [*THREE_TRIALS, "cluster=local_fake_tpu", "sweep.id=fake-tpu"]
    res = cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = mlflow_lookup.client(tmp_path)
    trials = mlflow_lookup.runs(client, kind="trial")
    assert len(trials) == 3
    spans = []
    for r in trials:
        assert r.data.tags["status"] == "finished", r.data.tags
        (att,) = json.loads(mlflow_lookup.artifact_text(client, r, "attempts.json", tmp_path))
        assert att["outcome"] == "finished"
        assert sorted(h["process_id"] for h in att["hosts"]) == [0, 1]
        # gang: both hosts on the same slice, one per TPU worker id, process id = TPU_WORKER_ID
        assert len({h["slice"] for h in att["hosts"]}) == 1 and att["hosts"][0]["slice"].startswith(
            "fake-slice-"
        )
        assert all(str(h["process_id"]) == h["worker_id"] for h in att["hosts"])
        stale = sorted(FAKE_TPU_STALE_ENV)
        assert all(h["megascale"] == {} and h["scrubbed"] == stale for h in att["hosts"]), att["hosts"]
        assert len({h["node_id"] for h in att["hosts"]}) == 2
        assert r.data.tags["slices"] == att["hosts"][0]["slice"]
        spans.append((att["placed"], att["ended"]))
    # concurrency = free slices: never more than 2 trials hold a slice at once, and the slices were shared
    edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in edges:
        live += d
        peak = max(peak, live)
    assert peak == 2
    assert {r.data.tags["slices"] for r in trials} == {"fake-slice-0", "fake-slice-1"}
