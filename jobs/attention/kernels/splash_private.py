"""The one place that touches jax's Pallas splash attention, including its private backward.

Why private: a ring hop's backward must use the GLOBAL out and lse (merged over all hops), which the public
`make_splash_mha(..., save_residuals=True)` cannot take; `_splash_attention_bwd(..., res, do)` can (the same
route MaxText takes on its Tokamax fork). Verified against jax 0.10.2
(jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py): `_splash_attention_bwd`
(line 2255) takes static (save_residuals, mask_value, is_mqa, block_sizes, residual_checkpoint_name,
mask_function, attn_logits_soft_cap, interpret) then res = (q, k, v, segment_ids, sinks, out, lse,
dq_mask_info, dkv_mask_info) and do, and returns (None, None, None, dq, dk, dv, None, dsinks).
Also private: splash builds its pallas_call out_shapes without shard_map's varying-axes type, so under
shard_map(check_vma=True) it raises; we trace it with the check off (config._check_vma, as pallas_call does
for its own kernel body) and pcast the results to vary like the inputs, which is what they are.
tests/test_kernels_splash.py::test_private_api_shape fails loudly when any of this moves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as _config
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as _sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as _sm

from jobs.attention.core import match_varying

SegmentIds = _sk.SegmentIds
LANES = 128  # splash tiles sequence blocks in multiples of the TPU lane width
# Keys per inner step of a kv block: a 2048 x 2048 step needs 33.4 MB of scoped VMEM on tpu7x (limit 32 MB).
COMPUTE_BLOCK = 512
_ONES, _ZEROS = np.ones((1, 1), np.bool_), np.zeros((1, 1), np.bool_)


class BlockCausalMask(_sm.CausalMask):
    """CausalMask that answers a whole block above or below the diagonal without building it.

    jax turns a mask into its block map by slicing it block by block and asking `.any()` / `.all()` of
    each slice (numpy, ~0.6 ms per 512-block): 8 minutes for a 458,752-token hop. Only diagonal blocks are
    built here; the block map is identical (tests/test_kernels_splash.py compares it with jax's).
    """

    def __getitem__(self, idx) -> np.ndarray:
        q, k = (_sm._fill_slice(s, n) for s, n in zip(idx, self.shape, strict=True))
        if q.start + self.offset >= k.stop - 1:
            return _ONES
        if q.stop - 1 + self.offset < k.start:
            return _ZEROS
        return super().__getitem__((q, k))


class BlockLocalMask(_sm.LocalMask):
    """LocalMask (here: a causal window, right side 0) that answers the blocks outside its band without building
    them (see BlockCausalMask): at long lengths nearly every block is one."""

    def __getitem__(self, idx) -> np.ndarray:
        q, k = (_sm._fill_slice(s, n) for s, n in zip(idx, self.shape, strict=True))
        left = self.window_size[0]
        if k.start > q.stop - 1 + self.offset or k.stop - 1 < q.start + self.offset - left:
            return _ZEROS
        return super().__getitem__((q, k))


class BlockFullMask(_sm.FullMask):
    """FullMask whose blocks are answered without allocating them (see BlockCausalMask)."""

    def __getitem__(self, idx) -> np.ndarray:
        return _ONES


@functools.lru_cache(maxsize=256)
def make(
    kind: str,
    offset: int,
    shape: tuple[int, int],
    heads: int,
    block_q: int,
    block_kv: int,
    interpret: bool,
    size: int = 0,
    fused: bool = False,
) -> _sk.SplashAttentionKernel:
    """A splash MHA kernel (GQA via fewer KV heads) with a static mask: "full", "causal" at `offset`, "local"
    (a window of `size` keys ending at the query's own) or "chunked" (causal inside chunks of `size`).

    Cached: building the block-sparse mask info is numpy work we do once per (mask, shape, blocks).
    """
    mask = {
        "full": lambda: BlockFullMask(shape),
        "causal": lambda: BlockCausalMask(shape, offset=offset),
        "local": lambda: BlockLocalMask(shape, window_size=(size - 1, 0), offset=offset),
        "chunked": lambda: _sm.ChunkedCausalMask(shape, chunk_size=size),
    }[kind]()
    # Concrete mask-info arrays even when first built inside a trace: the cache outlives that trace.
    with jax.ensure_compile_time_eval():
        return _sk.make_splash_mha(
            _sm.MultiHeadMask([mask] * heads),
            block_sizes=block_sizes(block_q, block_kv, fused),
            save_residuals=True,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )


def block_sizes(block_q: int, block_kv: int, fused: bool) -> _sk.BlockSizes:
    """Splash's blocks: one (q, kv) block for forward and backward, kv computed in COMPUTE_BLOCK slices; `fused`
    puts dq inside the dK/dV kernel (jobs.tuning.fused_backward says when)."""
    sizes = dict(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=min(block_kv, COMPUTE_BLOCK),
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=min(block_kv, COMPUTE_BLOCK),
    )
    if fused:
        return _sk.BlockSizes(**sizes, use_fused_bwd_kernel=True)
    return _sk.BlockSizes(**sizes, block_q_dq=block_q, block_kv_dq=block_kv)


def fwd(
    kernel: _sk.SplashAttentionKernel, q_HxLqxD, k_KxLkxD, v_KxLkxD, segment_ids: SegmentIds | None = None
) -> tuple[jax.Array, jax.Array]:
    """(out [H, Lq, D] in q's dtype, lse [H, Lq] fp32 natural log); q must be pre-scaled by D**-0.5.

    segment_ids (q [Lq], kv [Lk]): packed documents; a row that sees no key in this call gets splash's finite
    mask value as lse (~-2.4e38), which weighs nothing when merged with the row's visible hops.
    """
    with _config._check_vma(False):
        out, (lse,) = kernel(q_HxLqxD, k_KxLkxD, v_KxLkxD, segment_ids=segment_ids)
    refs = (q_HxLqxD, k_KxLkxD, v_KxLkxD)
    return match_varying(out, *refs), match_varying(lse, *refs)


def _collapse(info):
    # _splash_attention (the jitted public path) flattens the leading block dims before the kernels run;
    # calling the backward directly we must do the same.
    if info is None or info.partial_mask_blocks is None:
        return info
    pmb = info.partial_mask_blocks
    return info._replace(partial_mask_blocks=pmb.reshape(-1, *pmb.shape[-2:]))


def bwd(
    kernel: _sk.SplashAttentionKernel,
    q_HxLqxD,
    k_KxLkxD,
    v_KxLkxD,
    o_HxLqxD,
    lse_HxLq,
    do_HxLqxD,
    segment_ids: SegmentIds | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """dq (w.r.t. the pre-scaled q), dk, dv given the given (global) out and lse."""
    kw = kernel.kwargs
    res = (
        q_HxLqxD,
        k_KxLkxD,
        v_KxLkxD,
        segment_ids,
        None,  # sinks
        o_HxLqxD,
        lse_HxLq.astype(jnp.float32),
        _collapse(kernel.dq_mask_info),
        _collapse(kernel.dkv_mask_info),
    )
    with _config._check_vma(False):
        grads = _sk._splash_attention_bwd(
            False,  # save_residuals
            kw["mask_value"],
            kw["is_mqa"],
            kw["block_sizes"],
            None,  # residual_checkpoint_name
            kw["mask_function"],
            kw["attn_logits_soft_cap"],
            kw["interpret"],
            res,
            do_HxLqxD,
        )
    refs = (q_HxLqxD, k_KxLkxD, v_KxLkxD, o_HxLqxD, lse_HxLq, do_HxLqxD)
    return tuple(match_varying(g, *refs) for g in grads[3:6])
