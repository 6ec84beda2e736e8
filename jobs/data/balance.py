"""Load balance of packed documents under context parallelism: the attention work each device does per layout.

Layouts and segment helpers live in jobs.data.document_layouts and are re-exported here, so callers import one
module. Work is counted two ways, for a row of L tokens over P devices (Ll = L/P queries each, every device
attending its queries over the whole row's keys, as all-gather and ring do):
  - entries: unmasked (query, key) score entries, sum over the device's queries of (position in document + 1);
    padding (segment 0) does none;
  - tiles: block x block tiles with at least one unmasked entry, the device's Ll queries cut into blocks in
    local order and the row's keys cut into blocks in layout order: what a block-skipping kernel computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jobs.data.document_layouts import (
    LAYOUTS,
    document_positions,
    permutation,
    runs,
    segment_ids_from_lengths,
)

__all__ = [
    "LAYOUTS",
    "Balance",
    "block_work_per_device",
    "document_positions",
    "permutation",
    "runs",
    "sampled_row",
    "segment_ids_from_lengths",
    "summary",
    "token_work",
    "useful_fraction",
    "work_per_device",
]


def _checked(segment_ids_L: np.ndarray, perm: np.ndarray, P: int) -> tuple[np.ndarray, np.ndarray, int]:
    seg_L = np.asarray(segment_ids_L).reshape(-1)
    perm_L = np.asarray(perm, dtype=np.int64).reshape(-1)
    L = seg_L.size
    if perm_L.size != L or P < 1 or L % P:
        raise ValueError(f"need a permutation of L={L} positions and L % P == 0, got {perm_L.size} and P={P}")
    return seg_L, perm_L, L // P


def token_work(segment_ids_L: np.ndarray) -> np.ndarray:
    """Unmasked score entries [L] (int64) of each query: its position in its document + 1, 0 for padding."""
    seg_L = np.asarray(segment_ids_L).reshape(-1)
    return np.where(seg_L != 0, document_positions(seg_L) + 1, 0)


def work_per_device(segment_ids_L: np.ndarray, perm: np.ndarray, P: int) -> np.ndarray:
    """Unmasked score entries [P] (int64) each device computes for its queries under the layout `perm`."""
    seg_L, perm_L, Ll = _checked(segment_ids_L, perm, P)
    return token_work(seg_L)[perm_L].reshape(P, Ll).sum(axis=1)


def useful_fraction(segment_ids_L: np.ndarray) -> float:
    """Unmasked entries with documents / the causal row's L(L+1)/2 (what MaxText's MFU counts)."""
    seg_L = np.asarray(segment_ids_L).reshape(-1)
    L = seg_L.size
    return float(token_work(seg_L).sum()) / (L * (L + 1) / 2)


def _blocks(perm_L, doc_L, pad_L, first_L, block_of, key_side):
    """Per (block, document) present: (block, doc, the document's least (keys) or greatest (queries) row
    position in the block). Works on the pieces where runs of consecutive row positions meet block cuts."""
    L = perm_L.size
    s = np.flatnonzero(first_L)
    e = np.concatenate([s[1:], [L]])
    keep = ~pad_L[s]
    s, e = s[keep], e[keep]
    b, d = block_of(s), doc_L[s]
    pos = perm_L[s] if key_side else perm_L[e - 1]
    key = b * (doc_L.max() + 1) + d
    o = np.lexsort((pos if key_side else -pos, key))
    key, b, d, pos = key[o], b[o], d[o], pos[o]
    head = np.ones(key.size, bool)
    head[1:] = key[1:] != key[:-1]
    return b[head], d[head], pos[head]


def block_work_per_device(
    segment_ids_L: np.ndarray, perm: np.ndarray, P: int, *, block: int = 512
) -> np.ndarray:
    """Tiles [P] (int64) of block x block with any unmasked entry that each device computes (see the module).

    Device r's query blocks are slots [r*Ll + i*block, ...) of `perm` (the last may be short when block does
    not divide Ll); key blocks are slots [j*block, ...) of the whole `perm`. A tile (Q, K) is live when some
    document d has a key in K at a row position <= that of a query of d in Q. Counted exactly without the
    tile grid: sum over (Q, d) of the K blocks holding d whose least position of d is <= Q's greatest, less
    the tiles counted more than once (Q and K sharing two or more live documents).
    """
    seg_L, perm_L, Ll = _checked(segment_ids_L, perm, P)
    L = seg_L.size
    start_R, end_R, _ = runs(seg_L)
    doc_L = np.repeat(np.arange(start_R.size, dtype=np.int64), end_R - start_R)[perm_L]
    pad_L = seg_L[perm_L] == 0
    slot = np.arange(L, dtype=np.int64)
    cont = np.zeros(L, bool)
    cont[1:] = (perm_L[1:] == perm_L[:-1] + 1) & (doc_L[1:] == doc_L[:-1])
    nq = -(-Ll // block)  # query blocks per device
    qb, qd, qmax = _blocks(
        perm_L,
        doc_L,
        pad_L,
        ~cont | ((slot % Ll) % block == 0),
        lambda s: (s // Ll) * nq + (s % Ll) // block,
        key_side=False,
    )
    kb, kd, kmin = _blocks(perm_L, doc_L, pad_L, ~cont | (slot % block == 0), lambda s: s // block, True)
    # sum over (Q, d) of the key blocks of d that Q sees
    span = L + 1
    comp = np.sort(kd * span + kmin)
    seen = np.searchsorted(comp, qd * span + qmax, "right") - np.searchsorted(comp, qd * span, "left")
    tiles_P = np.bincount(qb // nq, seen, minlength=P).astype(np.int64)
    # tiles counted once per live shared document: only blocks with two or more documents can share two
    multi_q = np.isin(qb, qb[1:][qb[1:] == qb[:-1]])
    multi_k = np.isin(kb, kb[1:][kb[1:] == kb[:-1]])
    qb, qd, qmax = qb[multi_q], qd[multi_q], qmax[multi_q]
    o = np.argsort(kd[multi_k], kind="stable")
    kb, kd, kmin = kb[multi_k][o], kd[multi_k][o], kmin[multi_k][o]
    lo, hi = np.searchsorted(kd, qd, "left"), np.searchsorted(kd, qd, "right")
    cnt = hi - lo
    qi = np.repeat(np.arange(qd.size), cnt)
    kj = np.repeat(lo, cnt) + np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    live = kmin[kj] <= qmax[qi]
    nk = -(-L // block)  # key blocks
    pair, times = np.unique(qb[qi[live]] * nk + kb[kj[live]], return_counts=True)
    over = times > 1
    tiles_P -= np.bincount((pair[over] // nk) // nq, times[over] - 1, minlength=P).astype(np.int64)
    return tiles_P


@dataclass(frozen=True)
class Balance:
    """Per-device work of one layout: entries and tiles, max and mean over the P devices."""

    layout: str
    entries_max: float
    entries_mean: float
    tiles_max: float
    tiles_mean: float

    @property
    def entries_ratio(self) -> float:
        return self.entries_max / self.entries_mean if self.entries_mean else 1.0

    @property
    def tiles_ratio(self) -> float:
        return self.tiles_max / self.tiles_mean if self.tiles_mean else 1.0


def summary(
    segment_ids_L: np.ndarray,
    P: int,
    *,
    layouts: Sequence[str] = LAYOUTS,
    block: int = 512,
    chunk: int = 512,
) -> dict[str, Balance]:
    """Max and mean per-device work (entries and block tiles) of each layout for one row."""
    out = {}
    for name in layouts:
        perm = permutation(name, segment_ids_L, P, chunk=chunk)
        e_P = work_per_device(segment_ids_L, perm, P)
        t_P = block_work_per_device(segment_ids_L, perm, P, block=block)
        out[name] = Balance(name, float(e_P.max()), float(e_P.mean()), float(t_P.max()), float(t_P.mean()))
    return out


def sampled_row(lengths: np.ndarray, L: int, seed: int) -> np.ndarray:
    """Segment ids [L] of one row: documents of these lengths sampled with replacement (seeded) until the row
    is full, the last truncated (the benchmark's rows, and the planner's sample of a corpus)."""
    rng = np.random.default_rng(seed)
    picked = []
    total = 0
    while total < L:
        draw = lengths[rng.integers(0, lengths.size, size=max(16, int(2 * L / lengths.mean())))]
        picked.append(draw)
        total += int(draw.sum())
    n = np.concatenate(picked)
    cum = np.cumsum(n)
    k = int(np.searchsorted(cum, L))  # document k is the one that crosses L
    n = n[: k + 1].copy()
    n[k] -= int(cum[k]) - L
    return segment_ids_from_lengths(n, L)
