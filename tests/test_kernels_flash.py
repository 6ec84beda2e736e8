"""GPU flash (cuDNN) kernel: the private API it binds is where the adapter expects it (any host), and
fwd + dQ/dK/dV parity under ring and ulysses on a GPU (skipped when none is present)."""

import inspect

import jax
import jax.extend.core
import jax.numpy as jnp
import pytest

from jobs.attention import attention, flash_kernel
from tests.test_attention import BF16_TOL, make_inputs, out_and_grads, reference

HAS_GPU = jax.default_backend() == "gpu"


def test_private_api_shape():
    """Fails loudly when jax moves what jobs/attention/flash_kernel.py binds."""
    fa = flash_kernel._fa
    assert fa is not None, "jax._src.cudnn.fused_attention_stablehlo is gone"
    params = inspect.signature(fa.dot_product_attention).parameters
    assert {"scale", "mask_type", "qkv_layout", "return_residual"} <= set(params)
    assert {"CAUSAL", "NO_MASK"} <= set(fa.MaskType.__members__) and fa.AttentionLayout.BTNH.value == 0
    rule = list(inspect.signature(fa._dot_product_attention_bwd_rule).parameters)
    assert rule[:8] == [
        "scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout", "sliding_window_length", "is_training"
    ], rule  # fmt: skip
    assert isinstance(fa._dot_product_attention_bwd_p_wrapper, jax.extend.core.Primitive)


def test_falls_back_to_xla_where_cudnn_cannot_run():
    """fp32 (no cuDNN flash path) is the xla kernel, exactly."""
    q, k, v, _ = make_inputs(1, 64, 4, 2, 16)
    pos = jnp.arange(64)
    got = flash_kernel.flash_fwd(q, k, v, pos, pos, causal=True, block_q=16, block_kv=16)
    want = flash_kernel.xla_fwd(q, k, v, pos, pos, causal=True, block_q=16, block_kv=16)
    for a, b in zip(got, want, strict=True):
        assert float(jnp.max(jnp.abs(a - b))) == 0.0


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (cuDNN)")
@pytest.mark.parametrize(
    "strategy,layout", [("ring", "zigzag"), ("ring", "contiguous"), ("ulysses", "zigzag")]
)
def test_flash_matches_reference_bf16(strategy, layout):
    from jax.sharding import Mesh

    from jobs.attention import from_zigzag, to_zigzag

    n = min(2, len(jax.devices()))
    mesh = Mesh(jax.devices()[:n], ("context",))
    q, k, v, ct = make_inputs(2, 1024, 8, 2, 128, jnp.bfloat16)

    def f(q, k, v):
        q, k, v = (to_zigzag(x, n) for x in (q, k, v)) if layout == "zigzag" else (q, k, v)
        out = attention(q, k, v, strategy=strategy, mesh=mesh, layout=layout, kernel="flash")
        return from_zigzag(out, n) if layout == "zigzag" else out

    got = jax.jit(lambda q, k, v, ct: out_and_grads(f, q, k, v, ct))(q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, reference(q, k, v, ct, True), strict=True):
        err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)))
        assert err < BF16_TOL, f"flash {strategy} {layout}: {name} max abs error {err:.2e}"
