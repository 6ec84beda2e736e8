"""Blockwise (flash-style) attention in plain XLA: (out, lse) and its backward, never an L x L score matrix.

Runs on every backend. Memory is O(block_q x block_kv) scores plus O(L) outputs; blocks that a causal mask
hides entirely (judged from true token positions, so permuted layouts work) are skipped with lax.cond.
Layout: head-major inside, with the G = Hq/Hkv query heads of a KV head stacked as extra rows (R = bq*G), so
every matmul is a plain batched [R, D] x [D, bk] product (GQA costs no extra transposes or KV copies).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs.attention.core import NEG_INF, match_varying, safe_max
from jobs.attention.kernels.mask import Mask
from jobs.attention.kernels.xla_mask import PositionMask, segment_mask


def fit_block(length: int, block: int) -> int:
    """Largest divisor of length that is <= block (blocks must tile the local sequence)."""
    b = max(1, min(block, length))
    while length % b:
        b -= 1
    return b


def _precision(dtype: jnp.dtype) -> jax.lax.Precision:
    # fp32 inputs ask for fp32 matmuls (TPU/GPU default would round to bf16 and break the 2e-5 check).
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def _rows(x_BxLxHx___: jax.Array, n: int, kv_heads: int) -> jax.Array:
    """[B, L, H, ...] -> [n, B, K, (L/n)*G, ...]: block-major, head-major, G query heads as extra rows."""
    B, L, H = x_BxLxHx___.shape[:3]
    rest = x_BxLxHx___.shape[3:]
    x = x_BxLxHx___.reshape(B, n, L // n, kv_heads, H // kv_heads, *rest)
    perm = (1, 0, 3, 2, 4, *range(5, 5 + len(rest)))
    return jnp.transpose(x, perm).reshape(n, B, kv_heads, (L // n) * (H // kv_heads), *rest)


def _unrows(x_NxBxKxRx___: jax.Array, heads: int) -> jax.Array:
    """Inverse of _rows: [n, B, K, b*G, ...] -> [B, n*b, H, ...]."""
    n, B, K, R = x_NxBxKxRx___.shape[:4]
    rest = x_NxBxKxRx___.shape[4:]
    G = heads // K
    x = x_NxBxKxRx___.reshape(n, B, K, R // G, G, *rest)
    perm = (1, 0, 3, 2, 4, *range(5, 5 + len(rest)))
    return jnp.transpose(x, perm).reshape(B, n * (R // G), heads, *rest)


def _kv_blocks(x_BxLxKxD: jax.Array, n: int) -> jax.Array:
    """[B, L, K, D] -> [n, B, K, L/n, D]."""
    B, L, K, D = x_BxLxKxD.shape
    return jnp.transpose(x_BxLxKxD.reshape(B, n, L // n, K, D), (1, 0, 3, 2, 4))


def _kv_unblocks(x_NxBxKxbxD: jax.Array) -> jax.Array:
    n, B, K, b, D = x_NxBxKxbxD.shape
    return jnp.transpose(x_NxBxKxbxD, (1, 0, 3, 2, 4)).reshape(B, n * b, K, D)


def _setup(q, k, mask: Mask):
    B, Lq, H, D = q.shape
    Lk, K = k.shape[1], k.shape[2]
    bq, bk = fit_block(Lq, mask.block_q), fit_block(Lk, mask.block_kv)
    nq, nk = Lq // bq, Lk // bk
    # Tie the positions to q. Positions are loop-invariant in a model that scans its layers, and under autodiff
    # lax.scan hoists loop-invariant residuals out of the loop (_scan_known_hoisting / _scan_partial_eval_custom):
    # everything computed from positions alone -- the causal mask of every (q-block, kv-block) pair and the
    # masked scores' -inf fill -- got partially evaluated out of these loops and stacked as [nq, nk, R, bk]
    # buffers (~1-4 GiB per train step at 16K/4 devices). Through the barrier they depend on q, so they stay
    # per block, inside the loops.
    causal, span = mask.causal, mask.span
    if mask.segmented:  # packed documents: positions and segment ids per batch row
        qpos, kpos, q_seg, kv_seg, _ = jax.lax.optimization_barrier(
            (mask.q_pos, mask.kv_pos, mask.q_seg, mask.kv_seg, q)
        )
        return B, H, K, D, nq, nk, bk, segment_mask(causal, qpos, q_seg, kpos, kv_seg, nq, nk, H // K, span)
    qpos, kpos, _ = jax.lax.optimization_barrier((mask.q_pos, mask.kv_pos, q))
    qpos_NxR = jnp.repeat(qpos.reshape(nq, bq), H // K, axis=1)  # row r = (query i, head g) -> pos i
    return B, H, K, D, nq, nk, bk, PositionMask(causal, qpos_NxR, kpos.reshape(nk, bk), span)


def xla_fwd(
    q_BxLqxHxD: jax.Array,
    k_BxLkxKxD: jax.Array,
    v_BxLkxKxD: jax.Array,
    mask: Mask,
) -> tuple[jax.Array, jax.Array]:
    """Returns out [B, Lq, H, D] fp32 (normalised) and lse [B, Lq, H] fp32 (-inf where no key is visible).

    Masked by true positions (and segment ids, and a window or chunk), whatever the layout: mask.order is unused.
    """
    B, H, K, D, nq, nk, _, blocks = _setup(q_BxLqxHxD, k_BxLkxKxD, mask)
    scale = D**-0.5
    prec = _precision(q_BxLqxHxD.dtype)
    f32 = jnp.float32
    q_NxBxKxRxD = _rows(q_BxLqxHxD, nq, K)
    k_NxBxKxbxD, v_NxBxKxbxD = _kv_blocks(k_BxLkxKxD, nk), _kv_blocks(v_BxLkxKxD, nk)
    refs = (q_BxLqxHxD, k_BxLkxKxD, v_BxLkxKxD, mask.q_pos, mask.kv_pos)

    def q_block(xs):
        q_b, qpos_b = xs

        def attend(carry, k_b, v_b, kpos_b):
            m, denom, acc = carry
            s = jnp.einsum("bkrd,bksd->bkrs", q_b, k_b, preferred_element_type=f32, precision=prec) * scale
            if blocks.active:
                s = blocks.where(qpos_b, kpos_b, s)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = safe_max(m_new)
            p = jnp.exp(s - m_safe[..., None])
            corr = jnp.exp(m - m_safe)
            pv = jnp.einsum(
                "bkrs,bksd->bkrd", p.astype(v_b.dtype), v_b, preferred_element_type=f32, precision=prec
            )
            return m_new, denom * corr + p.sum(-1), acc * corr[..., None] + pv

        def kv_step(carry, xs):
            k_b, v_b, kpos_b = xs
            if not blocks.active:
                return attend(carry, k_b, v_b, kpos_b), None
            visible = blocks.visible(qpos_b, kpos_b)
            return jax.lax.cond(visible, lambda c: attend(c, k_b, v_b, kpos_b), lambda c: c, carry), None

        stat = q_b.shape[:3]
        init = (
            match_varying(jnp.full(stat, NEG_INF, f32), *refs),
            match_varying(jnp.zeros(stat, f32), *refs),
            match_varying(jnp.zeros(q_b.shape, f32), *refs),
        )
        (m, denom, acc), _ = jax.lax.scan(kv_step, init, (k_NxBxKxbxD, v_NxBxKxbxD, blocks.k))
        seen = denom > 0
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), NEG_INF)
        return acc / jnp.where(seen, denom, 1.0)[..., None], lse

    o_NxBxKxRxD, lse_NxBxKxR = jax.lax.map(q_block, (q_NxBxKxRxD, blocks.q))
    return _unrows(o_NxBxKxRxD, H), _unrows(lse_NxBxKxR, H)


def xla_bwd(
    q_BxLqxHxD: jax.Array,
    k_BxLkxKxD: jax.Array,
    v_BxLkxKxD: jax.Array,
    o_BxLqxHxD: jax.Array,
    lse_BxLqxH: jax.Array,
    do_BxLqxHxD: jax.Array,
    mask: Mask,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq, dk, dv (fp32) given the final (global) out and lse; recomputes probabilities block by block."""
    B, H, K, D, nq, nk, _, blocks = _setup(q_BxLqxHxD, k_BxLkxKxD, mask)
    scale = D**-0.5
    dtype = q_BxLqxHxD.dtype
    prec = _precision(dtype)
    f32 = jnp.float32
    delta_BxLqxH = jnp.sum(o_BxLqxHxD.astype(f32) * do_BxLqxHxD.astype(f32), axis=-1)
    q_NxBxKxRxD = _rows(q_BxLqxHxD, nq, K)
    do_NxBxKxRxD = _rows(do_BxLqxHxD.astype(dtype), nq, K)
    lse_NxBxKxR = _rows(safe_max(lse_BxLqxH.astype(f32)), nq, K)
    delta_NxBxKxR = _rows(delta_BxLqxH, nq, K)
    k_NxBxKxbxD, v_NxBxKxbxD = _kv_blocks(k_BxLkxKxD, nk), _kv_blocks(v_BxLkxKxD, nk)
    refs = (q_BxLqxHxD, k_BxLkxKxD, v_BxLkxKxD, o_BxLqxHxD, lse_BxLqxH, do_BxLqxHxD, mask.q_pos, mask.kv_pos)

    def zeros(shape):
        return match_varying(jnp.zeros(shape, f32), *refs)

    def q_block(dkv, xs):
        q_b, do_b, lse_b, delta_b, qpos_b = xs

        def grads(dq_b, k_b, v_b, kpos_b):
            s = jnp.einsum("bkrd,bksd->bkrs", q_b, k_b, preferred_element_type=f32, precision=prec) * scale
            if blocks.active:
                s = blocks.where(qpos_b, kpos_b, s)
            p = jnp.exp(s - lse_b[..., None])
            dv_b = jnp.einsum(
                "bkrs,bkrd->bksd", p.astype(dtype), do_b, preferred_element_type=f32, precision=prec
            )
            dp = jnp.einsum("bkrd,bksd->bkrs", do_b, v_b, preferred_element_type=f32, precision=prec)
            ds = (p * (dp - delta_b[..., None]) * scale).astype(dtype)
            dq_b = dq_b + jnp.einsum("bkrs,bksd->bkrd", ds, k_b, preferred_element_type=f32, precision=prec)
            dk_b = jnp.einsum("bkrs,bkrd->bksd", ds, q_b, preferred_element_type=f32, precision=prec)
            return dq_b, (dk_b, dv_b)

        def kv_step(dq_b, xs):
            k_b, v_b, kpos_b = xs
            if not blocks.active:
                return grads(dq_b, k_b, v_b, kpos_b)
            skip = lambda c: (c, (zeros(k_b.shape), zeros(k_b.shape)))
            visible = blocks.visible(qpos_b, kpos_b)
            return jax.lax.cond(visible, lambda c: grads(c, k_b, v_b, kpos_b), skip, dq_b)

        dq_b, (dk_NxBxKxbxD, dv_NxBxKxbxD) = jax.lax.scan(
            kv_step, zeros(q_b.shape), (k_NxBxKxbxD, v_NxBxKxbxD, blocks.k)
        )
        return (dkv[0] + dk_NxBxKxbxD, dkv[1] + dv_NxBxKxbxD), dq_b

    init = (zeros(k_NxBxKxbxD.shape), zeros(v_NxBxKxbxD.shape))
    (dk, dv), dq_NxBxKxRxD = jax.lax.scan(
        q_block, init, (q_NxBxKxRxD, do_NxBxKxRxD, lse_NxBxKxR, delta_NxBxKxR, blocks.q)
    )
    return _unrows(dq_NxBxKxRxD, H), _kv_unblocks(dk), _kv_unblocks(dv)
