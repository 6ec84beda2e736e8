"""Double-ring CP (LoongTrain's Double-Ring-Attention): a ring of rings over two context mesh axes.

Why: in a flat ring over P devices that spans groups (hosts, slices), every one of the P-1 steps has a
transfer over a slow inter-group link, and a step waits for its slowest transfer. Here G groups (outer axis
`context`) of N devices (inner axis `context_ulysses`), device (a, b) holding shard p = a*N + b of P = G*N:
K/V go around the inner ring (fast links inside a group) N times per round, and once per round the round's
base block moves to the next group, issued at the start of the round so that the slow transfer overlaps
N hops of compute: forward steps with an inter-group transfer fall from P-1 to G-1.

The zigzag / contiguous layout is that of one flat ring of P positions, so ring.hop_fwd / hop_bwd apply
unchanged with flat source positions; only s = t = 0 (our own block) needs the causal mask. Same O(L/P)
discipline as ring: hop loops are ring.loop while loops, the custom VJP saves only (q, k, v, out, lse), and
dK/dV travel with their block (N inner shifts per round bring it back to the round's start, then one outer
shift), so after G rounds every block's gradient is home. Packed documents: the block's Tokens travel with
it (every shift moves (K, V, Tokens)), and hops no local query can see skip their kernel, as in ring; so do
the chunk pairs a sliding window or chunk cannot reach, and sinks correct the merged result once, as in ring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.core import merge
from jobs.attention.cp.ring import RingConfig, block, hop_bwd, hop_fwd, loop, saved_core, with_tokens
from jobs.attention.layout import block_positions
from jobs.attention.sharding import Options, axis_size

OUTER_AXIS, INNER_AXIS = strategies.get("double_ring").axes  # the registry's (outer ring, inner ring)


@dataclass(frozen=True)
class DoubleRingConfig:
    ring: RingConfig  # size = P = outer * inner (the flat ring the layout is defined over)
    outer: int
    inner: int


def _shift(axis: str, n: int, tree):
    """Send to the next device along `axis` (x -> x+1 mod n); identity on a size-1 axis."""
    return jax.lax.ppermute(tree, axis, [(x, (x + 1) % n) for x in range(n)]) if n > 1 else tree


def _setup(cfg: DoubleRingConfig, Ll: int):
    """(flat position p, its token positions, src(s, t): flat position of the block held at round s step t)."""
    G, N = cfg.outer, cfg.inner
    a = jax.lax.axis_index(OUTER_AXIS) if G > 1 else jnp.int32(0)
    b = jax.lax.axis_index(INNER_AXIS) if N > 1 else jnp.int32(0)
    p = a * N + b
    pos = block_positions(Ll * G * N, cfg.ring.layout, G * N, p)
    return p, pos, lambda s, t: ((a - s) % G) * N + (b - t) % N


def _fwd(cfg: DoubleRingConfig, q, k, v, tok):
    G, N = cfg.outer, cfg.inner
    p, pos, src = _setup(cfg, q.shape[1])
    hop = lambda s, t, blk: hop_fwd(cfg.ring, src(s, t), p, q, blk, pos, qt=tok)

    def inner(s, lo: int, blk, acc):
        """Merge hops t = lo .. N-1 of round s into acc; blk is the block (K, V[, Tokens]) held at step lo."""

        def step(c):
            t, o, lse, blk = c
            nxt = _shift(INNER_AXIS, N, blk)  # issued before the hop it overlaps with
            return (t + 1, *merge(o, lse, *hop(s, t, blk)), nxt)

        if lo < N - 1:
            _, *acc, blk = loop(lo, N - 1, step, (*acc, blk))
        return merge(*acc, *hop(s, N - 1, blk))  # last hop of the round: no inner shift

    own = block(k, v, tok)
    base = _shift(OUTER_AXIS, G, own)  # round 1's block, in flight during all of round 0
    cur = _shift(INNER_AXIS, N, own)
    acc = hop_fwd(cfg.ring, p, p, q, own, pos, own=True, qt=tok)
    if N > 1:
        acc = inner(0, 1, cur, acc)
    if G == 1:
        return acc

    def round_(c):
        s, o, lse, base = c
        nxt = _shift(OUTER_AXIS, G, base)
        return (s + 1, *inner(s, 0, base, (o, lse)), nxt)

    if G > 2:
        _, *acc, base = loop(1, G - 1, round_, (*acc, base))
    return inner(G - 1, 0, base, acc)  # last round: no outer shift


def _core_bwd(cfg, res, do):
    q, k, v, o, lse, tok = res
    G, N = cfg.outer, cfg.inner
    p, pos, src = _setup(cfg, q.shape[1])
    hop = lambda s, t, blk: hop_bwd(cfg.ring, src(s, t), p, q, blk, o, lse, do, pos, qt=tok)

    def inner(s, lo: int, blk, dkv, dq):
        """Hops t = lo .. N-1 of round s; (blk, dkv) is the block and its gradient so far at step lo. Returns
        dq and the block's gradient, back on the device that held it at step 0 (N inner shifts)."""

        def step(c):
            t, dq, blk, (dk, dv) = c
            nxt = _shift(INNER_AXIS, N, blk)
            dq_s, dk_s, dv_s = hop(s, t, blk)
            return (t + 1, dq + dq_s, nxt, _shift(INNER_AXIS, N, (dk + dk_s, dv + dv_s)))

        if lo < N - 1:
            _, dq, blk, dkv = loop(lo, N - 1, step, (dq, blk, dkv))
        dq_s, dk_s, dv_s = hop(s, N - 1, blk)
        return dq + dq_s, _shift(INNER_AXIS, N, (dkv[0] + dk_s, dkv[1] + dv_s))

    own = block(k, v, tok)
    base = _shift(OUTER_AXIS, G, own)
    cur = _shift(INNER_AXIS, N, own)
    dq, dk, dv = hop_bwd(cfg.ring, p, p, q, own, o, lse, do, pos, own=True, qt=tok)
    dbase = _shift(INNER_AXIS, N, (dk, dv))  # our block's gradient travels with our K/V
    if N > 1:
        dq, dbase = inner(0, 1, cur, dbase, dq)
    dbase = _shift(OUTER_AXIS, G, dbase)  # then follows base to the next group
    if G > 1:

        def round_(c):
            s, dq, blk, dkv = c
            nxt = _shift(OUTER_AXIS, G, blk)
            dq, dkv = inner(s, 0, blk, dkv, dq)
            return (s + 1, dq, nxt, _shift(OUTER_AXIS, G, dkv))

        if G > 2:
            _, dq, base, dbase = loop(1, G - 1, round_, (dq, base, dbase))
        dq, dbase = inner(G - 1, 0, base, dbase, dq)
        dbase = _shift(OUTER_AXIS, G, dbase)  # last outer hop: our own block's gradient comes home
    dk, dv = dbase
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


double_ring_core = saved_core(
    _fwd, _core_bwd, "Double-ring attention of local blocks (inside shard_map over both axes); out like q."
)


def double_ring_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_(context,context_ulysses), H, D] in `layout` order over P = G*N positions."""
    del L  # each hop's positions come from the local block and the flat ring position
    G, N = axis_size(mesh, OUTER_AXIS), axis_size(mesh, INNER_AXIS)
    ring = RingConfig(INNER_AXIS, G * N, o.causal, o.layout, o.kernel, o.block_q, o.block_kv, o.span)
    return with_tokens(double_ring_core, DoubleRingConfig(ring, G, N))
