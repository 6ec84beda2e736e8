"""Section 2's probe of cuDNN's packed (ragged) layout: what wiring packed documents into the flash kernel needs.

The flash kernel runs packed documents on the xla kernel today (jobs/attention/kernels/flash.py). cuDNN can take
them as segments (q_seqlen/kv_seqlen [B, M], q_offsets/kv_offsets [B, M+1], PADDING_CAUSAL), but its softmax
statistics then come back as [B*M, N, T], and which index runs along T (the token's place in the row, or in
its segment) is not documented. A ring hop's merge needs those statistics per token, so this probe answers it
on the GPU, with nothing wired yet: one packed call's out against the dense masked fp32 reference, the
statistics compared under both readings, and the public API's own gradients. CPU: records cuDNN's refusal.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_check_common import BF16_TOL
from jobs.attention import reference_attention


def documents(L: int, M: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row of M documents of uneven lengths filling L: (segment ids [1, L] from 1, offsets [1, M+1],
    lengths [1, M]), offsets and lengths in the API's form (M segments, so no -1 padding)."""
    cuts = np.sort(np.random.default_rng(0).choice(np.arange(8, L - 8, 8), M - 1, replace=False))
    offsets = np.concatenate([[0], cuts, [L]]).astype(np.int32)
    lengths = np.diff(offsets).astype(np.int32)
    seg = np.repeat(np.arange(1, M + 1, dtype=np.int32), lengths)
    return seg[None], offsets[None], lengths[None]


def reference_lse(q, k, seg) -> jax.Array:
    """fp32 natural-log logsumexp of the scaled scores each query sees (its own document, causal): [B, L, H]."""
    B, L, H, D = q.shape
    kk = jnp.repeat(k.astype(jnp.float32), H // k.shape[2], axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), kk, precision="highest") * D**-0.5
    pos = jnp.arange(L)
    see = (seg[:, :, None] == seg[:, None, :]) & (pos[:, None] >= pos[None, :])[None]
    return jnp.swapaxes(jax.nn.logsumexp(jnp.where(see[:, None], s, -jnp.inf), axis=-1), 1, 2)


def stats_readings(stats, offsets, lengths) -> dict[str, jax.Array]:
    """The statistics [M, N, T] gathered to [1, L, N] under both readings of T: row index or segment index."""
    M, L = lengths.shape[1], int(offsets[0, -1])
    seg_of = np.repeat(np.arange(M), lengths[0])  # which segment each row token is in
    in_seg = np.arange(L) - np.repeat(offsets[0, :-1], lengths[0])
    return {
        "row_index": stats[seg_of, :, np.arange(L)][None],
        "segment_index": stats[seg_of, :, in_seg][None],
    }


def packed_probe(L: int, heads: tuple[int, int, int], M: int = 4) -> dict[str, Any]:
    from jax._src.cudnn import fused_attention_stablehlo as fa

    H, K, D = heads
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(kq, (1, L, H, D), jnp.float32).astype(jnp.bfloat16)
    k, v = (jax.random.normal(r, (1, L, K, D), jnp.float32).astype(jnp.bfloat16) for r in (kk, kv))
    ct = jax.random.normal(kc, (1, L, H, D), jnp.float32).astype(jnp.bfloat16)
    seg, offsets, lengths = documents(L, M)
    lens, offs = jnp.asarray(lengths), jnp.asarray(offsets)

    def cudnn(q, k, v):
        return fa.dot_product_attention(
            q,
            k,
            v,
            q_seqlen=lens,
            kv_seqlen=lens,
            q_offsets=offs,
            kv_offsets=offs,
            scale=D**-0.5,
            mask_type=fa.MaskType.PADDING_CAUSAL,
            qkv_layout="BTNH",
            return_residual=True,
        )

    out, stats = jax.jit(cudnn)(q, k, v)
    segj = jnp.asarray(seg)
    ref = lambda q, k, v: reference_attention(q, k, v, causal=True, q_seg=segj, kv_seg=segj)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want, vjp = jax.vjp(ref, *f32)
    got_grads = jax.jit(lambda q, k, v, ct: jax.vjp(lambda *a: cudnn(*a)[0], q, k, v)[1](ct))(q, k, v, ct)
    lse = reference_lse(q, k, segj)
    err = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
    grads = {
        n: err(g, w)
        for n, g, w in zip(("dq", "dk", "dv"), got_grads, vjp(ct.astype(jnp.float32)), strict=True)
    }
    stats_err = {name: err(s, lse) for name, s in stats_readings(stats, offsets, lengths).items()}
    return {
        "L": L,
        "heads": list(heads),
        "documents": M,
        "lengths": lengths[0].tolist(),
        "stats_shape": list(stats.shape),
        "out_error": err(out, want),
        "grad_errors": grads,
        "stats_error_by_reading": stats_err,
        "stats_reading": min(stats_err, key=stats_err.get),
        "within_tol": bool(max(err(out, want), *grads.values()) < BF16_TOL),
        "tolerance": BF16_TOL,
    }
