"""Section 2 of the GPU check: bf16 flash (cuDNN) against the dense fp32 reference, forward and dQ/dK/dV.

(a) what a ring does, hop by hop at the kernel level: the causal diagonal block and the non-causal blocks
before it, merged by log-sum-exp (jobs.attention.core.merge); each hop's backward with the GLOBAL out and lse,
dK/dV summed into their chunk. Contiguous (device r holds chunk r) and zigzag (chunks r and 2n-1-r) orders.
(b) every registered strategy through attention(...) on a one-device mesh, both layouts. (c) head_dim 256.
(d) a probe of cuDNN's packed layout (benchmarks/gpu_check_packed.py), which packed documents will need.
Every item says whether cuDNN really ran (flash.FALLBACKS stayed empty) and, if not, why.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from benchmarks.gpu_check_common import BF16_TOL, BLOCK, Recorder, Sizes
from benchmarks.gpu_check_packed import packed_probe
from jobs import strategies
from jobs.attention import attention, from_zigzag, merge, reference_attention, to_zigzag
from jobs.attention.kernels import flash
from jobs.attention.kernels.flash import flash_bwd, flash_fwd
from jobs.attention.kernels.mask import Mask
from jobs.strategies import rules

NAMES = ("out", "dq", "dk", "dv")
Hop = tuple[tuple[int, ...], tuple[int, ...], bool]  # (query chunks, key chunks, causal)


def inputs(L: int, H: int, K: int, D: int, seed: int = 0) -> tuple[jax.Array, ...]:
    """q, k, v, cotangent: unit normal, bf16 (tests/test_attention.py make_inputs' recipe)."""
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
    shapes = ((1, L, H, D), (1, L, K, D), (1, L, K, D), (1, L, H, D))
    return tuple(
        jax.random.normal(r, s, jnp.float32).astype(jnp.bfloat16)
        for r, s in zip((kq, kk, kv, kc), shapes, strict=True)
    )


@jax.jit
def reference(q, k, v, ct):
    """Dense fp32 attention (causal) and its gradients: the ground truth."""
    f32 = [x.astype(jnp.float32) for x in (q, k, v, ct)]
    out, vjp = jax.vjp(lambda q, k, v: reference_attention(q, k, v, causal=True), *f32[:3])
    return (out, *vjp(f32[3]))


def errors(got, want) -> dict[str, Any]:
    """Max abs error per output, the largest, and whether it is within the bf16 tolerance."""
    errs = {
        n: float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)))
        for n, g, w in zip(NAMES, got, want, strict=True)
    }
    worst = max(errs.values())
    return {"errors": errs, "max_error": worst, "within_tol": bool(worst < BF16_TOL), "tolerance": BF16_TOL}


def traced(fn, *args) -> tuple[Any, list[str]]:
    """fn(*args), jitted, and the fallback reasons its tracing added (empty: cuDNN ran every call)."""
    flash.FALLBACKS.clear()
    out = jax.block_until_ready(jax.jit(fn)(*args))
    return out, list(flash.FALLBACKS)


def ring_hops(n: int, zigzag: bool) -> tuple[int, list[Hop]]:
    """(chunks, hops) of a causal ring over n devices: what each device computes against each source.

    Contiguous: device r's chunk r against itself (causal), then against every earlier chunk (no mask).
    Zigzag: device r holds chunks (r, 2n-1-r); against itself causal (index order is position order within
    the pair); against s < r all its queries see only s's first chunk; against s > r only its second query
    chunk sees s, both of s's chunks, unmasked (DESIGN.md's zigzag rule: no masks after step 0)."""
    if not zigzag:
        return n, [((r,), (r,), True) for r in range(n)] + [
            ((r,), (s,), False) for r in range(n) for s in range(r)
        ]
    own = [(r, 2 * n - 1 - r) for r in range(n)]
    hops: list[Hop] = [(own[r], own[r], True) for r in range(n)]
    for r in range(n):
        hops += [(own[r], (s,), False) for s in range(r)]
        hops += [((own[r][1],), own[s], False) for s in range(r + 1, n)]
    return 2 * n, hops


def hop_merged(q, k, v, ct, chunks: int, hops: list[Hop]):
    """Out and dq, dk, dv of causal attention computed hop by hop with the flash kernel (natural order)."""
    c = q.shape[1] // chunks
    part = lambda x, ids: jnp.concatenate([x[:, i * c : (i + 1) * c] for i in ids], axis=1)
    pos = lambda ids: jnp.concatenate([jnp.arange(i * c, (i + 1) * c) for i in ids])
    mask = lambda qi, ki, causal: Mask(pos(qi), pos(ki), causal, min(BLOCK, c), min(BLOCK, c))
    acc: dict[int, tuple[jax.Array, jax.Array]] = {}
    for qi, ki, causal in hops:
        o, lse = flash_fwd(part(q, qi), part(k, ki), part(v, ki), mask(qi, ki, causal))
        for j, i in enumerate(qi):
            oi, li = o[:, j * c : (j + 1) * c], lse[:, j * c : (j + 1) * c]
            acc[i] = (oi, li) if i not in acc else merge(*acc[i], oi, li)
    out = jnp.concatenate([acc[i][0] for i in range(chunks)], axis=1)
    lse = jnp.concatenate([acc[i][1] for i in range(chunks)], axis=1)
    dq = {i: 0.0 for i in range(chunks)}
    dk, dv = dict(dq), dict(dq)
    for qi, ki, causal in hops:  # every hop's backward reads the merged (global) out and lse
        args = (part(q, qi), part(k, ki), part(v, ki), part(out, qi), part(lse, qi), part(ct, qi))
        gq, gk, gv = flash_bwd(*args, mask(qi, ki, causal))
        for j, i in enumerate(qi):
            dq[i] = dq[i] + gq[:, j * c : (j + 1) * c]
        for j, i in enumerate(ki):
            dk[i], dv[i] = dk[i] + gk[:, j * c : (j + 1) * c], dv[i] + gv[:, j * c : (j + 1) * c]
    join = lambda d: jnp.concatenate([d[i] for i in range(chunks)], axis=1)
    return out, join(dq), join(dk), join(dv)


def merge_item(L: int, heads: tuple[int, int, int], n: int, zigzag: bool) -> dict[str, Any]:
    q, k, v, ct = inputs(L, *heads)
    chunks, hops = ring_hops(n, zigzag)
    got, fallbacks = traced(lambda q, k, v, ct: hop_merged(q, k, v, ct, chunks, hops), q, k, v, ct)
    shape = {"L": L, "heads": list(heads), "devices": n, "chunks": chunks, "hops": len(hops)}
    return shape | errors(got, reference(q, k, v, ct)) | {"flash_ran": not fallbacks, "fallbacks": fallbacks}


def one_device_mesh(strategy: str) -> Mesh:
    """The strategy's own axes (at least `context`), all of size 1, over the first device."""
    axes = strategies.get(strategy).axes or ("context",)
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(axes)), axes)


def strategy_item(strategy: str, layout: str, L: int, heads: tuple[int, int, int]) -> dict[str, Any]:
    mesh = one_device_mesh(strategy)
    ring = rules.ring_size(strategy, dict(mesh.shape))
    q, k, v, ct = inputs(L, *heads)

    def f(q, k, v):  # natural order in and out, as tests/test_attention.py's natural_order_fn
        if layout == "zigzag":
            q, k, v = (to_zigzag(x, ring) for x in (q, k, v))
        out = attention(q, k, v, strategy=strategy, mesh=mesh, layout=layout, kernel="flash")
        return from_zigzag(out, ring) if layout == "zigzag" else out

    def out_and_grads(q, k, v, ct):
        out, vjp = jax.vjp(f, q, k, v)
        return (out, *vjp(ct))

    got, fallbacks = traced(out_and_grads, q, k, v, ct)
    shape = {"L": L, "heads": list(heads), "mesh": dict(mesh.shape)}
    return shape | errors(got, reference(q, k, v, ct)) | {"flash_ran": not fallbacks, "fallbacks": fallbacks}


def parity(rec: Recorder, s: Sizes) -> None:
    """Section 2, cheapest and most telling first: the ring's own hop arithmetic, head_dim 256, strategies."""
    rec.run("parity", "merge_contiguous", lambda: merge_item(s.parity_L, s.parity_heads, s.chunks, False))
    rec.run("parity", "merge_zigzag", lambda: merge_item(s.parity_L, s.parity_heads, s.chunks, True))
    wide = (s.parity_heads[0], s.parity_heads[1], 256)
    rec.run("parity", "merge_contiguous_d256", lambda: merge_item(s.wide_L, wide, s.chunks, False))
    for name in strategies.NAMES:
        for layout in (
            "contiguous",
            "zigzag",
        ):  # "balanced" needs a loader's positions: not a kernel question
            if layout in strategies.get(name).layouts:
                item = lambda n=name, lay=layout: strategy_item(n, lay, s.strategy_L, s.parity_heads)
                rec.run("parity", f"{name}_{layout}", item)
    # what wiring packed documents into the flash kernel needs to know (benchmarks/gpu_check_packed.py)
    rec.run("parity", "packed_layout_probe", lambda: packed_probe(s.strategy_L, s.parity_heads))
    rec.data["parity"]["tolerance"] = BF16_TOL
    rec.save()
