"""dry_run=true record=true: the plan as planned MLflow runs, marked as such, never gated as measured ones."""

import mlflow_lookup
import pytest

from orchestrator.results import gate


def test_planned_sweep_to_14m_on_tpu7x_without_a_tpu(tmp_path, store, cli):
    args = [
        "+sweep=cp_scaling",
        "cluster=tpu7x_128",
        "model=llama3_1_8b_long",
        "dry_run=true",
        "record=true",
        "sweep.id=plan14m",
        "skip_invalid=true",
    ]
    res = cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "recorded the plan as sweep plan14m-plan" in res.stdout
    client = mlflow_lookup.client(tmp_path)
    (parent,) = mlflow_lookup.runs(client, "plan14m-plan", "sweep")
    children = mlflow_lookup.runs(client, "plan14m-plan", "trial")
    assert parent.data.tags["planned"] == "true" and parent.data.tags["status"] == "planned"
    assert len(children) == int(parent.data.tags["points"]) and all(
        r.data.tags["planned"] == "true" for r in children
    )
    statuses = {r.data.tags["status"] for r in children}
    assert "planned" in statuses and "finished" not in statuses  # a verdict, never a measured outcome
    ring14 = [
        r
        for r in children
        if r.data.params["strategy"] == "ring" and r.data.params["context_length"] == "14680064"
    ]
    assert (
        ring14 and ring14[0].data.metrics["predicted_mfu"] > 0 and ring14[0].data.metrics["roofline_mfu"] > 0
    )
    m = ring14[0].data.metrics  # the band from tpu7x's fit, around the point: low < step < high
    assert m["predicted_step_time_low_s"] < m["predicted_step_time_s"] < m["predicted_step_time_high_s"]
    assert m["predicted_mfu_low"] < m["predicted_mfu"] < m["predicted_mfu_high"]
    steps = set(mlflow_lookup.steps(client, parent, "predicted_mfu/ring"))
    assert 14680064 in steps and min(steps) <= 131072  # stepped by context length, up to 14M
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "plots")} == {
        "plots/planned_mfu_vs_context.png",
        "plots/planned_memory_vs_context.png",
    }


@pytest.mark.slow
def test_planned_runs_are_never_a_regression_baseline(tmp_path, local_ray, store, cli):
    one = [
        "+sweep=smoke",
        "progress=plain",
        "sweep.axes.strategy=[all_gather]",
        "sweep.axes.context_length=[512]",
    ]
    plan = cli([*one, "dry_run=true", "record=true", "sweep.id=s"], cwd=tmp_path)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    real = cli([*one, "sweep.id=s"], cwd=tmp_path)
    assert real.returncode == 0, real.stdout[-2000:] + real.stderr[-2000:]
    client = mlflow_lookup.client(tmp_path)
    planned = mlflow_lookup.runs(client, "s-plan", "trial")
    measured = mlflow_lookup.runs(client, "s", "trial")
    assert (
        planned[0].data.tags["trial_id"] == measured[0].data.tags["trial_id"]
    )  # same point, two kinds of run
    assert measured[0].info.run_id != planned[0].info.run_id  # the real sweep did not reuse the planned run
    result = gate.compare(client, mlflow_lookup.experiment_id(client), "s")
    assert result.changes == [] and len(result.new) == 1  # the planned run is no baseline


def test_a_planned_point_logs_the_compilers_peak_beside_the_sum():
    """aot=true: both compiled figures reach the planned run (the sum can exceed HBM for a program that fits)."""
    from dataclasses import replace

    from orchestrator.plan import aot, plan
    from orchestrator.results.planned import point_metrics
    from tests.test_aot import tiny_spec

    spec = tiny_spec()
    [row] = plan([replace(spec, cluster=replace(spec.cluster, hosts=1))])  # the 8 devices its mesh spans
    got = point_metrics(row, aot.CompileResult(peak_bytes=127e9, compiler_peak_bytes=93e9))
    assert got["compiled_bytes_per_device"] == 127e9 and got["compiler_peak_bytes_per_device"] == 93e9
    assert row.verdict == "run", row.reason
    assert got["predicted_bytes_per_device"] == row.predicted_hbm_bytes_per_device > 0
    assert got["predicted_chip_hours"] == row.chip_hours > 0
    assert "compiler_peak_bytes_per_device" not in point_metrics(row, aot.CompileResult(peak_bytes=127e9))
