"""How far back a causal query sees: every earlier key (global), a sliding window, or its own fixed chunk.

A query at true position q sees a key at k iff lo(q) <= k <= q, where lo is -inf (global), q - W + 1
(window=W: W counts the query itself, as Gemma's, Mistral's and MaxText's sliding_window_size do: MaxText's
attention_op masks with jnp.triu(ones, -W + 1) * jnp.tril(ones, W - 1), which with causal leaves keys q-W+1 .. q)
or C * (q // C) (chunk=C, Llama 4's chunked attention: the keys of the query's own chunk). lo never decreases
with q, which makes the test "may a query in [q0, q1] see a key in [k0, k1]" exact for ranges of positions
(and conservative for any set of positions judged by its hull): see `ranges_see`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Span:
    """window=W or chunk=C (at most one; neither: global causal). Static, hashable: part of a trace's shape."""

    window: int | None = None
    chunk: int | None = None

    @staticmethod
    def of(window: int | None, chunk: int | None, length: int) -> Span:
        """The span of a call over `length` tokens: a window or chunk that covers the whole row is no limit
        (global causal attention, the same program), so callers never pay for a mask that hides nothing."""
        window = None if window is None or window >= length else int(window)
        chunk = None if chunk is None or chunk >= length else int(chunk)
        return Span(window, chunk)

    @property
    def limited(self) -> bool:
        return self.window is not None or self.chunk is not None

    @property
    def lookback(self) -> int | None:
        """Most keys before a query's own position it can see (None: unlimited)."""
        if self.window is not None:
            return self.window - 1
        return None if self.chunk is None else self.chunk - 1

    def lo(self, q_pos: jax.Array) -> jax.Array:
        """The oldest key position a query at q_pos sees (global: no limit, int32 min)."""
        if self.window is not None:
            return q_pos - (self.window - 1)
        if self.chunk is not None:
            return (q_pos // self.chunk) * self.chunk
        return jnp.full_like(q_pos, jnp.iinfo(jnp.int32).min)

    def sees(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """Elementwise (broadcasting): may the query at q_pos see the key at k_pos (causal and in span)?"""
        see = q_pos >= k_pos
        return see & (k_pos >= self.lo(q_pos)) if self.limited else see

    def ranges_see(self, q0, q1, k0, k1) -> jax.Array:
        """May some query at a position in [q0, q1] see some key in [k0, k1]? Exact for whole ranges (the
        first query at or after k0 is the one whose span reaches furthest forward), conservative for hulls."""
        see = k0 <= q1
        return see & (self.lo(jnp.maximum(q0, k0)) <= k1) if self.limited else see

    def hull_sees(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """Scalar: ranges_see over the hulls of two position sets."""
        return self.ranges_see(jnp.min(q_pos), jnp.max(q_pos), jnp.min(k_pos), jnp.max(k_pos))


GLOBAL = Span()
