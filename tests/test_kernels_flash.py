"""GPU flash (cuDNN) kernel: the private API it binds is where the adapter expects it (any host), and
fwd + dQ/dK/dV parity under ring and ulysses on a GPU (skipped when none is present)."""

import logging

import jax
import jax.extend.core
import jax.numpy as jnp
import pytest

from jobs.attention import attention
from jobs.attention.kernels import flash
from jobs.attention.kernels.mask import Mask
from tests.test_attention import BF16_TOL, make_inputs, out_and_grads, reference

HAS_GPU = jax.default_backend() == "gpu"


def test_private_api_shape():
    """Fails loudly when jax moves what jobs/attention/kernels/flash.py binds."""
    assert flash.api_drift() == {}


def test_falls_back_to_xla_where_cudnn_cannot_run(caplog):
    """fp32 (no cuDNN flash path) is the xla kernel, exactly; the reason is logged once and kept."""
    q, k, v, _ = make_inputs(1, 64, 4, 2, 16)
    pos = jnp.arange(64)
    mask = Mask(pos, pos, causal=True, block_q=16, block_kv=16)
    flash.FALLBACKS.clear()
    with caplog.at_level(logging.WARNING, logger=flash.__name__):
        got = flash.flash_fwd(q, k, v, mask)
        flash.flash_fwd(q, k, v, mask)
    want = flash.xla_fwd(q, k, v, mask)
    for a, b in zip(got, want, strict=True):
        assert float(jnp.max(jnp.abs(a - b))) == 0.0
    why = "float32 inputs (cuDNN flash is bf16/fp16 only)"
    assert list(flash.FALLBACKS) == [why]
    assert [r.getMessage() for r in caplog.records] == [
        f"flash attention kernel: {why}; running the xla kernel"
    ]


def test_every_refusal_has_its_reason():
    """What cuDNN cannot run, each in words: the reason the start record and the trial's tag carry."""
    bf = [x.astype(jnp.bfloat16) for x in make_inputs(1, 64, 4, 2, 16)[:3]]
    q, k, v = bf
    assert "offset" in flash.refusal(q, k[:, :32], v[:, :32], causal=True)
    assert "packed documents" in flash.refusal(q, k, v, causal=False, segmented=True)
    if not HAS_GPU:  # here cuDNN's own check refuses: no cuDNN on a CPU host
        assert flash.refusal(q, k, v, causal=True).startswith("cuDNN refuses it: ")
    wide = jnp.zeros((1, 64, 4, 512), jnp.bfloat16)  # head_dim 512: over any GPU's cuDNN limit
    assert flash.refusal(wide, wide, wide, causal=True).startswith("cuDNN refuses it: ")


def test_a_trial_reports_its_kernel_fallback():
    """kernel=flash off a GPU: the trial runs (the xla kernel) and its start record says why."""
    from jobs.train import train
    from orchestrator.config.grid import expand
    from orchestrator.config.load import load

    args = [
        "model=tiny",
        "strategy=ring",
        "strategy.kernel=flash",
        "context_length=256",
        "train.steps=1",
        "train.dtype=bfloat16",
        "cluster=local",
    ]
    (spec,) = expand(load(args))
    start = next(r.to_dict() for r in train(spec) if r.kind == "start")
    if HAS_GPU:
        assert start.get("kernel_fallbacks") is None  # bf16, even blocks: cuDNN takes every hop
    else:
        assert start["kernel_fallbacks"] and start["kernel_fallbacks"][0].startswith("cuDNN refuses it: ")


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
