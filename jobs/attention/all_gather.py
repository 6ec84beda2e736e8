"""All-gather CP: gather K and V over the context axis, attend the local queries (full K/V per device)."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from jobs.attention.kernel import attend
from jobs.attention.layout import global_positions
from jobs.attention.sharding import axis_size, qkv_spec

AXIS = "context"


def all_gather_attention(
    q_BxLxHxD: jax.Array,
    k_BxLxKxD: jax.Array,
    v_BxLxKxD: jax.Array,
    *,
    mesh: Mesh,
    causal: bool,
    layout: str,
    kernel: str,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Inputs A[B, L_context, H, D] (natural or zigzag order); out like q. Mask from true positions."""
    P, L = axis_size(mesh, AXIS), q_BxLxHxD.shape[1]
    spec = qkv_spec(mesh, "all_gather")

    def local(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD):
        pos_L = global_positions(L, layout, P)
        if P == 1:
            return attend(q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, pos_L, pos_L, causal, kernel, block_q, block_kv)
        Ll = L // P
        qpos_Ll = jax.lax.dynamic_slice_in_dim(pos_L, jax.lax.axis_index(AXIS) * Ll, Ll)
        # Autodiff turns these gathers into reduce-scatters of dK/dV in the backward pass.
        k_BxLxKxD = jax.lax.all_gather(k_BxLlxKxD, AXIS, axis=1, tiled=True)
        v_BxLxKxD = jax.lax.all_gather(v_BxLlxKxD, AXIS, axis=1, tiled=True)
        return attend(q_BxLlxHxD, k_BxLxKxD, v_BxLxKxD, qpos_Ll, pos_L, causal, kernel, block_q, block_kv)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(
        q_BxLxHxD, k_BxLxKxD, v_BxLxKxD
    )
