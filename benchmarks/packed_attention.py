"""Ring attention fwd+bwd with packed documents vs one causal row at the same length, on 8 CPU devices.

Run by hand: `.venv/bin/python benchmarks/packed_attention.py --length 16384`. Documents have long-tailed
(lognormal) lengths with a few documents per shard, packed back to back with padding (segment 0) at the row
end. For each layout it prints the wall time of the compiled fwd+bwd, unpacked and packed, and the fraction
of ring hops (device x hop, forward and backward) whose kernel the segment summary skipped, counted on the
running devices (jobs.attention.hopcount). Simulated CPU devices share the host's cores, so wall time is the
sum of all devices' work: skipped hops show directly, load balance does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from jobs.attention import (
    attention,
    hopcount,
)
from jobs.mesh import small_mesh
from jobs.strategies import rules


def packed_row(L: int, mean_doc: float, rng: np.random.Generator, pad: int) -> np.ndarray:
    """Segment ids [L]: lognormal document lengths (sigma 1, long tail) back to back, the last one cut at
    L - pad, then `pad` padding tokens (segment 0)."""
    sigma = 1.0
    mu = np.log(mean_doc) - sigma**2 / 2
    lengths, total = [], 0
    while total < L - pad:
        n = max(1, int(rng.lognormal(mu, sigma)))
        lengths.append(min(n, L - pad - total))
        total += lengths[-1]
    ids = np.concatenate([np.full(n, i + 1, np.int32) for i, n in enumerate(lengths)])
    return np.concatenate([ids, np.zeros(pad, np.int32)])


def order(layout: str, seg_L: np.ndarray, P: int) -> np.ndarray:
    """Natural index at each position of `layout` (balanced: jobs.data.balance's packing-aware order)."""
    L = seg_L.size
    if layout == "contiguous":
        return np.arange(L)
    if layout == "zigzag":
        return rules.zigzag_permutation(L, P)
    from jobs.data import balance  # a colleague's module; only this layout needs it

    return np.asarray(balance.permutation("balanced", seg_L, P))


def step_fn(mesh, layout: str, block: int, seg, pos):
    """jit'd fwd+bwd of ring attention on already-permuted inputs (seg None: the unpacked row)."""
    kw = dict(strategy="ring", mesh=mesh, layout=layout, block_q=block, block_kv=block)
    if seg is not None:
        kw |= dict(segment_ids=seg, positions=pos if layout == "balanced" else None)

    def f(q, k, v, ct):
        out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, **kw), q, k, v)
        return (out, *vjp(ct))

    return jax.jit(f)


def timed(fns, args, iters: int) -> list[float]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--docs-per-shard", type=float, default=3.0, help="mean documents per device shard")
    ap.add_argument("--pad", type=int, default=0, help="padding tokens at the row end (segment 0)")
    ap.add_argument("--layouts", default="contiguous,zigzag,balanced")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    L, P = a.length, a.devices
    mesh = small_mesh({"context": P})
    seg_L = packed_row(L, L / P / a.docs_per_shard, np.random.default_rng(a.seed), a.pad)
    n_docs = len(np.unique(seg_L[seg_L > 0]))
    keys = jax.random.split(jax.random.PRNGKey(a.seed), 4)
    Hq, Hkv, D = a.q_heads, a.kv_heads, a.head_dim
    shapes = ((1, L, Hq, D), (1, L, Hkv, D), (1, L, Hkv, D), (1, L, Hq, D))
    q, k, v, ct = (jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes, strict=True))
    print(
        f"ring fwd+bwd, L={L:,} over {P} CPU devices, Hq={Hq} Hkv={Hkv} D={D}, block {a.block}, fp32; "
        f"{n_docs} documents (mean {L / P / a.docs_per_shard:,.0f} tokens, lognormal sigma 1), pad {a.pad}; "
        f"median of {a.iters}, unpacked and packed runs interleaved"
    )
    print(f"{'layout':<11} {'unpacked s':>10} {'packed s':>9} {'speedup':>8} {'hops run':>9} {'skipped':>8}")
    for layout in a.layouts.split(","):
        try:
            perm = order(layout, seg_L, P)
        except ImportError as e:
            print(f"{layout:<11} skipped: {e}")
            continue
        take = lambda x, perm=perm: jnp.take(x, jnp.asarray(perm), axis=1)
        args = tuple(take(x) for x in (q, k, v, ct))
        seg = jnp.asarray(seg_L[perm])[None]
        pos = jnp.asarray(perm, jnp.int32)[None]
        unpacked = step_fn(mesh, "contiguous" if layout == "balanced" else layout, a.block, None, None)
        plain, packed = timed((unpacked, step_fn(mesh, layout, a.block, seg, pos)), args, a.iters)
        with hopcount.counting() as counter:
            jax.block_until_ready(step_fn(mesh, layout, a.block, seg, pos)(*args))
            jax.effects_barrier()
        run, total = counter["fwd"] + counter["bwd"], 2 * P * P
        print(
            f"{layout:<11} {plain:>10.3f} {packed:>9.3f} {plain / packed:>7.2f}x {run:>4}/{total:<4} "
            f"{1 - run / total:>7.1%}"
        )
    print("unpacked balanced = the unpacked contiguous row (balanced only exists with documents)")


if __name__ == "__main__":
    main()
