"""The xla kernel's mask per (query block, key block): by positions alone (one position vector for the whole
batch, today's path), or by per-row positions and segment ids (packed documents); either limited by a Span
(sliding window or chunk). Each says which entries are visible and whether a block pair has any (so the
kernel can skip it: a key block older than every query's window is skipped like a future one)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jobs.attention.core import NEG_INF
from jobs.attention.span import GLOBAL, Span
from jobs.attention.tokens import extrema, sees


@dataclass(frozen=True)
class PositionMask:
    """Causal by true positions shared by the batch: q [nq, R] (row = query x head), k [nk, bk]."""

    causal: bool
    q: jax.Array
    k: jax.Array
    span: Span = GLOBAL  # only with causal (jobs.strategies.rules.validate_masks)

    @property
    def active(self) -> bool:
        return self.causal

    def where(self, qb, kb, s_BxKxRxb: jax.Array) -> jax.Array:
        return jnp.where(self.span.sees(qb[:, None], kb[None, :]), s_BxKxRxb, NEG_INF)

    def visible(self, qb, kb) -> jax.Array:
        return self.span.hull_sees(qb, kb)


@dataclass(frozen=True)
class SegmentMask:
    """Segment ids (and, causal, true positions) per batch row.

    q = (pos [nq, B, R], seg [nq, B, R], last [nq, B, S]); k = (pos [nk, B, bk], seg [nk, B, bk], first [nk, B, S]).
    """

    causal: bool
    q: tuple
    k: tuple
    span: Span = GLOBAL

    active = True  # segments always mask

    def where(self, qb, kb, s_BxKxRxb: jax.Array) -> jax.Array:
        (qpos, qseg, _), (kpos, kseg, _) = qb, kb
        see_BxRxb = qseg[:, :, None] == kseg[:, None, :]
        if self.causal:
            see_BxRxb = see_BxRxb & self.span.sees(qpos[:, :, None], kpos[:, None, :])
        return jnp.where(see_BxRxb[:, None], s_BxKxRxb, NEG_INF)

    def visible(self, qb, kb) -> jax.Array:
        see = sees(qb[2], kb[2], self.causal)
        return see & self.span.hull_sees(qb[0], kb[0]) if self.span.limited else see


def _q_rows(x_BxL: jax.Array, n: int, group: int) -> jax.Array:
    """[B, L] -> [n, B, (L/n)*G]: row r of a block = query r // G (the kernel's row layout)."""
    B, L = x_BxL.shape
    return jnp.swapaxes(jnp.repeat(x_BxL.reshape(B, n, L // n), group, axis=2), 0, 1)


def segment_mask(
    causal: bool,
    qpos_BxLq,
    qseg_BxLq,
    kpos_BxLk,
    kseg_BxLk,
    nq: int,
    nk: int,
    group: int,
    span: Span = GLOBAL,
) -> SegmentMask:
    """The SegmentMask of nq query blocks (G query heads per KV head as rows) and nk key blocks."""
    B, Lq = qpos_BxLq.shape
    Lk = kpos_BxLk.shape[1]
    _, q_last = extrema(qpos_BxLq.reshape(B, nq, Lq // nq), qseg_BxLq.reshape(B, nq, Lq // nq))
    k_first, _ = extrema(kpos_BxLk.reshape(B, nk, Lk // nk), kseg_BxLk.reshape(B, nk, Lk // nk))
    q = (_q_rows(qpos_BxLq, nq, group), _q_rows(qseg_BxLq, nq, group), q_last)
    kb = lambda x: jnp.swapaxes(x.reshape(B, nk, Lk // nk), 0, 1)
    return SegmentMask(causal, q, (kb(kpos_BxLk), kb(kseg_BxLk), k_first), span)
