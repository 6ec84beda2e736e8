"""Ulysses CP: all-to-all sequence->heads, full-sequence attention on H/U heads, all-to-all back.

GQA-aware: with fewer KV heads than the Ulysses size U (U a multiple of Hkv) each KV head is replicated
U/Hkv times before the exchange; autodiff of the repeat sums the replicas' gradients. After the exchange a
device holds the whole sequence, so a sliding window or chunk is just the kernel's mask by true positions;
attention sinks are per query head, so each device takes the slice of them for the heads it now holds.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.core import match_varying
from jobs.attention.kernels import attend
from jobs.attention.kernels.mask import Mask, Order
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, axis_size


def seq_to_heads(x_BxLlxHxD: jax.Array, axis: str) -> jax.Array:
    """A[B, L_axis, H, D] -> A[B, L, H_axis, D]."""
    return jax.lax.all_to_all(x_BxLlxHxD, axis, split_axis=2, concat_axis=1, tiled=True)


def heads_to_seq(x_BxLxHuxD: jax.Array, axis: str) -> jax.Array:
    """A[B, L, H_axis, D] -> A[B, L_axis, H, D]."""
    return jax.lax.all_to_all(x_BxLxHuxD, axis, split_axis=1, concat_axis=2, tiled=True)


def gather_tokens(pos_BxLl, seg_BxLl, axis: str, size: int) -> tuple:
    """Packed documents: (pos, seg) of the longer sequence an all-to-all assembles (they have no heads to
    trade, so every device gathers them whole); () without segment ids."""
    if seg_BxLl is None:
        return ()
    if size == 1:
        return pos_BxLl, seg_BxLl
    return tuple(jax.lax.all_gather(x, axis, axis=1, tiled=True) for x in (pos_BxLl, seg_BxLl))


def ulysses_exchange(
    q_BxLlxHxD: jax.Array,
    k_BxLlxKxD: jax.Array,
    v_BxLlxKxD: jax.Array,
    *,
    axis: str,
    size: int,
    inner: Callable[..., jax.Array],
    pos_BxLl: jax.Array | None = None,
    seg_BxLl: jax.Array | None = None,
    sinks_H: jax.Array | None = None,
) -> jax.Array:
    """Trade sequence for heads over `axis`, run inner(q, k, v[, pos, seg], sinks=) on the longer sequence,
    trade back (pos, seg: packed documents, gathered over `axis`; sinks_H: this device's heads' sinks, sliced
    to the H/size heads it holds after the exchange)."""
    tok = gather_tokens(pos_BxLl, seg_BxLl, axis, size)
    if size == 1:
        return inner(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, *tok, sinks=sinks_H)
    if sinks_H is not None:  # device u gets heads [u*H/size, (u+1)*H/size) of the all-to-all's split
        Hu = q_BxLlxHxD.shape[2] // size
        sinks_H = jax.lax.dynamic_slice_in_dim(sinks_H, jax.lax.axis_index(axis) * Hu, Hu)
    K = k_BxLlxKxD.shape[2]
    if K < size:  # size % K == 0 (strategies.rules): device u then gets (a copy of) KV head u // (size/K)
        k_BxLlxKxD = jnp.repeat(k_BxLlxKxD, size // K, axis=2)
        v_BxLlxKxD = jnp.repeat(v_BxLlxKxD, size // K, axis=2)
    q, k, v = (seq_to_heads(x, axis) for x in (q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD))
    return heads_to_seq(inner(q, k, v, *tok, sinks=sinks_H), axis)


def ulysses_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_context, H, D] (natural or zigzag order)."""
    axis = strategies.get("ulysses").ulysses_axis
    P = axis_size(mesh, axis)
    order = Order(o.layout, P, whole=True)  # the whole sequence in layout order (static-mask kernels need it)

    def full_sequence(q_BxLxHuxD, k_BxLxKuxD, v_BxLxKuxD, pos_BxL=None, seg_BxL=None, sinks=None):
        packed = seg_BxL is not None  # packed documents: masks from the gathered positions and segment ids
        pos = pos_BxL if packed else global_positions(L, o.layout, P)  # every device holds all tokens
        segs = (seg_BxL, seg_BxL) if packed else ()
        mask = Mask(pos, pos, o.causal, o.block_q, o.block_kv, order, o.span, *segs)
        sinks = None if sinks is None else match_varying(sinks, q_BxLxHuxD)
        return attend(q_BxLxHuxD, k_BxLxKuxD, v_BxLxKuxD, mask, o.kernel, sinks)

    return lambda q, k, v, pos=None, seg=None, sinks=None: ulysses_exchange(
        q, k, v, axis=axis, size=P, inner=full_sequence, pos_BxLl=pos, seg_BxLl=seg, sinks_H=sinks
    )
