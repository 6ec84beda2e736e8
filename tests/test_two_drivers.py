"""Two drivers on one sweep id and one tracking server: every trial runs once, one child run per trial."""

import mlflow_lookup
import pytest
from drivers import Driver
from servers import start_mlflow_server

pytestmark = pytest.mark.ray  # each driver starts a local Ray of its own


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
            *server.overrides,
            "sweep.id=race",
        ]
        dirs = [tmp_path / "a", tmp_path / "b"]
        for d in dirs:
            d.mkdir()
        drivers = [Driver(args, d) for d in dirs]
        codes = [d.finish(timeout=900) for d in drivers]
        outs = ["\n".join(d.lines) for d in drivers]
        for code, out in zip(codes, outs, strict=True):
            assert code == 0, out[-4000:]
        c = mlflow_lookup.client(server.url)
        parents = mlflow_lookup.runs(c, "race", "sweep")
        trials = mlflow_lookup.runs(c, "race", "trial")
        points = {r.info.run_id: mlflow_lookup.steps(c, r) for r in trials}
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
            steps = mlflow_lookup.steps(c, r)
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
