"""Packed documents: per-token true positions and segment ids of a block, and a cheap "can any query see any key"
summary of it, so a kernel block or a whole ring hop with nothing visible is skipped.

The summary hashes segment ids into S buckets and keeps, per bucket, the first (min) and last (max) true
position of the block's tokens. Queries at positions i see keys at j <= i of the same segment, so a pair of
blocks has a visible entry iff some segment's last query position >= its first key position: with fewer than
S distinct segments in the two blocks the test is exact, and a bucket collision only makes it conservative.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

BUCKETS = 128  # S: summary width; [B, S] int32 per block, tiny beside its K/V
# what segment_max / segment_min give an empty bucket
_MIN, _MAX = jnp.iinfo(jnp.int32).min, jnp.iinfo(jnp.int32).max


class Tokens(NamedTuple):
    """One block's mask inputs (a pytree: it travels with its K/V around a ring)."""

    pos: jax.Array  # int32 [B, n]: true row position of each token
    seg: jax.Array  # int32 [B, n]: segment (document) id of each token
    first: jax.Array  # int32 [B, S]: min position per segment bucket (empty: int32 max)
    last: jax.Array  # int32 [B, S]: max position per segment bucket (empty: int32 min)


def extrema(pos_BxNxb: jax.Array, seg_BxNxb: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(first, last) [N, B, S] per block of b tokens: min and max position per segment bucket."""
    B, N, b = pos_BxNxb.shape
    base = (
        jnp.arange(B, dtype=jnp.int32)[:, None, None] * N + jnp.arange(N, dtype=jnp.int32)[None, :, None]
    ) * BUCKETS
    idx = (base + jnp.mod(seg_BxNxb, BUCKETS).astype(jnp.int32)).reshape(-1)
    pos = pos_BxNxb.astype(jnp.int32).reshape(-1)
    first = jax.ops.segment_min(pos, idx, num_segments=B * N * BUCKETS).reshape(B, N, BUCKETS)
    last = jax.ops.segment_max(pos, idx, num_segments=B * N * BUCKETS).reshape(B, N, BUCKETS)
    return jnp.swapaxes(first, 0, 1), jnp.swapaxes(last, 0, 1)


def tokens(pos_BxL: jax.Array, seg_BxL: jax.Array) -> Tokens:
    """The Tokens of a whole block (its summary computed once; it travels with the block)."""
    first, last = extrema(pos_BxL[:, None], seg_BxL[:, None])
    return Tokens(pos_BxL.astype(jnp.int32), seg_BxL.astype(jnp.int32), first[0], last[0])


def sees(q_last: jax.Array, k_first: jax.Array, causal: bool) -> jax.Array:
    """Scalar bool: may any query (bucket maxima q_last [..., S]) see any key (bucket minima k_first)?"""
    if causal:
        return jnp.any(q_last >= k_first)
    return jnp.any((q_last > _MIN) & (k_first < _MAX))


def block_sees(q: Tokens, k: Tokens, causal: bool) -> jax.Array:
    return sees(q.last, k.first, causal)
