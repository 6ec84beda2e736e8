"""Training batches: a synthetic key->value recall task with real long-range structure, and token files.

Every host builds the same global batch deterministically from (seed, step); each device then takes only
its own shard, so the loader is multi-host safe without coordination.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from jobs import cp_rules, storage
from jobs.spec import TrialSpec

RECALL_KEYS, RECALL_VALUES = 8, 8


def recall_vocab(vocab: int) -> tuple[int, int, int, int]:
    """Token ranges of the recall task: (pair base, query base, answer base, filler count)."""
    pairs = RECALL_KEYS * RECALL_VALUES
    filler = vocab - 1 - pairs - RECALL_KEYS - RECALL_VALUES
    if filler < 1:
        raise ValueError(f"recall task needs vocab > {vocab - filler + 1}, model has {vocab}")
    p0 = 1 + filler
    return p0, p0 + pairs, p0 + pairs + RECALL_KEYS, filler


def recall_batch(seed: int, step: int, batch: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """Key->value recall across the whole sequence. The first half is filler with each of 16 keys placed
    once, fused with its value (one token per (key, value)); the second half asks (query key, answer
    value) pairs. Every answer lies on average L/2 tokens back, on another device under CP, so the loss
    (counted on answers only) falls below chance ln(8) only if attention across devices is right."""
    rng = np.random.default_rng([seed, step])
    p0, q0, a0, filler = recall_vocab(vocab)
    half = length // 2
    if half < RECALL_KEYS:
        raise ValueError(f"recall task needs context_length >= {2 * RECALL_KEYS}, got {length}")
    tokens = rng.integers(1, 1 + filler, size=(batch, length), dtype=np.int32)
    mask = np.zeros((batch, length), np.float32)
    n_q = (length - half) // 2
    for b in range(batch):
        value_of = rng.integers(0, RECALL_VALUES, size=RECALL_KEYS)
        where = rng.choice(half, size=RECALL_KEYS, replace=False)
        tokens[b, where] = p0 + np.arange(RECALL_KEYS) * RECALL_VALUES + value_of
        asked = rng.integers(0, RECALL_KEYS, size=n_q)
        tokens[b, half : half + 2 * n_q : 2] = q0 + asked
        tokens[b, half + 1 : half + 2 * n_q : 2] = a0 + value_of[asked]
        mask[b, half : half + 2 * n_q : 2] = 1.0  # a query position predicts its answer
    targets = np.concatenate([tokens[:, 1:], np.zeros((batch, 1), np.int32)], axis=1)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return {"tokens": tokens, "targets": targets, "positions": positions, "mask": mask}


def chance_loss(vocab: int) -> float:
    """Recall loss of a model that knows the answer range but not the answer."""
    return math.log(RECALL_VALUES)


def token_file_batch(
    path_or_array, seed: int, step: int, batch: int, length: int, dtype: str = "uint16"
) -> dict[str, np.ndarray]:
    """Random windows of length+1 from a flat token array (memory-mapped for local files)."""
    arr = path_or_array
    if isinstance(arr, str):
        arr = np.memmap(arr, dtype=np.dtype(dtype), mode="r")
    if len(arr) < length + 2:
        raise ValueError(f"token file has {len(arr)} tokens, fewer than context_length+1 = {length + 1}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(arr) - length - 1, size=batch)
    windows = np.stack([np.asarray(arr[s : s + length + 1]).astype(np.int32) for s in starts])
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return {
        "tokens": windows[:, :-1],
        "targets": windows[:, 1:],
        "positions": positions,
        "mask": np.ones((batch, length), np.float32),
    }


def layout(spec: TrialSpec, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Apply the strategy's load-balanced token order once per batch (tokens, targets, positions, mask): the
    zigzag permutation for the ring positions the strategy names, whatever the strategy (the attention's
    mask assumes it for every strategy that accepts layout=zigzag)."""
    ring = cp_rules.ring_size(spec.strategy.name, spec.mesh.shape())
    if spec.strategy.layout != "zigzag" or ring == 1:
        return batch
    perm = np.asarray(cp_rules.zigzag_permutation(spec.context_length, ring))
    return {k: v[:, perm] for k, v in batch.items()}


class Batches:
    """Step-indexed global batches for a trial (deterministic; resume just asks for step k)."""

    def __init__(self, spec: TrialSpec, cache_dir: str | None = None):
        self.spec = spec
        self.tokens = None
        d = spec.train.data
        if d.kind == "tokens":
            if not d.path:
                raise ValueError(
                    "train.data.kind=tokens needs train.data.path (a local file or gs:// object)"
                )
            cache = cache_dir or os.path.join(tempfile.gettempdir(), "cp-orchestrator-data")
            # memory-mapped: each host reads only the windows it touches
            self.tokens = np.memmap(storage.fetch(d.path, cache), dtype=np.dtype(d.dtype), mode="r")

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        s, t = self.spec, self.spec.train
        if t.data.kind == "recall":
            b = recall_batch(t.seed, step, t.batch, s.context_length, s.model.vocab)
        elif t.data.kind == "tokens":
            b = token_file_batch(self.tokens, t.seed, step, t.batch, s.context_length, t.data.dtype)
        else:
            raise ValueError(f"unknown data kind {t.data.kind!r}; use recall or tokens")
        return layout(s, b)
