"""Single owners: names and constants jobs/spec.py owns, and the modules that take them from it; the multislice
hint of jobs.strategies.rules, which asks each candidate strategy (not the refused one) what it shards over."""

import pytest

from jobs import strategies
from jobs.strategies import rules


def test_dcn_refusal_names_the_strategies_that_may_lay_the_axis_across_slices():
    """`none` shards over no axis, yet four strategies may lay `context` across slices: the hint names them."""
    may = [n for n in strategies.CP_NAMES if "context" in strategies.get(n).dcn_axes]
    assert may == ["all_gather", "ring", "usp", "double_ring"]
    with pytest.raises(ValueError) as e:
        rules.validate_dcn("none", mesh={"context": 4}, dcn="context", slices=2)
    assert str(e.value) == (
        "none cannot lay context across slices: none does not shard over context; use mesh.dcn=data or "
        "mesh.dcn=fsdp, or strategy=all_gather / ring / usp / double_ring, which may lay context across slices"
    )


def test_dcn_refusal_for_a_strategy_of_that_axis_is_unchanged():
    with pytest.raises(ValueError) as e:
        rules.validate_dcn("ulysses", mesh={"context": 4}, dcn="context", slices=2)
    assert str(e.value) == (
        "ulysses cannot lay context across slices: ulysses's all-to-all over context would cross the slow "
        "network twice per layer and pass, with no compute to hide behind; use mesh.dcn=data or mesh.dcn=fsdp, "
        "or strategy=all_gather / ring / usp / double_ring, which may lay context across slices"
    )


def test_no_strategy_may_lay_the_inner_axis_across_slices():
    with pytest.raises(ValueError) as e:
        rules.validate_dcn("usp", mesh={"context": 2, "context_ulysses": 2}, dcn="context_ulysses", slices=2)
    assert "or strategy=" not in str(e.value)


def test_remat_presets_have_one_owner():
    """jobs.spec names the presets and their residuals; the model builds one policy each."""
    from jobs.model import REMAT_POLICIES
    from jobs.spec import REMAT_PRESETS, REMATS

    assert REMATS == ("none", *REMAT_PRESETS) == tuple(REMAT_POLICIES)
    assert REMAT_POLICIES["none"] is None and all(REMAT_POLICIES[n] is not None for n in REMAT_PRESETS)


def test_dtypes_and_loss_chunk_have_one_owner():
    import jax.numpy as jnp

    from jobs import spec
    from jobs.step import DTYPES
    from orchestrator.plan import memory

    assert spec.DTYPES == tuple(DTYPES)
    assert DTYPES == {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
    assert memory.loss_chunk_tokens is spec.loss_chunk_tokens  # the job's rule is the planner's
    # bytes, not tokens: a 262K vocabulary takes 256-token chunks, a 128K one 512 (256 MiB of fp32 logits)
    assert (
        spec.loss_chunk_tokens(8192, 1, 262_144) == 256 and spec.loss_chunk_tokens(131_072, 1, 128_256) == 512
    )
    assert spec.loss_chunk_tokens(8192, 4, 151_936) == 64  # four rows share the budget
