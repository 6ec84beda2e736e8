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

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.ring_timing import add_ring_arguments, interleaved_medians, ring_step
from jobs.attention import hopcount
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


def packed_step(mesh, layout: str, block: int, seg, pos):
    """The ring's step over packed documents (positions only where the balanced order moved them)."""
    return ring_step(mesh, layout, block, segment_ids=seg, positions=pos if layout == "balanced" else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_ring_arguments(ap, length=16384)
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
        unpacked = ring_step(mesh, "contiguous" if layout == "balanced" else layout, a.block)
        plain, packed = interleaved_medians(
            (unpacked, packed_step(mesh, layout, a.block, seg, pos)), args, a.iters
        )
        with hopcount.counting() as counter:
            jax.block_until_ready(packed_step(mesh, layout, a.block, seg, pos)(*args))
            jax.effects_barrier()
        run, total = counter["fwd"] + counter["bwd"], 2 * P * P
        print(
            f"{layout:<11} {plain:>10.3f} {packed:>9.3f} {plain / packed:>7.2f}x {run:>4}/{total:<4} "
            f"{1 - run / total:>7.1%}"
        )
    print("unpacked balanced = the unpacked contiguous row (balanced only exists with documents)")


if __name__ == "__main__":
    main()
