"""The planner: validation messages, fit verdicts at 14M tokens on the 64-chip clusters, TFLOPs, output."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config.load import group_option
from orchestrator.plan import (
    cluster_model,
    memory,
    plan,
    plan_one,
    render_table,
    to_json,
    to_markdown,
    validity,
)
from orchestrator.plan.search import recommend

ROOT = Path(__file__).resolve().parent.parent
L14M = 14 * 2**20


pytestmark = pytest.mark.usefixtures("pinned_cpu_peak")


def conf(group: str, name: str) -> dict:
    return group_option(group, name)


def spec(
    model="llama3_1_8b", cluster="v5p_128", strategy="ring", length=L14M, mesh=None, **train
) -> TrialSpec:
    c = cluster_model.load(cluster)[0]
    return TrialSpec(
        model=ModelSpec(**conf("model", model)),
        mesh=mesh or MeshSpec(context=c.devices),
        strategy=StrategySpec(**conf("strategy", strategy)),
        context_length=length,
        train=TrainSpec(**train),
        cluster=c,
    )


USP = {
    "v5p_128": MeshSpec(context_ulysses=8, context=8),
    "tpu7x_128": MeshSpec(context_ulysses=8, context=16),
}


def rows_14m(cluster: str) -> dict:
    names = ("all_gather", "ulysses", "ring", "usp")
    return {
        n: plan_one(spec(cluster=cluster, strategy=n, mesh=USP[cluster] if n == "usp" else None))
        for n in names
    }


def test_tflops_match_maxtext():
    row = plan_one(spec(length=131_072))
    assert row.tflops_per_device_per_step == pytest.approx(303.3, rel=1e-3)


@pytest.mark.parametrize("cluster", ["v5p_128", "tpu7x_128"])
def test_14m_points_all_gather_and_ulysses(cluster):
    rows = rows_14m(cluster)
    ag = rows["all_gather"]
    assert ag.verdict == "infeasible"
    assert "needs" in ag.reason and "full K,V of 14,680,064 tokens: 56.0 GiB/layer" in ag.reason
    uly = rows["ulysses"]
    P = cluster_model.load(cluster)[0].devices
    assert uly.verdict == "invalid"
    assert f"context={P}" in uly.reason and f"32 % {P} = 32" in uly.reason
    assert uly.predicted_hbm_bytes_per_device is None


def rows_14m_remat(cluster: str, remat: str) -> dict:
    return {
        n: plan_one(spec(cluster=cluster, strategy=n, mesh=USP[cluster] if n == "usp" else None, remat=remat))
        for n in ("ring", "usp")
    }


def test_14m_ring_and_usp_fit_tpu7x():
    """The loss unembeds in chunks of 256 MiB of fp32 logits (jobs.spec.loss_chunk_tokens): ring and USP fit
    tpu7x-128's 128 devices."""
    rows = rows_14m_remat("tpu7x_128", "full")
    for name in ("ring", "usp"):
        assert rows[name].verdict == "run", rows[name].reason
        assert rows[name].predicted_hbm_bytes_per_device < 96 * 2**30


def test_14m_on_v5p_full_remat_is_tight_and_offload_frees_the_layer_inputs():
    """64 devices hold 229,376 tokens each: with remat=full the saved layer inputs alone are 56 GiB of 95, and
    ring is at the edge (libtpu fits it with a 93.6 GiB peak; the planner says 99.1, 1.06 x that:
    docs/results/aot.md); offloading them to host memory (remat=offload, the public v5p recipe's policy) makes ring and USP
    fit with room."""
    full, offload = rows_14m_remat("v5p_128", "full"), rows_14m_remat("v5p_128", "offload")
    assert 93.6 * 2**30 < full["ring"].predicted_hbm_bytes_per_device < 1.15 * 93.6 * 2**30
    for name in ("ring", "usp"):
        assert full[name].memory["saved_activations"] == pytest.approx(56 * 2**30, rel=0.01)
        assert offload[name].verdict == "run", offload[name].reason
        assert offload[name].memory["saved_activations"] == 0
        assert offload[name].memory["host_offload"] == pytest.approx(56 * 2**30, rel=0.01)
        assert offload[name].predicted_hbm_bytes_per_device < 80 * 2**30


def test_over_hbm_names_the_memory_policy_that_fits():
    """v5p_128 ring at 14M with remat full is over HBM; the reason names the preset that fits (remat=offload,
    the public v5p recipe's), with its figure; all_gather fits under none; a point that fits pays nothing."""
    full, off = plan_one(spec()), plan_one(spec(remat="offload"))
    assert full.verdict == "infeasible" and off.verdict == "run"
    assert full.reason.startswith("needs ") and "largest term: saved activations" in full.reason
    assert full.reason.endswith(
        f"; fits with train.remat=offload ({memory.gib(off.predicted_hbm_bytes_per_device)})"
    )
    ag = plan_one(spec(strategy="all_gather"))
    assert "; no train.remat preset fits (leanest: train.remat=offload, " in ag.reason
    assert "train.remat" not in plan_one(spec(length=131_072)).reason


def test_131k_all_four_feasible():
    pts = [
        spec(strategy="all_gather", length=131_072),
        spec(strategy="ring", length=131_072),
        spec(strategy="usp", length=131_072, mesh=USP["v5p_128"]),
        spec(strategy="ulysses", length=131_072, mesh=MeshSpec(context=32, fsdp=2), batch=2),
    ]
    rows = plan(pts)
    assert [r.verdict for r in rows] == ["run"] * 4, [r.reason for r in rows]
    for r in rows:
        assert 0 < r.predicted_mfu <= 1 and r.predicted_step_s > 0 and r.comm_bytes_per_layer > 0
        # the model is slower than the bound it refines, and says what it is limited by
        assert r.predicted_mfu < r.roofline_mfu and r.predicted_step_s > r.roofline_step_s and r.limiter
        assert r.predicted_hbm_bytes_per_device < 95 * 2**30


def test_validation_messages_name_numbers_and_fix():
    bad = [
        spec(mesh=MeshSpec(context=32)),  # 32 devices on a 64-device cluster
        spec(mesh=MeshSpec(context=32, fsdp=2), batch=1),  # batch 1 over fsdp 2
        spec(length=131_136, mesh=MeshSpec(context=64)),  # zigzag needs L % 128
        spec(strategy="ulysses", mesh=MeshSpec(context=4, tensor=16)),  # tensor 16 > kv heads 8
    ]
    msgs = [[str(p) for p in validity.problems(s)] for s in bad]
    assert any("= 32 devices but cluster v5p_128 has 64" in m for m in msgs[0])
    assert any("[batch vs data*fsdp]" in m and "1 % 2 = 1" in m for m in msgs[1])
    assert any("131136 % 128 = 64" in m and "layout=contiguous" in m for m in msgs[2])
    assert any("tensor=16" in m and "kv_heads=8" in m for m in msgs[3])
    for s, m in zip(bad, msgs, strict=True):
        assert m and all(line.startswith(s.trial_id) and "\n" not in line for line in m)
    # every problem of every point at once, one line each
    assert len(validity.validate(bad)) == sum(len(m) for m in msgs)


def test_one_point_reports_every_broken_rule():
    s = spec(strategy="ulysses", length=1000, mesh=MeshSpec(context=64, fsdp=2), batch=1)
    rules = {p.rule for p in validity.problems(s)}
    assert {"mesh vs cluster", "batch vs data*fsdp", "heads per strategy", "sequence divisibility"} <= rules
    row = plan_one(s)
    assert row.verdict == "invalid" and row.reason.count(";") >= 3


def test_local_cluster_budget():
    """On cluster=local the tiny cp_scaling points up to 4K tokens run, longer ones miss the 3 s budget
    (the step-time model at the nominal host rate; a sweep plans with the rate it measures)."""
    rows = plan(
        [spec("tiny", "local", n, L, MeshSpec(context=8)) for n in ("ring", "ulysses") for L in (4096, 8192)]
    )
    assert [r.verdict for r in rows] == ["run", "infeasible"] * 2
    assert "> this cluster's 3 s budget" in rows[1].reason
    far = plan_one(spec("tiny", "local", "all_gather", L14M, MeshSpec(context=8)))
    assert far.verdict == "infeasible" and "cpu has 1.0 GiB" in far.reason


def test_outputs():
    rows = plan([spec(length=131_072), spec(strategy="ulysses"), spec(strategy="all_gather")])
    data = json.loads(to_json(rows))
    assert [d["verdict"] for d in data] == ["run", "invalid", "infeasible"]
    assert data[0]["predicted_mfu"] < data[0]["roofline_mfu"] and data[0]["limiter"]
    assert data[1]["predicted_mfu"] is None and data[1]["roofline_mfu"] is None
    assert data[0]["memory"]["params"] == memory.breakdown(spec(length=131_072))["params"]
    console = Console(record=True, width=100)
    render_table(rows, console)
    text = console.export_text()
    assert "infeasible" in text and "1 run, 1 infeasible, 1 invalid" in text
    assert (
        "step s (band)" in text and "MFU ≤ (roofline)" not in text
    )  # compact: the roofline is in the reason
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    assert "    model " not in text  # one model: not repeated on every point
    console = Console(record=True, width=100)
    render_table(plan([spec(length=131_072), spec("tiny_gemma", length=131_072)]), console)
    text = console.export_text()  # a sweep over models: each point's model on its detail line
    assert "    model llama3_1_8b; " in text and "    model tiny_gemma; " in text
    console = Console(record=True, width=300)
    render_table(rows, console, wide=True)
    assert "MFU ≤ (roofline)" in console.export_text()
    assert to_markdown(rows).count("\n") == 4


def test_predicted_mfu_tracks_published_runs():
    """The plan's own rows for the published 4M-token recipes land near their measured MFU (roofline: 1.00)."""
    v5p = plan_one(spec("llama3_1_8b_long", "v5p_128", "ring", 4 * 2**20, batch=2, remat="save_attn"))
    tpu7x = plan_one(spec("llama3_1_8b_long", "tpu7x_128", "ring", 4 * 2**20, remat="save_attn"))
    assert v5p.predicted_mfu == pytest.approx(0.699, rel=0.1) and v5p.roofline_mfu > 0.9
    assert tpu7x.predicted_mfu == pytest.approx(0.509, rel=0.1) and tpu7x.roofline_mfu > 0.9
    assert "attention kernel" in v5p.limiter and "head_dim 256" in v5p.limiter


def test_recommend():
    rec = recommend(ModelSpec(**conf("model", "llama3_1_8b")), cluster_model.load("v5p_128")[0], 131_072)
    assert rec.row is not None and rec.row.verdict == "run" and rec.spec.mesh.size == 64
    assert rec.row.strategy in rec.reason and "fastest" in rec.reason and "limited by" in rec.reason
    assert f"MFU {rec.row.predicted_mfu:.2f} (roofline ≤ {rec.row.roofline_mfu:.2f})" in rec.reason
    best = min((r for r in rec.candidates if r.verdict == "run"), key=lambda r: r.predicted_step_s)
    assert best.trial_id == rec.row.trial_id
    none = recommend(ModelSpec(**conf("model", "llama3_1_8b")), cluster_model.load("local")[0], L14M)
    assert none.spec is None and "nothing fits" in none.reason


AOT_POINTS = [  # (strategy, mesh, length, block, remat): blocks cover each kernel call's local sequence
    ("ring", MeshSpec(context=4), 2048, 512, "full"),
    ("all_gather", MeshSpec(context=4), 1024, 1024, "full"),
    ("usp", MeshSpec(context_ulysses=2, context=2), 2048, 1024, "full"),
]


def _aot_rows() -> list:
    """aot.compare's rows (aot.Comparison) for AOT_POINTS."""
    from orchestrator.plan import aot

    specs = []
    for name, mesh, length, block, remat in AOT_POINTS:
        s = spec("tiny", "v5p_128", name, length, mesh, remat=remat)
        specs.append(replace(s, strategy=replace(s.strategy, kernel="xla", block_q=block, block_kv=block)))
    return aot.compare(specs, topology="2x2x1")


@pytest.mark.slow
def test_analytic_never_below_tpu_compiler():
    """The planner may over-predict memory, never under-predict it by more than 5 % (a plan that says `run` must
    compile). Compiles for a v5p 2x2x1 slice; the session's AOT cache (conftest.py) serves the next test."""
    pytest.importorskip("libtpu")
    for r in _aot_rows():
        assert r.status == "compiled" and r.ratio >= 0.95, r


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="tiny model, xla kernel: the analytic model over-predicts all_gather and "
    "usp (2.7, 3.0 x the compiler's peak) and ring (2.5): the xla kernel's tile term; strict, so a fix shows",
)
def test_analytic_vs_tpu_compiler():
    """The analytic model against the real TPU compiler's memory_analysis on a v5p 2x2x1 slice (4 devices).

    Blocks cover each kernel call's local sequence: with several blocks per call the current XLA kernel
    compiles to O(L_q x L_k) buffers, which no flash-style model predicts. The model prices the xla kernel's
    transients, so the points pin kernel=xla (auto would compile splash for TPU, whose transients the model
    does not price yet). Compiles take ~1 min each on 2 cores the first time, then come from the AOT cache.
    """
    pytest.importorskip("libtpu")
    for r in _aot_rows():
        assert 0.75 <= r.ratio <= 1.25, r
