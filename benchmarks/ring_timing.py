"""Timing ring attention's compiled forward+backward on simulated CPU devices, for the benchmarks that contrast
two variants of one ring (window_hops, packed_attention)."""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from jobs.attention import attention


def ring_step(mesh, layout: str, block: int, **mask):
    """jit'd fwd+bwd of ring attention on already-permuted inputs; `mask` is attention()'s window, segment_ids
    or positions."""
    kw = dict(strategy="ring", mesh=mesh, layout=layout, block_q=block, block_kv=block, **mask)

    def f(q, k, v, ct):
        out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, **kw), q, k, v)
        return (out, *vjp(ct))

    return jax.jit(f)


def interleaved_medians(fns, args, iters: int) -> list[float]:
    """Median wall time of each compiled fn, runs interleaved (a shared host's load drifts; this spreads it)."""
    for fn in fns:
        jax.block_until_ready(fn(*args))  # compile and warm up
    times = [[] for _ in fns]
    for _ in range(iters):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def add_ring_arguments(ap: argparse.ArgumentParser, length: int) -> None:
    """The ring's shape: --length (tokens), --devices, --q-heads, --kv-heads, --head-dim, --block."""
    ap.add_argument("--length", type=int, default=length)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=512)
