"""All-gather CP: gather K and V over the context axis, attend the local queries (full K/V per device)."""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.kernels import attend
from jobs.attention.kernels.hop import Order
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, axis_size


def all_gather_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_context, H, D] (natural or zigzag order); mask from true positions."""
    (axis,) = strategies.get("all_gather").axes
    P = axis_size(mesh, axis)

    def packed(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_BxLl, seg_BxLl):
        """Packed documents: gather the keys' positions and segment ids with them."""
        gather = lambda x: jax.lax.all_gather(x, axis, axis=1, tiled=True) if P > 1 else x
        k_BxLxKxD, v_BxLxKxD, kpos_BxL, kseg_BxL = (
            gather(x) for x in (k_BxLlxKxD, v_BxLlxKxD, pos_BxLl, seg_BxLl)
        )
        return attend(
            q_BxLlxHxD,
            k_BxLxKxD,
            v_BxLxKxD,
            pos_BxLl,
            kpos_BxL,
            o.causal,
            o.kernel,
            o.block_q,
            o.block_kv,
            Order(o.layout, P),
            (seg_BxLl, kseg_BxL),
        )

    def local(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_BxLl=None, seg_BxLl=None):
        if seg_BxLl is not None:
            return packed(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_BxLl, seg_BxLl)
        pos_L = global_positions(L, o.layout, P)
        order = Order(o.layout, P)  # keys: the whole sequence in layout order (static-mask kernels need it)
        run = lambda q, k, v, qpos: attend(
            q, k, v, qpos, pos_L, o.causal, o.kernel, o.block_q, o.block_kv, order
        )
        if P == 1:
            return run(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_L)
        Ll = L // P
        qpos_Ll = jax.lax.dynamic_slice_in_dim(pos_L, jax.lax.axis_index(axis) * Ll, Ll)
        # Autodiff turns these gathers into reduce-scatters of dK/dV in the backward pass.
        k_BxLxKxD = jax.lax.all_gather(k_BxLlxKxD, axis, axis=1, tiled=True)
        v_BxLxKxD = jax.lax.all_gather(v_BxLlxKxD, axis, axis=1, tiled=True)
        return run(q_BxLlxHxD, k_BxLxKxD, v_BxLxKxD, qpos_Ll)

    return local
