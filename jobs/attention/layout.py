"""Zigzag layout helpers: permute a batch once, and the true token positions each device holds."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs.strategies import rules


def to_zigzag(x_BxLx___: jax.Array, ring_size: int) -> jax.Array:
    """Natural order -> zigzag layout along axis 1 (what the training job does to tokens/targets/positions)."""
    perm = rules.zigzag_permutation(x_BxLx___.shape[1], ring_size)
    return jnp.take(x_BxLx___, jnp.asarray(perm), axis=1)


def from_zigzag(x_BxLx___: jax.Array, ring_size: int) -> jax.Array:
    """Zigzag layout -> natural order along axis 1."""
    inv = rules.inverse_permutation(rules.zigzag_permutation(x_BxLx___.shape[1], ring_size))
    return jnp.take(x_BxLx___, jnp.asarray(inv), axis=1)


def global_positions(length: int, layout: str, ring_size: int) -> jax.Array:
    """True position of every token of the (possibly permuted) global sequence."""
    if layout == "zigzag":
        return jnp.asarray(rules.zigzag_permutation(length, ring_size), dtype=jnp.int32)
    return jnp.arange(length, dtype=jnp.int32)


def block_positions(length: int, layout: str, ring_size: int, index: jax.Array | int) -> jax.Array:
    """True positions of ring block `index` (length L/R): contiguous, or chunks index and 2R-1-index."""
    block = length // ring_size
    if layout == "zigzag":
        c = block // 2
        first = index * c + jnp.arange(c, dtype=jnp.int32)
        second = (2 * ring_size - 1 - index) * c + jnp.arange(c, dtype=jnp.int32)
        return jnp.concatenate([first, second])
    return index * block + jnp.arange(block, dtype=jnp.int32)
