"""Packed documents in the plan: how much of the causal row's attention the document mask leaves, and its balance.

MFU, as MaxText counts it, prices every row's attention as one causal mask (jobs/flops.py). With packed
documents a query sees only its own document, so the useful work is far less: the plan reports both. What the
kernel computes is the tiles with anything visible, at the grain it can skip: a `strategy.block_kv` block for
the xla kernel (CPU, GPU, and the balanced layout anywhere); on TPU splash's mask is static, so only a whole ring
hop whose documents meet none of the local queries' is skipped (a strategy that gathers the whole sequence skips
nothing). The busiest device's
tiles over the mean is the layout's imbalance. Both come from jobs/data/balance on a row sampled from the corpus's
own document lengths (`lengths.npy`, written by `python -m jobs.data.documents.corpus`, beside the shards).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from jobs import storage, strategies
from jobs.data import balance
from jobs.spec import TrialSpec
from jobs.strategies import rules

LENGTHS = "lengths.npy"


@dataclass(frozen=True)
class Packing:
    useful: float  # unmasked score entries / the causal row's: the attention work the documents need
    computed: float  # live block tiles / the causal row's: what a block-skipping kernel computes
    imbalance: float  # the busiest device's tiles / the mean, under the trial's layout (0: as a causal row)
    docs_per_row: float
    source: str  # where the document lengths came from


def lengths_uri(source: str) -> str:
    """`lengths.npy` in a source directory (or gs:// prefix), or beside a single shard file."""
    if source.endswith((".arrayrecord", ".array_record", ".parquet")):
        head = source.rsplit("/", 1)[0] if "/" in source else "."
        return storage.join(head, LENGTHS)
    return storage.join(source.rstrip("/"), LENGTHS)


@lru_cache(maxsize=16)
def _lengths(source: str) -> np.ndarray | None:
    uri = lengths_uri(source)
    try:
        if not storage.exists(uri):
            return None
        n = np.load(storage.fetch(uri, os.path.join(tempfile.gettempdir(), "cp-orchestrator-data")))
    except Exception:  # noqa: BLE001 - an unreadable or absent file: priced as one causal row, and said so
        return None
    n = np.asarray(n, np.int64).reshape(-1)
    return n[n > 0] if (n > 0).any() else None


def sources(spec: TrialSpec) -> tuple[str, ...]:
    d = spec.train.data
    return tuple(d.sources) or ((d.path,) if d.path else ())


def of(spec: TrialSpec) -> Packing | None:
    """The packing figures of a documents trial (None: not packed, or no lengths to sample from)."""
    if spec.train.data.kind != "documents":
        return None
    found = [(s, n) for s in sources(spec) if (n := _lengths(s)) is not None]
    if not found:
        return None
    from orchestrator.plan.memory import local_sizes

    # the shards the layout balances: zigzag's ring positions, balanced's every sequence shard
    shape, s = spec.mesh.shape(), strategies.get(spec.strategy.name)
    P = s.cp(shape) if spec.strategy.layout == "balanced" else rules.ring_size(spec.strategy.name, shape)
    hop = s.hop_tokens(local_sizes(spec))
    splash = spec.cluster.platform == "tpu" and spec.strategy.layout != "balanced"  # balanced runs on xla
    block = min(hop, spec.context_length) if splash else spec.strategy.block_kv
    return _measure(
        tuple(s for s, _ in found), spec.context_length, P, spec.strategy.layout, block, spec.train.seed
    )


@lru_cache(maxsize=256)
def _measure(found: tuple[str, ...], L: int, P: int, layout: str, block: int, seed: int) -> Packing:
    # a mixture's lengths pooled (the planner's sample, not the loader's exact weights)
    lengths = np.concatenate([_lengths(s) for s in found])
    seg = balance.sampled_row(lengths, L, seed)
    layout = layout if L % (2 * P) == 0 or layout == "contiguous" else "contiguous"
    if (
        block >= L
    ):  # the whole sequence in one kernel call: every causal tile computed, balanced as a causal row
        return Packing(
            useful=balance.useful_fraction(seg),
            computed=1.0,
            imbalance=0.0,
            docs_per_row=float(len(np.unique(seg[seg > 0]))),
            source=", ".join(found),
        )
    b = balance.summary(seg, P, layouts=(layout,), block=block)[layout]
    nb = -(-L // block)
    row_tiles = nb * (nb + 1) / 2  # a causal row's live tiles
    return Packing(
        useful=balance.useful_fraction(seg),
        computed=min(1.0, b.tiles_mean * P / row_tiles),
        imbalance=b.tiles_ratio,
        docs_per_row=float(len(np.unique(seg[seg > 0]))),
        source=", ".join(found),
    )


def words(p: Packing | None, spec: TrialSpec, mfu: float) -> str:
    """The plan's note on which FLOPs MFU counts, for a documents trial."""
    if spec.train.data.kind != "documents":
        return ""
    if p is None:
        return (
            f"documents without {LENGTHS} beside {', '.join(sources(spec)) or 'the source'}: attention priced "
            "as one causal row (build the corpus with python -m jobs.data.documents.corpus)"
        )
    return (
        f"MFU counts the causal row (MaxText's convention); {p.docs_per_row:,.0f} documents a row leave "
        f"{p.useful:.1%} of its attention as useful work, useful MFU {useful_mfu(spec, p, mfu):.3f}; the kernel "
        f"computes {p.computed:.1%} of the row's tiles"
        + (f", busiest device {p.imbalance:.2f}x the mean" if p.imbalance else "")
    )


def useful_mfu(spec: TrialSpec, p: Packing, mfu: float) -> float:
    """MFU with attention counted as the documents' own unmasked work instead of the causal row."""
    from jobs.flops import layer_flops

    weights, attention = layer_flops(spec.model, spec.context_length)
    return mfu * (weights + p.useful * attention) / (weights + attention)
