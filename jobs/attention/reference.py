"""Dense fp32 attention, the ground truth every strategy is tested against (materialises L x L: small L only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _batched(x: jax.Array) -> jax.Array:
    """[L] -> [1, L]; [B, L] stays."""
    return x[None] if x.ndim == 1 else x


def _visible(Lq, Lk, causal, q_pos, kv_pos, q_seg, kv_seg, window, chunk) -> jax.Array:
    """bool [B or 1, Lq, Lk]: which key each query sees, written out term by term."""
    q_pos = _batched(jnp.arange(Lq) if q_pos is None else q_pos)[:, :, None]
    kv_pos = _batched(jnp.arange(Lk) if kv_pos is None else kv_pos)[:, None, :]
    see = jnp.ones((1, Lq, Lk), bool)
    if q_seg is not None or kv_seg is not None:
        q_seg = _batched(jnp.zeros(Lq, jnp.int32) if q_seg is None else q_seg)
        kv_seg = _batched(jnp.zeros(Lk, jnp.int32) if kv_seg is None else kv_seg)
        see = see & (q_seg[:, :, None] == kv_seg[:, None, :])
    if causal:
        see = see & (kv_pos <= q_pos)
    if window is not None:  # keys q-W+1 .. q: W counts the query itself
        see = see & (q_pos - kv_pos < window)
    if chunk is not None:  # keys of the query's own chunk
        see = see & (q_pos // chunk == kv_pos // chunk)
    return see


def reference_attention(
    q_BxLxHxD: jax.Array,
    k_BxLxKxD: jax.Array,
    v_BxLxKxD: jax.Array,
    *,
    causal: bool = True,
    q_pos: jax.Array | None = None,
    kv_pos: jax.Array | None = None,
    q_seg: jax.Array | None = None,
    kv_seg: jax.Array | None = None,
    window: int | None = None,
    chunk: int | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v in fp32 with GQA; out like q.

    Positions ([L] or [B, L]) default to natural order. With segment ids q_seg [B, Lq], kv_seg [B, Lk] a query
    sees a key only when their ids are equal (and, causal, kv_pos <= q_pos); window=W keeps keys with
    q_pos - kv_pos < W, chunk=C keys with q_pos // C == kv_pos // C. sinks [H]: one more logit per query head
    in every row's softmax, with no value. Rows that see nothing are 0.
    """
    B, Lq, H, D = q_BxLxHxD.shape
    Lk, K = k_BxLxKxD.shape[1], k_BxLxKxD.shape[2]
    f32 = jnp.float32
    q = q_BxLxHxD.astype(f32).reshape(B, Lq, K, H // K, D)
    k, v = k_BxLxKxD.astype(f32), v_BxLxKxD.astype(f32)
    hi = jax.lax.Precision.HIGHEST
    s_BxKxGxLqxLk = jnp.einsum("bqkgd,bskd->bkgqs", q, k, precision=hi) * D**-0.5
    see_BxLqxLk = _visible(Lq, Lk, causal, q_pos, kv_pos, q_seg, kv_seg, window, chunk)
    see = jnp.broadcast_to(see_BxLqxLk[:, None, None], s_BxKxGxLqxLk.shape)
    s = jnp.where(see, s_BxKxGxLqxLk, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        sink_KxGx1x1 = sinks.astype(f32).reshape(K, H // K, 1, 1)
        m = jnp.maximum(m, sink_KxGx1x1)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    e = jnp.where(see, jnp.exp(s - m), 0.0)
    total = e.sum(-1, keepdims=True)
    if sinks is not None:
        total = total + jnp.exp(sink_KxGx1x1 - m)
    p = e / jnp.where(total > 0, total, 1.0)
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v, precision=hi).reshape(B, Lq, H, D)
    return o.astype(q_BxLxHxD.dtype)
