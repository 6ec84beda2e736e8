"""`train.remat=auto` (each point's fastest fitting policy, resolved before launch), a point's chip-hours and
cost, `budget.chip_hours`, and the recommender's tie-break toward the leaner layout."""

import json
from dataclasses import replace

import pytest
from drivers import run_cli

from orchestrator.config.grid import expand_points
from orchestrator.config.load import load
from orchestrator.plan import auto, cluster_model, cost, plan, policies
from orchestrator.tracking.mlflow_names import trial_params

L14M = 14_680_064
LONG = ["model=llama3_1_8b_long", "cluster=tpu7x_128"]


def specs(words):
    """The grid's specs with train.remat=auto resolved, as the driver plans them."""
    points = expand_points(load(words))
    return auto.resolve_all([p.spec for p in points], [p.cluster for p in points])


@pytest.fixture(scope="module")
def cp_scaling_auto():
    got = specs(["+sweep=cp_scaling", *LONG, "train.remat=auto"])
    return got, plan(got)


def test_auto_reaches_the_recipe_level_at_14m(cp_scaling_auto):
    got, rows = cp_scaling_auto
    full = {r.strategy: r for r in plan(specs(["+sweep=cp_scaling", *LONG])) if r.context_length == L14M}
    long = {r.strategy: r for r in rows if r.context_length == L14M}
    for name in ("ring", "usp"):  # published: ring 0.487 with offload=[attn_out,layer_input]
        assert long[name].verdict == "run" and long[name].predicted_mfu >= 0.45, long[name]
        assert (
            full[name].predicted_mfu is None or full[name].predicted_mfu < 0.35 or full[name].verdict != "run"
        )
        assert "offload=" in long[name].policy
    assert not any(s.train.remat == "auto" for s in got)
    assert all("auto" not in r.policy for r in rows)


def test_resolved_policy_is_what_the_id_and_params_say(cp_scaling_auto):
    """A point whose resolved policy is given explicitly gets the same trial id: ids hash the policy, not auto."""
    got, _ = cp_scaling_auto
    for s in [s for s in got if s.context_length in (131072, L14M) and s.strategy.name in ("ring", "usp")]:
        p = policies.Policy(s.train.remat, s.train.memory)
        words = [f"strategy={s.strategy.name}", f"context_length={s.context_length}", *LONG, "train.steps=8"]
        explicit = specs(words + [w.strip("'") for w in p.words()])[0]
        assert explicit.trial_id == s.trial_id, (s.train, explicit.train)
        params = trial_params(s)
        assert params["remat"] == s.train.remat != "auto"
        if s.train.memory.offload:
            assert params["memory_offload"] == ",".join(s.train.memory.offload)


def test_auto_as_a_sweep_axis_names_the_resolved_preset():
    got = specs(
        [
            "+sweep=smoke",
            "+sweep.axes.train.remat=[full,auto]",
            "cluster=v5p_128",
            "model=llama3_1_8b",
            "sweep.axes.context_length=[262144]",
        ]
    )
    assert got and all(dict(s.axes)["train.remat"] == s.train.remat != "auto" for s in got)


def test_auto_keeps_an_invalid_point_invalid_with_its_own_reason():
    (s,) = specs(["strategy=ulysses", f"context_length={L14M}", *LONG, "train.remat=auto"])
    (row,) = plan([s])
    assert s.train.remat == "full" and row.verdict == "invalid" and "heads" in row.reason


def test_chip_hours_count_chips_not_devices():
    (v5p,) = specs(["model=llama3_1_8b", "cluster=v5p_128", "context_length=131072", "train.steps=100"])
    (tpu7x,) = specs(["model=llama3_1_8b", "cluster=tpu7x_128", "context_length=131072", "train.steps=100"])
    assert cost.chips(v5p) == 64 and cost.chips(tpu7x) == 64  # 128 TensorCores = 64 Ironwood chips
    model = cluster_model.model_of(v5p.cluster)
    assert cost.chip_hours(v5p, model, 2.0) == pytest.approx(64 * (100 * 2.0 + 300) / 3600)
    (row,) = plan([v5p])
    assert (
        row.chip_hours == pytest.approx(cost.chip_hours(v5p, model, row.predicted_step_s))
        and row.cost is None
    )
    priced = replace(model, price_per_chip_hour=2.5)
    assert plan([v5p], [priced])[0].cost == pytest.approx(2.5 * row.chip_hours)


def test_budget_line_names_the_costliest_points_and_what_fits():
    got = specs(["+sweep=cp_scaling", *LONG, "train.remat=auto"])
    rows = plan(got)
    spent = cost.total(rows)
    assert cost.over_budget(got, rows, 0) == "" and cost.over_budget(got, rows, spent * 1.01) == ""
    line = cost.over_budget(got, rows, spent / 2)
    assert f"over budget.chip_hours={spent / 2:g}" in line and "L=14,680,064 (" in line
    assert "train.steps=" in line and "context_length up to" in line
    steps = int(line.split("train.steps=")[1].split()[0])
    fewer = [replace(s, train=replace(s.train, steps=steps)) for s in got]
    assert cost.total(plan(fewer)) <= spent / 2  # the suggested step count does fit
    cut = int(line.split("context_length up to ")[1].split()[0].replace(",", ""))
    assert sum(r.chip_hours for r in rows if r.verdict == "run" and r.context_length <= cut) <= spent / 2


def test_cli_refuses_an_over_budget_sweep(tmp_path, no_ray_no_mlflow):
    args = ["+sweep=cp_scaling", *LONG, "train.remat=auto", "budget.chip_hours=100", "skip_invalid=true"]
    res = run_cli(args, cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr
    assert "over budget.chip_hours=100" in errors[0] and "nothing launched" in errors[0]
    assert not (tmp_path / "mlflow.db").exists()
    res = run_cli([*args, "dry_run=true", "output=json"], cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
    assert res.returncode == 2 and "over budget" in res.stderr
    assert all("chip_hours" in r for r in json.loads(res.stdout))  # the plan is still printed first


def test_a_tie_goes_to_the_simplest_policy_with_headroom():
    (s,) = specs(["model=llama3_1_8b", "cluster=v5p_128", "context_length=131072"])
    limit, gib = cluster_model.model_of(s.cluster).hbm_bytes_per_device, 2**30
    plain = policies.Policy("full", policies.MemorySpec())
    moved = policies.Policy("full", policies.MemorySpec(offload=("attn_out",)))
    host = policies.Policy("full", policies.MemorySpec(offload=("attn_out",), host=("optimizer",)))
    # within TIE (0.5 %) of each other: the fewest words wins while it leaves 20 % of HBM free
    runs = [(100.0, 30 * gib, s, host), (100.3, 40 * gib, s, moved), (100.4, 60 * gib, s, plain)]
    assert auto.pick(runs, limit)[3] is plain
    assert [r[3] for r in auto.rank([*runs, (120.0, gib, s, moved)], limit)][:3] == [plain, moved, host]
    tight = [(100.0, 30 * gib, s, host), (100.4, int(0.9 * limit), s, plain)]
    assert (
        auto.pick(tight, limit)[3] is host
    )  # the simple one would leave under 20 % free: the leanest instead
    assert (
        auto.pick([(100.0, gib, s, host), (130.0, gib, s, plain)], limit)[3] is host
    )  # not a tie: the fastest
