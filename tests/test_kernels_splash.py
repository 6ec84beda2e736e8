"""Splash (Pallas TPU) kernel under every CP strategy, in Pallas interpret mode on simulated CPU devices.

Parity with the dense reference (forward and dQ/dK/dV, fp32, 2e-5) like tests/test_attention.py does for the
xla kernel; the xla fallback is disabled so a silently skipped splash would fail. Splash tiles in multiples of
128 tokens, so local lengths here are 128 or 256 and head counts small (interpret mode is slow on 2 cores).
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs.attention import attention, reference_attention
from jobs.attention.kernels import splash
from jobs.attention.kernels.mask import MONOTONIC, Mask
from jobs.mesh import small_mesh
from tests.test_attention import FP32_TOL, make_inputs, natural_order_fn, out_and_grads, reference

splash_api = pytest.importorskip("jobs.attention.kernels.splash_private")


def _no_fallback(*args, **kwargs):
    raise AssertionError("splash fell back to the xla kernel: the test shapes do not exercise splash")


def check_splash(monkeypatch, strategy, mesh_shape, B, L, H, K, D, layout, block=128):
    monkeypatch.setattr(splash, "xla_fwd", _no_fallback)
    monkeypatch.setattr(splash, "xla_bwd", _no_fallback)
    f, _ = natural_order_fn(
        strategy, mesh_shape, layout=layout, kernel="splash", block_q=block, block_kv=block
    )
    q, k, v, ct = make_inputs(B, L, H, K, D)
    got = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))(q, k, v, ct)
    want = reference(q, k, v, ct, True)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < FP32_TOL, f"splash {strategy} {mesh_shape} {layout}: {name} max abs error {err:.2e}"


def test_private_api_shape():
    """Fails loudly when jax moves the private splash backward this project's adapter calls."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    params = list(inspect.signature(sk._splash_attention_bwd).parameters)
    assert params == [
        "save_residuals",
        "mask_value",
        "is_mqa",
        "block_sizes",
        "residual_checkpoint_name",
        "mask_function",
        "attn_logits_soft_cap",
        "interpret",
        "res",
        "do",
    ], params
    kern = splash_api.make("causal", 0, (128, 128), 2, 128, 128, True)
    assert {
        "mask_value",
        "is_mqa",
        "block_sizes",
        "mask_function",
        "attn_logits_soft_cap",
        "interpret",
    } <= set(kern.kwargs)


def test_single_call_matches_reference():
    """One causal call, GQA, against the dense reference: out, lse and the three gradients."""
    q, k, v, do = make_inputs(1, 256, 4, 2, 16)
    pos = jnp.arange(256)
    mask = Mask(pos, pos, causal=True, block_q=128, block_kv=128)
    o, lse = splash.splash_fwd(q, k, v, mask)
    want = reference_attention(q, k, v)
    assert float(jnp.max(jnp.abs(o - want))) < FP32_TOL
    got = splash.splash_bwd(q, k, v, o, lse, do, mask)
    _, vjp = jax.vjp(lambda q, k, v: reference_attention(q, k, v), q, k, v)
    for g, w in zip(got, vjp(do), strict=True):
        assert float(jnp.max(jnp.abs(g - w))) < FP32_TOL


# (strategy, mesh, B, L, Hq, Hkv, D, layout): P in {2, 4}, MHA and GQA; every splash call's length is a
# multiple of 128 (zigzag ring hops use half blocks: L/(2R) >= 128).
CASES = [
    ("all_gather", {"context": 2}, 1, 256, 2, 2, 16, "contiguous"),
    pytest.param("all_gather", {"context": 4}, 1, 1024, 4, 2, 16, "zigzag", marks=pytest.mark.slow),
    ("ulysses", {"context": 2}, 1, 256, 2, 2, 16, "contiguous"),
    pytest.param("ulysses", {"context": 4}, 1, 512, 4, 2, 16, "zigzag", marks=pytest.mark.slow),
    ("ring", {"context": 2}, 1, 512, 2, 2, 16, "zigzag"),
    pytest.param("ring", {"context": 4}, 1, 512, 4, 2, 16, "contiguous", marks=pytest.mark.slow),
    pytest.param("ring", {"context": 4}, 1, 1024, 2, 1, 16, "zigzag", marks=pytest.mark.slow),
    ("usp", {"context": 2, "context_ulysses": 2}, 1, 512, 4, 2, 16, "zigzag"),
    pytest.param(
        "usp", {"context": 1, "context_ulysses": 2}, 1, 256, 2, 2, 16, "contiguous", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize(
    "strategy,mesh_shape,B,L,H,K,D,layout",
    CASES,
    ids=lambda x: "x".join(map(str, x.values())) if isinstance(x, dict) else None,
)
def test_splash_matches_reference_causal_fp32(monkeypatch, strategy, mesh_shape, B, L, H, K, D, layout):
    check_splash(monkeypatch, strategy, mesh_shape, B, L, H, K, D, layout)


@pytest.mark.parametrize("strategy,L", [("ring", 512), ("ulysses", 64)])
def test_auto_is_xla_on_cpu(strategy, L):
    """kernel=auto (the default) traces the TPU branch too, but a CPU compile keeps only xla's: same numbers."""
    mesh = small_mesh({"context": 2})
    q, k, v, ct = make_inputs(1, L, 2, 2, 16)

    def run(kernel):
        f = lambda q, k, v: attention(
            q, k, v, strategy=strategy, mesh=mesh, kernel=kernel, block_q=128, block_kv=128
        )
        return jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))(q, k, v, ct)

    for a, b in zip(run("auto"), run("xla"), strict=True):
        assert float(jnp.max(jnp.abs(a - b))) == 0.0


@pytest.mark.parametrize("dkv", [False, True], ids=["fwd", "dkv"])
@pytest.mark.parametrize(
    "q_len,kv_len,block,offset",
    [(2048, 2048, 256, 0), (1024, 2048, 256, 512), (2048, 2048, 512, -512), (1024, 4096, 256, 1024)],
)
def test_block_masks_give_jax_block_map(q_len, kv_len, block, offset, dkv):
    """The cheap block masks yield exactly the block map (every MaskInfo array, dtype included) jax builds
    from its own CausalMask / FullMask / LocalMask (a 300-key window)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    def info(mask):
        return mi._process_mask(sm.MultiHeadMask([mask] * 2), (block, block), dkv)

    pairs = [
        (
            sm.CausalMask((q_len, kv_len), offset=offset),
            splash_api.BlockCausalMask((q_len, kv_len), offset=offset),
        ),
        (sm.FullMask((q_len, kv_len)), splash_api.BlockFullMask((q_len, kv_len))),
        (
            sm.LocalMask((q_len, kv_len), window_size=(299, 0), offset=offset),
            splash_api.BlockLocalMask((q_len, kv_len), window_size=(299, 0), offset=offset),
        ),
    ]
    for stock, cheap in pairs:
        (want, want_fn), (got, got_fn) = info(stock), info(cheap)
        assert (want_fn is None) == (got_fn is None)
        for field in want._fields:
            w, g = getattr(want, field), getattr(got, field)
            if isinstance(w, np.ndarray):
                assert w.dtype == g.dtype and np.array_equal(w, g), (type(stock).__name__, field)
            else:
                assert w == g, (type(stock).__name__, field)
        assert int((want.block_mask == 1).sum()) > 0 or isinstance(stock, sm.FullMask)


def test_long_hops_grow_blocks_instead_of_falling_back():
    """usp at 14M on tpu7x_128 attends 458,752-token hops: 802,816 512-blocks exceed the block-map budget, so
    the plan grows key blocks to 2048 (200,704 entries) rather than running the xla kernel; query blocks stay
    512 (VMEM); past 2048-key blocks it falls back."""
    plan = splash._plan(458_752, 458_752, True, MONOTONIC, 512, 512)
    assert plan is not None and plan.block_kv == 2048 and plan.blocks_q == (512,)
    assert splash._plan(114_688, 114_688, True, MONOTONIC, 512, 512).block_kv == 512  # ring: unchanged
    assert splash._plan(1_048_576, 1_048_576, True, MONOTONIC, 512, 512) is None


# A window or chunk under the strategies whose calls hold the whole sequence: splash's own LocalMask /
# ChunkedCausalMask (window 100 and chunk 128 cut across the 128-token blocks and, zigzag, the reordering).
@pytest.mark.parametrize(
    "strategy,mesh_shape,layout,span",
    [
        ("ulysses", {"context": 2}, "contiguous", {"window": 100}),
        ("ulysses", {"context": 2}, "zigzag", {"window": 100}),
        ("ulysses", {"context": 2}, "contiguous", {"chunk": 128}),
        ("none", {}, "contiguous", {"window": 100, "sinks": True}),
    ],
    ids=str,
)
def test_splash_runs_windows_and_chunks_over_whole_sequences(monkeypatch, strategy, mesh_shape, layout, span):
    monkeypatch.setattr(splash, "xla_fwd", _no_fallback)
    monkeypatch.setattr(splash, "xla_bwd", _no_fallback)
    span = dict(span)
    sinks = jnp.linspace(-1.0, 1.0, 4) if span.pop("sinks", False) else None
    f, _ = natural_order_fn(
        strategy, mesh_shape, layout=layout, kernel="splash", block_q=128, block_kv=128, sinks=sinks, **span
    )
    q, k, v, ct = make_inputs(1, 512, 4, 2, 16)
    got = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))(q, k, v, ct)
    dense = lambda q, k, v: reference_attention(q, k, v, sinks=sinks, **span)
    want = out_and_grads(dense, q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < FP32_TOL, f"splash {strategy} {layout} {span}: {name} max abs error {err:.2e}"


def test_splash_refuses_a_window_where_the_mask_moves_with_a_hop():
    q, k, v, _ = make_inputs(1, 256, 2, 2, 16)
    f, _ = natural_order_fn("ring", {"context": 2}, kernel="splash", block_q=128, block_kv=128, window=64)
    with pytest.raises(ValueError, match="only under ulysses or none"):
        f(q, k, v)


@pytest.mark.parametrize("span", [{"window": 20}, {"chunk": 32}], ids=str)
def test_a_length_splash_cannot_tile_falls_back_to_xla_with_its_window(span):
    """96 tokens are no multiple of 128: splash hands the call to the xla kernel, which must keep the window or
    chunk (it once ran plain causal attention there: max error 1.23)."""
    f, _ = natural_order_fn("none", {}, kernel="splash", block_q=128, block_kv=128, **span)
    q, k, v, ct = make_inputs(1, 96, 4, 2, 16)
    got = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))(q, k, v, ct)
    want = out_and_grads(lambda q, k, v: reference_attention(q, k, v, **span), q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < FP32_TOL, f"splash fallback {span}: {name} max abs error {err:.2e}"
