"""Tier 3: the real CLI in a subprocess — local Ray, JAX on 8 simulated devices, a fresh sqlite MLflow store."""

import math
import time

import pytest
from conftest import run_cli
from mlflow import MlflowClient


@pytest.mark.slow
def test_smoke_sweep_end_to_end(tmp_path):
    t0 = time.monotonic()
    res = run_cli(["+sweep=smoke", "progress=plain"], cwd=tmp_path)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in res.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("cp_scaling")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4  # smoke: 2 strategies x 2 lengths
    ids = {r.data.tags["trial_id"] for r in children}
    assert len(ids) == 4
    for r in children:
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["status"] == "finished" and r.info.status == "FINISHED"
        assert {"strategy", "context_length", "mesh", "model"} <= set(r.data.params)
        losses = [m.value for m in client.get_metric_history(r.info.run_id, "loss")]
        assert len(losses) == int(r.data.params["steps"]) and all(math.isfinite(x) for x in losses)
        assert r.data.metrics["final_mfu"] > 0
        assert r.data.metrics["compiled_bytes_per_device"] > 0
        assert "trial_spec.json" in [a.path for a in client.list_artifacts(r.info.run_id)]
    # the parent charts MFU against context length per strategy
    hist = client.get_metric_history(parents[0].info.run_id, "mfu/ring")
    assert sorted(m.step for m in hist) == [512, 1024]
    print(f"smoke sweep wall time: {wall:.1f} s")


@pytest.mark.parametrize(
    "args, words",
    [
        (["+sweep=smoke", "model=nope"], "choose model from"),
        (["+sweep=smoke", "trian.steps=3"], "Could not override 'trian.steps'"),
        (["+sweep=smoke", "sweep.axes.context_length=[]"], "grid is empty"),
        (["+sweep=smoke", "sweep.axes.context_length=[1000]"], "1000"),
    ],
)
def test_bad_input_exits_2_before_launch(tmp_path, args, words):
    res = run_cli(args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors and words in errors[0], res.stderr
    assert "Started a local Ray instance" not in res.stdout + res.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing half-launched, not even a tracking store
