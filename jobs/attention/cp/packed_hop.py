"""One ring hop with packed documents: skipped (lax.cond) when the K/V block's summary shows that no local
query sees any of its keys, otherwise the kernel masks by segment ids and true positions.

Shared by ring, usp and double_ring (through ring.hop_fwd / hop_bwd). Layout structure still saves work
when a hop runs: contiguous, a visible block from another device is entirely in the past (unmasked but for
segments); zigzag keeps ring's early / late halves; balanced (arbitrary positions) masks by positions.
A sliding window or chunk adds its test to the skip (by the hulls of the two blocks' positions) and its mask
to every hop that runs, which then runs whole (causal and span masked; the kernel skips inner blocks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs.attention import hopcount
from jobs.attention.core import NEG_INF, match_varying
from jobs.attention.kernels import get_kernel
from jobs.attention.kernels.mask import ALL, MONOTONIC, Mask, Order
from jobs.attention.tokens import Tokens, block_sees


def _mask(cfg, qt: Tokens, kt: Tokens) -> Mask:
    """The hop's mask by segment ids and true positions; its causal flag is set per part (_causal)."""
    order = Order("balanced", cfg.size) if cfg.layout == "balanced" else MONOTONIC
    return Mask(qt.pos, kt.pos, cfg.causal, cfg.block_q, cfg.block_kv, order, cfg.span, qt.seg, kt.seg)


def _causal(cfg, own: bool) -> bool:
    """Whether this hop's kernel needs the causal mask (see the module docstring)."""
    return cfg.causal and (own or cfg.layout == "balanced" or cfg.span.limited)


def _halves(cfg, own: bool) -> bool:
    return cfg.causal and not own and cfg.layout == "zigzag" and not cfg.span.limited


def _sees(cfg, qt: Tokens, kt: Tokens) -> jax.Array:
    see = block_sees(qt, kt, cfg.causal)
    return see & cfg.span.hull_sees(qt.pos, kt.pos) if cfg.span.limited else see


def _hop(cfg, j, r, qt: Tokens, kt: Tokens, own: bool, direction: str, *, whole, early, late, skipped):
    """One hop's control, forward or backward alike: skipped (lax.cond) when no local query sees a key of the
    block; else the whole block, or (zigzag, another device's block) its early or late half by ring position
    (early: j < r). `whole`, `early`, `late` and `skipped` compute the hop's results each way."""

    def run():
        hopcount.note(direction)
        if not _halves(cfg, own):
            return whole()
        return jax.lax.cond(j < r, early, late)

    if own:  # a token always sees itself
        return run()
    return jax.lax.cond(_sees(cfg, qt, kt), run, skipped)


def hop_fwd(cfg, j, r, q, k, v, qt: Tokens, kt: Tokens, *, own: bool):
    """(out fp32, lse fp32) of the local queries (Tokens qt) against the K/V block of ring position j (kt)."""
    kern, mask = get_kernel(cfg.kernel), _mask(cfg, qt, kt)
    refs = (q, k, v, qt.pos, kt.pos)

    def fwd(qs, ks, causal):
        return kern.fwd(q[:, qs], k[:, ks], v[:, ks], mask.cut(qs, ks, causal=causal))

    def empty(n):
        shape = (q.shape[0], n, q.shape[2])
        o = match_varying(jnp.zeros((*shape, q.shape[3]), jnp.float32), *refs)
        return o, match_varying(jnp.full(shape, NEG_INF, jnp.float32), *refs)

    c = q.shape[1] // 2

    def early():
        return fwd(ALL, slice(None, c), False)

    def late():
        o1, lse1 = fwd(slice(c, None), ALL, False)
        o0, lse0 = empty(c)
        return jnp.concatenate([o0, o1], 1), jnp.concatenate([lse0, lse1], 1)

    def whole():
        return fwd(ALL, ALL, _causal(cfg, own))

    def skipped():
        return empty(q.shape[1])

    return _hop(cfg, j, r, qt, kt, own, "fwd", whole=whole, early=early, late=late, skipped=skipped)


def hop_bwd(cfg, j, r, q, k, v, o, lse, do, qt: Tokens, kt: Tokens, *, own: bool):
    """(dq, dk, dv) fp32 of one hop (as hop_fwd), recomputed from the saved global out and lse."""
    kern, mask = get_kernel(cfg.kernel), _mask(cfg, qt, kt)
    refs = (q, k, v, o, lse, do, qt.pos, kt.pos)

    def bwd(qs, ks, causal):
        args = (q[:, qs], k[:, ks], v[:, ks], o[:, qs], lse[:, qs], do[:, qs])
        return kern.bwd(*args, mask.cut(qs, ks, causal=causal))

    def zeros(x):
        return match_varying(jnp.zeros(x.shape, jnp.float32), *refs)

    c = q.shape[1] // 2

    def early():
        dq, dk0, dv0 = bwd(ALL, slice(None, c), False)
        return dq, jnp.concatenate([dk0, zeros(dk0)], 1), jnp.concatenate([dv0, zeros(dv0)], 1)

    def late():
        dq1, dk, dv = bwd(slice(c, None), ALL, False)
        return jnp.concatenate([zeros(dq1), dq1], 1), dk, dv

    def whole():
        return bwd(ALL, ALL, _causal(cfg, own))

    def skipped():
        return zeros(q), zeros(k), zeros(v)

    return _hop(cfg, j, r, qt, kt, own, "bwd", whole=whole, early=early, late=late, skipped=skipped)
