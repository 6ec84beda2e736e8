"""The step-time model against published runs: recompute the calibration table, hold the held-out rows to 25 %."""

from __future__ import annotations

import pytest

from orchestrator.calibrate import tpu as calibration
from orchestrator.calibrate.published_tpu import ROWS
from orchestrator.plan.hardware import model_of
from orchestrator.plan.steptime import kernel_efficiency, step_time

EIGHT_M = 8 * 2**20
TABLE = calibration.table()


def _id(c: calibration.Check) -> str:
    return c.row.label.replace(" ", "_")


def test_every_long_row_is_held_out():
    """Calibrate only up to 4M tokens: every row of 8M tokens or more is held out, and so are the chosen ones."""
    for r in ROWS:
        if r.length >= EIGHT_M:
            assert r.held_out, r.label
        assert r.source and (r.mfu is not None) != (r.step_s is not None), r.label
    held = [r for r in ROWS if r.held_out]
    assert len(held) >= 10 and any(r.length < EIGHT_M for r in held)


def test_fit_never_sees_held_out_rows(monkeypatch):
    seen = []
    real = calibration.check
    monkeypatch.setattr(calibration, "check", lambda row, spec=None: seen.append(row) or real(row, spec))
    calibration.fit("tpu7x_128", rounds=1)
    assert seen and not any(r.held_out for r in seen) and {r.cluster for r in seen} == {"tpu7x_128"}


@pytest.mark.parametrize("c", [c for c in TABLE if not c.row.held_out], ids=_id)
def test_calibration_rows(c):
    """Predicted vs published for every row the constants were fitted on (a fit, so only a loose bound)."""
    print(f"{c.row.label}: published {c.published:.1%}, predicted {c.predicted:.1%} ({c.error:+.0%})")
    assert abs(c.error) < 0.30, c


@pytest.mark.parametrize("c", [c for c in TABLE if c.row.held_out], ids=_id)
def test_held_out_rows_within_25_percent(c):
    """Never fitted on: MFU within 25 % (relative) of the published figure, for every TPU row."""
    print(f"{c.row.label}: published {c.published:.1%}, predicted {c.predicted:.1%} ({c.error:+.0%})")
    assert abs(c.error) <= calibration.TOLERANCE, f"{c.row.label} ({c.row.held_out}): {c.error:+.0%}"


def test_table_renders_every_row():
    md = calibration.markdown(TABLE)
    assert md.count("\n") == len(ROWS) + 1 and "held out: 8M tokens or more" in md


def test_page_has_constants_both_tables_and_caveats():
    """docs/results/calibration.md's body: every row once, the three chips' constants, tpu7x's shared ones marked."""
    body = calibration.page_body(TABLE)
    labels = [c.row.label for c in TABLE]  # the 4M Ironwood run is there twice: with and without p-state 7
    assert all(body.count(f"| {x} |") == labels.count(x) for x in labels)
    assert body.count("| held out because |") == 1 and "## Caveats" in body
    for chip in ("| v5p |", "| tpu7x |", "| local CPU |"):
        assert chip in body
    marked = body.count("(v5p's)") - 1  # less the sentence that explains the mark
    assert marked == len(calibration.SHARED)


def test_kernel_efficiency_grows_with_head_dim_and_block():
    c = model_of(ROWS[0].spec.cluster)
    assert kernel_efficiency(c, 128, 65536) < kernel_efficiency(c, 256, 65536) <= c.attention_efficiency
    assert kernel_efficiency(c, 256, 1024) < kernel_efficiency(c, 256, 65536)


def test_remat_and_offload_cost_time_not_model_flops():
    """Recompute lowers MFU at the same model FLOPs; offload adds transfer that compute hides at these sizes."""
    from dataclasses import replace

    base = next(r for r in ROWS if r.label == "v5p_128 8B-hd256 ring 4,096K").spec
    runs = {
        p: step_time(replace(base, train=replace(base.train, remat=p))) for p in ("none", "save_attn", "full")
    }
    assert len({round(s.tflops_per_device, 6) for s in runs.values()}) == 1
    assert runs["none"].step_s < runs["save_attn"].step_s < runs["full"].step_s
    off = step_time(replace(base, train=replace(base.train, remat="offload")))
    assert off.exposed_offload_s == 0.0 and off.step_s == pytest.approx(runs["full"].step_s)
    tiny = replace(model_of(base.cluster), host_bytes_per_s=1e6)  # a starved host link: offload limits
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
    predicted = {s.trial_id: s.context_length / 8e3 for s in specs}
    trials = collect(specs, recs.__getitem__, None, predicted)
    ax = make_figures(trials)["step_time_vs_context"].axes[0]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines["ring measured"] == pytest.approx([0.1024, 0.2048])
    assert lines["ring predicted"] == pytest.approx([0.128, 0.256])
    at_run = [step_time(s, peak=0.02).step_s for s in specs]
    assert lines["ring predicted at run-time rate"] == pytest.approx(at_run)
    assert [t.predicted_step_at_run_s for t in trials] == pytest.approx(at_run)


def test_cpu_probe_measures_this_host(monkeypatch):
    """Unpinned, the planner runs the job's own matmul probe in a child process (no jax in the driver)."""
    from orchestrator.plan import hardware as peak

    monkeypatch.delenv(peak.CPU_PEAK_ENV, raising=False)
    rate = peak.measured_cpu_tflops.__wrapped__(4, "float32")
    assert rate > 0 and rate != peak.NOMINAL_CPU_TFLOPS  # measured, not the fallback
