"""Token layouts for packed documents under context parallelism: which row positions each device holds.

A row of L tokens is spread over P devices; device r holds `perm[r*Ll:(r+1)*Ll]` (Ll = L/P) of the row, in that
local order. A segment id per row position names its document (0: padding); a query at row position i in
document d sees the keys j <= i of d. `contiguous` and `zigzag` balance one causal row (jobs.strategies.rules);
`balanced` balances the documents. jobs.data.balance re-exports these and measures the work a layout leaves.
"""

from __future__ import annotations

import heapq

import numpy as np

from jobs.strategies.base import LAYOUTS
from jobs.strategies.rules import zigzag_permutation


def segment_ids_from_lengths(lengths: np.ndarray | list[int], L: int) -> np.ndarray:
    """Segment ids [L] (int32) of documents packed back to back: document k gets id k+1, padding at the end 0."""
    n_D = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if (n_D < 0).any() or n_D.sum() > L:
        raise ValueError(f"need non-negative document lengths summing to at most L={L}, got sum {n_D.sum()}")
    ids_L = np.zeros(L, np.int32)
    ids_L[: n_D.sum()] = np.repeat(np.arange(1, n_D.size + 1, dtype=np.int32), n_D)
    return ids_L


def runs(segment_ids_L: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, id) of each maximal run of equal segment ids, in row order: the documents and padding.

    A nonzero id must form one run: the attention matches ids, so an id split in two would join two documents.
    """
    seg_L = np.asarray(segment_ids_L).reshape(-1)
    if seg_L.size == 0:
        raise ValueError("empty row")
    cut = np.flatnonzero(seg_L[1:] != seg_L[:-1]) + 1
    start_R = np.concatenate([[0], cut]).astype(np.int64)
    end_R = np.concatenate([cut, [seg_L.size]]).astype(np.int64)
    id_R = seg_L[start_R]
    nz = np.sort(id_R[id_R != 0])
    twice = nz[1:][nz[1:] == nz[:-1]]
    if twice.size:
        raise ValueError(f"segment id {twice[0]} occurs in two separate runs; give each document one id")
    return start_R, end_R, id_R


def document_positions(segment_ids_L: np.ndarray) -> np.ndarray:
    """Position [L] (int64) of each token within its document (its run of equal segment ids), from 0."""
    start_R, end_R, _ = runs(segment_ids_L)
    return np.arange(end_R[-1], dtype=np.int64) - np.repeat(start_R, end_R - start_R)


def _run_work(a: np.ndarray, e: np.ndarray, doc_start: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """Unmasked score entries of the queries at row positions [a, e) of a document starting at doc_start."""
    pa, pe = a - doc_start, e - doc_start
    return np.where(pad, 0, (pe * (pe + 1) - pa * (pa + 1)) // 2)


def permutation(layout: str, segment_ids_L: np.ndarray, P: int, *, chunk: int = 512) -> np.ndarray:
    """Row position [L] (int64) at each slot of the layout: device r holds perm[r*L/P:(r+1)*L/P].

    contiguous: the identity. zigzag: `jobs.strategies.rules.zigzag_permutation(L, P)` (needs L % 2P == 0).
    balanced (needs L % P == 0), deterministic:
      1. Units. Each run of equal segment ids (a document, or the padding) of n tokens is cut into 2m pieces
         of equal-ish size, m = clamp(n // (2c), 1, P) with c = min(chunk, L/(8P)) (at least 1); unit k is
         the pair of pieces k and 2m-1-k (Transformer Engine's per-document zigzag), so every pair of a
         document holds the same tokens and nearly the same work, and no piece is shorter than c. m = 1 keeps
         the document whole; a document of at least 2Pc tokens gives each of P units one pair.
      2. Greedy LPT. Units in a queue by work (sum of position-in-document + 1; padding 0), largest first,
         ties by row position; each goes to the least-loaded device that still has room for all its tokens.
      3. Exact fill. A unit no device has room for is cut to fill the roomiest device (lowest index on ties)
         exactly, at a point that leaves both sides at least c tokens long or touching a document boundary
         (its tail cut off, else its head; a shorter middle piece only when neither is possible), and the
         rest goes back into the queue with its own work. Each cut fills a device: at most P cuts.
      4. Each device's runs in row order (adjacent pieces of one document merge).
    So each device gets exactly L/P tokens, and a run of consecutive row positions on a device is at least c
    tokens long unless it starts or ends at a document boundary or came from one of the <= P cuts (at most 2P
    such runs in all; none when the documents' pairs fill the devices exactly). One document filling the row
    reproduces zigzag exactly. Cost: vectorised over tokens and runs; a Python loop over units (<= L/2c + the
    documents), ~0.3 s for L = 14,680,064 and P = 128 on one core.
    """
    seg_L = np.asarray(segment_ids_L).reshape(-1)
    L = seg_L.size
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if P < 1 or L % P:
        raise ValueError(f"need L % P == 0 to give each device L/P tokens: {L} % {P} = {L % max(P, 1)}")
    if layout == "contiguous":
        return np.arange(L, dtype=np.int64)
    if layout == "zigzag":
        return zigzag_permutation(L, P).astype(np.int64)
    return _balanced(seg_L, P, chunk)


def _balanced(seg_L: np.ndarray, P: int, chunk: int) -> np.ndarray:
    L = seg_L.size
    Ll = L // P
    c = max(1, min(int(chunk), Ll // 8))
    start_R, end_R, id_R = runs(seg_L)
    n_R = end_R - start_R
    m_R = np.clip(n_R // (2 * c), 1, P)
    # unit u: pair k of run r
    r_U = np.repeat(np.arange(n_R.size), m_R)
    k_U = np.arange(r_U.size) - np.repeat(np.cumsum(m_R) - m_R, m_R)
    s_U, n_U, two_U = start_R[r_U], n_R[r_U], 2 * m_R[r_U]

    def bound(j: np.ndarray) -> np.ndarray:
        return s_U + (j * n_U) // two_U

    mid = k_U == m_R[r_U] - 1  # the middle pair's pieces touch: one run
    a1, e1 = bound(k_U), np.where(mid, bound(k_U + 2), bound(k_U + 1))
    a2 = np.where(mid, e1, bound(two_U - 1 - k_U))
    e2 = np.where(mid, e1, bound(two_U - k_U))
    pad_U = id_R[r_U] == 0
    t_U = (e1 - a1) + (e2 - a2)
    w_U = _run_work(a1, e1, s_U, pad_U) + _run_work(a2, e2, s_U, pad_U)
    order = np.lexsort((a1, -w_U))

    dev_U = np.full(r_U.size, -1, np.int64)
    extra = _lpt(order, (a1, e1, a2, e2, start_R[r_U], end_R[r_U], pad_U, t_U, w_U), Ll, P, c, dev_U)
    done = dev_U >= 0
    pieces = [(dev_U[done], a1[done], e1[done]), (dev_U[done], a2[done], e2[done])]
    if extra:
        pieces.append(tuple(np.asarray(x, np.int64) for x in zip(*extra, strict=True)))
    dev, a, e = (np.concatenate(x) for x in zip(*pieces, strict=True))
    keep = e > a
    dev, a, e = dev[keep], a[keep], e[keep]
    o = np.lexsort((a, dev))
    dev, a, n = dev[o], a[o], (e - a)[o]
    if not (np.bincount(dev, n, minlength=P) == Ll).all():
        raise AssertionError("balanced layout lost tokens")  # a bug here, never an input problem
    offset = np.cumsum(n) - n
    return np.repeat(a - offset, n) + np.arange(L, dtype=np.int64)


def _lpt(
    order: np.ndarray, units: tuple, Ll: int, P: int, c: int, dev_U: np.ndarray
) -> list[tuple[int, int, int]]:
    """Steps 2 and 3: units to devices (dev_U), largest work first; returns the (device, a, e) of cut pieces."""
    a1, e1, a2, e2, ds_U, de_U, pad_U, t_U, w_U = (x.tolist() for x in units)
    work_P = np.zeros(P, np.float64)
    room_P = np.full(P, Ll, np.int64)
    heap = [(-w_U[u], a1[u], u, None) for u in order.tolist()]  # already in heap order
    extra = []
    while heap:
        w, _, u, rest = heapq.heappop(heap)
        runs_ = rest if rest is not None else [(a, e) for a, e in ((a1[u], e1[u]), (a2[u], e2[u])) if e > a]
        t = sum(e - a for a, e in runs_)
        d = int(np.argmin(np.where(room_P >= t, work_P, np.inf)))
        if room_P[d] >= t:
            if rest is None:
                dev_U[u] = d
            else:
                extra += [(d, a, e) for a, e in runs_]
            work_P[d] -= w
            room_P[d] -= t
            continue
        # no device has room for all of it: fill the roomiest exactly, the rest back in the queue
        d = int(np.argmax(room_P))
        room, ds, de, pad = int(room_P[d]), ds_U[u], de_U[u], pad_U[u]
        given, left = [], list(runs_)
        while left[0][1] - left[0][0] <= room - sum(e - a for a, e in given):
            given.append(left.pop(0))
        k = room - sum(e - a for a, e in given)
        if k:
            piece, rem, _ = _cut(*left[0], k, ds, de, c)
            given.append(piece)
            left[0] = rem
        wg = sum(_work(a, e, ds, pad) for a, e in given)
        extra += [(d, a, e) for a, e in given]
        work_P[d] += wg
        room_P[d] = 0
        wl = sum(_work(a, e, ds, pad) for a, e in left)
        heapq.heappush(heap, (-wl, left[0][0], u, left))
    return extra


def _work(a: int, e: int, ds: int, pad: bool) -> int:
    return 0 if pad else ((e - ds) * (e - ds + 1) - (a - ds) * (a - ds + 1)) // 2


def _cut(a: int, e: int, k: int, ds: int, de: int, c: int) -> tuple[tuple[int, int], tuple[int, int], bool]:
    """Cut k tokens off the run [a, e) of a document [ds, de): (given, rest, whether both are valid runs)."""
    if (k >= c or e == de) and (e - k - a >= c or a == ds):
        return (e - k, e), (a, e - k), True
    if (k >= c or a == ds) and (e - a - k >= c or e == de):
        return (a, a + k), (a + k, e), True
    return (e - k, e), (a, e - k), False
