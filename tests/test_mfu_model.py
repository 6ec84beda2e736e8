"""The step-time model against published TPU runs: every table held out of its own fit, the bands those errors
give, the configs holding the fit's constants, and the mechanisms the model prices."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

import jobs.hardware
from orchestrator.calibrate import family, fit
from orchestrator.calibrate.published_tpu import ROWS
from orchestrator.calibrate.tpu import KNOBS, check
from orchestrator.plan import cluster_model
from orchestrator.plan.cluster_model import model_of
from orchestrator.plan.steptime import kernel_efficiency, step_time

GOAL = 0.20  # every held-out cell's step within 20 % (issue #40's goal)
PICK = 0.05  # a held-out fit's pick within 5 % of the best measured step


@pytest.fixture(scope="module")
def result() -> family.Result:
    return family.calibrate(family.TPU)


def test_rows_have_a_source_a_figure_and_a_reason_to_be_excluded():
    for r in ROWS:
        assert r.source and (r.mfu is not None) != (r.step_s is not None), r.label
    assert [r.label for r in ROWS if r.excluded] == ["tpu7x_128 8B-hd256 ring 4,096K"]  # the clock setting
    assert len({r.table for r in ROWS}) >= 5


def test_no_fit_sees_the_table_it_predicts_or_an_excluded_row(monkeypatch):
    seen: list[set[str]] = []

    def spy(
        rows, knobs, base, fixed=None
    ):  # records what a fit would see; prices with the configs' constants
        seen.append({r.table for r in rows})
        return {chip: {} for chip in base}

    monkeypatch.setattr(fit, "fit", spy)
    rows = family.TPU.rows()
    cells = fit.leave_one_table_out(rows, KNOBS, family.TPU.base())
    tables = list(dict.fromkeys(r.table for r in rows))
    assert seen == [set(tables) - {t} for t in tables]
    assert {c.row.table for c in cells} == set(tables) and len(cells) == len(rows)


def test_every_held_out_cell_is_within_the_goal(result):
    """Predicted by the fit on every other table: each fitted cell's step within 20 % of the published one."""
    for c in result.held_out:
        print(f"{c.row.table}: {c.row.label}: {c.error:+.0%}")
    missed = [
        (c.row.label, f"{c.error:+.0%}")
        for c in result.held_out
        if not c.row.excluded and abs(c.error) > GOAL
    ]
    assert not missed, missed


def test_held_out_picks(result):
    """At each point of a table that compares strategies, the held-out fit's fastest against the measured best:
    every pick within 5 % but PR #4836's 64K (the model's fixed costs per ring hop are pinned by that table
    alone: held out, it prices usp8x8 ahead of all-gather, 9.9 % slower measured)."""
    regret = {p.point: p.regret for p in result.picks}
    assert len(regret) == 4
    assert sorted(r <= PICK for r in regret.values()) == [False, True, True, True], regret
    assert max(regret.values()) < 0.10, regret


def test_configs_hold_the_fit_and_its_bands(result):
    """conf/cluster/*.yaml carries what `python -m orchestrator.calibrate --fit --write` computes (4 digits)."""
    for chip, values in result.constants.items():
        have = cluster_model.load(chip)[1]
        for k, v in values.items():
            # a band is a quantile over a dozen held-out fits, each least-squares path differing in its last
            # digits from one CPU's BLAS to another's: it moves by up to ~0.5 % between machines (0.8499 here,
            # 0.8535 on another Xeon), the fitted constants by far less
            rel = 1e-2 if "_band_" in k else 2e-3
            assert getattr(have, k) == pytest.approx(v, rel=rel, abs=1e-9), (chip, k)
    (lo, hi) = result.bands["step"]
    assert lo < 1 < hi and hi - lo < 0.4  # compute-bound steps: a band of about +-15 %


def test_band_covers_the_held_out_cells(result):
    inside = sum(c.row.step_s / c.predicted_s >= 0.999 * result.bands["step"][0] for c in result.held_out)
    assert inside >= 0.9 * len(result.held_out) - 2


def test_published_14m_points_with_their_host_ram():
    """The hidden-transfer and host-RAM terms on the published 14M runs: MFU within 25 % of 0.371 (v5p,
    layer inputs offloaded) and 0.487 (tpu7x, layer inputs and attention outputs), and both fit their hosts."""
    from orchestrator.plan import plan_one
    from orchestrator.plan.policies import Policy

    for label, published in (
        ("v5p_128 8B-hd256 ring 14,336K", 0.371),
        ("tpu7x_128 8B-hd256 ring 14,336K", 0.487),
    ):
        row = next(r for r in ROWS if r.label == label)
        c = check(row)
        assert abs(c.predicted / published - 1) <= 0.25, (label, c.predicted)
        policy = Policy("full", replace(row.spec.train.memory, offload=row.offload))
        planned = plan_one(replace(row.spec, train=policy.apply(row.spec.train)))
        host = next(r for r in planned.resources if r.name == "host_memory")
        assert host.verdict == "fits" and 0 < host.used < host.capacity, (label, host)


def test_kernel_efficiency_grows_with_head_dim():
    c = model_of(ROWS[0].spec.cluster)
    assert kernel_efficiency(c, 128) < kernel_efficiency(c, 256) <= c.attention_efficiency


def test_zigzag_balances_what_contiguous_leaves_on_the_last_device():
    """The schedule's busiest device: contiguous causal shards leave the last one about twice the mean; zigzag
    halves the chunks and evens the work; the step keeps what the halved chunks cost."""
    base = next(r for r in ROWS if r.label == "v5p 8B ring 256K cp64").spec
    contiguous = step_time(base)
    zigzag = step_time(replace(base, strategy=replace(base.strategy, layout="zigzag")))
    assert 1.3 < contiguous.attention_s / zigzag.attention_s < 2.0
    assert zigzag.step_s < contiguous.step_s


def test_remat_and_offload_cost_time_not_model_flops():
    """Recompute lowers MFU at the same model FLOPs; offload costs its exposed share, and limits the step when the
    host link starves."""
    base = next(r for r in ROWS if r.label == "v5p_128 8B-hd256 ring 4,096K").spec
    runs = {
        p: step_time(replace(base, train=replace(base.train, remat=p))) for p in ("none", "save_attn", "full")
    }
    assert len({round(s.tflops_per_device, 6) for s in runs.values()}) == 1
    assert runs["none"].step_s < runs["save_attn"].step_s < runs["full"].step_s
    off = step_time(replace(base, train=replace(base.train, remat="offload")))
    m = model_of(base.cluster)
    assert off.exposed_offload_s == pytest.approx(m.offload_exposed * off.offload_s, rel=1e-6)
    assert off.step_s == pytest.approx(runs["full"].step_s + off.exposed_offload_s, rel=1e-9)
    tiny = replace(m, host_bytes_per_s=1e6)  # a starved host link: offload becomes the limiter
    slow = step_time(replace(base, train=replace(base.train, remat="offload")), model=tiny)
    assert slow.exposed_offload_s > 0 and slow.limiter.startswith("offload bandwidth")


def test_step_time_plot_draws_predicted_next_to_measured():
    """The sweep's step-time figure: each strategy's measured median and the planner's prediction, dashed."""
    from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
    from orchestrator.results.report import collect, make_figures

    tiny = ModelSpec("tiny", vocab=256, embed=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, mlp=128)
    specs = [
        TrialSpec(tiny, MeshSpec(context=8), StrategySpec(name="ring"), L, TrainSpec(steps=2), ClusterSpec())
        for L in (1024, 2048)
    ]
    recs = {
        s.trial_id: [
            {"kind": "start", "peak_tflops_per_device": 0.02},  # the rate the trial measured
            {"kind": "summary", "step_time_median_s": s.context_length / 1e4, "mfu": 0.1},
        ]
        for s in specs
    }
    rows = {  # what the report reads of a PlanRow
        s.trial_id: SimpleNamespace(
            predicted_step_s=s.context_length / 8e3, predicted_hbm_bytes_per_device=None
        )
        for s in specs
    }
    trials = collect(specs, recs.__getitem__, rows)
    ax = make_figures(trials)["step_time_vs_context"].axes[0]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines["ring measured"] == pytest.approx([0.1024, 0.2048])
    assert lines["ring predicted"] == pytest.approx([0.128, 0.256])
    at_run = [step_time(s, peak=0.02).step_s for s in specs]
    assert lines["ring predicted at run-time rate"] == pytest.approx(at_run)
    assert [t.predicted_step_at_run_s for t in trials] == pytest.approx(at_run)


def test_cpu_probe_measures_this_host(monkeypatch):
    """Unpinned, the planner runs the job's own matmul probe in a child process (no jax in the driver)."""
    monkeypatch.delenv(jobs.hardware.CPU_PEAK_ENV, raising=False)
    rate = cluster_model.measured_cpu_tflops.__wrapped__(4, "float32")
    assert rate > 0 and rate != cluster_model.NOMINAL_CPU_TFLOPS  # measured, not the fallback


def test_a_pinned_cpu_rate_is_the_trials_denominator_too(monkeypatch):
    """CP_PLAN_CPU_TFLOPS pins the rate for the trial's MFU as for the plan (both divide by one number), labelled
    as pinned; a trial's hosts get the driver's pin. Unpinned, the job measures its matmul on the spot."""
    from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
    from orchestrator.launch.cluster import worker_env

    tiny = ModelSpec("tiny", vocab=256, embed=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, mlp=128)
    spec = TrialSpec(tiny, MeshSpec(context=8), StrategySpec(name="ring"), 1024, TrainSpec(), ClusterSpec())
    monkeypatch.setenv(jobs.hardware.CPU_PEAK_ENV, "0.0123")
    assert jobs.hardware.peak_tflops(spec) == (0.0123, "cpu_pinned_bfloat16")
    cluster_model.measured_cpu_tflops.cache_clear()  # the suite's own pin, read by an earlier test of this process
    try:
        assert cluster_model.peak_tflops(spec) == 0.0123
    finally:
        cluster_model.measured_cpu_tflops.cache_clear()  # later tests read the suite's pin again
    assert worker_env(spec.cluster)[jobs.hardware.CPU_PEAK_ENV] == "0.0123"
    tpu = replace(spec.cluster, platform="tpu", accelerator="v5p", peak_tflops_per_device=459.0)
    assert jobs.hardware.CPU_PEAK_ENV not in worker_env(tpu)
    monkeypatch.delenv(jobs.hardware.CPU_PEAK_ENV)
    rate, source = jobs.hardware.peak_tflops(spec)
    assert source == "cpu_measured_bfloat16" and rate > 0 and rate != 0.0123
