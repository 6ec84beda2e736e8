"""Training on packed documents (a real corpus, 8 simulated CPU devices): every strategy like no CP, resume."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from jobs import strategies
from jobs.data import Batches
from jobs.spec import RunSpec
from jobs.train import train
from orchestrator.config.grid import expand, expand_points
from orchestrator.config.load import load

ROOT = Path(__file__).resolve().parent.parent


def spec_of(corpus, *overrides: str):
    data = ["train.data.kind=documents", f"train.data.sources=[{corpus}]", "model.vocab=512"]
    return expand(load([*data, "context_length=512", "train.batch=2", *overrides]))[0]


def steps(spec) -> list[dict]:
    return [r.to_dict() for r in train(spec) if r.kind == "step"]


def losses(spec) -> list[float]:
    return [r["loss"] for r in steps(spec)]


def test_rows_hold_several_documents(stdlib_corpus):
    b = Batches(spec_of(stdlib_corpus, "strategy=ring", "strategy.layout=contiguous"))(0)
    assert b["segment_ids"].shape == (2, 512) and b["segment_ids"].max() > 1  # packed, not one per row
    starts = np.flatnonzero(np.diff(b["segment_ids"][0]) != 0) + 1
    assert (b["positions"][0][starts] == 0).all()  # RoPE restarts in every document


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_trains_on_documents_like_no_cp(stdlib_corpus, layout):
    base = ["train.steps=3", "train.dtype=float32"]
    ref = losses(spec_of(stdlib_corpus, "strategy=none", "cluster.devices_per_host=1", *base))
    recs = steps(spec_of(stdlib_corpus, "strategy=ring", f"strategy.layout={layout}", *base))
    np.testing.assert_allclose([r["loss"] for r in recs], ref, rtol=0, atol=2e-4)
    assert ref[0] == pytest.approx(np.log(512), rel=0.1)  # a real loss on real text, not a masked-out zero
    for r in recs:  # loss by position within the document: the step's loss is their token-weighted mean
        by = r["loss_by_position"]
        assert set(by) == {"0-256", "256-512"} and min(by.values()) <= r["loss"] <= max(by.values())


# One layout per strategy, every layout at least once: tests/test_attention_segments.py holds the whole
# strategy x layout matrix against the dense reference; this checks the training step's plumbing of each.
EVERY = [
    ("all_gather", "zigzag"),
    ("ulysses", "contiguous"),
    ("ring", "balanced"),
    ("usp", "zigzag"),
    ("double_ring", "balanced"),
]


@pytest.mark.slow
def test_every_strategy_trains_on_documents_like_no_cp(stdlib_corpus):
    base = ["train.steps=3", "train.dtype=float32"]
    ref = losses(spec_of(stdlib_corpus, "strategy=none", "cluster.devices_per_host=1", *base))
    assert {s for s, _ in EVERY} == set(strategies.CP_NAMES)
    assert {lay for _, lay in EVERY} == {
        lay for s in strategies.CP_NAMES for lay in strategies.get(s).layouts
    }
    for name, layout in EVERY:
        got = losses(spec_of(stdlib_corpus, f"strategy={name}", f"strategy.layout={layout}", *base))
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-4, err_msg=f"{name} {layout}")


@pytest.mark.slow
def test_resume_sees_the_batches_it_would_have_seen(stdlib_corpus, tmp_path):
    """Checkpoints carry the documents iterator's state: the resumed steps equal the uninterrupted run's."""
    whole = spec_of(
        stdlib_corpus, "strategy=ring", "strategy.layout=zigzag", "train.dtype=float32", "train.steps=6"
    )
    ref = losses(whole)
    run = RunSpec(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    first = dataclasses.replace(whole, train=dataclasses.replace(whole.train, steps=4), run=run)
    assert losses(first) == pytest.approx(ref[:4], abs=1e-5)
    recs = [r.to_dict() for r in train(dataclasses.replace(whole, run=run))]
    assert next(r for r in recs if r["kind"] == "start")["resumed_from_step"] == 4
    got = {r["step"]: r["loss"] for r in recs if r["kind"] == "step"}
    # steps 4 and 5 ran on the restored iterator: a fresh one would have fed batches 0 and 1 again
    assert [got[s] for s in range(6)] == pytest.approx(ref, abs=1e-5)


def test_quickstart_sweep_is_cp_scaling_on_the_corpus_with_steps_by_length(
    stdlib_corpus, tmp_path, pinned_cpu_peak
):
    """conf/sweep/quickstart.yaml: cp_scaling's 75 points on documents, the same tokens per short trial; with
    its 1 s step budget the planner runs every strategy at 1K and 2K (at the pinned CPU rate) and calls the rest
    infeasible."""
    from orchestrator.plan import plan

    # the file's own data (data/stdlib, built on first use) swapped for the test corpus
    budget = OmegaConf.load(ROOT / "conf" / "sweep" / "quickstart.yaml").set["cluster.max_step_seconds"]
    data = (
        f"+sweep.set={{train.data.kind:documents,train.data.sources:[{stdlib_corpus}],model.vocab:4096,"
        f"cluster.max_step_seconds:{budget}}}"
    )
    specs = expand(load(["+sweep=quickstart", "~sweep.set", data]))
    assert len(specs) == 75 and {s.train.data.kind for s in specs} == {"documents"}
    assert {s.model.vocab for s in specs} == {4096}
    steps = {s.context_length: s.train.steps for s in specs}
    assert [steps[n] for n in (1024, 2048, 4096, 8192, 14680064)] == [32, 16, 8, 8, 8]
    points = expand_points(load(["+sweep=quickstart", "~sweep.set", data]))  # the budget is the planner's
    runs = [r for r in plan(specs, [p.cluster for p in points]) if r.verdict == "run"]
    assert sorted({r.context_length for r in runs}) == [1024, 2048] and len(runs) == 10
