"""The training job on 8 simulated CPU devices: learning through CP, resume after a kill, gs:// I/O, bad input."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from servers import gcs_client

from jobs import storage, strategies
from jobs.data import RECALL_VALUES, chance_loss, recall_batch, recall_vocab
from jobs.spec import DataSpec, MeshSpec, RunSpec
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load


def spec_of(*overrides: str):
    return expand(load(list(overrides)))[0]


def run(spec) -> tuple[dict, list[float], dict]:
    recs = [r.to_dict() for r in train(spec)]  # the form a Ray batch and a checkpoint carry
    start = next(r for r in recs if r["kind"] == "start")
    summary = next((r for r in recs if r["kind"] == "summary"), {})
    return start, [r["loss"] for r in recs if r["kind"] == "step"], summary


LEARN = ["context_length=128", "train.batch=8", "train.dtype=float32", "train.lr=1e-2", "train.warmup=20"]


@pytest.mark.slow
@pytest.mark.many_steps
def test_recall_learns_through_ring_cp_and_matches_no_cp():
    """Answers sit ~L/2 back, on other devices: the loss beats chance only if ring attention is right."""
    steps = "train.steps=200"
    ring = spec_of("strategy=ring", steps, *LEARN)
    dense = spec_of("strategy=none", steps, "cluster.devices_per_host=1", *LEARN)
    assert ring.mesh.cp == 8 and dense.mesh.size == 1
    recs = [r.to_dict() for r in train(ring)]
    cp_losses = [r["loss"] for r in recs if r["kind"] == "step"]
    summary = next(r for r in recs if r["kind"] == "summary")
    _, ref_losses, _ = run(dense)
    chance = chance_loss(ring.model.vocab)
    late = float(np.mean(cp_losses[-10:]))
    print(f"recall loss: first {cp_losses[0]:.3f}, last-10 mean {late:.3f}, chance {chance:.3f}")
    assert late < 0.8 * chance
    assert summary["mfu"] > 0 and summary["compiled_bytes_per_device"] > 0
    # same curve as the no-CP run: identical early, within fp32 reduction-order drift later
    np.testing.assert_allclose(cp_losses[:10], ref_losses[:10], rtol=0, atol=2e-3)
    assert abs(np.mean(cp_losses[-10:]) - np.mean(ref_losses[-10:])) < 0.15
    # retrieval accuracy by distance to the key (one bucket at L=128): chance is 1 in 8 values
    acc = [r["accuracy_by_distance"]["0-128"] for r in recs if r["kind"] == "step"]
    assert all(set(r["accuracy_by_distance"]) == {"0-128"} for r in recs if r["kind"] == "step")
    assert np.mean(acc[:5]) < 0.3 and np.mean(acc[-10:]) > 0.3, (acc[:5], acc[-10:])


def test_recall_batch_says_how_far_back_each_answer_is():
    b = recall_batch(seed=3, step=1, batch=2, length=64, vocab=256)
    p0, q0, a0, _ = recall_vocab(256)
    rows, cols = np.nonzero(b["mask"])
    d = b["distance"][rows, cols]
    assert (d > 0).all() and (b["distance"][b["mask"] == 0] == 0).all()
    key_token = b["tokens"][rows, cols - d]  # the (key, value) token `distance` back from each query
    asked, answer = b["tokens"][rows, cols] - q0, b["targets"][rows, cols] - a0
    assert ((key_token - p0) // RECALL_VALUES == asked).all() and (
        (key_token - p0) % RECALL_VALUES == answer
    ).all()


def _job(spec_path, env):
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.train", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_kill_and_resume_continues_with_the_same_losses(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax-cache")
    base = spec_of("strategy=ring", "context_length=256", "train.steps=8", "train.dtype=float32")
    ref_path, ckpt_path = tmp_path / "ref.json", tmp_path / "ckpt.json"
    ref_path.write_text(base.to_json())
    with_ckpt = dataclasses.replace(
        base, run=RunSpec(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=3)
    )
    ckpt_path.write_text(with_ckpt.to_json())
    assert with_ckpt.trial_id == base.trial_id  # where checkpoints go is not identity

    ref = _job(ref_path, env)
    ref_steps = {r["step"]: r["loss"] for r in map(json.loads, ref.stdout) if r["kind"] == "step"}
    assert ref.wait() == 0 and len(ref_steps) == 8

    victim = _job(ckpt_path, env)
    for line in victim.stdout:
        r = json.loads(line)
        if r["kind"] == "step" and r["step"] == 4:
            os.kill(victim.pid, signal.SIGKILL)  # a preempted host: no cleanup, no final save
            break
    victim.wait()

    resumed = _job(ckpt_path, env)
    recs = [json.loads(line) for line in resumed.stdout]
    assert resumed.wait() == 0
    first = recs[0]["resumed_from_step"]
    assert first in (3, 6), first  # the last completed checkpoint (after step 2, or after step 5)
    steps = [r["step"] for r in recs if r["kind"] == "step"]
    # the checkpoint's records come first (the driver may have missed them), then the steps run now
    assert steps == list(range(8)), steps
    got = {r["step"]: r["loss"] for r in recs if r["kind"] == "step"}
    for s, loss in got.items():
        assert loss == pytest.approx(ref_steps[s], abs=1e-5), (s, loss, ref_steps[s])


@pytest.mark.slow
def test_gcs_token_data_and_checkpoints(gcs):
    tokens = np.random.default_rng(0).integers(0, 256, size=20_000).astype(np.uint16)
    storage.write_bytes(f"{gcs}/data/tokens.bin", tokens.tobytes())
    data = DataSpec(kind="tokens", path=f"{gcs}/data/tokens.bin", dtype="uint16")
    s = spec_of("strategy=ring", "context_length=256", "train.steps=4", "train.dtype=float32")
    s = dataclasses.replace(
        s,
        train=dataclasses.replace(s.train, data=data),
        run=RunSpec(checkpoint_dir=f"{gcs}/ckpt", checkpoint_every=2),
    )
    start, losses, _ = run(s)
    assert start["resumed_from_step"] == 0 and len(losses) == 4 and all(np.isfinite(losses))
    names = [
        b.name for b in gcs_client(os.environ["STORAGE_EMULATOR_HOST"]).list_blobs("cp-test", prefix="ckpt/")
    ]
    assert any(n.startswith("ckpt/3/") for n in names), names[:5]
    # a longer trial on the same checkpoint prefix picks up where the first stopped
    longer = dataclasses.replace(s, train=dataclasses.replace(s.train, steps=6))
    start2, losses2, _ = run(longer)
    assert start2["resumed_from_step"] == 4 and len(losses2) == 6  # 4 carried by the checkpoint, 2 run
    assert losses2[:4] == losses


def test_bad_input_is_clear():
    s = spec_of("strategy=ring", "context_length=256")
    with pytest.raises(ValueError, match="mesh context4 has 4 devices but 8 are available"):
        list(train(dataclasses.replace(s, mesh=MeshSpec(context=4))))
    with pytest.raises(
        ValueError, match="heads not divisible by the tensor axis: q_heads 8, kv_heads 4, tensor 3"
    ):
        list(train(dataclasses.replace(s, mesh=MeshSpec(context=2, tensor=3))))
    missing = dataclasses.replace(s.train, data=DataSpec(kind="tokens", path="/nonexistent/tokens.bin"))
    with pytest.raises(FileNotFoundError, match="data file /nonexistent/tokens.bin does not exist"):
        list(train(dataclasses.replace(s, train=missing)))


@pytest.mark.slow
def test_grad_accumulation_matches_the_full_batch():
    """Two micro-batches of one sequence give the same update as one batch of two (fp32, token-weighted)."""
    base = ["strategy=ring", "context_length=256", "train.steps=3", "train.batch=2", "train.dtype=float32"]
    _, full, _ = run(spec_of(*base))
    _, accum, _ = run(spec_of(*base, "train.grad_accum=2"))
    np.testing.assert_allclose(accum, full, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_every_strategy_trains_like_no_cp_in_bf16():
    """The same trial (bf16 compute) with each CP strategy on 8 devices vs dense attention on one device."""
    base = ["context_length=256", "train.steps=5", "train.batch=2", "train.dtype=bfloat16"]
    _, ref, _ = run(spec_of("strategy=none", "cluster.devices_per_host=1", *base))
    for strategy in strategies.CP_NAMES:
        s = spec_of(f"strategy={strategy}", *base)
        assert s.mesh.cp == 8
        _, losses, _ = run(s)
        # bf16 noise: different reduction orders round differently; a wrong mask or shard is off by ~0.1-1
        np.testing.assert_allclose(losses, ref, rtol=0, atol=3e-2, err_msg=strategy)


@pytest.mark.parametrize("strategy", ["all_gather", "ulysses"])
def test_zigzag_matches_contiguous_on_recall(strategy):
    """layout=zigzag permutes the tokens the way the attention mask assumes, for every strategy (it used to
    permute only for ring and usp: all_gather and ulysses attended natural-order tokens with a zigzag mask)."""
    base = [
        f"strategy={strategy}",
        "context_length=128",
        "train.steps=3",
        "train.batch=2",
        "train.dtype=float32",
    ]
    _, zigzag, _ = run(spec_of(*base, "strategy.layout=zigzag"))
    _, contiguous, _ = run(spec_of(*base, "strategy.layout=contiguous"))
    np.testing.assert_allclose(zigzag, contiguous, rtol=0, atol=1e-4)
