"""Two drivers on one sweep id and one tracking server: every trial runs once, one child run per trial."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from mlflow import MlflowClient
from servers import start_mlflow_server

pytestmark = pytest.mark.ray  # each driver starts a local Ray of its own


def _driver(args: list[str], cwd) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_two_drivers_started_together_run_each_trial_once(tmp_path, postgres):
    """Both drivers start at once (each with its own local Ray): they race to create the runs, one claims
    each trial's lease, the other waits for it; both exit 0 and every loss point is in the store once."""
    server = start_mlflow_server(tmp_path / "server", backend=postgres.database("race"))
    try:
        args = [
            "+sweep=smoke",
            "~sweep.set",
            "sweep.axes.context_length=[512]",
            "train.steps=3",
            "progress=plain",
            "tracking=server",
            f"tracking.uri={server.url}",
            "sweep.id=race",
        ]
        dirs = [tmp_path / "a", tmp_path / "b"]
        for d in dirs:
            d.mkdir()
        procs = [_driver(args, d) for d in dirs]
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for p, out in zip(procs, outs, strict=True):
            assert p.returncode == 0, out[-4000:]
        c = MlflowClient(server.url)
        exp = c.get_experiment_by_name("cp_scaling")
        runs = c.search_runs([exp.experiment_id], "tags.sweep_id = 'race'")
        parents = [r for r in runs if r.data.tags["kind"] == "sweep"]
        trials = [r for r in runs if r.data.tags["kind"] == "trial"]
        points = {
            r.info.run_id: sorted(m.step for m in c.get_metric_history(r.info.run_id, "loss")) for r in trials
        }
        print(
            f"two drivers: {len(parents)} parent runs, {len(trials)} child runs for "
            f"{len({r.data.tags['trial_id'] for r in trials})} trial ids, loss steps per child {list(points.values())}, "
            f"attempts {[r.data.tags.get('attempts') for r in trials]}"
        )
        assert len(parents) == 1, [r.info.run_id for r in parents]
        # whichever driver published last, the parent's plots cover both trials (the waiter reads them back)
        assert parents[0].data.tags["plots_trials"] == "2", parents[0].data.tags
        assert sorted(r.data.tags["trial_id"] for r in trials) == sorted(
            {r.data.tags["trial_id"] for r in trials}
        )
        assert len(trials) == 2
        for r in trials:
            assert r.data.tags["status"] == "finished" and r.data.tags["attempts"] == "1", r.data.tags
            steps = sorted(m.step for m in c.get_metric_history(r.info.run_id, "loss"))
            assert steps == [0, 1, 2], (r.data.tags["trial_id"], steps)
            assert r.data.params["lease_1"] and "lease_2" not in r.data.params  # one holder, never taken over
            assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        # one driver ran both; the other waited on its leases, said so, and reported their outcome
        ran = [sum("attempt 1 on " in line for line in out.splitlines()) for out in outs]
        assert sorted(ran) == [0, 2], (ran, outs)
        waiter = outs[ran.index(0)]
        assert "which holds this sweep: waiting" in waiter and "finished by driver " in waiter, waiter[-3000:]
        assert "0 finished, 0 failed, 0 skipped (already finished), 2 run by another driver" in waiter
    finally:
        server.stop()
