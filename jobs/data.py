"""Training batches: a synthetic key->value recall task with real long-range structure, and token files.

Every host builds the same global batch deterministically from (seed, step); each device then takes only
its own shard, so the loader is multi-host safe without coordination.
"""

from __future__ import annotations

import math

import numpy as np

from jobs import cp_rules
from jobs.spec import TrialSpec


def recall_batch(seed: int, step: int, batch: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """Pairs (key, value) with one random key->value map per sequence. The second half repeats keys from
    the first half; its values are only predictable by attending back across the whole sequence.
    The loss counts those recalled values only, so chance level is ln(vocab/2)."""
    rng = np.random.default_rng([seed, step])
    n_keys = vocab // 2 - 1
    keys = np.arange(1, vocab // 2)
    half = length // 2
    tokens = np.zeros((batch, length), np.int32)
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        value_of = rng.integers(vocab // 2, vocab, size=n_keys)
        first = rng.choice(keys, size=half // 2)
        seen = np.unique(first)
        second = rng.choice(seen, size=(length - half) // 2)
        ks = np.concatenate([first, second])
        tokens[b, 0 : 2 * len(ks) : 2] = ks
        tokens[b, 1 : 2 * len(ks) : 2] = value_of[ks - 1]
        # position t predicts t+1: count key positions of the second half (their target is a recalled value)
        mask[b, half : 2 * len(ks) : 2] = 1.0
    targets = np.concatenate([tokens[:, 1:], np.zeros((batch, 1), np.int32)], axis=1)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return {"tokens": tokens, "targets": targets, "positions": positions, "mask": mask}


def chance_loss(vocab: int) -> float:
    return math.log(vocab // 2)


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
    """Apply the strategy's load-balanced token order once per batch (tokens, targets, positions, mask)."""
    if spec.strategy.name not in ("ring", "usp") or spec.strategy.layout != "zigzag":
        return batch
    perm = np.asarray(cp_rules.zigzag_permutation(spec.context_length, spec.mesh.context))
    return {k: v[:, perm] for k, v in batch.items()}


class Batches:
    """Step-indexed global batches for a trial (deterministic; resume just asks for step k)."""

    def __init__(self, spec: TrialSpec, tokens: np.ndarray | None = None):
        self.spec = spec
        self.tokens = tokens  # a flat token array already read (e.g. from gs://), else the path is memmapped

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        s, t = self.spec, self.spec.train
        if t.data.kind == "recall":
            b = recall_batch(t.seed, step, t.batch, s.context_length, s.model.vocab)
        elif t.data.kind == "tokens":
            src = self.tokens if self.tokens is not None else t.data.path
            b = token_file_batch(src, t.seed, step, t.batch, s.context_length, t.data.dtype)
        else:
            raise ValueError(f"unknown data kind {t.data.kind!r}; use recall or tokens")
        return layout(s, b)
