"""Every CP strategy against the dense fp32 reference on 8 simulated CPU devices: forward, dQ/dK/dV, causality."""

import os
from functools import partial

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from jobs import strategies  # noqa: E402
from jobs.attention import attention, from_zigzag, reference_attention, to_zigzag  # noqa: E402
from jobs.attention.sharding import qkv_spec  # noqa: E402
from jobs.mesh import small_mesh  # noqa: E402
from jobs.strategies import rules

FP32_TOL = 2e-5
# bf16 inputs (8-bit mantissa, rel. step 2^-8 = 3.9e-3) with fp32 softmax statistics and accumulators: the
# error is dominated by rounding q/k/v/p to bf16, measured <= ~1e-2 abs on unit-normal inputs; allow 3e-2.
BF16_TOL = 3e-2
BLOCK = 16  # small blocks so every local kernel runs several q and kv blocks


def make_inputs(B, L, H, K, D, dtype=jnp.float32, seed=0):
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(kq, (B, L, H, D), jnp.float32)
    k = jax.random.normal(kk, (B, L, K, D), jnp.float32)
    v = jax.random.normal(kv, (B, L, K, D), jnp.float32)
    ct = jax.random.normal(kc, (B, L, H, D), jnp.float32)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), ct.astype(dtype)


def natural_order_fn(strategy, mesh_shape, *, layout="contiguous", causal=True, **attention_kw):
    """attention in natural token order; zigzag inputs are permuted in and out like the training job does."""
    mesh = small_mesh(mesh_shape)
    ring = rules.ring_size(strategy, mesh_shape)
    kw = {"block_q": BLOCK, "block_kv": BLOCK} | attention_kw

    def f(q, k, v):
        if layout == "zigzag":
            q, k, v = (to_zigzag(x, ring) for x in (q, k, v))
        out = attention(q, k, v, strategy=strategy, mesh=mesh, causal=causal, layout=layout, **kw)
        return from_zigzag(out, ring) if layout == "zigzag" else out

    return f, mesh


def out_and_grads(f, q, k, v, ct):
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(ct))


@partial(jax.jit, static_argnames="causal")
def reference(q, k, v, ct, causal=True):
    f32 = lambda x: x.astype(jnp.float32)
    fn = lambda q, k, v: reference_attention(q, k, v, causal=causal)
    return out_and_grads(fn, f32(q), f32(k), f32(v), f32(ct))


def check(strategy, mesh_shape, B, L, H, K, D, *, layout="contiguous", causal=True, dtype=jnp.float32):
    """Compile forward+backward once, check the collective is in the HLO, compare with the reference."""
    f, _ = natural_order_fn(strategy, mesh_shape, layout=layout, causal=causal)
    q, k, v, ct = make_inputs(B, L, H, K, D, dtype)
    compiled = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct)).lower(q, k, v, ct).compile()
    text = compiled.as_text()
    for coll in strategies.get(
        strategy
    ).collectives:  # a silently disabled CP would still give the right numbers
        assert coll in text, f"{strategy}: no {coll} in the compiled HLO"
    got = compiled(q, k, v, ct)
    want = reference(q, k, v, ct, causal)
    tol = FP32_TOL if dtype == jnp.float32 else BF16_TOL
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape
        err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)))
        assert err < tol, f"{strategy} {mesh_shape} {layout}: {name} max abs error {err:.2e} >= {tol}"


# (mesh, B, L, Hq, Hkv, D): per P one MHA and/or one GQA combo, incl. Hkv < P for Ulysses.
CASES = [
    ("all_gather", {"context": 2}, 2, 64, 4, 4, 16, "contiguous"),
    ("all_gather", {"context": 4}, 1, 128, 4, 2, 8, "contiguous"),
    ("all_gather", {"context": 8}, 1, 128, 8, 2, 8, "zigzag"),
    ("ring", {"context": 2}, 2, 64, 4, 4, 16, "zigzag"),
    ("ring", {"context": 4}, 1, 128, 4, 2, 8, "zigzag"),
    ("ring", {"context": 8}, 1, 128, 4, 1, 8, "zigzag"),
    ("ring", {"context": 4}, 1, 128, 4, 2, 8, "contiguous"),
    ("ring", {"context": 8}, 1, 128, 2, 2, 8, "contiguous"),
    ("ulysses", {"context": 2}, 2, 64, 4, 4, 16, "contiguous"),
    ("ulysses", {"context": 4}, 1, 128, 8, 2, 8, "zigzag"),  # Hkv < P: KV heads replicated
    ("ulysses", {"context": 8}, 1, 128, 8, 4, 8, "contiguous"),  # Hkv < P
    ("usp", {"context": 2, "context_ulysses": 2}, 1, 128, 4, 2, 8, "zigzag"),
    ("usp", {"context": 4, "context_ulysses": 2}, 1, 128, 4, 1, 8, "zigzag"),  # Hkv < U
    ("usp", {"context": 2, "context_ulysses": 4}, 1, 128, 8, 8, 8, "contiguous"),
    ("double_ring", {"context": 2, "context_ulysses": 4}, 1, 128, 4, 1, 8, "zigzag"),  # via the registry
]


@pytest.mark.parametrize(
    "strategy,mesh_shape,B,L,H,K,D,layout",
    CASES,
    ids=lambda x: "x".join(map(str, x.values())) if isinstance(x, dict) else None,
)
def test_matches_reference_causal_fp32(strategy, mesh_shape, B, L, H, K, D, layout):
    check(strategy, mesh_shape, B, L, H, K, D, layout=layout)


@pytest.mark.parametrize(
    "strategy,mesh_shape",
    [
        pytest.param("all_gather", {"context": 4}, marks=pytest.mark.slow),
        ("ring", {"context": 4}),
        pytest.param("ulysses", {"context": 4}, marks=pytest.mark.slow),
        ("usp", {"context": 2, "context_ulysses": 2}),
    ],
)
def test_matches_reference_non_causal(strategy, mesh_shape):
    check(
        strategy,
        mesh_shape,
        1,
        64,
        4,
        2,
        8,
        layout="zigzag" if strategy == "ring" else "contiguous",
        causal=False,
    )


@pytest.mark.parametrize(
    "strategy,mesh_shape",
    [
        ("ring", {"data": 2, "context": 2, "tensor": 2}),
        pytest.param(
            "usp",
            {"data": 1, "fsdp": 2, "context": 2, "context_ulysses": 2, "tensor": 1},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_full_mesh_inside_outer_jit(strategy, mesh_shape):
    """Batch over data/fsdp, heads over tensor, inputs as NamedSharding'd arrays into one outer jit."""
    mesh = small_mesh(mesh_shape)
    q, k, v, ct = make_inputs(2, 64, 4, 2, 8)
    sharding = NamedSharding(mesh, qkv_spec(mesh, strategy))
    q, k, v = (jax.device_put(x, sharding) for x in (q, k, v))

    @jax.jit
    def step(q, k, v, ct):
        f = lambda q, k, v: attention(
            q, k, v, strategy=strategy, mesh=mesh, layout="zigzag", block_q=BLOCK, block_kv=BLOCK
        )
        return out_and_grads(f, q, k, v, ct)

    ring = rules.ring_size(strategy, mesh_shape)
    ct_zigzag = to_zigzag(ct, ring)
    got = step(*(to_zigzag(x, ring) for x in (q, k, v)), ct_zigzag)
    want = reference(q, k, v, ct)
    for g, w in zip(got, want, strict=True):
        assert float(jnp.max(jnp.abs(from_zigzag(g, ring) - w))) < FP32_TOL


@pytest.mark.parametrize(
    "strategy,mesh_shape,layout",
    [
        ("ring", {"context": 4}, "zigzag"),
        pytest.param("usp", {"context": 2, "context_ulysses": 2}, "zigzag", marks=pytest.mark.slow),
    ],
)
def test_bf16_close_to_fp32_reference(strategy, mesh_shape, layout):
    check(strategy, mesh_shape, 1, 128, 4, 2, 16, layout=layout, dtype=jnp.bfloat16)


@pytest.mark.parametrize(
    "strategy,mesh_shape,layout",
    [
        ("ring", {"context": 4}, "zigzag"),
        ("ring", {"context": 4}, "contiguous"),
        ("usp", {"context": 2, "context_ulysses": 2}, "zigzag"),
        ("double_ring", {"context": 2, "context_ulysses": 2}, "zigzag"),
        pytest.param("all_gather", {"context": 4}, "contiguous", marks=pytest.mark.slow),
        pytest.param("ulysses", {"context": 4}, "zigzag", marks=pytest.mark.slow),
    ],
)
def test_causality_through_gradients(strategy, mesh_shape, layout):
    """d out[t] / d k[s], d v[s] is exactly zero for every s > t (natural order)."""
    f, _ = natural_order_fn(strategy, mesh_shape, layout=layout)
    q, k, v, _ = make_inputs(1, 64, 4, 2, 8)
    grads = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))
    for t in (0, 21, 40, 63):
        ct = jnp.zeros(q.shape).at[:, t].set(1.0)
        _, _, dk, dv = grads(q, k, v, ct)
        for d in (dk, dv):
            assert float(jnp.max(jnp.abs(d[:, t + 1 :]), initial=0.0)) == 0.0, (
                f"{strategy}: future keys leak into t={t}"
            )
        assert float(jnp.max(jnp.abs(dv[:, : t + 1]))) > 0.0  # (dk[0] is 0 at t=0: one key, flat softmax)


def test_eager_call_outside_jit():
    """No outer jit: shard_map runs eagerly on unsharded inputs."""
    mesh = small_mesh({"context": 2})
    q, k, v, ct = make_inputs(1, 64, 4, 2, 8)
    out = attention(q, k, v, strategy="ring", mesh=mesh, block_q=BLOCK, block_kv=BLOCK)
    assert float(jnp.max(jnp.abs(out - reference(q, k, v, ct)[0]))) < FP32_TOL


@pytest.mark.parametrize(
    "strategy,mesh_shape,L,H,K,layout,match",
    [
        (
            "ring",
            {"context": 8},
            1000,
            4,
            4,
            "zigzag",
            r"1000 % 16 = 8; use a multiple of 16 or layout=contiguous",
        ),
        ("usp", {"context": 4, "context_ulysses": 1}, 36, 4, 4, "zigzag", r"36 % 8 = 4"),
        ("ulysses", {"context": 4}, 64, 6, 2, "contiguous", r"q_heads/tensor = 6 % 4 = 2"),
        ("ulysses", {"context": 2}, 64, 3, 3, "contiguous", r"q_heads/tensor = 3 % 2 = 1"),
        ("ring", {"context": 2}, 64, 4, 3, "contiguous", r"q_heads % kv_heads"),
        ("spiral", {"context": 2}, 64, 4, 4, "contiguous", r"unknown attention strategy 'spiral'"),
    ],
)
def test_bad_inputs_raise_value_error(strategy, mesh_shape, L, H, K, layout, match):
    """The data plane raises exactly what jobs.strategies.rules (the planner) raises, before compiling anything."""
    mesh = small_mesh(mesh_shape)
    q, k, v, _ = make_inputs(1, L, H, K, 8)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, strategy=strategy, mesh=mesh, layout=layout)


def test_kernel_registry_errors():
    mesh = small_mesh({"context": 2})
    q, k, v, _ = make_inputs(1, 64, 4, 4, 8)
    with pytest.raises(ValueError, match="unknown attention kernel"):
        attention(q, k, v, strategy="ring", mesh=mesh, kernel="cudnn9")
    with pytest.raises(ValueError, match="must share batch"):
        attention(q, k[:, :32], v[:, :32], strategy="ring", mesh=mesh)


def test_merge_of_two_empty_rows_is_not_nan():
    from jobs.attention.core import empty_like, merge

    o, lse = empty_like(jnp.ones((1, 2, 1, 4)), jnp.ones((1, 2, 1)))
    o2, lse2 = merge(o, lse, o, lse)
    assert not bool(jnp.isnan(o2).any()) and bool(jnp.isneginf(lse2).all())
    o3, lse3 = merge(o, lse, jnp.ones((1, 2, 1, 4)), jnp.zeros((1, 2, 1)))
    assert jnp.allclose(o3, 1.0) and jnp.allclose(lse3, 0.0)
