"""GPU clusters (conf/cluster/dgx_*.yaml) against published GPU runs: every row prices, NeMo's TFLOP/s reproduce
from our FLOPs, the fit gives the configs' constants, and the planner and recommender across two DGX H100 nodes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from jobs.flops import PEAK_TFLOPS_PER_DEVICE
from jobs.spec import ClusterSpec, MeshSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.calibrate import family, gpu
from orchestrator.calibrate.published_gpu import (
    CHECKS,
    FLOP_TOLERANCE,
    FP8_SHARE,
    NEMO_B200,
    NEMO_H100,
    PEAK,
    ROWS,
    SOURCES,
    cluster_option,
    gpu_cluster,
    linear_share,
)
from orchestrator.calibrate.published_tpu import model
from orchestrator.calibrate.tpu import check
from orchestrator.plan import cluster_model, plan_one, validity
from orchestrator.plan.search import recommend
from orchestrator.plan.steptime import step_time

pytestmark = pytest.mark.usefixtures("pinned_cpu_peak")
TABLE = [check(r) for r in ROWS]
L1M = 2**20


def _id(c) -> str:
    return c.row.label.replace(" ", "_")


def two_nodes(name: str = "dgx_h100") -> ClusterSpec:
    return replace(gpu_cluster(name, 8), slices_per_trial=2)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label.replace(" ", "_"))
def test_every_row_builds_a_valid_spec_and_prices(row):
    s = row.spec
    assert validity.problems(s) == [], row.label
    assert s.cluster.platform == "gpu" and s.cluster.hosts == 1 and s.mesh.size == row.chips_devices
    assert (s.cluster.slices_per_trial > 1) == bool(s.mesh.dcn)  # a replica over nodes lays context across
    st = step_time(s, offload=row.offload)
    assert st.step_s > 0 and 0 < st.mfu < 1 and math.isfinite(st.step_s)
    assert row.source in SOURCES and (row.mfu is not None) != (row.step_s is not None)


def test_labels_are_unique_and_every_source_has_rows():
    assert len({r.label for r in ROWS}) == len(ROWS)
    assert {r.cluster for r in ROWS} == {"dgx_h100", "dgx_b200"} and {r.source for r in ROWS} == set(SOURCES)


def test_fp8_rows_excluded_by_their_linear_share():
    """Rows with FP8 linear layers above FP8_SHARE of the FLOPs never calibrate; at most that share they may."""
    for r in ROWS:
        if r.source_tflops:  # NeMo: FP8
            share = linear_share(model(r.model), r.length)
            assert bool(r.excluded) == (share > FP8_SHARE), r.label


def test_nemo_tflops_reproduce_from_our_flops():
    """Where NeMo gives tokens/s and TFLOP/s, our count with the whole attention square gives its TFLOP/s; the
    causal count would not (NeMo counted full attention until #14424)."""
    for c in CHECKS:
        print(f"{c.label}: ours {c.ours:.1f} vs {c.tflops} ({c.error:+.3%})")
        assert abs(c.error) <= FLOP_TOLERANCE, c.label
        causal = replace(c, full_attention=False)
        assert causal.error < -0.05, c.label


def test_maxtext_row_is_self_consistent():
    """JAX-Toolbox's table: 16 sequences at 0.721 s/step is its 22.19 sequences/s."""
    (row,) = [r for r in ROWS if r.label.endswith("(MaxText)")]
    assert row.batch / row.step_s == pytest.approx(22.19, abs=0.01)


def test_config_peaks_are_the_rows_peaks():
    for name, peak in PEAK.items():
        assert gpu_cluster(name, 8).peak_tflops_per_device == peak
    for name in ("h100", "h200"):
        assert gpu_cluster(f"dgx_{name}", 8).peak_tflops_per_device == PEAK_TFLOPS_PER_DEVICE[name]


def test_gpu_cluster_is_one_host_per_node():
    c = gpu_cluster("dgx_h100", 256)
    assert (c.hosts, c.devices_per_host, c.slices_per_trial, c.devices) == (1, 8, 32, 256)
    assert gpu_cluster("dgx_b200", 2).devices == 2
    env = cluster_option("dgx_h100")["env"]
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler=true"


@pytest.fixture(scope="module")
def result() -> family.Result:
    return family.calibrate(family.GPU)


def test_configs_hold_the_gpu_fit_and_h200_is_h100s(result):
    """conf/cluster/dgx_*.yaml carry what `python -m orchestrator.calibrate --gpu --fit --write` computes, with
    the TPU family's constants kept where no GPU row pins them, and H200 takes H100's."""
    v5p = cluster_model.load("v5p_128")[1]
    for chip, values in result.constants.items():
        have = cluster_model.load(chip)[1]
        for k, v in values.items():
            assert getattr(have, k) == pytest.approx(v, rel=2e-3, abs=1e-9), (chip, k)
        for k in gpu.BORROWED:
            assert getattr(have, k) == getattr(v5p, k), (chip, k)
    assert result.constants["dgx_h200"] == result.constants["dgx_h100"]


def test_no_gpu_fit_sees_an_excluded_row_or_its_own_table(result):
    fitted = [c for c in result.held_out if not c.row.excluded]
    assert {c.row.table for c in fitted} == {"JAX-Toolbox MaxText", NEMO_H100, NEMO_B200}
    for c in fitted:  # every cell the fit that never saw its table predicts within 20 %
        print(f"{c.row.label}: held out {c.error:+.1%}")
        assert abs(c.error) <= 0.20, c.row.label


@pytest.mark.parametrize("c", [c for c in TABLE if not c.row.excluded], ids=_id)
def test_calibration_rows_within_5_percent(c):
    print(f"{c.row.label}: published {c.published:.1%}, predicted {c.predicted:.1%} ({c.error:+.1%})")
    assert abs(c.error) < 0.05, c.row.label


@pytest.mark.parametrize("cluster", ["dgx_h100", "dgx_b200"])
def test_fp8_excluded_rows_are_underpredicted_more_the_more_fp8_they_run(cluster):
    """The model runs linear layers at BF16 rates: FP8 rows come out below published, the further the larger
    their linear share (reported, not fitted: the errors are the page's)."""
    fp8 = [c for c in TABLE if c.row.cluster == cluster and "FP8" in c.row.excluded]
    fp8.sort(key=lambda c: linear_share(model(c.row.model), c.row.length))
    for c in fp8:
        print(f"{c.row.label}: {linear_share(model(c.row.model), c.row.length):.0%} FP8, {c.error:+.1%}")
    errors = [c.error for c in fp8]
    assert len(fp8) >= 6 and all(e < 0 for e in errors) and errors == sorted(errors, reverse=True)


# -- the planner and the recommender on two DGX H100 nodes -------------------------------------------------------
def spec(strategy: str, mesh: MeshSpec, length: int = L1M) -> TrialSpec:
    return TrialSpec(
        model=model("llama3_1_8b"),
        mesh=mesh,
        strategy=StrategySpec(name=strategy, layout="zigzag"),
        context_length=length,
        train=TrainSpec(remat="full"),
        cluster=two_nodes(),
    )


def test_plan_two_nodes_with_the_ring_across_them():
    """Ring over 16 GPUs of 2 nodes, context across the InfiniBand: its hops hide behind attention; all_gather's
    blocking gathers do not; Ulysses' all-to-all may not cross."""
    ring = plan_one(spec("ring", MeshSpec(context=16, dcn="context")))
    assert ring.verdict == "run" and ring.dcn_exposed_s == 0.0
    assert "DCN over context across 2 slices: 0 s exposed of" in ring.limiter
    gather = plan_one(spec("all_gather", MeshSpec(context=16, dcn="context")))
    assert gather.verdict == "run" and 0 < gather.dcn_exposed_s < gather.predicted_step_s
    ulysses = plan_one(spec("ulysses", MeshSpec(context=8, fsdp=2, dcn="context")))
    assert ulysses.verdict == "invalid" and "all-to-all" in ulysses.reason


def test_composed_two_node_point_plans_with_its_dcn_exposure():
    """The driver's own route: `cluster=dgx_h100 cluster.slices_per_trial=2 mesh.dcn=context` composed by Hydra,
    expanded and planned; mesh=auto fills the 16 GPUs with the ring."""
    from orchestrator.config.grid import expand
    from orchestrator.config.load import load

    words = [
        "cluster=dgx_h100",
        "cluster.slices_per_trial=2",
        "mesh.dcn=context",
        "model=llama3_1_8b",
        "strategy=ring",
        f"context_length={L1M}",
    ]
    (s,) = expand(load(words))
    assert s.mesh == MeshSpec(context=16, dcn="context") and s.cluster.devices == 16
    row = plan_one(s)
    assert (
        row.verdict == "run"
        and row.dcn_exposed_s == 0.0
        and "DCN over context across 2 slices" in row.limiter
    )


def test_recommender_puts_the_ring_across_nodes_and_ulysses_inside_nvlink():
    """What the model chooses at the configs' constants for Llama-3.1-8B at 128K on 2 DGX H100 nodes: USP with its
    ring (context=2) across the nodes and its all-to-all (context_ulysses=8) inside each node's NVLink; plain
    ring within 2 %."""
    rec = recommend(model("llama3_1_8b"), two_nodes(), 131_072)
    print(rec.reason)
    m = rec.spec.mesh
    assert rec.dcn == "context" and rec.row.strategy == "usp" and (m.context, m.context_ulysses) == (2, 8)
    assert (
        "across 2 slices, usp with dcn=context" in rec.reason
        and "the all-to-alls stay in a slice" in rec.reason
    )
    assert "ulysses never is valid" in rec.reason
    assert recommend(model("llama3_1_8b"), gpu_cluster("dgx_h100", 8), 131_072).dcn == ""
