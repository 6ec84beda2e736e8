"""Beyond one slice: which axis may cross DCN (one error line each), what the planner charges for it, the
multislice sweep's dry run, the recommender's choice of axis, and an AOT compile for two TPU slices."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from jobs import strategies
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from jobs.strategies import rules
from orchestrator.config.load import group_option
from orchestrator.plan import cluster_model, memory, plan, plan_one, to_markdown, validity
from orchestrator.plan.search import recommend

L1M, L28M = 2**20, 28 * 2**20


def conf(group: str, name: str) -> dict:
    return group_option(group, name)


def cluster(name: str = "tpu7x_128", slices: int = 2, **kw) -> ClusterSpec:
    return replace(cluster_model.load(name)[0], slices_per_trial=slices, **kw)


def spec(
    strategy: str, mesh: MeshSpec, length: int = L1M, c: ClusterSpec | None = None, **train
) -> TrialSpec:
    return TrialSpec(
        model=ModelSpec(**conf("model", "llama3_1_8b_long")),
        mesh=mesh,
        strategy=StrategySpec(name=strategy, layout=strategies.get(strategy).default_layout),
        context_length=length,
        train=TrainSpec(**{"remat": "full", **train}),
        cluster=c or cluster(),
    )


def multislice_problem(s: TrialSpec) -> str:
    found = [p.message for p in validity.problems(s) if p.rule == "multislice"]
    assert all("\n" not in m for m in found)  # one line each
    return found[0] if found else ""


# -- validation ---------------------------------------------------------------------------------------------
def test_ulysses_all_to_all_across_dcn_is_rejected_with_the_reason_and_the_fix():
    msg = multislice_problem(spec("ulysses", MeshSpec(context=16, fsdp=16, dcn="context")))
    assert "ulysses cannot lay context across slices" in msg and "all-to-all" in msg
    assert "mesh.dcn=data or mesh.dcn=fsdp" in msg and "usp" in msg  # the fix: a ring over the slices
    msg = multislice_problem(spec("usp", MeshSpec(context=64, context_ulysses=4, dcn="context_ulysses")))
    assert "all-to-all over context_ulysses" in msg and "mesh.dcn=context" in msg
    assert multislice_problem(spec("usp", MeshSpec(context=64, context_ulysses=4, dcn="context"))) == ""


def test_tensor_across_dcn_is_rejected():
    msg = multislice_problem(spec("ring", MeshSpec(context=128, tensor=2, dcn="tensor")))
    assert (
        "ring cannot lay tensor across slices" in msg and "all-reduces" in msg and "mesh.dcn=context" in msg
    )


def test_double_ring_crosses_on_its_outer_ring_only_and_all_gather_may_cross():
    msg = multislice_problem(
        spec("double_ring", MeshSpec(context=16, context_ulysses=16, dcn="context_ulysses"))
    )
    assert "inner ring" in msg and "outer ring" in msg
    assert (
        multislice_problem(spec("double_ring", MeshSpec(context=16, context_ulysses=16, dcn="context"))) == ""
    )
    assert multislice_problem(spec("all_gather", MeshSpec(context=256, dcn="context"))) == ""


def test_two_slices_need_a_dcn_axis_whose_size_they_divide():
    msg = multislice_problem(spec("ring", MeshSpec(context=256)))
    assert "spans 2 slices" in msg and "mesh.dcn" in msg and "context, data, fsdp" in msg
    c = cluster("tpu7x_128", slices=4)  # 512 devices; context=2 cannot be cut into 4 slices
    msg = multislice_problem(spec("ring", MeshSpec(fsdp=1, data=256, context=2, dcn="context"), c=c))
    assert "context=2 is not a multiple of slices_per_trial=4" in msg and "multiple of 4" in msg
    with pytest.raises(ValueError, match="is not a multiple"):
        rules.validate_dcn("ring", mesh={"context": 6}, dcn="context", slices=4)
    # One slice: nothing crosses, a named axis is harmless.
    assert multislice_problem(spec("ring", MeshSpec(context=128, dcn="context"), c=cluster(slices=1))) == ""


def test_every_strategy_lets_data_parallelism_cross():
    for name in strategies.NAMES:
        assert {"data", "fsdp"} <= set(strategies.get(name).dcn_axes), name
        assert "tensor" not in strategies.get(name).dcn_axes


# -- planner ------------------------------------------------------------------------------------------------
def test_dcn_time_ring_over_dcn_exposes_more_than_double_ring():
    ring = plan_one(spec("ring", MeshSpec(context=256, dcn="context")))
    double = plan_one(spec("double_ring", MeshSpec(context=16, context_ulysses=16, dcn="context")))
    assert ring.verdict == double.verdict == "run"
    assert (
        ring.dcn_exposed_s > 10 * double.dcn_exposed_s and ring.dcn_exposed_s > 0
    )  # every hop vs one per round
    assert ring.dcn_exposed_s < ring.predicted_step_s
    assert "DCN over context across 2 slices" in ring.limiter and "exposed DCN transfer" in ring.limiter
    # Registry: double ring's slice-crossing bytes are the outer hops' share of the ring's (G-1 of R-1).
    x = memory.local_sizes(spec("double_ring", MeshSpec(context=16, context_ulysses=16, dcn="context")))
    shape = {"context": 16, "context_ulysses": 16}
    _, crossing = strategies.get("double_ring").dcn_bytes(x, shape, "context", 2)
    assert crossing == strategies.get("ring").comm_bytes(x)[1] * 15 // 255


def test_no_dcn_time_on_one_slice_or_without_a_bandwidth():
    one = plan_one(spec("ring", MeshSpec(context=128), c=cluster(slices=1)))
    assert one.dcn_exposed_s == 0.0 and "DCN" not in one.limiter
    named = plan_one(spec("ring", MeshSpec(context=128, dcn="context"), c=cluster(slices=1)))
    assert named.dcn_exposed_s == 0.0 and named.predicted_step_s == one.predicted_step_s
    unmodelled = replace(cluster_model.load("tpu7x_128")[1], dcn_bytes_per_s=0.0)
    blind = plan_one(spec("ring", MeshSpec(context=256, dcn="context")), unmodelled)
    assert blind.dcn_exposed_s == 0.0 and "not modelled" in blind.limiter


def test_memory_per_device_does_not_change_with_slices():
    """256 devices as two 128-device slices or as one 256-device slice: the same per-device HBM."""
    two = plan_one(spec("ring", MeshSpec(context=256, dcn="context"), L28M))
    one = plan_one(spec("ring", MeshSpec(context=256), L28M, c=cluster(slices=1, hosts=32)))
    assert two.predicted_hbm_bytes_per_device == one.predicted_hbm_bytes_per_device
    assert two.verdict == "run"  # 28M tokens fit two tpu7x-128 slices with full remat


def test_data_parallel_over_dcn_prices_only_the_fsdp_traffic():
    dp = plan_one(spec("ring", MeshSpec(data=2, context=128, dcn="data"), batch=2))
    assert dp.verdict == "run" and 0 <= dp.dcn_exposed_s < 1.0


# -- the multislice sweep -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tpu7x_128", "v5p_128"])
def test_multislice_sweep_dry_run_plans_every_point(name):
    from orchestrator.config.grid import expand
    from orchestrator.config.load import load

    specs = expand(load(["+sweep=multislice", f"cluster={name}", "model=llama3_1_8b_long", "dry_run=true"]))
    rows = plan(specs)
    assert len(rows) == 72 and all(r.verdict in ("run", "infeasible") for r in rows), [
        r.reason for r in rows if r.verdict == "invalid"
    ]
    assert {s.cluster.slices_per_trial for s in specs} == {1, 2}
    assert max(s.context_length for s in specs) == 29_360_128
    across = [r for s, r in zip(specs, rows, strict=True) if s.mesh.dcn == "context"]
    assert across and all(r.dcn_exposed_s is not None for r in across if r.verdict == "run")
    # 28M tokens: two slices with the ring across them fit, in half the layer inputs one slice holds.
    at = {
        (s.cluster.slices_per_trial, s.mesh.dcn, s.strategy.name, s.train.remat): r
        for s, r in zip(specs, rows, strict=True)
        if s.context_length == 29_360_128
    }
    remat = "full" if name == "tpu7x_128" else "offload"
    assert at[(2, "context", "ring", remat)].verdict == "run"
    one, two = at[(1, "", "ring", remat)], at[(2, "context", "ring", remat)]
    assert two.memory["saved_activations"] * 2 == one.memory["saved_activations"]
    assert two.predicted_hbm_bytes_per_device < one.predicted_hbm_bytes_per_device
    assert "DCN s" in to_markdown(rows).splitlines()[0]


# -- recommender ----------------------------------------------------------------------------------------------
def test_recommender_names_the_axis_across_slices():
    m = ModelSpec(**conf("model", "llama3_1_8b_long"))
    rec = recommend(m, cluster(), L1M)
    assert rec.dcn == "context" and rec.spec.mesh.dcn == "context"
    assert "across 2 slices" in rec.reason and "with dcn=context" in rec.reason
    assert "ring with dcn=context: every hop crosses DCN" in rec.reason
    assert "ulysses never is valid" in rec.reason and "all-to-all" in rec.reason
    assert recommend(m, cluster(slices=1), L1M).dcn == ""


# -- AOT: the real step compiled for two TPU slices on this host ------------------------------------------------
def test_aot_compiles_for_two_slices(tmp_path, monkeypatch):
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from orchestrator.plan import aot

    monkeypatch.setenv("CP_AOT_CACHE", str(tmp_path))
    c = cluster("v5p_128", slices=2, topology="2x2x1")  # two 4-chip v5p slices: 8 devices
    tiny = TrialSpec(
        model=ModelSpec(**conf("model", "tiny")),
        mesh=MeshSpec(context=8, dcn="context"),
        strategy=StrategySpec(name="ring", block_q=256, block_kv=256),
        context_length=2048,
        train=TrainSpec(remat="full"),
        cluster=c,
    )
    assert aot.topology_tag(tiny) == "v5:2x2x1x2slices"
    one = replace(tiny, cluster=replace(c, slices_per_trial=1))
    assert aot.topology_tag(one) == "v5:2x2x1"  # same trial id, another program: the tag keeps them apart
    [row] = aot.compare([tiny])
    assert row.status == "compiled" and row.verdict == "run", row
    assert row.topology == "v5:2x2x1x2slices" and row.compiled_bytes > 0
    name = f"{tiny.trial_id}-v5_2x2x1x2slices-{aot.program_version(tiny)}.json"
    assert [p.name for p in tmp_path.glob("*.json")] == [name]
