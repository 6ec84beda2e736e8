"""Time and compiled memory of each CP attention (fwd+bwd) on an 8-device CPU mesh vs one-device attention.

Run by hand: `.venv/bin/python benchmarks/attention.py --length 4096`. Also compares zigzag vs contiguous ring
and, when importable, the `ringattention` PyPI package (same shapes, MHA, its contiguous causal ring) as a peer.
Note simulated CPU devices share the host's cores: load balance (zigzag) only shows in wall time when the
host has at least as many free cores as devices; the `work%` column gives the busiest device's share of the L x L scores (critical path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from benchmarks import page
from jobs import strategies
from jobs.attention import attention
from jobs.attention.kernels import KERNELS
from jobs.attention.sharding import qkv_spec
from jobs.mesh import small_mesh
from jobs.spec import OWN_KERNEL
from orchestrator import provenance


def ringattention_peer(mesh: Mesh, block: int):
    """The PyPI `ringattention` (Liu et al.) blockwise ring, wrapped in our shard_map; None if unusable."""
    try:
        jax.lib.xla_bridge = jax._src.xla_bridge  # removed in jax 0.10; the package reads it at import
        from ringattention import ring_attention as peer
    except Exception as e:  # noqa: BLE001 - any import failure means "no peer", reported in the table
        return None, f"ringattention unusable: {type(e).__name__}: {e}"
    kwargs = dict(
        causal_block_size=1,
        deterministic=True,
        dropout_rng=None,
        attn_pdrop=0.0,
        query_chunk_size=block,
        key_chunk_size=block,
        dtype=jnp.float32,
        policy=jax.checkpoint_policies.nothing_saveable,
        precision=None,
        prevent_cse=True,
    )
    spec = PartitionSpec(None, "context", None, None)

    def local(q, k, v):
        return peer(q, k, v, None, None, None, "context", True, kwargs)

    # Its loop carries are not typed for shard_map's varying-axes check, so that check is off.
    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
    return fn, ""


def measure(fn, mesh, spec, shapes, dtype, iters):
    """Compile fwd+bwd once; return (median wall s, median process CPU s, compile s, per-device MiB).

    CPU seconds (all threads of this process) measure total work, robust to other load on a shared host.
    """
    sharding = NamedSharding(mesh, spec)
    abstract = [jax.ShapeDtypeStruct(s, dtype, sharding=sharding) for s in shapes]
    step = jax.jit(lambda q, k, v, ct: jax.vjp(fn, q, k, v)[1](ct))
    t0 = time.perf_counter()
    compiled = step.lower(*abstract).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    mb = (mem.temp_size_in_bytes + mem.argument_size_in_bytes) / 2**20
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    args = [
        jax.device_put(jax.random.normal(k_, s, jnp.float32).astype(dtype), sharding)
        for k_, s in zip(keys, shapes, strict=True)
    ]
    jax.block_until_ready(compiled(*args))  # warm-up
    times, cpu = [], []
    for _ in range(iters):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu), compile_s, mb


def busiest_device_work(strategy: str, layout: str, p: int) -> float:
    """Share of the L x L score matrix the busiest device computes under a causal mask (dense: 1/2)."""
    rotates = strategy == "peer" or (
        strategy in strategies.NAMES and strategies.get(strategy).default_layout == "zigzag"
    )
    if rotates and layout == "contiguous":
        return (p - 0.5) / p**2  # last device: its diagonal block plus every earlier block
    return 0.5 / p  # zigzag ring, all_gather, ulysses, dense on one device: 1/P of the causal triangle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8, help="MHA by default so the peer runs the same shapes")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--kernel", default="auto", choices=list(KERNELS), help="local kernel (auto: per backend)"
    )
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument(
        "--only", default="", help="comma-separated strategy[:layout] rows to run (peer = ringattention)"
    )
    ap.add_argument(
        "--dense-max-length", type=int, default=4096, help="skip the L x L dense reference above this"
    )
    page.add_argument(ap, "attention")
    a = ap.parse_args()
    made = provenance.current(
        "python benchmarks/attention.py", sys.argv[1:], load=True
    )  # the load at the start
    dtype = jnp.dtype(a.dtype)
    B, L, H, K, D, P = a.batch, a.length, a.q_heads, a.kv_heads, a.head_dim, a.devices
    q_shape, kv_shape = (B, L, H, D), (B, L, K, D)
    shapes = (q_shape, kv_shape, kv_shape, q_shape)
    one = {"context": 1}
    rows = [("reference", one, "contiguous"), ("none", one, "contiguous")]
    for name in strategies.CP_NAMES:  # every registered strategy: its first split, its layout (+ contiguous)
        st = strategies.get(name)
        splits = st.mesh_splits(P)
        if not splits:
            continue
        c, u = splits[0]
        shape = {"context": c, "context_ulysses": u} if "context_ulysses" in st.axes else {"context": c}
        rows += [(name, shape, lay) for lay in dict.fromkeys(("contiguous", st.default_layout))]
    setup = f"B={B} L={L} Hq={H} Hkv={K} D={D} dtype={a.dtype} block={a.block} devices={len(jax.devices())} causal"
    print(setup)
    header = f"{'strategy':<12}{'mesh':<14}{'layout':<12}{'kernel':<8}{'ms/step':>10}{'cpu ms':>9}{'x dense':>9}{'compile s':>11}{'MiB/dev':>10}{'work%':>7}"
    print(header)
    print("-" * len(header))
    results: dict[tuple[str, str], tuple[float, float]] = {}
    table: list[list[str]] = []  # the page's rows, as printed
    base = None
    only = {x for x in a.only.split(",") if x}
    keep = lambda s, lay: not only or s in only or f"{s}:{lay}" in only

    def row(name, label, layout, kern, sec, cpu, comp, mb, work) -> None:
        print(
            f"{name:<12}{label:<14}{layout:<12}{kern:<8}{sec * 1e3:>10.1f}{cpu * 1e3:>9.0f}{sec / base:>9.2f}{comp:>11.1f}{mb:>10.1f}{100 * work:>7.1f}"
        )
        table.append(
            [
                name,
                label,
                layout,
                kern,
                f"{sec * 1e3:.0f}",
                f"{cpu * 1e3:.0f}",
                f"{sec / base:.2f}",
                f"{comp:.1f}",
                f"{mb:.1f}",
                f"{100 * work:.1f} %",
            ]
        )

    for strategy, shape, layout in rows:
        if not keep(strategy, layout):
            continue
        if strategy == "reference" and L > a.dense_max_length:
            print(f"{strategy:<12}{'1 device':<14}{layout:<12}{'-':<8}  skipped (L > --dense-max-length)")
            continue
        mesh = small_mesh(shape)
        fn = lambda q, k, v, s=strategy, m=mesh, lay=layout: attention(
            q, k, v, strategy=s, mesh=m, layout=lay, kernel=a.kernel, block_q=a.block, block_kv=a.block
        )
        sec, cpu, comp, mb = measure(fn, mesh, qkv_spec(mesh, strategy), shapes, dtype, a.iters)
        base = base or sec
        results[(strategy, layout)] = (sec, cpu)
        label = "x".join(str(v) for v in shape.values())
        work = busiest_device_work(strategy, layout, int(np.prod(list(shape.values()))))
        # the kernel that ran (auto: this host's backend's); the dense reference has none
        kern = (
            "-"
            if strategy == "reference"
            else OWN_KERNEL.get(jax.default_backend(), "xla")
            if a.kernel == "auto"
            else a.kernel
        )
        row(strategy, label, layout, kern, sec, cpu, comp, mb, work)
    mesh = small_mesh({"context": P})
    peer, why = (None, "not selected") if not keep("peer", "contiguous") else (1, "")
    if peer:
        peer, why = ringattention_peer(mesh, a.block)
    notes = []
    if peer is None or K != H:
        why = why or "ringattention needs Hkv == Hq (MHA)"
        print(f"{'peer':<12}{'-':<14}{'-':<12}{'-':<8}  {why}")
        notes.append(f"peer (`ringattention`) not run: {why}")
    else:
        sec, cpu, comp, mb = measure(
            peer, mesh, PartitionSpec(None, "context", None, None), shapes, dtype, a.iters
        )
        base = base or sec
        results[("peer", "contiguous")] = (sec, cpu)
        work = busiest_device_work("peer", "contiguous", P)
        row(PEER, str(P), "contiguous", "own", sec, cpu, comp, mb, work)
    zz, cont, peer_r = (
        results.get(k) for k in (("ring", "zigzag"), ("ring", "contiguous"), ("peer", "contiguous"))
    )
    ratios = []
    if zz and cont:
        ratios.append(
            f"ring zigzag / contiguous: wall {zz[0] / cont[0]:.2f}, cpu {zz[1] / cont[1]:.2f} "
            f"(target <= 0.6; busiest-device work ratio {P / 2 / (P - 0.5):.2f})"
        )
    if zz and peer_r:
        ratios.append(
            f"ring zigzag / ringattention (PyPI): wall {zz[0] / peer_r[0]:.2f}, cpu {zz[1] / peer_r[1]:.2f} (target <= 0.7)"
        )
    for line in ratios:
        print(line)
    notes += ratios
    if a.page:
        made = replace(
            made,
            machine=f"{made.machine}, jax {jax.__version__}, {len(jax.devices())} simulated "
            f"{jax.devices()[0].platform.upper()} devices sharing those cores",
        )
        body = page_body(setup, a, table, notes)
        print(f"wrote {page.write(a.page, 'Attention benchmark', made, NOTE, body)}")


PEER = "ringattn-pypi"
NOTE = """\
Forward plus backward of one causal attention call per CP strategy on simulated CPU devices, against a dense
one-device reference, through `jobs.attention.attention` (each strategy's first mesh split, its default layout
and the contiguous one) and, as a peer, the `ringattention` PyPI package (Liu et al.'s blockwise ring, MHA only).
The simulated devices share the host's cores, so wall time tracks the total work, not a real ring's critical
path: load balance (zigzag) shows in the last column, and in wall time only on a host with a free core per
device."""


def page_body(setup: str, a: argparse.Namespace, table: list[list[str]], notes: list[str]) -> str:
    head = [
        "strategy",
        "mesh",
        "layout",
        "kernel",
        "wall ms",
        "CPU ms",
        "× dense",
        "compile s",
        "MiB/device",
        "busiest device's share of the scores",
    ]
    return f"""\
Setup: `{setup}`, fwd+bwd, median of {a.iters} runs after a warm-up.

Columns: *mesh* the devices on the sequence (context, or context × context_ulysses); *layout* how tokens are
laid out over them (zigzag: each device holds chunks r and 2P−1−r); *kernel* the local attention kernel (`-` for
`reference`, dense attention over the whole L × L scores; `none` is our kernel on one device, no CP; `own` the
peer's). *wall ms* is the median step; *CPU ms* the process CPU time of a step (all threads: the total work,
robust to other load); *× dense* wall time over the first row's; *compile s* one compile of the step;
*MiB/device* the compiled step's arguments + temporaries per device (`memory_analysis`); the last column is the
share of the L × L score matrix the busiest device computes under the causal mask (dense on one device: 50 %).

{page.table(head, table)}

""" + "\n".join(f"- {n}" for n in notes)


if __name__ == "__main__":
    main()
