"""Training batches: a synthetic key->value recall task with real long-range structure, token files, and
packed documents (jobs/data/documents/).

Every host builds the same global batch deterministically from (seed, step) (documents: from the same iterator
state); each device then takes only its own shard, so the loader is multi-host safe without coordination.
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import TYPE_CHECKING

import numpy as np

from jobs import storage, strategies
from jobs.spec import DataSpec, TrialSpec
from jobs.strategies import rules

if TYPE_CHECKING:
    from jobs.data import documents

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
    distance = np.zeros((batch, length), np.int32)  # at a query: tokens back to its key (0 elsewhere)
    n_q = (length - half) // 2
    for b in range(batch):
        value_of = rng.integers(0, RECALL_VALUES, size=RECALL_KEYS)
        where = rng.choice(half, size=RECALL_KEYS, replace=False)
        tokens[b, where] = p0 + np.arange(RECALL_KEYS) * RECALL_VALUES + value_of
        asked = rng.integers(0, RECALL_KEYS, size=n_q)
        tokens[b, half : half + 2 * n_q : 2] = q0 + asked
        tokens[b, half + 1 : half + 2 * n_q : 2] = a0 + value_of[asked]
        mask[b, half : half + 2 * n_q : 2] = 1.0  # a query position predicts its answer
        distance[b, half : half + 2 * n_q : 2] = np.arange(half, half + 2 * n_q, 2) - where[asked]
    targets = np.concatenate([tokens[:, 1:], np.zeros((batch, 1), np.int32)], axis=1)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    return {"tokens": tokens, "targets": targets, "positions": positions, "mask": mask, "distance": distance}


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
    if spec.strategy.layout == "balanced":  # over every sequence shard, as the attention cuts the row
        return balanced(batch, strategies.get(spec.strategy.name).cp(spec.mesh.shape()))
    ring = rules.ring_size(spec.strategy.name, spec.mesh.shape())
    if spec.strategy.layout != "zigzag" or ring == 1:
        return batch
    perm = np.asarray(rules.zigzag_permutation(spec.context_length, ring))
    return {k: v[:, perm] for k, v in batch.items()}


def balanced(batch: dict[str, np.ndarray], shards: int) -> dict[str, np.ndarray]:
    """layout=balanced (packed documents): each row in its own token order (jobs/data/balance.py: equal attention
    work per device, contiguous runs), and `row_positions`, every token's true place in the row."""
    from jobs.data import balance

    perms = np.stack([balance.permutation("balanced", seg, shards) for seg in batch["segment_ids"]])
    out = {k: np.take_along_axis(v, perms, axis=1) for k, v in batch.items()}
    out["row_positions"] = perms.astype(np.int32)
    return out


def document_options(
    d: DataSpec, context_length: int, batch: int, vocab: int, seed: int = 0
) -> documents.Options:
    """The packed-documents options of a trial's train.data (its sources, or its path alone)."""
    from jobs.data import documents  # grain costs ~1.4 s to import: only for documents trials

    return documents.Options(
        sources=d.sources or ((d.path,) if d.path else ()),
        context_length=context_length,
        batch=batch,
        vocab=vocab,
        weights=d.weights,
        pack=d.pack,
        long_docs=d.long_docs,
        seed=seed,
    )


def default_cache() -> str:
    return os.path.join(tempfile.gettempdir(), "cp-orchestrator-data")


class Batches:
    """Global batches for a trial, by step. recall and tokens are step-indexed (resume just asks for step k);
    documents is a stream: asked in order (step k after k-1) each call is one batch; another step replays
    from the nearest remembered state (`restore`'s, or the start), so it costs a replay, never a wrong
    batch. `state(step)` is what a checkpoint stores to resume at `step`; `restore(state)` takes it back."""

    KEEP = 8  # states of the last steps kept, so a checkpoint of step n after step n+1 was built still works

    def __init__(self, spec: TrialSpec, cache_dir: str | None = None):
        self.spec = spec
        self.tokens = None
        self.documents: documents.DocumentIterator | None = None
        d = spec.train.data
        cache = cache_dir or default_cache()
        if d.kind == "tokens":
            if not d.path:
                raise ValueError(
                    "train.data.kind=tokens needs train.data.path (a local file or gs:// object)"
                )
            # memory-mapped: each host reads only the windows it touches
            self.tokens = np.memmap(storage.fetch(d.path, cache), dtype=np.dtype(d.dtype), mode="r")
        elif d.kind == "documents":
            from jobs.data.documents import DocumentIterator

            self.documents = DocumentIterator(
                document_options(d, spec.context_length, spec.train.batch, spec.model.vocab, spec.train.seed),
                cache,
            )
            self._states = {0: self.documents.get_state()}  # step -> iterator state that yields it next
            self._next = 0

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        s, t = self.spec, self.spec.train
        if t.data.kind == "recall":
            b = recall_batch(t.seed, step, t.batch, s.context_length, s.model.vocab)
        elif t.data.kind == "tokens":
            b = token_file_batch(self.tokens, t.seed, step, t.batch, s.context_length, t.data.dtype)
        elif t.data.kind == "documents":
            b = self._document_batch(step)
        else:
            raise ValueError(f"unknown data kind {t.data.kind!r}; use recall, tokens or documents")
        return layout(s, b)

    def _document_batch(self, step: int) -> dict[str, np.ndarray]:
        it = self.documents
        if step != self._next:
            start = max((k for k in self._states if k <= step), default=None)
            if start is None:
                raise ValueError(
                    f"documents: step {step} precedes the restored state's step {min(self._states)}"
                )
            it.set_state(self._states[start])
            self._next = start
            while self._next < step:
                next(it)
                self._next += 1
        b = next(it)
        self._next = step + 1
        self._states[self._next] = it.get_state()
        for k in sorted(self._states)[1 : -self.KEEP]:  # the first (start or restored) state stays
            del self._states[k]
        return b

    def state(self, step: int) -> dict:
        """JSON-serialisable state from which `restore` then `__call__(step)` gives this run's batch `step`.
        For documents `step` must be one of the last KEEP + 1 steps asked (or the start / restored step)."""
        kind = self.spec.train.data.kind
        if kind != "documents":
            return {"kind": kind, "step": step}
        if step not in self._states:
            raise ValueError(
                f"documents: no iterator state kept for step {step} (have {sorted(self._states)})"
            )
        return {"kind": kind, "step": step, "iterator": self._states[step]}

    def restore(self, state: dict) -> None:
        """Resume from `state(step)` of an earlier run of the same trial."""
        kind = self.spec.train.data.kind
        if state.get("kind") != kind:
            raise ValueError(f"data state of kind {state.get('kind')!r} for a trial of data kind {kind!r}")
        if kind == "documents":
            self.documents.set_state(state["iterator"])
            self._states = {int(state["step"]): state["iterator"]}
            self._next = int(state["step"])
