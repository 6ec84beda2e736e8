"""Packed documents in the plan: useful vs causal-row FLOPs, what the kernel computes, the layout's balance."""

import shutil

import pytest
from drivers import run_cli

from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.plan import packing, plan_one

TPU = ["model=llama3_1_8b_long", "cluster=tpu7x_128", "train.remat=auto"]


def spec(words):
    return expand(load(words))[0]


def documents(corpus, *words):
    return [*TPU, "train.data.kind=documents", f"train.data.sources=[{corpus}]", *words]


@pytest.mark.parametrize("length", [65_536, 1_048_576])
def test_ring_on_tpu_reports_both_mfus(stdlib_corpus, length):
    s = spec(documents(stdlib_corpus, "strategy=ring", "strategy.layout=zigzag", f"context_length={length}"))
    p = packing.of(s)
    assert 0 < p.useful < p.computed < 1 and p.docs_per_row > 2 and p.imbalance > 1
    row = plan_one(s)
    assert row.verdict == "run" and row.useful_mfu < row.predicted_mfu
    assert "MFU counts the causal row (MaxText's convention)" in row.reason and "useful MFU" in row.reason
    plain = plan_one(spec([*TPU, "strategy=ring", "strategy.layout=zigzag", f"context_length={length}"]))
    # the skipped hops make the step no slower (at 64K exposed FSDP gathers set it), yet the useful work per
    # second is lower than the causal row's
    assert row.predicted_step_s <= plain.predicted_step_s and row.useful_mfu < plain.predicted_mfu


def test_gathering_strategies_skip_nothing_on_tpu(stdlib_corpus):
    s = spec(
        documents(stdlib_corpus, "strategy=all_gather", "strategy.layout=zigzag", "context_length=65536")
    )
    p = packing.of(s)
    assert p.computed == 1.0 and p.imbalance == 0.0 and p.useful < 0.5  # splash's mask is static
    assert "computes 100.0% of the row's tiles" in plan_one(s).reason


def test_contiguous_is_less_balanced_than_zigzag(stdlib_corpus):
    words = documents(stdlib_corpus, "strategy=ring", "context_length=1048576")
    contiguous = packing.of(spec([*words, "strategy.layout=contiguous"]))
    zigzag = packing.of(spec([*words, "strategy.layout=zigzag"]))
    assert contiguous.useful == zigzag.useful and contiguous.imbalance > zigzag.imbalance > 1


def test_without_lengths_the_plan_says_so(stdlib_corpus, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(stdlib_corpus, bare)
    (bare / "lengths.npy").unlink()
    s = spec(documents(bare, "strategy=ring", "strategy.layout=zigzag", "context_length=65536"))
    row = plan_one(s)
    assert packing.of(s) is None and row.useful_mfu is None
    assert "attention priced as one causal row" in row.reason


def test_bad_sources_exit_2_before_anything(stdlib_corpus, tmp_path, no_ray_no_mlflow):
    for words, what in [
        ([f"train.data.sources=[{tmp_path / 'nope'}]"], "does not exist"),
        ([f"train.data.sources=[{stdlib_corpus}]", "model=tiny"], "vocab"),  # a 512-token BPE, vocab 256
    ]:
        args = ["dry_run=true", "train.data.kind=documents", "context_length=4096", *words]
        res = run_cli(args, cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and "train.data.sources" in lines[0], res.stderr
        assert what in lines[0], lines[0]


def test_balanced_layout_needs_documents_and_balances_them(stdlib_corpus):
    row = plan_one(spec([*TPU, "strategy=ring", "strategy.layout=balanced", "context_length=65536"]))
    assert (
        row.verdict == "invalid" and "layout vs data" in row.reason and "strategy.layout=zigzag" in row.reason
    )
    words = documents(stdlib_corpus, "strategy=ring", "context_length=1048576")
    balanced = packing.of(spec([*words, "strategy.layout=balanced"]))
    zigzag = packing.of(spec([*words, "strategy.layout=zigzag"]))
    # balanced runs on the xla kernel (512-token tiles), zigzag on splash (whole hops): fewer tiles, even work
    assert balanced.computed < zigzag.computed and balanced.imbalance < 1.2 < zigzag.imbalance
    splash = plan_one(spec([*words, "strategy.layout=balanced", "strategy.kernel=splash"]))
    assert splash.verdict == "invalid" and "layout vs kernel" in splash.reason
