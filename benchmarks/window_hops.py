"""Ring attention fwd+bwd with a sliding window vs global causal attention, on 8 CPU devices: chunk pairs run
and skipped, and step time.

    python benchmarks/window_hops.py [--length 8192] [--windows 512,2048] [--iters 3] [--page [PATH]]

For each layout (contiguous, zigzag) it times the compiled forward+backward of attention alone (median of
--iters, runs interleaved) without a window and with each window, and counts the (query chunk, key chunk)
pairs of every hop whose kernel ran or was skipped, forward and backward, on the running devices
(jobs.attention.hopcount). The global row's pairs are those of the causal ring's structure (contiguous: the
hops from earlier shards; zigzag: three pairs of the own hop, two of every other), which its unprobed path
runs. Simulated CPU devices share the host's cores, so wall time is the sum of all devices' work: skipped
pairs show directly, load balance does not.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import page
from benchmarks.ring_timing import add_ring_arguments, interleaved_medians, ring_step
from jobs.attention import hopcount
from jobs.mesh import small_mesh
from jobs.strategies import rules
from jobs.strategies.base import ring_steps
from orchestrator import provenance

PROG = "python benchmarks/window_hops.py"


def structural_pairs(layout: str, L: int, P: int) -> int:
    """Pairs the causal ring without a window runs per pass (brute force over chunk position ranges)."""
    pos = (rules.zigzag_permutation(L, P) if layout == "zigzag" else np.arange(L)).reshape(P, -1)
    n = 2 if layout == "zigzag" else 1
    first, last = pos.reshape(P, n, -1).min(-1), pos.reshape(P, n, -1).max(-1)  # [device, chunk]
    see = first[None, :, None, :] <= last[:, None, :, None]  # [r, j, a, b]: some key at or before a query
    return int(see.sum())


def counted(fn, args) -> tuple[int, int]:
    """(pairs run, pairs skipped) of one fwd+bwd, counted on the devices."""
    with hopcount.counting() as counter:
        jax.block_until_ready(fn(*args))
        jax.effects_barrier()
    return counter["fwd"] + counter["bwd"], counter["fwd skipped"] + counter["bwd skipped"]


def measure(a: argparse.Namespace) -> list[list[str]]:
    L, P = a.length, a.devices
    mesh = small_mesh({"context": P})
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    Hq, Hkv, D = a.q_heads, a.kv_heads, a.head_dim
    shapes = ((1, L, Hq, D), (1, L, Hkv, D), (1, L, Hkv, D), (1, L, Hq, D))
    args = tuple(jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes, strict=True))
    windows = [None, *(int(w) for w in a.windows.split(","))]
    rows = []
    for layout in ("contiguous", "zigzag"):
        fns = [ring_step(mesh, layout, a.block, window=w) for w in windows]
        times = interleaved_medians(fns, args, a.iters)
        total = 2 * P * P * (4 if layout == "zigzag" else 1)  # fwd + bwd
        for w, t in zip(windows, times, strict=True):
            if w is None or w >= L:  # a window covering the row is global attention (the same program)
                run, how, steps = 2 * structural_pairs(layout, L, P), "by structure", P
            else:
                run, _ = counted(ring_step(mesh, layout, a.block, window=w), args)
                how, steps = "counted", ring_steps(P, L // P, layout, w - 1)
            label = "global causal" if w is None else f"window {w:,}" + (" (>= L: global)" if w >= L else "")
            row = [layout, label, f"{steps}/{P}", f"{run}/{total} ({how})", f"{total - run}", f"{t:.3f}"]
            rows.append([*row, f"{times[0] / t:.2f}x"])
            print(" | ".join(rows[-1]), flush=True)
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ring_arguments(ap, length=8192)
    ap.add_argument("--windows", default="512,2048", help="comma-separated window sizes (tokens)")
    ap.add_argument("--iters", type=int, default=3)
    page.add_argument(ap, "windows")
    a = ap.parse_args(argv)
    made = provenance.current(PROG, argv, load=True)  # before the run: its commit
    rows = measure(a)
    head = ["layout", "mask", "ring steps", "chunk pairs run (fwd+bwd)", "not run", "fwd+bwd s", "vs global"]
    body = page.table(head, rows)
    if not a.page:
        print(body)
        return 0
    Ll = a.length // a.devices
    note = f"""Ring attention forward+backward alone, L = {a.length:,} tokens over {a.devices} simulated CPU devices
(shards of {Ll:,} tokens; zigzag chunks of {Ll // 2:,}), Hq = {a.q_heads}, Hkv = {a.kv_heads}, D = {a.head_dim},
block {a.block}, fp32; median of {a.iters} interleaved runs. A window of W tokens lets a query see W - 1 keys
before it: a hop's (query chunk, key chunk) pair that no query of the chunk can reach skips its kernel (its K/V
still travels), and in the contiguous layout the ring stops rotating after the last shard a window reaches
(*ring steps*: the steps it runs, of P). *chunk pairs run*: pairs whose kernel ran, over all pairs of a full ring
(devices x P hops x pairs per hop, forward and backward), counted on the devices by `jobs.attention.hopcount`;
the global row's are those of the causal ring's structure. The simulated devices share the host's cores, so time
is the sum of all devices' work."""
    path = page.write(a.page, "Sliding windows on the ring: hops skipped", made, note, body)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
