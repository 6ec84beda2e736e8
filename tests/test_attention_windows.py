"""Sliding windows, chunked attention and attention sinks under every CP strategy against the dense masked fp32
reference (forward, dQ/dK/dV and d sinks), every layout, packed documents too; ring hops (chunk pairs) a window
cannot reach really skip their kernel (counted on the running devices); window >= L is global attention; bad
inputs raise. Cheap by design: L = 64, one compile per case, a covering set in the suite; the full matrix
(strategy x P x layout x case, 240 compiles, ~10 min on 2 cores) is a check run by hand:
CP_FULL_MATRIX=1 python -m pytest tests/test_attention_windows.py"""

import os
from functools import partial

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from meshes import MESHES  # noqa: E402

from jobs.attention import attention, hopcount, reference_attention  # noqa: E402
from jobs.mesh import small_mesh  # noqa: E402
from jobs.strategies import rules  # noqa: E402
from jobs.strategies.base import ring_steps  # noqa: E402

TOL = 5e-5
L, H, D, BLOCK = 64, 8, 8, 8
# Documents of one row (natural order), padding (id 0) at the end: one shorter than a P=8 shard, one across
# several shards.
DOCS = (5, 30, 3, 10)


def case(name: str, P: int) -> dict:
    """The mask arguments of a named case for a P-way split of L (shard Ll = L/P)."""
    Ll = L // P
    return {
        "window<shard": dict(window=Ll // 2 + 1),
        "window=shard": dict(window=Ll),
        "window>shards": dict(window=min(5 * Ll // 2, L - 5)),  # P = 2: still short of the row
        "chunk": dict(chunk=3 * Ll // 2),  # not aligned to shards
        "sinks": dict(sinks=True),
        "window+sinks": dict(window=Ll + 3, sinks=True),
        "packed+window": dict(window=Ll - 1, packed=True),
        "packed+chunk+sinks": dict(chunk=Ll + 2, packed=True, sinks=True),
    }[name]


def segments() -> np.ndarray:
    ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(DOCS)])
    return np.concatenate([ids, np.zeros(L - ids.size)]).astype(np.int32)[None]


def order(layout: str, P: int, ring: int) -> np.ndarray:
    """[L] natural index at each position of the layout (balanced: 4P runs of L/4P shuffled, fixed seed)."""
    if layout == "zigzag":
        return rules.zigzag_permutation(L, ring)
    if layout == "balanced":
        runs = np.arange(L).reshape(4 * P, L // (4 * P))
        return runs[np.random.default_rng(0).permutation(4 * P)].reshape(-1)
    return np.arange(L)


def inputs(K: int, seed: int = 0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    shapes = ((1, L, H, D), (1, L, K, D), (1, L, K, D), (1, L, H, D))
    q, k, v, ct = (jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes, strict=False))
    return q, k, v, ct, jax.random.normal(keys[4], (H,), jnp.float32)


def grads(f, q, k, v, sinks, ct):
    out, vjp = jax.vjp(f, q, k, v, sinks)
    return (out, *vjp(ct))


@partial(jax.jit, static_argnames=("window", "chunk", "use_sinks", "packed"))
def reference(q, k, v, sinks, ct, seg, *, window, chunk, use_sinks, packed):
    segs = dict(q_seg=seg, kv_seg=seg) if packed else {}

    def f(q, k, v, s):
        s = s if use_sinks else None
        return reference_attention(q, k, v, window=window, chunk=chunk, sinks=s, **segs)

    return grads(f, q, k, v, sinks, ct)


def cp_fn(strategy, mesh_shape, layout, kw: dict, perm: np.ndarray, seg: np.ndarray, kernel="xla"):
    """attention on natural-order arrays: permuted into the layout (tokens, segment ids, balanced positions)
    and back out."""
    mesh = small_mesh(mesh_shape) if mesh_shape else None
    idx, inv = jnp.asarray(perm, jnp.int32), jnp.asarray(np.argsort(perm), jnp.int32)
    extra = {}
    if kw.get("packed"):
        extra["segment_ids"] = jnp.asarray(seg)[:, idx]
    if layout == "balanced":
        extra["positions"] = idx[None]
    masks = dict(window=kw.get("window"), chunk=kw.get("chunk"))

    permute = (lambda x, i: x[:, i]) if layout != "contiguous" else (lambda x, i: x)

    def f(q, k, v, sinks):
        q, k, v = (permute(x, idx) for x in (q, k, v))
        s = sinks if kw.get("sinks") else None
        opts = dict(layout=layout, kernel=kernel, block_q=BLOCK, block_kv=BLOCK, sinks=s)
        out = attention(q, k, v, strategy=strategy, mesh=mesh, **opts, **masks, **extra)
        return permute(out, inv)

    return f


def check(strategy, P, layout, name, K=2, hlo=None, kernel="xla"):
    """One compile of forward + backward; every output and gradient within TOL of the reference."""
    kw = case(name, P)
    mesh_shape = MESHES[strategy][P] if strategy in MESHES else {}
    perm = order(layout, P, rules.ring_size(strategy, mesh_shape) if mesh_shape else 1)
    seg = segments()
    q, k, v, ct, sinks = inputs(K)
    f = cp_fn(strategy, mesh_shape, layout, kw, perm, seg, kernel)
    compiled = jax.jit(lambda *a: grads(f, *a[:4], a[4])).lower(q, k, v, sinks, ct).compile()
    got = compiled(q, k, v, sinks, ct)
    flags = dict(use_sinks=bool(kw.get("sinks")), packed=bool(kw.get("packed")))
    want = reference(
        q, k, v, sinks, ct, jnp.asarray(seg), window=kw.get("window"), chunk=kw.get("chunk"), **flags
    )
    names = ("out", "dq", "dk", "dv", "dsinks")
    for n, g, w in zip(names, got, want, strict=True):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < TOL, f"{strategy} P={P} {layout} {name}: {n} max abs error {err:.2e}"
    if not kw.get("sinks"):
        assert float(jnp.max(jnp.abs(got[4]))) == 0.0  # no sinks, no sink gradient
    if hlo:
        hlo(compiled.as_text())


CASES = ("window<shard", "window=shard", "window>shards", "chunk", "sinks", "window+sinks", "packed+window")
LAYOUTS = {"contiguous": CASES, "zigzag": CASES, "balanced": ("packed+window", "packed+chunk+sinks")}
# (strategy, P, layout, case): every strategy meets every layout, windows shorter than, equal to and longer
# than a shard, chunks, sinks and packed documents, and P = 2, 4 and 8; CP_FULL_MATRIX=1 adds the rest of MATRIX.
FAST = {
    (s, P, lay, c)
    for s in MESHES
    for P, lay, c in (
        (8, "contiguous", "window<shard"),
        (4, "zigzag", "window>shards"),
        (2, "contiguous", "chunk"),
        (8, "zigzag", "window+sinks"),
        (4, "balanced", "packed+chunk+sinks"),
    )
} | {
    ("ring", 4, "contiguous", "sinks"),  # sinks without a window: unmasked hops, corrected in the saved core
    ("ring", 4, "zigzag", "window=shard"),
    ("ring", 8, "contiguous", "packed+window"),
}
FULL = os.environ.get("CP_FULL_MATRIX") == "1"
MATRIX = [
    pytest.param(s, P, lay, c, id=f"{s}-P{P}-{lay}-{c}")
    for s in MESHES
    for P in (2, 4, 8)
    for lay, cases in LAYOUTS.items()
    for c in cases
    if FULL or (s, P, lay, c) in FAST
]


@pytest.mark.parametrize("strategy,P,layout,name", MATRIX)
def test_matches_reference(strategy, P, layout, name):
    K = 4 if P == 2 else 2  # GQA groups of 2 and 4
    check(strategy, P, layout, name, K=K)


@pytest.mark.parametrize("name", ["window<shard", "packed+chunk+sinks"])
def test_no_cp_and_reference_strategy(name):
    check("none", 4, "contiguous", name)
    check("reference", 4, "contiguous", name)


def test_auto_kernel_runs_windows_with_xla():
    """kernel=auto traces its TPU branch too: with a window that branch must be xla, not a refusing splash."""
    check("ring", 2, "contiguous", "window+sinks", kernel="auto")


def test_all_gather_fetches_only_the_halo():
    """A window shorter than a shard: all_gather ppermutes one neighbour's tail instead of gathering K/V."""

    def hlo(text):
        assert "collective-permute" in text and "all-gather" not in text

    check("all_gather", 8, "contiguous", "window<shard", hlo=hlo)


def expected_pairs(layout: str, P: int, window: int) -> int:
    """Brute force: (device, hop, query chunk, key chunk) of a flat ring where some query sees some key."""
    pos = np.asarray(order(layout, P, P)).reshape(P, -1)
    n = 2 if layout == "zigzag" else 1
    chunks = pos.reshape(P, n, -1)  # [device, chunk, tokens]
    q = chunks[:, None, :, None, :, None]
    k = chunks[None, :, None, :, None, :]
    see = (k <= q) & (q - k < window)  # [r, j, a, b, tq, tk]
    return int(see.any(axis=(4, 5)).sum())


@pytest.mark.parametrize(
    "layout,P,window",
    [("contiguous", 8, 5), pytest.param("zigzag", 4, 6, marks=pytest.mark.slow)],
)
def test_window_skips_unreachable_hops(layout, P, window):
    """Each device runs a kernel on exactly the chunk pairs the window reaches, forward and backward; a window
    shorter than a shard (8 tokens) on contiguous ring at P = 8 runs the own hop and the previous shard's."""
    q, k, v, ct, sinks = inputs(2)
    perm = order(layout, P, P)
    f = cp_fn("ring", {"context": P}, layout, dict(window=window), perm, segments())
    with hopcount.counting() as counter:
        jax.block_until_ready(jax.jit(lambda *a: grads(f, *a[:4], a[4]))(q, k, v, sinks, ct))
        jax.effects_barrier()
    # the contiguous ring stops rotating at the last shard the window reaches: 2 of P steps here
    steps = ring_steps(P, len(perm) // P, layout, window - 1)
    total = P * steps * (4 if layout == "zigzag" else 1)
    run = expected_pairs(layout, P, window)
    want = {"fwd": run, "bwd": run, "fwd skipped": total - run, "bwd skipped": total - run}
    assert dict(counter) == want
    if layout == "contiguous":
        assert steps == 2 and run == P + (
            P - 1
        )  # of P * 2 = 16 pairs: device 0's second (its future) skipped


def test_window_or_chunk_covering_the_row_is_global_attention():
    """window >= L (or chunk >= L) takes the global causal path: bit-identical results."""
    mesh = small_mesh({"context": 4})
    q, k, v, _, _ = inputs(2)
    kw = dict(strategy="ring", mesh=mesh, layout="zigzag", block_q=BLOCK, block_kv=BLOCK)
    glob = jax.jit(lambda q, k, v: attention(q, k, v, **kw))(q, k, v)
    for extra in (dict(window=L), dict(window=10 * L), dict(chunk=L)):
        got = jax.jit(lambda q, k, v, extra=extra: attention(q, k, v, **kw, **extra))(q, k, v)
        assert np.array_equal(np.asarray(got), np.asarray(glob)), extra


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window=0), r"window must be a positive int \(tokens\) or None, got 0"),
        (dict(chunk=-4), r"chunk must be a positive int \(tokens\) or None, got -4"),
        (dict(window=2.5), r"window must be a positive int"),
        (dict(window=8, chunk=16), r"window=8 and chunk=16 are two different masks; pass one of them"),
        (dict(window=8, causal=False), r"window=8 limits how far back a causal query sees; pass causal=True"),
        (
            dict(sinks=jnp.zeros(4)),
            r"sinks are one logit per query head: shape \[q_heads\] = \[8\], got \[4\]",
        ),
        (
            dict(chunk=16, kernel="splash"),
            r"kernel=splash runs a sliding window or chunk only under ulysses or none",
        ),
    ],
)
def test_bad_mask_inputs_raise_value_error(kw, match):
    q, k, v, _, _ = inputs(2)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, strategy="ring", mesh=small_mesh({"context": 2}), **kw)


def _no_fallback(*args, **kwargs):
    raise AssertionError("splash fell back to the xla kernel: the test shapes do not exercise splash")


@pytest.mark.slow
def test_splash_runs_sinks(monkeypatch):
    """Sinks need nothing from the kernel: splash (Pallas interpret mode) under ring, corrected once."""
    from jobs.attention.kernels import splash

    monkeypatch.setattr(splash, "xla_fwd", _no_fallback)
    monkeypatch.setattr(splash, "xla_bwd", _no_fallback)
    n = 256
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    shapes = ((1, n, 2, 16), (1, n, 1, 16), (1, n, 1, 16), (1, n, 2, 16), (2,))
    q, k, v, ct, sinks = (jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes, strict=True))
    kw = dict(strategy="ring", mesh=small_mesh({"context": 2}), kernel="splash", block_q=128, block_kv=128)
    got = jax.jit(lambda *a: grads(lambda q, k, v, s: attention(q, k, v, sinks=s, **kw), *a))(
        q, k, v, sinks, ct
    )
    want = grads(lambda q, k, v, s: reference_attention(q, k, v, sinks=s), q, k, v, sinks, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv", "dsinks"), got, want, strict=True):
        assert float(jnp.max(jnp.abs(g - w))) < TOL, name
