"""Our own runs on a real TPU v5e chip (orchestrator/calibrate/chip.py, benchmarks/chip_runs/): the planner held
to what the chip measured. No chip needed: the runs' JSON lines and the calibration table are in the repo."""

from __future__ import annotations

import pytest

from benchmarks import chip_page
from orchestrator import REPO
from orchestrator.calibrate import chip, family
from orchestrator.plan import cluster_model, plan_one, steptime

RUNS = REPO / "benchmarks" / "chip_runs" / "2026-12-07"


@pytest.fixture(scope="module")
def result() -> family.Result:
    return family.calibrate(family.CHIP)


def test_every_point_held_out_of_its_own_fit_lies_in_its_band(result):
    """Leave one point out: each measured step against the fit on all the others, inside the band the config
    carries (step_band_* or fixed_band_*, by the share the rates price)."""
    model = cluster_model.load("v5e_1")[1]
    assert len(result.held_out) == len(chip.points()) >= 6
    for cell in result.held_out:
        st = steptime.step_time(cell.row.spec, model=model)
        low, high = steptime.band_of(model, st.settled)
        assert low <= cell.row.step_s / cell.predicted_s <= high, cell.row.label
        assert abs(cell.error) < 0.25, cell.row.label  # and the band is not a blank cheque


def test_the_configs_constants_are_the_fit_on_every_point(result):
    model = cluster_model.load("v5e_1")[1]
    for name, value in result.constants["v5e_1"].items():
        assert getattr(model, name) == pytest.approx(value, rel=1e-3, abs=1e-9), name


def test_the_planners_hbm_is_within_ten_percent_of_each_programs_peak_on_the_chip():
    model = cluster_model.load("v5e_1")[1]
    for p in chip.points():
        predicted = plan_one(p.spec, model).predicted_hbm_bytes_per_device
        assert abs(predicted / p.program_peak_bytes - 1) <= 0.10, p.name


def test_every_verdict_matches_the_chip():
    """A point the planner calls runnable ran on the chip; one it calls infeasible ran out of HBM at compile."""
    model = cluster_model.load("v5e_1")[1]
    judged = [r for r in chip_page.runs(RUNS) if r.name not in chip_page.SUPERSEDED]
    assert len(judged) >= 10 and any(not r.ok for r in judged) and any(r.ok for r in judged)
    for r in judged:
        verdict = plan_one(r.spec, model).verdict
        assert (verdict == "run") == r.ok, (r.name, verdict, r.error)
        if not r.ok:
            assert "RESOURCE_EXHAUSTED" in r.error


def test_the_xla_kernel_is_priced_slower_than_splash_on_the_chip():
    """The chip ran xla 1.54x slower than splash at 8K (0.912 s vs 0.592 s): the model says so too."""
    model = cluster_model.load("v5e_1")[1]
    by = {p.name: p for p in chip.points()}
    splash, xla = (steptime.step_time(by[n].spec, model=model).step_s for n in ("p01", "p02"))
    assert 1.3 < xla / splash < 1.8
    assert model.host_bytes_per_s > 0 and model.xla_attention_ratio < 1
