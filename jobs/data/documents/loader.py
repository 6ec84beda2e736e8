"""The packed-documents iterator: weighted mixture of sources -> shuffled, repeated documents -> packed rows ->
global batches {tokens, targets, segment_ids, positions, mask}, each [B, L].

Deterministic given (sources, weights, seed, options): every host builds the same global batch from the same
state without coordination, and a restored iterator yields exactly the batches an uninterrupted one would.
The state is grain's, a small JSON-serialisable dict. Mixing is per document (weights are document
proportions, not token proportions).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import grain
import numpy as np

from jobs.data.documents.pack import finish_rows, pack
from jobs.data.documents.sources import TokenSource
from jobs.spec import LONG_DOCS, PACKS

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Options:
    """What shapes the batches (all of it changes the data a trial sees)."""

    sources: tuple[str, ...]
    context_length: int
    batch: int
    vocab: int
    weights: tuple[float, ...] = ()  # () : uniform
    pack: str = "first_fit"  # first_fit | concat
    long_docs: str = "split"  # split | truncate
    seed: int = 0

    @property
    def bins(self) -> int:
        """First-fit's open rows: more bins, less padding; a few batches' worth keeps a round cheap to replay."""
        return max(8, 2 * self.batch)


def validate(o: Options) -> tuple[float, ...]:
    """ValueError (one line) for options that cannot give rows with loss; returns the normalised weights."""
    if not o.sources:
        raise ValueError("train.data.kind=documents needs train.data.sources (or train.data.path)")
    if o.pack not in PACKS:
        raise ValueError(f"train.data.pack={o.pack!r}; use one of {', '.join(PACKS)}")
    if o.long_docs not in LONG_DOCS:
        raise ValueError(f"train.data.long_docs={o.long_docs!r}; use one of {', '.join(LONG_DOCS)}")
    if o.context_length < 2:
        raise ValueError(
            f"context_length={o.context_length} leaves every row without a target inside its document; use >= 2"
        )
    if o.batch < 1:
        raise ValueError(f"train.batch={o.batch}: need at least one row per batch")
    w = o.weights or (1.0,) * len(o.sources)
    if len(w) != len(o.sources):
        raise ValueError(
            f"train.data.weights has {len(w)} entries for {len(o.sources)} sources; give one each"
        )
    if any(not np.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"train.data.weights={list(w)} must be non-negative with a positive sum")
    return tuple(float(x) / sum(w) for x in w)


def _documents(src: TokenSource, seed: int) -> grain.IterDataset:
    # shuffled, reshuffled each epoch, endless: a mixture never stops on its smallest source
    ds = grain.MapDataset.source(src).shuffle(seed=seed).repeat()
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=64))


def build(o: Options, cache_dir: str) -> grain.IterDataset:
    """The pipeline as a grain IterDataset of global batches (no iteration yet)."""
    weights = validate(o)
    picked = [(s, w, i) for i, (s, w) in enumerate(zip(o.sources, weights, strict=True)) if w > 0]
    streams = [_documents(TokenSource(s, o.vocab, cache_dir), o.seed * 1009 + i) for s, _, i in picked]
    docs = streams[0] if len(streams) == 1 else grain.IterDataset.mix(streams, [w for _, w, _ in picked])
    rows = pack(docs, o.context_length, o.pack, o.long_docs, o.bins)
    return rows.batch(o.batch, drop_remainder=True).map(finish_rows)


class DocumentIterator:
    """Global batches in order; `get_state()` / `set_state()` checkpoint it (JSON-serialisable)."""

    def __init__(self, options: Options, cache_dir: str):
        self.options = options
        self._it = iter(build(options, cache_dir))
        self.batches = 0  # batches yielded so far (the step the next batch belongs to, from a fresh start)

    def __iter__(self) -> DocumentIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        b = next(self._it)
        self.batches += 1
        return b

    def get_state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "batches": self.batches, "grain": self._it.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"document iterator state version {state.get('version')}, want {STATE_VERSION}")
        # a state that went through JSON (a checkpoint) and one fresh from get_state restore alike
        self._it.set_state(json.loads(json.dumps(state["grain"])))
        self.batches = int(state["batches"])


def check(o: Options, cache_dir: str) -> dict[str, int]:
    """The driver's cheap pre-launch check: options, every source's shards present, the first record of each
    source read and checked (schema, vocab). Fetches one shard per gs:// source, never the corpus.
    Returns {source: shard count}."""
    validate(o)
    out = {}
    for s in o.sources:
        src = TokenSource(s, o.vocab, cache_dir, first_shard_only=True)
        src.first()
        out[s] = src.shards
    return out
