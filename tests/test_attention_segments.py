"""Packed documents (segment ids) under every CP strategy against the dense masked fp32 reference, forward and
dQ/dK/dV, for contiguous, zigzag and balanced token orders, xla and splash (Pallas interpret mode) kernels; and
ring hops that no local query can see really skip their kernel (counted on the running devices)."""

import os
from functools import partial

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from meshes import MESHES  # noqa: E402

from jobs.attention import attention, hopcount, reference_attention
from jobs.attention.kernels import splash  # noqa: E402
from jobs.mesh import small_mesh  # noqa: E402
from jobs.strategies import rules  # noqa: E402

TOL = 5e-5
BLOCK = 16
# Two rows with different packings (documents shorter than a shard, one longer than two shards at P >= 4)
# and a padding segment (id 0) at each row's end; lengths for L = 128, scaled for longer rows.
DOCS = ((10, 75, 5, 20), (40, 3, 3, 50, 12))


def segments(L: int, docs=DOCS) -> np.ndarray:
    """int32 [B, L] natural-order segment ids 1.. per document, padding 0 at the end."""
    rows = []
    for lengths in docs:
        ids = np.concatenate([np.full(n * L // 128, i + 1) for i, n in enumerate(lengths)])
        rows.append(np.concatenate([ids, np.zeros(L - ids.size)]).astype(np.int32))
    return np.stack(rows)


def balanced_perm(L: int, P: int, seed: int) -> np.ndarray:
    """A fixed hand-made 'balanced' order: 4P runs of L/4P tokens shuffled over the devices (L/P each, in
    contiguous runs, positions not increasing within a device)."""
    runs = np.arange(L).reshape(4 * P, L // (4 * P))
    return runs[np.random.default_rng(seed).permutation(4 * P)].reshape(-1)


def perms(layout: str, B: int, L: int, P: int, ring: int) -> np.ndarray:
    """[B, L] natural index at each position of the given order (a different balanced order per row)."""
    if layout == "zigzag":
        return np.tile(rules.zigzag_permutation(L, ring), (B, 1))
    if layout == "balanced":
        return np.stack([balanced_perm(L, P, seed=b) for b in range(B)])
    return np.tile(np.arange(L), (B, 1))


def make_inputs(B, L, H, K, D, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    shapes = ((B, L, H, D), (B, L, K, D), (B, L, K, D), (B, L, H, D))
    return tuple(jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes, strict=True))


def packed_fn(strategy, mesh_shape, layout, kernel, seg_BxL, *, block=BLOCK, causal=True, perm_BxL=None):
    """attention on natural-order arrays: permuted in (tokens, segment ids, positions per row) and back out."""
    mesh = None if strategy == "none" else small_mesh(mesh_shape)
    B, L = seg_BxL.shape
    P = int(np.prod([mesh_shape.get(a, 1) for a in rules.sequence_axes(strategy)])) if mesh else 1
    if perm_BxL is None:
        perm_BxL = perms(layout, B, L, P, rules.ring_size(strategy, mesh_shape))
    perm = jnp.asarray(perm_BxL, jnp.int32)
    inv = jnp.argsort(perm, axis=1)
    take = lambda x, idx: jnp.take_along_axis(x, idx.reshape(*idx.shape, *([1] * (x.ndim - 2))), axis=1)
    seg = take(jnp.asarray(seg_BxL), perm)
    kw = dict(
        block_q=block, block_kv=block, segment_ids=seg, positions=perm if layout == "balanced" else None
    )

    def f(q, k, v):
        q, k, v = (take(x, perm) for x in (q, k, v))
        out = attention(
            q, k, v, strategy=strategy, mesh=mesh, causal=causal, layout=layout, kernel=kernel, **kw
        )
        return take(out, inv)

    return f


def out_and_grads(f, q, k, v, ct):
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(ct))


# The references take the segment ids as an argument, so each compiles once per shape for the whole matrix.
@partial(jax.jit, static_argnames="causal")
def reference(q, k, v, ct, seg_BxL, causal=True):
    fn = lambda q, k, v: reference_attention(q, k, v, causal=causal, q_seg=seg_BxL, kv_seg=seg_BxL)
    return out_and_grads(fn, q, k, v, ct)


@partial(jax.jit, static_argnames="causal")
def unpacked(q, k, v, causal=True):
    return reference_attention(q, k, v, causal=causal)


def check(
    strategy, mesh_shape, layout, kernel="xla", *, L=128, H=8, K=2, D=8, block=BLOCK, causal=True, order=None
):
    """order(seg_L, P) -> [L]: the balanced permutation of each row (default: the hand-made one)."""
    seg = segments(L)
    q, k, v, ct = make_inputs(seg.shape[0], L, H, K, D)
    P = int(np.prod([mesh_shape.get(a, 1) for a in rules.sequence_axes(strategy)]))
    perm = None if order is None else np.stack([order(row, P) for row in seg])
    f = packed_fn(strategy, mesh_shape, layout, kernel, seg, block=block, causal=causal, perm_BxL=perm)
    got = jax.jit(lambda *a: out_and_grads(f, *a))(q, k, v, ct)
    want = reference(q, k, v, ct, jnp.asarray(seg), causal)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < TOL, f"{strategy} {mesh_shape} {layout} {kernel}: {name} max abs error {err:.2e}"
    # the documents are really separate: a row's output differs from the unpacked (one causal row) answer
    plain = unpacked(q, k, v, causal)
    assert float(jnp.max(jnp.abs(got[0] - plain))) > 1e-2


LAYOUTS = ("contiguous", "zigzag", "balanced")
FAST = {  # (strategy, P, layout): one per strategy and layout at least, the rest in the slow matrix
    ("ring", 4, "contiguous"),
    ("ring", 8, "zigzag"),
    ("ring", 8, "balanced"),
    ("all_gather", 4, "balanced"),
    ("ulysses", 2, "zigzag"),
    ("usp", 4, "balanced"),
    ("double_ring", 4, "zigzag"),
    ("double_ring", 8, "balanced"),
}
MATRIX = [
    pytest.param(s, P, lay, marks=() if (s, P, lay) in FAST else pytest.mark.slow, id=f"{s}-P{P}-{lay}")
    for s in MESHES
    for P in (2, 4, 8)
    for lay in LAYOUTS
]


@pytest.mark.parametrize("strategy,P,layout", MATRIX)
def test_packed_matches_reference_xla(strategy, P, layout):
    check(strategy, MESHES[strategy][P], layout)


@pytest.mark.parametrize(
    "strategy,P",
    [
        ("ring", 8),
        pytest.param("usp", 8, marks=pytest.mark.slow),
        pytest.param("all_gather", 4, marks=pytest.mark.slow),
    ],
)
def test_packed_with_the_loaders_balanced_layout(strategy, P):
    """The layout jobs.data.balance computes from each row's documents (what the loader will hand us)."""
    balance = pytest.importorskip("jobs.data.balance")
    check(
        strategy,
        MESHES[strategy][P],
        "balanced",
        order=lambda seg, P: balance.permutation("balanced", seg, P),
    )


@pytest.mark.parametrize("layout", ["contiguous", "balanced"])
def test_packed_no_cp_and_reference_strategy(layout):
    check("none", {}, layout)
    check("reference", {"context": 4}, layout)


@pytest.mark.parametrize(
    "strategy,P,layout",
    [("ring", 4, "zigzag"), pytest.param("usp", 4, "balanced", marks=pytest.mark.slow)],
)
def test_packed_non_causal(strategy, P, layout):
    check(strategy, MESHES[strategy][P], layout, causal=False)


def test_auto_kernel_runs_balanced_with_xla():
    """kernel=auto traces its TPU branch too: for balanced that branch must be xla, not a refusing splash."""
    check("ring", MESHES["ring"][4], "balanced", "auto")


def _no_fallback(*args, **kwargs):
    raise AssertionError("splash fell back to the xla kernel: the test shapes do not exercise splash")


SPLASH = [  # (strategy, mesh, L, layout): splash calls need lengths that are multiples of 128
    ("ring", {"context": 2}, 512, "zigzag"),
    ("all_gather", {"context": 2}, 256, "contiguous"),
    pytest.param("ulysses", {"context": 2}, 256, "zigzag", marks=pytest.mark.slow),
    pytest.param("ulysses", {"context": 2}, 256, "contiguous", marks=pytest.mark.slow),
    pytest.param("usp", {"context": 2, "context_ulysses": 2}, 512, "contiguous", marks=pytest.mark.slow),
    pytest.param(
        "double_ring", {"context": 2, "context_ulysses": 2}, 512, "contiguous", marks=pytest.mark.slow
    ),
    pytest.param("ring", {"context": 4}, 512, "contiguous", marks=pytest.mark.slow),
    pytest.param("ring", {"context": 4}, 1024, "zigzag", marks=pytest.mark.slow),
    pytest.param("all_gather", {"context": 4}, 1024, "zigzag", marks=pytest.mark.slow),
    pytest.param("usp", {"context": 2, "context_ulysses": 2}, 512, "zigzag", marks=pytest.mark.slow),
    pytest.param("double_ring", {"context": 2, "context_ulysses": 2}, 1024, "zigzag", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("strategy,mesh_shape,L,layout", SPLASH)
def test_packed_matches_reference_splash(monkeypatch, strategy, mesh_shape, L, layout):
    monkeypatch.setattr(splash, "xla_fwd", _no_fallback)
    monkeypatch.setattr(splash, "xla_bwd", _no_fallback)
    check(strategy, mesh_shape, layout, "splash", L=L, H=2, K=1, D=16, block=128)


def expected_hops(seg_BxL: np.ndarray, perm_BxL: np.ndarray, P: int) -> int:
    """Brute force: (device, hop) pairs of a flat ring whose K/V block some local query sees (any row)."""
    B, L = seg_BxL.shape
    n = L // P
    seg = np.take_along_axis(seg_BxL, perm_BxL, 1).reshape(B, P, n)
    pos = perm_BxL.reshape(B, P, n)
    see = (seg[:, :, None, :, None] == seg[:, None, :, None, :]) & (
        pos[:, :, None, :, None] >= pos[:, None, :, None, :]
    )  # [B, r (queries), j (keys), n, n]
    return int(see.any(axis=(0, 3, 4)).sum())


def count_hops(strategy, mesh_shape, layout, seg_BxL) -> tuple[dict, int]:
    B, L = seg_BxL.shape
    P = int(np.prod(list(mesh_shape.values())))
    q, k, v, ct = make_inputs(B, L, 4, 2, 8)
    with hopcount.counting() as counter:
        f = packed_fn(strategy, mesh_shape, layout, "xla", seg_BxL)
        jax.block_until_ready(jax.jit(lambda *a: out_and_grads(f, *a))(q, k, v, ct))
        jax.effects_barrier()
    perm = perms(layout, B, L, P, rules.ring_size(strategy, mesh_shape))
    return dict(counter), expected_hops(seg_BxL, perm, P)


# L = 128 over 8 devices: every document (and the padding) shorter than a 16-token shard
SHORT_DOCS = ((8, 12, 6, 14, 9, 13, 5, 11, 14, 10, 7, 12), (10, 4, 4, 13, 12, 7, 11, 14, 6, 9, 13, 12))


@pytest.mark.parametrize(
    "strategy,mesh_shape,layout",
    [
        ("ring", {"context": 8}, "contiguous"),
        pytest.param("ring", {"context": 8}, "balanced", marks=pytest.mark.slow),
        pytest.param("ring", {"context": 4}, "zigzag", marks=pytest.mark.slow),
        pytest.param(
            "double_ring", {"context": 2, "context_ulysses": 4}, "contiguous", marks=pytest.mark.slow
        ),
    ],
)
def test_invisible_hops_skip_their_kernel(strategy, mesh_shape, layout):
    """Every device runs a kernel on exactly the hops whose K/V block a local query sees, fwd and bwd."""
    seg = segments(128, SHORT_DOCS)
    counts, want = count_hops(strategy, mesh_shape, layout, seg)
    P = int(np.prod(list(mesh_shape.values())))
    assert counts == {"fwd": want, "bwd": want}, (counts, want)
    if layout == "contiguous":  # documents shorter than a shard: only hops s = 0 and 1 can see anything
        assert P < want <= 2 * P


def test_one_document_runs_every_visible_hop():
    """Control: one document filling the row under contiguous ring skips only the future (causal) hops."""
    seg = np.ones((1, 128), np.int32)
    counts, want = count_hops("ring", {"context": 4}, "contiguous", seg)
    assert want == 4 * 5 // 2 and counts == {"fwd": want, "bwd": want}


@pytest.mark.parametrize(
    "kw,match",
    [
        (
            dict(layout="balanced"),
            r"layout=balanced is a data-dependent token order: pass positions and segment_ids",
        ),
        (dict(layout="balanced", segment_ids=True), r"pass positions \("),
        (
            dict(layout="balanced", segment_ids=True, positions=True, kernel="splash"),
            r"splash cannot run layout=balanced",
        ),
        (dict(layout="contiguous", segment_ids="short"), r"must be \[B, L\] = \[1, 64\], got \[1, 32\]"),
        (
            dict(layout="spiral", segment_ids=True),
            r"unknown layout 'spiral'; use one of contiguous, zigzag, balanced",
        ),
    ],
)
def test_bad_packed_inputs_raise_value_error(kw, match):
    mesh = small_mesh({"context": 2})
    q, k, v, _ = make_inputs(1, 64, 4, 2, 8)
    full = jnp.ones((1, 64), jnp.int32)
    conv = {True: full, "short": full[:, :32]}
    args = {n: conv[x] if n in ("segment_ids", "positions") else x for n, x in kw.items()}
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, strategy="ring", mesh=mesh, **args)


def test_balanced_layout_in_registry_and_rules():
    for name in ("all_gather", "ulysses", "ring", "usp", "double_ring"):
        rules.validate(name, context_length=64, q_heads=4, kv_heads=2, mesh={"context": 2}, layout="balanced")
    assert "balanced" in rules.LAYOUTS  # a trial may name it (with train.data.kind=documents)


def test_unpacked_call_is_unchanged():
    """segment_ids=None takes the old path: no segment summaries (scatter-min/max), no hop probes."""
    mesh = small_mesh({"context": 4})
    q, k, v, _ = make_inputs(1, 64, 4, 2, 8)
    kw = dict(strategy="ring", mesh=mesh, layout="zigzag", block_q=BLOCK, block_kv=BLOCK)
    with hopcount.counting():
        plain = str(jax.make_jaxpr(lambda q, k, v: attention(q, k, v, **kw))(q, k, v))
        seg = jnp.ones((1, 64), jnp.int32)
        packed = str(jax.make_jaxpr(lambda q, k, v: attention(q, k, v, segment_ids=seg, **kw))(q, k, v))
    assert "scatter" not in plain and "callback" not in plain
    assert "scatter" in packed and "callback" in packed  # the probe itself can see a packed call
