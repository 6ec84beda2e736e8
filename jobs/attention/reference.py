"""Dense fp32 attention, the ground truth every strategy is tested against (materialises L x L: small L only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def reference_attention(
    q_BxLxHxD: jax.Array,
    k_BxLxKxD: jax.Array,
    v_BxLxKxD: jax.Array,
    *,
    causal: bool = True,
    q_pos: jax.Array | None = None,
    kv_pos: jax.Array | None = None,
) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v in fp32 with GQA; positions default to natural order. Out like q."""
    B, Lq, H, D = q_BxLxHxD.shape
    Lk, K = k_BxLxKxD.shape[1], k_BxLxKxD.shape[2]
    f32 = jnp.float32
    q = q_BxLxHxD.astype(f32).reshape(B, Lq, K, H // K, D)
    k, v = k_BxLxKxD.astype(f32), v_BxLxKxD.astype(f32)
    hi = jax.lax.Precision.HIGHEST
    s_BxKxGxLqxLk = jnp.einsum("bqkgd,bskd->bkgqs", q, k, precision=hi) * D**-0.5
    if causal:
        q_pos = jnp.arange(Lq) if q_pos is None else q_pos
        kv_pos = jnp.arange(Lk) if kv_pos is None else kv_pos
        s_BxKxGxLqxLk = jnp.where(q_pos[:, None] >= kv_pos[None, :], s_BxKxGxLqxLk, -jnp.inf)
    p = jax.nn.softmax(s_BxKxGxLqxLk, axis=-1)
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v, precision=hi).reshape(B, Lq, H, D)
    return o.astype(q_BxLxHxD.dtype)
