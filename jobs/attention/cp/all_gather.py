"""All-gather CP: gather K and V over the context axis, attend the local queries (full K/V per device).

A sliding window or chunk with the contiguous layout gathers only the halo instead: the `lookback` keys just
before the local shard (the tail of the preceding shard(s), ppermuted from up to ceil(lookback / L_local)
neighbours), which is all a local query can see; K/V memory is then L/P + lookback, not L. Zigzag and balanced
keep the full gather and mask: a zigzag shard is two chunks whose halos sit on two other devices (themselves
split in chunks), and balanced positions are data, so the halo is not one static slice; the mask is still
exact, only the memory and bytes are a full gather's.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.core import match_varying
from jobs.attention.kernels import attend
from jobs.attention.kernels.mask import MONOTONIC, Mask, Order
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, axis_size
from jobs.strategies.all_gather import halo_tokens

FAR = jnp.iinfo(jnp.int32).max // 2  # the position of a halo slot before token 0: in every query's future


def halo_length(o: Options, P: int, Ll: int) -> int:
    """Keys to fetch before the local shard (0: gather everything instead): jobs.strategies.all_gather's rule,
    which the planner prices too."""
    return halo_tokens(o.span.lookback, o.layout, P, Ll, o.block_kv)


def fetch_halo(xs: tuple, axis: str, P: int, Ll: int, h: int) -> list:
    """Each of xs [B, Ll, ...] with the h tokens before the shard prepended ([B, h + Ll, ...]); a device
    with fewer than h tokens before it gets zeros there (mask them: halo_positions)."""
    n = -(-h // Ll)
    parts = []
    for i in range(n, 0, -1):  # the farthest shard first; it sends only its tail
        take = Ll if i < n else h - (n - 1) * Ll
        perm = [(x, x + i) for x in range(P - i)]
        parts.append([jax.lax.ppermute(x[:, Ll - take :], axis, perm) for x in xs])
    return [jnp.concatenate([p[j] for p in parts] + [x], axis=1) for j, x in enumerate(xs)]


def halo_positions(kpos: jax.Array, axis: str, Ll: int, h: int) -> jax.Array:
    """kpos [..., h + Ll] with the slots before token 0 moved to FAR, where causal masking hides them."""
    start = jax.lax.axis_index(axis) * Ll - h  # true position of the first halo slot (contiguous layout)
    return jnp.where(start + jnp.arange(h + Ll, dtype=jnp.int32) >= 0, kpos, FAR)


def all_gather_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_context, H, D] (natural or zigzag order); mask from true positions."""
    (axis,) = strategies.get("all_gather").axes
    P = axis_size(mesh, axis)
    Ll = L // P
    h = halo_length(o, P, Ll)

    def run(q, k, v, qpos, kpos, order: Order, segs: tuple, sinks):
        mask = Mask(qpos, kpos, o.causal, o.block_q, o.block_kv, order, o.span, *segs)
        return attend(q, k, v, mask, o.kernel, sinks)

    def local(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_BxLl=None, seg_BxLl=None, sinks=None):
        sinks = None if sinks is None else match_varying(sinks, q_BxLlxHxD)
        packed = seg_BxLl is not None
        pos_L = global_positions(L, o.layout, P)
        if P == 1:
            segs = (seg_BxLl, seg_BxLl) if packed else ()
            pos = pos_BxLl if packed else pos_L
            return run(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos, pos, Order(o.layout, P), segs, sinks)
        qpos = pos_BxLl if packed else jax.lax.dynamic_slice_in_dim(pos_L, jax.lax.axis_index(axis) * Ll, Ll)
        xs = (k_BxLlxKxD, v_BxLlxKxD, *((pos_BxLl, seg_BxLl) if packed else ()))
        if h:
            k, v, *toks = fetch_halo(xs, axis, P, Ll, h)
            kpos = halo_positions(toks[0] if packed else (qpos[0] - h + jnp.arange(h + Ll)), axis, Ll, h)
            order = MONOTONIC  # keys: one run of positions, not the whole sequence
        else:
            # Autodiff turns these gathers into reduce-scatters of dK/dV in the backward pass.
            k, v, *toks = (jax.lax.all_gather(x, axis, axis=1, tiled=True) for x in xs)
            kpos = toks[0] if packed else pos_L
            # keys: the whole sequence in layout order (static-mask kernels need it)
            order = Order(o.layout, P)
        segs = (seg_BxLl, toks[1]) if packed else ()
        return run(q_BxLlxHxD, k, v, qpos, kpos, order, segs, sinks)

    return local
