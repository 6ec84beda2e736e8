"""benchmarks/published.py: at every published context-parallel point the recommender finds a configuration at
least as fast as the recipe's own (it searches strategy x mesh x memory policy; the planner is analytic)."""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.calibrate import published_tpu
from orchestrator.plan import validity
from orchestrator.plan.search import Choice

ROOT = Path(__file__).resolve().parent.parent
# A tie within auto.TIE (0.5 %) of step time goes to the simpler policy, per mesh and again across meshes, so
# the pick may be up to (1 + TIE)^2 - 1 ≈ 1.0 % slower than the fastest configuration it searched.
TOLERANCE = 0.01


def _load():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_published", ROOT / "benchmarks" / "published.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


bp = _load()
CP_ROWS = [r for r in published_tpu.ROWS if r.strategy != "none"]


@pytest.fixture(scope="module")
def points():
    return bp.points()


def test_recipe_policy_is_valid_and_priced_as_calibration_prices_it(points):
    """The published offload goes into train.memory (valid, so plan_one prices it) and the planner then gives
    the recipe the step time calibration.check gives it with `offload` passed on the side."""
    assert bp.recipe_policy(CP_ROWS[2]).label() == "train.remat=full train.memory.offload=[attn_out]"
    for p in points:
        for x in p.recipes:
            assert validity.problems(x.spec) == [], x.row.label
            assert x.plan.predicted_mfu == pytest.approx(x.calibrated, rel=1e-9), x.row.label


def test_pick_is_at_least_as_fast_as_the_recipe(points):
    for p in points:
        assert p.pick is not None and p.pick.row.verdict == "run", (p.key, p.answer.closest)
        for x in p.recipes:
            if x.plan.verdict != "run":
                continue
            floor = x.plan.predicted_mfu * (1 - TOLERANCE)
            assert p.pick.row.predicted_mfu >= floor, (x.row.label, p.pick.row.reason, x.plan.reason)


def test_a_row_per_point(points):
    keys = {bp.point_key(r) for r in CP_ROWS}
    assert len(points) == len(keys) and sum(len(p.recipes) for p in points) == len(CP_ROWS)
    table = bp.markdown(points).splitlines()
    assert len(table) == 2 + len(points) and all(line.count(" | ") == len(bp.HEAD) - 1 for line in table[2:])
    held = [r for r in CP_ROWS if r.excluded]
    assert "\n".join(table).count("**excluded**") == len(held)
    body = bp.page_body(points)
    assert all(f"- {r.label}: {r.excluded}" in body for r in held)


def test_why_says_same_or_not_runnable(points):
    x = points[0].recipes[0]
    assert bp.why(Choice(x.spec, x.plan, x.policy, ""), x) == "same as the recipe"
    over = replace(x, plan=replace(x.plan, verdict="infeasible", reason="needs 99 GiB/device"))
    assert bp.why(points[0].pick, over) == "the recipe is infeasible per the planner: needs 99 GiB/device"
    assert "x faster step, largest saving attention kernel" in bp.why(
        points[-2].pick, points[-2].recipes[0]
    )  # PR #4836 256K: full remat
