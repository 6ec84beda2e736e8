"""TPU kernel: Pallas splash attention behind the (out, lse) / (dq, dk, dv) kernel interface.

Splash masks are static, so a call is cut into pieces that each use a prebuilt mask (jobs.attention.kernels.mask.Order
says how the keys are laid out): a full hop is FullMask; a causal call over one monotonic sequence (every ring
hop, zigzag blocks included) is CausalMask; a zigzag-ordered whole sequence (ulysses) is put back in natural
order first; a device's query block against the whole sequence (all_gather) picks CausalMask(offset=start)
for its chunk's start with lax.switch. On TPU the Mosaic kernel runs; on any other backend the same kernel
runs in Pallas interpret mode (for tests: lax.platform_dependent keeps only the branch of the target
platform, so an AOT compile for a TPU topology from a CPU host gets the Mosaic kernel). Shapes splash cannot
tile (lengths not multiples of 128) fall back to the xla kernel, which is exact for any positions, and so do
calls whose block map stays over MAX_MASK_BLOCKS even with 2048-key blocks (splash_private's block masks make
building it cheap: ~4 s for 802,816 blocks). Packed documents go through splash's own SegmentIds (reordered
and split with the tokens); the "balanced" layout has data-dependent positions no static mask can express,
so kernel=splash refuses it with a ValueError (kernel=auto runs xla there, see jobs.attention.kernels).
A sliding window or chunk runs where the call holds the whole sequence (Order.whole: ulysses, none): after
the natural-order reordering it is one static LocalMask or ChunkedCausalMask. Elsewhere (a ring hop, a
device block against the gathered keys, a halo) the mask moves with a traced offset: kernel=splash refuses
it before any trace (rules.validate_masks) and kernel=auto runs xla there. Sinks need nothing here (the
caller corrects the merged (out, lse), jobs.attention.core).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jobs import tuning
from jobs.attention.kernels import splash_private
from jobs.attention.kernels.mask import Mask, Order
from jobs.attention.kernels.xla import xla_bwd, xla_fwd
from jobs.attention.span import GLOBAL, Span
from jobs.strategies import rules

log = logging.getLogger(__name__)
# The block map (data_next, block_mask: 3 bytes an entry) is scalar-prefetched into TPU SMEM, so it stays small:
# past this many entries kv blocks grow (x2, up to MAX_GROWN_BLOCK; splash_private keeps the compute step at 512)
# before the xla fallback. Query blocks stay: 1024-query blocks of head dim 256 exceed v5p's 16 MB of scoped
# VMEM. tpu7x_128 ring at 14M: 224 x 224 512-blocks; usp there attends 458,752-token hops: 896 x 896
# 512-blocks -> 896 x 224 with 2048-key blocks (84.6 GiB per device compiled; 89.2 with the xla fallback).
MAX_MASK_BLOCKS = 2**18
MAX_GROWN_BLOCK = 2048


class _Piece(NamedTuple):
    """Queries [q0, q0+length) (after any reordering) against all keys with one kind of mask."""

    q0: int
    length: int
    kind: str  # "full" | "causal" (offset 0) | "chunk" (CausalMask(offset=start), start from q positions)
    # | "local" (a window of `size` keys, the query's own included) | "chunked" (chunks of `size` from 0)
    size: int = 0


class _Plan(NamedTuple):
    perm: np.ndarray | None  # layout index -> natural position; None when no reordering is needed
    q_reordered: bool  # queries are the whole sequence and get the same reordering as the keys
    pieces: tuple[_Piece, ...]
    block_kv: int
    blocks_q: tuple[int, ...]


def _fit(length: int, block: int) -> int | None:
    """Largest multiple of 128 that divides length and is <= block (splash tiles in lanes)."""
    b = min(block, length) // splash_private.LANES * splash_private.LANES
    while b > 0 and length % b:
        b -= splash_private.LANES
    return b or None


def _plan(
    Lq: int, Lk: int, causal: bool, order: Order, block_q: int, block_kv: int, span: Span = GLOBAL
) -> _Plan | None:
    perm = rules.zigzag_permutation(Lk, order.ring) if causal and order.permuted else None
    if not causal:
        pieces: tuple[_Piece, ...] = (_Piece(0, Lq, "full"),)
    elif span.limited:  # the whole sequence (_planned saw Order.whole): one static mask
        kind, size = ("local", span.window) if span.window is not None else ("chunked", span.chunk)
        pieces = (_Piece(0, Lq, kind, size),)
    elif Lq == Lk:
        pieces = (_Piece(0, Lq, "causal"),)
    else:  # one device's block: zigzag holds two chunks, each contiguous in position
        n = 2 if order.permuted else 1
        if Lq % n or Lk % (Lq // n):
            return None
        c = Lq // n
        pieces = tuple(_Piece(i * c, c, "chunk") for i in range(n))
    bqs = tuple(_fit(p.length, block_q) for p in pieces)
    if None in bqs:
        return None
    while True:
        bk = _fit(Lk, block_kv)
        if bk is None:
            return None
        blocks = sum(p.length // bq for p, bq in zip(pieces, bqs, strict=True)) * (Lk // bk)
        if blocks <= MAX_MASK_BLOCKS:
            break
        if block_kv >= MAX_GROWN_BLOCK:
            log.warning(
                "splash: %d mask blocks (> %d) for %dx%d; using the xla kernel",
                blocks,
                MAX_MASK_BLOCKS,
                Lq,
                Lk,
            )
            return None
        block_kv = min(2 * block_kv, MAX_GROWN_BLOCK)
    return _Plan(perm, perm is not None and Lq == Lk, pieces, bk, bqs)


def _heads(x_BxLxHxD: jax.Array) -> jax.Array:
    return jnp.swapaxes(x_BxLxHxD, 1, 2)


def _on_platform(kind: str, offset: int, shape, heads: int, bq: int, bk: int, body, *args, size: int = 0):
    """Run body(kernel, *args) with the Mosaic kernel on TPU, the interpreted one elsewhere; args[0] is q."""
    q = args[0]
    fused = tuning.fused_backward(q.shape[0], heads, shape[0], shape[1], bk, q.shape[-1])

    def branch(interpret: bool):
        kern = splash_private.make(kind, offset, shape, heads, bq, bk, interpret, size, fused)
        return lambda *a: body(kern, *a)

    return jax.lax.platform_dependent(*args, tpu=branch(False), default=branch(True))


def _ids(segs):
    return None if segs is None else splash_private.SegmentIds(*segs)


def _fwd_body(kern, q, k, v, segs):
    o, lse = jax.vmap(partial(splash_private.fwd, kern))(_heads(q), _heads(k), _heads(v), _ids(segs))
    return _heads(o).astype(jnp.float32), jnp.swapaxes(lse, 1, 2)


def _bwd_body(kern, q, k, v, o, lse, do, segs):
    dq, dk, dv = jax.vmap(partial(splash_private.bwd, kern))(
        _heads(q), _heads(k), _heads(v), _heads(o), jnp.swapaxes(lse, 1, 2), _heads(do), _ids(segs)
    )
    return tuple(_heads(g).astype(jnp.float32) for g in (dq, dk, dv))


def _planned(q, k, mask: Mask) -> _Plan | None:
    """The plan of this call (None: the xla kernel runs it), after refusing what no static mask can say."""
    if mask.order.layout == "balanced":
        raise ValueError(
            "kernel=splash cannot run layout=balanced (its masks are static, balanced positions are data); "
            "use kernel=xla or kernel=auto (xla for balanced)"
        )
    if mask.span.limited and not mask.order.whole:
        raise ValueError(rules.SPLASH_SPAN)
    return _plan(q.shape[1], k.shape[1], mask.causal, mask.order, mask.block_q, mask.block_kv, mask.span)


def _inverses(plan: _Plan) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(queries', keys') index maps from the layout's order into the plan's natural order (None: as they are)."""
    inv = None if plan.perm is None else rules.inverse_permutation(plan.perm)
    return (inv if plan.q_reordered else None), inv


def _segs(mask: Mask, q_inv, inv) -> tuple | None:
    """Packed documents' (q_seg, kv_seg) in the plan's order (None without segment ids)."""
    return (_take(mask.q_seg, q_inv), _take(mask.kv_seg, inv)) if mask.segmented else None


def _piece_segs(plan: _Plan, i: int, segs: tuple | None):
    if segs is None:
        return None
    p = plan.pieces[i]
    return segs[0][:, p.q0 : p.q0 + p.length], segs[1]


def _run_piece(plan: _Plan, i: int, body, q_pos, q, k, *rest):
    """body on piece i: its static mask, or for a "chunk" the CausalMask of the chunk's start (lax.switch)."""
    p, bq, bk = plan.pieces[i], plan.blocks_q[i], plan.block_kv
    shape, heads = (p.length, k.shape[1]), q.shape[2]
    if p.kind != "chunk":
        return _on_platform(p.kind, 0, shape, heads, bq, bk, body, q, k, *rest, size=p.size)
    branches = [
        partial(_on_platform, "causal", n * p.length, shape, heads, bq, bk, body)
        for n in range(k.shape[1] // p.length)
    ]
    row = q_pos if q_pos.ndim == 1 else q_pos[0]  # contiguous/zigzag positions are the same in every row
    return jax.lax.switch(row[p.q0] // p.length, branches, q, k, *rest)


def _take(x: jax.Array, idx: np.ndarray | None) -> jax.Array:
    return x if idx is None else jnp.take(x, jnp.asarray(idx, jnp.int32), axis=1)


def _split(plan: _Plan, x: jax.Array) -> list[jax.Array]:
    return [x[:, p.q0 : p.q0 + p.length] for p in plan.pieces]


def splash_fwd(q, k, v, mask: Mask):
    """(out fp32 [B, Lq, H, D], lse fp32 [B, Lq, H]); positions only pick the mask (see module doc)."""
    plan = _planned(q, k, mask)
    if plan is None:
        return xla_fwd(q, k, v, mask)
    q_inv, inv = _inverses(plan)
    q_s = _take((q * q.shape[-1] ** -0.5).astype(q.dtype), q_inv)  # splash applies no softmax scale
    k, v, segs = _take(k, inv), _take(v, inv), _segs(mask, q_inv, inv)
    outs = [
        _run_piece(plan, i, _fwd_body, mask.q_pos, q_i, k, v, _piece_segs(plan, i, segs))
        for i, q_i in enumerate(_split(plan, q_s))
    ]
    o = jnp.concatenate([x[0] for x in outs], 1)
    lse = jnp.concatenate([x[1] for x in outs], 1)
    back = plan.perm if plan.q_reordered else None
    return _take(o, back), _take(lse, back)


def splash_bwd(q, k, v, o, lse, do, mask: Mask):
    """dq, dk, dv (fp32) from the given (global) out and lse, piece by piece like the forward."""
    plan = _planned(q, k, mask)
    if plan is None:
        return xla_bwd(q, k, v, o, lse, do, mask)
    scale = q.shape[-1] ** -0.5
    q_inv, inv = _inverses(plan)
    q_s = _take((q * scale).astype(q.dtype), q_inv)
    o, lse, do = (_take(x, q_inv) for x in (o.astype(q.dtype), lse, do.astype(q.dtype)))
    k, v, segs = _take(k, inv), _take(v, inv), _segs(mask, q_inv, inv)
    dqs, dk, dv = [], 0.0, 0.0
    parts = zip(_split(plan, q_s), _split(plan, o), _split(plan, lse), _split(plan, do), strict=True)
    for i, (q_i, o_i, lse_i, do_i) in enumerate(parts):
        piece = _piece_segs(plan, i, segs)
        dq_i, dk_i, dv_i = _run_piece(plan, i, _bwd_body, mask.q_pos, q_i, k, v, o_i, lse_i, do_i, piece)
        dqs.append(dq_i)
        dk, dv = dk + dk_i, dv + dv_i
    dq = jnp.concatenate(dqs, 1) * scale  # the kernel differentiated w.r.t. the pre-scaled q
    return _take(dq, plan.perm if plan.q_reordered else None), _take(dk, plan.perm), _take(dv, plan.perm)
