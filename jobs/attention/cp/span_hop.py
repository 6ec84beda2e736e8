"""One ring hop under a sliding window or chunk (no segment ids): the hop is cut into (query chunk, key
chunk) pairs, one pair contiguous and four zigzag (a zigzag block is chunks r and 2R-1-r, each a run of
positions), and a pair runs its kernel only when some query of its chunk can see some key of the other
(Span.ranges_see, exact for runs of positions); the others skip it with lax.cond. So a window shorter than
a shard runs the own hop and the previous shard's; farther hops cost only their transfer, and in the contiguous
layout ring.py does not run them at all (ring_steps).

Shared by ring, usp and double_ring (through ring.hop_fwd / hop_bwd). A pair that runs gets the causal and
span masks by true positions (the xla kernel also skips its inner blocks that the span cannot reach).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs.attention import hopcount
from jobs.attention.core import empty_like, match_varying, merge
from jobs.attention.kernels import get_kernel
from jobs.attention.kernels.mask import Mask
from jobs.attention.layout import block_positions


def _pairs(cfg, q_len: int) -> list[tuple[slice, slice]]:
    """(query chunk, key chunk) slices of a hop's block: the layout's runs of consecutive positions."""
    n = 2 if cfg.layout == "zigzag" else 1
    c = q_len // n
    cuts = [slice(i * c, (i + 1) * c) for i in range(n)]
    return [(a, b) for a in cuts for b in cuts]


def _sees(cfg, mask: Mask, qs: slice, ks: slice) -> jax.Array:
    qc, kc = mask.q_pos[qs], mask.kv_pos[ks]
    return cfg.span.ranges_see(qc[0], qc[-1], kc[0], kc[-1])


def _mask(cfg, j, q_pos) -> Mask:
    """The hop's causal and span mask by true positions: the queries' and those of ring block j's keys."""
    k_pos = block_positions(q_pos.shape[-1] * cfg.size, cfg.layout, cfg.size, j)
    return Mask(q_pos, k_pos, True, cfg.block_q, cfg.block_kv, span=cfg.span)


def hop_fwd(cfg, j, q, k, v, q_pos):
    """(out fp32, lse fp32) of the local queries (true positions q_pos) against the K/V block of ring
    position j, pair by pair, merged per query chunk."""
    kern, mask = get_kernel(cfg.kernel), _mask(cfg, j, q_pos)
    refs = (q, k, v, q_pos, mask.kv_pos)
    per_chunk: dict[int, tuple] = {}
    for qs, ks in _pairs(cfg, q.shape[1]):

        def run(qs=qs, ks=ks):
            hopcount.note("fwd")
            return kern.fwd(q[:, qs], k[:, ks], v[:, ks], mask.cut(qs, ks))

        def skip(qs=qs):
            hopcount.note("fwd" + hopcount.SKIPPED)
            B, n, H, D = q.shape[0], qs.stop - qs.start, q.shape[2], q.shape[3]
            o = match_varying(jnp.zeros((B, n, H, D), jnp.float32), *refs)
            return empty_like(o, match_varying(jnp.zeros((B, n, H), jnp.float32), *refs))

        part = jax.lax.cond(_sees(cfg, mask, qs, ks), run, skip)
        prev = per_chunk.get(qs.start)
        per_chunk[qs.start] = part if prev is None else merge(*prev, *part)
    chunks = [per_chunk[s] for s in sorted(per_chunk)]
    return jnp.concatenate([o for o, _ in chunks], 1), jnp.concatenate([lse for _, lse in chunks], 1)


def hop_bwd(cfg, j, q, k, v, o, lse, do, q_pos):
    """(dq, dk, dv) fp32 of one hop (as hop_fwd), recomputed from the saved global out and lse."""
    kern, mask = get_kernel(cfg.kernel), _mask(cfg, j, q_pos)
    refs = (q, k, v, o, lse, do, q_pos, mask.kv_pos)
    dq = match_varying(jnp.zeros(q.shape, jnp.float32), *refs)
    dk = match_varying(jnp.zeros(k.shape, jnp.float32), *refs)
    dv = match_varying(jnp.zeros(v.shape, jnp.float32), *refs)
    for qs, ks in _pairs(cfg, q.shape[1]):

        def run(qs=qs, ks=ks):
            hopcount.note("bwd")
            args = (q[:, qs], k[:, ks], v[:, ks], o[:, qs], lse[:, qs], do[:, qs])
            return kern.bwd(*args, mask.cut(qs, ks))

        def skip(qs=qs, ks=ks):
            hopcount.note("bwd" + hopcount.SKIPPED)
            return tuple(
                match_varying(jnp.zeros(x.shape, jnp.float32), *refs) for x in (q[:, qs], k[:, ks], v[:, ks])
            )

        g_q, g_k, g_v = jax.lax.cond(_sees(cfg, mask, qs, ks), run, skip)
        dq = dq.at[:, qs].add(g_q)
        dk, dv = dk.at[:, ks].add(g_k), dv.at[:, ks].add(g_v)
    return dq, dk, dv
