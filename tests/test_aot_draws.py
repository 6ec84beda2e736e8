"""A point compiled in several draws is judged by its worst (result.worst): a refusal beats a fit, a failure beats
both, and the verdict states the spread."""

from __future__ import annotations

from orchestrator.plan import cluster_model
from orchestrator.plan.aot import result
from orchestrator.plan.aot.result import CompileResult, verdict

GIB = 2**30


def fit(peak_gib: float) -> CompileResult:
    return CompileResult(trial_id="t", compiler_peak_bytes=int(peak_gib * GIB), peak_bytes=int(70 * GIB))


TPU7X_HBM = cluster_model.load("tpu7x_128")[1].hbm_bytes_per_device  # 192 GB of HBM a chip


def test_the_largest_peak_is_judged_and_every_draw_is_kept():
    got = result.worst([fit(50.7), fit(54.4), fit(50.7)])
    assert got.compiler_peak_bytes == int(54.4 * GIB)
    assert got.draw_bytes == (int(50.7 * GIB), int(54.4 * GIB), int(50.7 * GIB))
    assert CompileResult.from_json(got.to_json()) == got  # the tuple survives the cache's JSON
    v, reason = verdict(got, TPU7X_HBM)
    assert v == "run" and reason.endswith("(worst of 3 draws: 50.7-54.4 GiB, spread 7.3%)"), reason


def test_a_refusal_beats_a_fit_and_a_failure_beats_both():
    refused = CompileResult(
        trial_id="t", status="rejected", required_bytes=int(200 * GIB), available_bytes=int(192 * GIB)
    )
    got = result.worst([fit(180), refused])
    assert got.status == "rejected" and got.draw_bytes == (int(180 * GIB), int(200 * GIB))
    assert verdict(got, TPU7X_HBM)[0] == "infeasible"
    broke = CompileResult(trial_id="t", status="failed", error="boom")
    assert result.worst([fit(1), broke, refused]) == broke


def test_one_draw_is_left_as_it_is_and_agreeing_draws_say_so():
    one = fit(3)
    assert result.worst([one]) is one and result.spread_note(one) == ""
    assert result.spread_note(result.worst([fit(3), fit(3)])) == "2 draws agree"


def test_perturbing_draw_one_does_nothing():
    before = len(result._PAD)
    result.perturb(1)
    assert len(result._PAD) == before
