"""Blockwise (flash-style) attention in plain XLA: (out, lse) and its backward, never an L x L score matrix.

Runs on every backend. Memory is O(block_q x block_kv) scores plus O(L) outputs; blocks that a causal mask
hides entirely (judged from true token positions, so permuted layouts work) are skipped with lax.cond.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs.attention.core import NEG_INF, match_varying, safe_max


def fit_block(length: int, block: int) -> int:
    """Largest divisor of length that is <= block (blocks must tile the local sequence)."""
    b = max(1, min(block, length))
    while length % b:
        b -= 1
    return b


def _precision(dtype: jnp.dtype) -> jax.lax.Precision:
    # fp32 inputs ask for fp32 matmuls (TPU/GPU default would round to bf16 and break the 2e-5 check).
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def _blocks(x_BxLx___: jax.Array, n: int) -> jax.Array:
    """[B, L, ...] -> [n, B, L/n, ...]: leading block axis for scan."""
    b, length = x_BxLx___.shape[:2]
    return jnp.moveaxis(x_BxLx___.reshape(b, n, length // n, *x_BxLx___.shape[2:]), 1, 0)


def _unblocks(x_NxBxbx___: jax.Array) -> jax.Array:
    n, b, blk = x_NxBxbx___.shape[:3]
    return jnp.moveaxis(x_NxBxbx___, 0, 1).reshape(b, n * blk, *x_NxBxbx___.shape[3:])


def _visible(qpos_b: jax.Array, kpos_b: jax.Array) -> jax.Array:
    return qpos_b[:, None] >= kpos_b[None, :]


def _any_visible(qpos_b: jax.Array, kpos_b: jax.Array) -> jax.Array:
    return jnp.max(qpos_b) >= jnp.min(kpos_b)


def xla_fwd(
    q_BxLqxHxD: jax.Array,
    k_BxLkxKxD: jax.Array,
    v_BxLkxKxD: jax.Array,
    qpos_Lq: jax.Array,
    kpos_Lk: jax.Array,
    *,
    causal: bool,
    block_q: int,
    block_kv: int,
) -> tuple[jax.Array, jax.Array]:
    """Returns out [B, Lq, H, D] fp32 (normalised) and lse [B, Lq, H] fp32 (-inf where no key is visible)."""
    B, Lq, H, D = q_BxLqxHxD.shape
    Lk, K = k_BxLkxKxD.shape[1], k_BxLkxKxD.shape[2]
    G = H // K
    bq, bk = fit_block(Lq, block_q), fit_block(Lk, block_kv)
    nq, nk = Lq // bq, Lk // bk
    scale = D**-0.5
    prec = _precision(q_BxLqxHxD.dtype)
    q_NxBxbxKxGxD = _blocks(q_BxLqxHxD.reshape(B, Lq, K, G, D), nq)
    k_NxBxbxKxD, v_NxBxbxKxD = _blocks(k_BxLkxKxD, nk), _blocks(v_BxLkxKxD, nk)
    qpos_Nxb, kpos_Nxb = qpos_Lq.reshape(nq, bq), kpos_Lk.reshape(nk, bk)
    refs = (q_BxLqxHxD, k_BxLkxKxD, v_BxLkxKxD, qpos_Lq, kpos_Lk)

    def q_block(xs):
        q_b, qpos_b = xs

        def attend(carry, k_b, v_b, kpos_b):
            m, denom, acc = carry
            s = jnp.einsum("bqkgd,bskd->bkgqs", q_b, k_b, preferred_element_type=jnp.float32, precision=prec)
            s = s * scale
            if causal:
                s = jnp.where(_visible(qpos_b, kpos_b), s, NEG_INF)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = safe_max(m_new)
            p = jnp.exp(s - m_safe[..., None])
            corr = jnp.exp(m - m_safe)
            pv = jnp.einsum(
                "bkgqs,bskd->bkgqd",
                p.astype(v_b.dtype),
                v_b,
                preferred_element_type=jnp.float32,
                precision=prec,
            )
            return m_new, denom * corr + p.sum(-1), acc * corr[..., None] + pv

        def kv_step(carry, xs):
            k_b, v_b, kpos_b = xs
            if not causal:
                return attend(carry, k_b, v_b, kpos_b), None
            pred = _any_visible(qpos_b, kpos_b)
            return jax.lax.cond(pred, lambda c: attend(c, k_b, v_b, kpos_b), lambda c: c, carry), None

        stat = (B, K, G, bq)
        init = (
            match_varying(jnp.full(stat, NEG_INF, jnp.float32), *refs),
            match_varying(jnp.zeros(stat, jnp.float32), *refs),
            match_varying(jnp.zeros((*stat, D), jnp.float32), *refs),
        )
        (m, denom, acc), _ = jax.lax.scan(kv_step, init, (k_NxBxbxKxD, v_NxBxbxKxD, kpos_Nxb))
        seen = denom > 0
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), NEG_INF)
        o = acc / jnp.where(seen, denom, 1.0)[..., None]
        # [B, K, G, bq, D] -> [B, bq, K*G, D]
        return jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(B, bq, H, D), jnp.transpose(
            lse, (0, 3, 1, 2)
        ).reshape(B, bq, H)

    o_NxBxbxHxD, lse_NxBxbxH = jax.lax.map(q_block, (q_NxBxbxKxGxD, qpos_Nxb))
    return _unblocks(o_NxBxbxHxD), _unblocks(lse_NxBxbxH)


def xla_bwd(
    q_BxLqxHxD: jax.Array,
    k_BxLkxKxD: jax.Array,
    v_BxLkxKxD: jax.Array,
    o_BxLqxHxD: jax.Array,
    lse_BxLqxH: jax.Array,
    do_BxLqxHxD: jax.Array,
    qpos_Lq: jax.Array,
    kpos_Lk: jax.Array,
    *,
    causal: bool,
    block_q: int,
    block_kv: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv (fp32) given the final (global) out and lse; recomputes probabilities block by block."""
    B, Lq, H, D = q_BxLqxHxD.shape
    Lk, K = k_BxLkxKxD.shape[1], k_BxLkxKxD.shape[2]
    G = H // K
    bq, bk = fit_block(Lq, block_q), fit_block(Lk, block_kv)
    nq, nk = Lq // bq, Lk // bk
    scale = D**-0.5
    dtype = q_BxLqxHxD.dtype
    prec = _precision(dtype)
    f32 = jnp.float32
    delta_BxLqxH = jnp.sum(o_BxLqxHxD.astype(f32) * do_BxLqxHxD.astype(f32), axis=-1)

    def stat_blocks(x_BxLqxH):  # -> [nq, B, K, G, bq]
        return jnp.transpose(_blocks(x_BxLqxH.reshape(B, Lq, K, G), nq), (0, 1, 3, 4, 2))

    q_NxBxbxKxGxD = _blocks(q_BxLqxHxD.reshape(B, Lq, K, G, D), nq)
    do_NxBxbxKxGxD = _blocks(do_BxLqxHxD.astype(dtype).reshape(B, Lq, K, G, D), nq)
    lse_NxBxKxGxb = stat_blocks(safe_max(lse_BxLqxH.astype(f32)))
    delta_NxBxKxGxb = stat_blocks(delta_BxLqxH)
    k_NxBxbxKxD, v_NxBxbxKxD = _blocks(k_BxLkxKxD, nk), _blocks(v_BxLkxKxD, nk)
    qpos_Nxb, kpos_Nxb = qpos_Lq.reshape(nq, bq), kpos_Lk.reshape(nk, bk)
    refs = (q_BxLqxHxD, k_BxLkxKxD, v_BxLkxKxD, o_BxLqxHxD, lse_BxLqxH, do_BxLqxHxD, qpos_Lq, kpos_Lk)

    def zeros(shape):
        return match_varying(jnp.zeros(shape, f32), *refs)

    def q_block(dkv, xs):
        q_b, do_b, lse_b, delta_b, qpos_b = xs

        def grads(dq_b, k_b, v_b, kpos_b):
            s = jnp.einsum("bqkgd,bskd->bkgqs", q_b, k_b, preferred_element_type=f32, precision=prec) * scale
            if causal:
                s = jnp.where(_visible(qpos_b, kpos_b), s, NEG_INF)
            p = jnp.exp(s - lse_b[..., None])
            dv_b = jnp.einsum(
                "bkgqs,bqkgd->bskd", p.astype(dtype), do_b, preferred_element_type=f32, precision=prec
            )
            dp = jnp.einsum("bqkgd,bskd->bkgqs", do_b, v_b, preferred_element_type=f32, precision=prec)
            ds = (p * (dp - delta_b[..., None]) * scale).astype(dtype)
            dq_b = dq_b + jnp.einsum("bkgqs,bskd->bqkgd", ds, k_b, preferred_element_type=f32, precision=prec)
            dk_b = jnp.einsum("bkgqs,bqkgd->bskd", ds, q_b, preferred_element_type=f32, precision=prec)
            return dq_b, (dk_b, dv_b)

        def kv_step(dq_b, xs):
            k_b, v_b, kpos_b = xs
            if not causal:
                return grads(dq_b, k_b, v_b, kpos_b)
            skip = lambda c: (c, (zeros((B, bk, K, D)), zeros((B, bk, K, D))))
            pred = _any_visible(qpos_b, kpos_b)
            return jax.lax.cond(pred, lambda c: grads(c, k_b, v_b, kpos_b), skip, dq_b)

        dq_b, (dk_NxBxbxKxD, dv_NxBxbxKxD) = jax.lax.scan(
            kv_step, zeros((B, bq, K, G, D)), (k_NxBxbxKxD, v_NxBxbxKxD, kpos_Nxb)
        )
        return (dkv[0] + dk_NxBxbxKxD, dkv[1] + dv_NxBxbxKxD), dq_b.reshape(B, bq, H, D)

    init = (zeros(k_NxBxbxKxD.shape), zeros(v_NxBxbxKxD.shape))
    (dk, dv), dq_NxBxbxHxD = jax.lax.scan(
        q_block, init, (q_NxBxbxKxGxD, do_NxBxbxKxGxD, lse_NxBxKxGxb, delta_NxBxKxGxb, qpos_Nxb)
    )
    return _unblocks(dq_NxBxbxHxD), _unblocks(dk), _unblocks(dv)
