"""jobs.strategies.rules: pure-Python CP constraints shared by the planner and the attention code."""

import re
import subprocess
import sys

import numpy as np
import pytest

from jobs.strategies import rules


def test_cp_rules_does_not_import_jax():
    code = "import sys, jobs.strategies.rules; assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')]"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sequence_axes():
    assert rules.sequence_axes("ring") == ("context",)
    assert rules.sequence_axes("usp") == ("context", "context_ulysses")
    assert rules.sequence_axes("none") == ()


@pytest.mark.parametrize("length,ring", [(16, 1), (16, 2), (64, 4), (48, 3)])
def test_zigzag_permutation(length, ring):
    perm = rules.zigzag_permutation(length, ring)
    assert sorted(perm.tolist()) == list(range(length))
    c = length // (2 * ring)
    for r in range(ring):  # device r holds chunks r and 2R-1-r
        block = perm[r * 2 * c : (r + 1) * 2 * c]
        assert block[:c].tolist() == list(range(r * c, (r + 1) * c))
        assert block[c:].tolist() == list(range((2 * ring - 1 - r) * c, (2 * ring - r) * c))
    inv = rules.inverse_permutation(perm)
    assert np.array_equal(perm[inv], np.arange(length))


def test_zigzag_is_identity_for_one_device():
    assert rules.zigzag_permutation(8, 1).tolist() == list(range(8))


def ok(strategy, L=1024, hq=8, hkv=2, layout="contiguous", **mesh):
    rules.validate(strategy, context_length=L, q_heads=hq, kv_heads=hkv, mesh=mesh, layout=layout)


def test_valid_configurations_pass():
    ok("ring", context=8, layout="zigzag")
    ok("ulysses", context=8, hq=8, hkv=2)  # Hkv < P: replicated KV heads
    ok("ulysses", context=2, hq=8, hkv=4)
    ok("usp", context=4, context_ulysses=4, hq=8, hkv=1, layout="zigzag")
    ok("all_gather", context=8, layout="zigzag")
    ok("none", data=2, tensor=2)
    ok("reference")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(strategy="ringg", context=2), "unknown attention strategy 'ringg'"),
        (
            dict(strategy="ring", L=1000, context=8, layout="zigzag"),
            r"1000 % 16 = 8; use a multiple of 16 or layout",
        ),
        (dict(strategy="ring", L=100, context=8), r"100 % 8 = 4|context_length % 8 = 4"),
        (dict(strategy="usp", L=36, context=4, context_ulysses=1, layout="zigzag"), r"36 % 8 = 4"),
        (dict(strategy="ulysses", hq=6, hkv=2, context=4), r"q_heads/tensor = 6 % 4 = 2"),
        (dict(strategy="ulysses", hq=12, hkv=3, context=2), r"kv_heads/tensor = 3 neither divides"),
        (dict(strategy="usp", hq=12, hkv=6, context=2, context_ulysses=4), r"context_ulysses=4"),
        (dict(strategy="ring", hq=8, hkv=3, context=2), r"q_heads % kv_heads == 0: 8 % 3 = 2"),
        (dict(strategy="ring", hq=8, hkv=2, context=2, tensor=4), r"tensor=4"),
        (dict(strategy="ring", context=2, layout="spiral"), "unknown layout 'spiral'"),
        (dict(strategy="ring", context=2, context_ulysses=2), "use strategy=usp"),
        (dict(strategy="ring", context=2, model=2), "unknown mesh axes"),
    ],
)
def test_bad_configurations_raise_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        ok(**kwargs)
    assert "\n" not in str(info.value)


def test_batch_must_divide_data_parallel_axes():
    with pytest.raises(ValueError, match=r"batch 3 is split .* 3 % 4 = 3"):
        rules.validate("ring", context_length=64, q_heads=4, kv_heads=4, mesh={"data": 2, "fsdp": 2}, batch=3)


def test_one_batch_rule_for_the_planner_and_the_job():
    """rules.batch_problem is the rule; the planner and the job's own guard say exactly its words."""
    from dataclasses import replace

    from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
    from jobs.train import check
    from orchestrator.plan import validity

    words = rules.batch_problem(6, 2, 2, grad_accum=2)
    assert words.startswith("batch 6 is split into grad_accum=2") and "6 % 8 = 6" in words
    assert rules.batch_problem(8, 2, 2, grad_accum=2) is None
    model = ModelSpec(name="t", vocab=64, embed=32, layers=1, q_heads=4, kv_heads=4, head_dim=8, mlp=64)
    spec = TrialSpec(
        model,
        MeshSpec(data=2, fsdp=2, context=2),
        StrategySpec(),
        context_length=64,
        train=TrainSpec(batch=6, grad_accum=2),
    )
    assert any(p.message == words for p in validity.problems(spec))
    with pytest.raises(ValueError, match=re.escape(words)):
        check(spec)
    assert not [
        p
        for p in validity.problems(replace(spec, train=TrainSpec(batch=8, grad_accum=2)))
        if p.rule.startswith("batch")
    ]
