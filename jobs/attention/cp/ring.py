"""Ring CP: rotate K/V around the context axis with ppermute and merge partial results by log-sum-exp.

Zigzag layout (device r holds chunks r and 2R-1-r) balances causal work: after step 0 a hop from source j<r
uses all queries against the first KV chunk, a hop from j>r only the second query chunk against all KV, so no
masks are needed and every device does the same work. The backward is a custom VJP that saves only
(q, k, v, out, lse) and rotates K/V again with dK/dV travelling along, then one last hop home: O(L/P) memory.
Packed documents: each K/V block travels with its Tokens (segment ids, true positions and their summary), and
a hop whose block no local query can see skips its kernel (jobs.attention.cp.packed_hop). A sliding window or
chunk: each (query chunk, key chunk) pair of a hop that the span cannot reach skips its kernel
(jobs.attention.cp.span_hop). Attention sinks: one correction of the merged (out, lse) inside the saved core,
after the last hop and before the VJP saves them (jobs.attention.core.add_sinks): the saved pair is then the
sink-corrected one, which makes every hop's recomputed backward right as it is; d sinks comes from it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.core import add_sinks, empty_like, match_varying, merge, sinks_grad
from jobs.attention.cp import packed_hop, span_hop
from jobs.attention.kernels import get_kernel
from jobs.attention.kernels.mask import Mask
from jobs.attention.layout import block_positions
from jobs.attention.sharding import Options, axis_size
from jobs.attention.span import GLOBAL, Span
from jobs.attention.tokens import Tokens, tokens
from jobs.strategies.base import ring_steps


@dataclass(frozen=True)
class RingConfig:
    axis: str
    size: int
    causal: bool
    layout: str
    kernel: str
    block_q: int
    block_kv: int
    span: Span = GLOBAL


def _shift(cfg: RingConfig, tree, by: int = 1):
    """Send `by` devices along the ring (r -> r+by); issued before the compute it overlaps with."""
    return jax.lax.ppermute(tree, cfg.axis, [(i, (i + by) % cfg.size) for i in range(cfg.size)])


def _steps(cfg: RingConfig, Ll: int) -> int:
    """Steps the ring runs: all of them, or, for a window or chunk in the contiguous layout, only up to the
    last shard it reaches (jobs.strategies.base.ring_steps, the rule the planner prices)."""
    return ring_steps(cfg.size, Ll, cfg.layout, cfg.span.lookback)


def _index(cfg: RingConfig) -> jax.Array:
    return jax.lax.axis_index(cfg.axis) if cfg.size > 1 else jnp.int32(0)


def block(k, v, tok: Tokens | None) -> tuple:
    """What travels around the ring: (k, v), and with packed documents (k, v, Tokens)."""
    return (k, v) if tok is None else (k, v, tok)


def _mask(cfg: RingConfig, pos, own: bool) -> Mask:
    """A hop's mask (unpacked, global causal): only our own block needs the causal one; any other block is wholly
    in the past (or, contiguous, wholly in the future and skipped) of the queries that see it."""
    return Mask(pos, pos, cfg.causal and own, cfg.block_q, cfg.block_kv)


def _hop_fwd(cfg: RingConfig, s, r, q, blk, pos, qt):
    """(out, lse) of local queries against the K/V block that started on device (r - s) mod R."""
    return hop_fwd(cfg, (r - s) % cfg.size, r, q, blk, pos, own=isinstance(s, int) and s == 0, qt=qt)


def hop_fwd(cfg: RingConfig, j, r, q, blk, pos, *, own: bool = False, qt: Tokens | None = None):
    """(out, lse) of the queries of ring position r against the K/V block `blk` of ring position j (j == r
    only when `own`, the one hop that needs a causal mask); any ring order whose blocks are zigzag or
    contiguous positions of one ring (double_ring's too) calls this. qt: the queries' Tokens (packed)."""
    if qt is not None:
        k, v, kt = blk
        return packed_hop.hop_fwd(cfg, j, r, q, k, v, qt, kt, own=own)
    k, v = blk
    if cfg.span.limited:
        return span_hop.hop_fwd(cfg, j, q, k, v, pos)
    fwd = get_kernel(cfg.kernel).fwd
    mask = _mask(cfg, pos, own)
    if own or not cfg.causal:
        return fwd(q, k, v, mask)
    refs = (q, k, v, pos, r)
    Ll = q.shape[1]
    shape = ((q.shape[0], Ll, q.shape[2], q.shape[3]), (q.shape[0], Ll, q.shape[2]))
    if cfg.layout == "zigzag":
        c = Ll // 2

        def early():  # j < r: both query chunks see all of KV chunk j, none of chunk 2R-1-j
            return fwd(q, k[:, :c], v[:, :c], mask.cut(ks=slice(None, c)))

        def late():  # j > r: only query chunk 2R-1-r sees KV, and sees both of its chunks
            o1, lse1 = fwd(q[:, c:], k, v, mask.cut(qs=slice(c, None)))
            o0, lse0 = empty_like(o1, lse1)
            return jnp.concatenate([o0, o1], 1), jnp.concatenate([lse0, lse1], 1)

        return jax.lax.cond(j < r, early, late)

    def full():
        return fwd(q, k, v, mask)

    def skip():  # contiguous: a block from a later device is entirely in the future
        o = match_varying(jnp.zeros(shape[0], jnp.float32), *refs)
        return empty_like(o, match_varying(jnp.zeros(shape[1], jnp.float32), *refs))

    return jax.lax.cond(j < r, full, skip)


def _hop_bwd(cfg: RingConfig, s, r, q, blk, o, lse, do, pos, qt):
    own = isinstance(s, int) and s == 0
    return hop_bwd(cfg, (r - s) % cfg.size, r, q, blk, o, lse, do, pos, own=own, qt=qt)


def hop_bwd(cfg: RingConfig, j, r, q, blk, o, lse, do, pos, *, own: bool = False, qt: Tokens | None = None):
    """(dq, dk, dv) fp32 of one hop (as hop_fwd), recomputed from the saved global out and lse."""
    if qt is not None:
        k, v, kt = blk
        return packed_hop.hop_bwd(cfg, j, r, q, k, v, o, lse, do, qt, kt, own=own)
    k, v = blk
    if cfg.span.limited:
        return span_hop.hop_bwd(cfg, j, q, k, v, o, lse, do, pos)
    bwd = get_kernel(cfg.kernel).bwd
    mask = _mask(cfg, pos, own)
    if own or not cfg.causal:
        return bwd(q, k, v, o, lse, do, mask)
    refs = (q, k, v, o, lse, do, pos, r)

    def zeros(x):
        return match_varying(jnp.zeros(x.shape, jnp.float32), *refs)

    if cfg.layout == "zigzag":
        c = q.shape[1] // 2

        def early():
            dq, dk0, dv0 = bwd(q, k[:, :c], v[:, :c], o, lse, do, mask.cut(ks=slice(None, c)))
            return dq, jnp.concatenate([dk0, zeros(dk0)], 1), jnp.concatenate([dv0, zeros(dv0)], 1)

        def late():
            dq1, dk, dv = bwd(q[:, c:], k, v, o[:, c:], lse[:, c:], do[:, c:], mask.cut(qs=slice(c, None)))
            return jnp.concatenate([zeros(dq1), dq1], 1), dk, dv

        return jax.lax.cond(j < r, early, late)

    def full():
        return bwd(q, k, v, o, lse, do, mask)

    return jax.lax.cond(j < r, full, lambda: (zeros(q), zeros(k), zeros(v)))


def _hops(n: int, step: Callable, carry: tuple) -> tuple:
    """Hops s = 1 .. n-2 of n (carry leads with s)."""
    return loop(1, n - 1, step, carry)


def loop(lo: int, hi: int, step: Callable, carry: tuple) -> tuple:
    """step(c) for c[0] = lo .. hi-1 (c = (i, *carry), step returns the next c) as a while loop, not a
    scan (why: O(L/P) memory under remat).

    The model checkpoints each layer, so JAX partially evaluates this forward again for the backward, and a
    scan's partial-eval rule stacks per-iteration residuals: the zigzag cond's zero / -inf fillers and the
    kernel's accumulator inits became [R-2, ...] buffers (f32[126, 1, L/2P, Hq, D] for ring on 128 devices:
    0.9 GiB per hop at 14M tokens, O(L) per device). A while loop has no residuals: JAX recomputes it.

    Except across CPU processes: XLA's CPU runtime deadlocked (gloo) on the ring's collective-permutes inside
    a while loop spanning two processes (tests/test_faults.py hung 2 of 2 runs, scan 0 of 5), and host
    memory is no constraint there. Same step function either way, so the numerics are the same.
    """
    if jax.process_count() > 1 and jax.devices()[0].platform == "cpu":
        body = lambda c, _: (step(c), None)
        return jax.lax.scan(body, (jnp.int32(lo), *carry), None, length=hi - lo)[0]
    return jax.lax.while_loop(lambda c: c[0] < hi, step, (jnp.int32(lo), *carry))


def _ring_fwd(cfg: RingConfig, q, k, v, tok: Tokens | None):
    r = _index(cfg)
    pos = block_positions(q.shape[1] * cfg.size, cfg.layout, cfg.size, r)
    hop = lambda s, blk: _hop_fwd(cfg, s, r, q, blk, pos, tok)
    blk = block(k, v, tok)
    n = _steps(cfg, q.shape[1])
    if n == 1:
        return hop(0, blk)
    nxt = _shift(cfg, blk)
    o, lse = hop(0, blk)

    def step(carry):
        s, o, lse, blk = carry
        nxt = _shift(cfg, blk)
        o, lse = merge(o, lse, *hop(s, blk))
        return (s + 1, o, lse, nxt)

    _, o, lse, blk = _hops(n, step, (o, lse, nxt))
    return merge(o, lse, *hop(n - 1, blk))


def saved_core(fwd: Callable, bwd: Callable, doc: str) -> Callable:
    """core(cfg, q, k, v, tok, sinks) -> out with a custom VJP that saves only (q, k, v, out, lse, tok, sinks):
    O(L/P) whatever the hop order. tok: the local block's Tokens (packed documents) or None. sinks: [H] fp32
    (the local query heads') or None, applied once to the merged (out, lse) before they are saved.
    fwd(cfg, q, k, v, tok) -> (out fp32, lse); bwd(cfg, (q, k, v, out, lse, tok), dout) -> (dq, dk, dv, None)."""

    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def core(
        cfg, q_BxLlxHxD: jax.Array, k_BxLlxKxD: jax.Array, v_BxLlxKxD: jax.Array, tok, sinks
    ) -> jax.Array:
        return core_fwd(cfg, q_BxLlxHxD, k_BxLlxKxD, v_BxLlxKxD, tok, sinks)[0]

    def core_fwd(cfg, q, k, v, tok, sinks):
        o, lse = fwd(cfg, q, k, v, tok)
        if sinks is not None:
            o, lse = add_sinks(o, lse, sinks)
        o = o.astype(q.dtype)
        return o, (q, k, v, o, lse, tok, sinks)

    def core_bwd(cfg, res, do):
        *res, sinks = res
        grads = bwd(cfg, tuple(res), do)
        if sinks is None:
            return (*grads, None)
        dsinks = match_varying(sinks_grad(res[3], res[4], do, sinks), sinks).astype(sinks.dtype)
        return (*grads, dsinks)

    core.defvjp(core_fwd, core_bwd)
    core.__doc__ = doc
    return core


def _ring_core_bwd(cfg, res, do):
    q, k, v, o, lse, tok = res
    r = _index(cfg)
    pos = block_positions(q.shape[1] * cfg.size, cfg.layout, cfg.size, r)
    hop = lambda s, blk: _hop_bwd(cfg, s, r, q, blk, o, lse, do, pos, tok)
    blk = block(k, v, tok)
    n = _steps(cfg, q.shape[1])
    if n == 1:
        dq, dk, dv = hop(0, blk)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None
    nxt = _shift(cfg, blk)
    dq, dk, dv = hop(0, blk)
    dkv = _shift(cfg, (dk, dv))  # our block's gradient travels with our K/V

    def step(carry):
        s, dq, blk, (dk, dv) = carry
        nxt = _shift(cfg, blk)
        dq_s, dk_s, dv_s = hop(s, blk)
        dkv = _shift(cfg, (dk + dk_s, dv + dv_s))
        return (s + 1, dq + dq_s, nxt, dkv)

    _, dq, blk, (dk, dv) = _hops(n, step, (dq, nxt, dkv))
    dq_s, dk_s, dv_s = hop(n - 1, blk)
    # final hop home: we held block r-(n-1)'s gradient (the whole ring: r+1's, one step on)
    dk, dv = _shift(cfg, (dk + dk_s, dv + dv_s), 1 - n)
    return (dq + dq_s).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_core = saved_core(
    _ring_fwd,
    _ring_core_bwd,
    "Ring attention of local blocks (call inside shard_map over cfg.axis); out like q.",
)


def with_tokens(core: Callable, cfg) -> Callable:
    """fn(q, k, v, pos=None, seg=None, sinks=None): core with the local block's Tokens when segment ids are
    given (sinks: the local query heads' [H], made to vary like q so that d sinks may)."""

    def fn(q, k, v, pos=None, seg=None, sinks=None):
        tok = None if seg is None else tokens(pos, seg)
        return core(cfg, q, k, v, tok, None if sinks is None else match_varying(sinks, q))

    return fn


def ring_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_context, H, D] in `layout` order (zigzag: already permuted); packed
    documents add pos, seg [B, L_context] (true positions and segment ids in the same order)."""
    del L  # each hop's positions come from the local block and the ring index
    (axis,) = strategies.get("ring").axes
    cfg = RingConfig(axis, axis_size(mesh, axis), o.causal, o.layout, o.kernel, o.block_q, o.block_kv, o.span)
    return with_tokens(ring_core, cfg)
