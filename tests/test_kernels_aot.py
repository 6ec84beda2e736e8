"""kernel=splash compiles for real TPU topologies (libtpu on a CPU host, no TPU): ring and usp train steps
lower to the Mosaic kernel (`tpu_custom_call` in the compiled HLO), not the interpreted or xla fallback."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config.load import group_option
from orchestrator.plan import cluster_model

ROOT = Path(__file__).resolve().parent.parent


def conf(group: str, name: str) -> dict:
    return group_option(group, name)


# (strategy, cluster, mesh, kernel): tpu7x 2x2x1 is 4 chips = 8 devices, v5p 2x2x1 is 4 megacore devices.
# kernel=auto (the default) must pick the Mosaic kernel when lowered for TPU from this CPU host.
CASES = [
    ("ring", "tpu7x_128", MeshSpec(context=8), "auto"),
    ("usp", "tpu7x_128", MeshSpec(context=4, context_ulysses=2), "splash"),
    pytest.param("ring", "v5p_128", MeshSpec(context=4), "splash", marks=pytest.mark.slow),
    pytest.param("usp", "v5p_128", MeshSpec(context=2, context_ulysses=2), "auto", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
    "strategy,cluster,mesh,kernel", CASES, ids=lambda x: x.label() if isinstance(x, MeshSpec) else None
)
def test_splash_compiles_to_mosaic(strategy, cluster, mesh, kernel):
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jobs.mesh import make_mesh
    from jobs.step import lower_train_step
    from orchestrator.plan import aot

    c = replace(cluster_model.load(cluster)[0], topology="2x2x1")
    s = replace(StrategySpec(**conf("strategy", strategy)), kernel=kernel, block_q=256, block_kv=256)
    spec = TrialSpec(
        model=ModelSpec(**conf("model", "tiny")),
        mesh=mesh,
        strategy=s,
        context_length=4096,
        train=TrainSpec(remat="full"),
        cluster=c,
    )
    devices = aot.devices(spec)
    assert len(devices) == mesh.size
    text = lower_train_step(spec, make_mesh(spec.mesh, devices)).compile().as_text()
    assert "tpu_custom_call" in text, f"{strategy} kernel={kernel}: no Mosaic kernel in the compiled HLO"
    assert "collective-permute" in text  # the ring is still there


@pytest.mark.parametrize("accel", ["tpu7x", "v5p"])
def test_long_hop_splash_fits_vmem_and_smem(accel):
    """usp's 458,752-token hop at 14M (head dim 256, 4 q heads on 1 KV head): the grown 512 x 2048 blocks
    compile to Mosaic for both chips (2048 x 2048 steps overflow scoped VMEM: 33.4 MB of tpu7x's 32, v5p's 16)."""
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from jobs.attention.kernels import splash
    from jobs.attention.kernels.mask import Mask
    from orchestrator.plan.aot.target import slice_devices

    name, chip = {"tpu7x": ("tpu7x:2x2x1", "default"), "v5p": ("v5:2x2x1", "megacore")}[accel]
    dev = slice_devices(name, chip, (2, 2, 1))[0]
    L, sd = 458_752, SingleDeviceSharding(dev)
    q = jax.ShapeDtypeStruct((1, L, 4, 256), jnp.bfloat16, sharding=sd)
    kv = jax.ShapeDtypeStruct((1, L, 1, 256), jnp.bfloat16, sharding=sd)
    o = jax.ShapeDtypeStruct((1, L, 4, 256), jnp.float32, sharding=sd)
    lse = jax.ShapeDtypeStruct((1, L, 4), jnp.float32, sharding=sd)
    pos = jax.ShapeDtypeStruct((L,), jnp.int32, sharding=sd)
    mask = lambda p: Mask(p, p, causal=True, block_q=512, block_kv=512)
    fwd = jax.jit(lambda q, k, v, p: splash.splash_fwd(q, k, v, mask(p)))
    bwd = jax.jit(lambda q, k, v, o, lse, do, p: splash.splash_bwd(q, k, v, o, lse, do, mask(p)))
    for f, args in ((fwd, (q, kv, kv, pos)), (bwd, (q, kv, kv, o, lse, q, pos))):
        assert "tpu_custom_call" in f.lower(*args).compile().as_text()


@pytest.mark.parametrize(
    "strategy,mesh", [("ring", MeshSpec(context=8)), ("usp", MeshSpec(context=4, context_ulysses=2))]
)
def test_packed_documents_compile_with_splash_segment_ids(strategy, mesh):
    """A packed-documents train step (segment ids with the tokens, hops skipped by lax.cond) still lowers to
    the Mosaic kernel for tpu7x 2x2x1, ring and usp."""
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jobs.mesh import make_mesh
    from jobs.spec import DataSpec
    from jobs.step import abstract_args, lower_train_step
    from orchestrator.plan import aot

    c = replace(cluster_model.load("tpu7x_128")[0], topology="2x2x1")
    s = replace(StrategySpec(**conf("strategy", strategy)), kernel="auto", block_q=256, block_kv=256)
    spec = TrialSpec(
        model=ModelSpec(**conf("model", "tiny")),
        mesh=mesh,
        strategy=s,
        context_length=4096,
        train=TrainSpec(remat="full", data=DataSpec(kind="documents", sources=("corpus",))),
        cluster=c,
    )
    m = make_mesh(spec.mesh, aot.devices(spec))
    assert "segment_ids" in abstract_args(spec, m)[1]
    text = lower_train_step(spec, m).compile().as_text()
    assert "tpu_custom_call" in text and "collective-permute" in text, strategy


def test_a_window_under_ulysses_compiles_to_splash_local_masks(monkeypatch):
    """A Gemma 3-style step (a window-32 local layer, a global one, sinks) under ulysses with kernel=splash:
    both layers lower to the Mosaic kernel (the local one with splash's LocalMask), none to the xla fallback."""
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jobs.attention.kernels import splash
    from jobs.mesh import make_mesh
    from jobs.step import lower_train_step
    from orchestrator.plan import aot
    from tests.test_pattern_aot import gemma_spec

    def no_fallback(*args, **kwargs):
        raise AssertionError("splash fell back to the xla kernel")

    monkeypatch.setattr(splash, "xla_fwd", no_fallback)
    monkeypatch.setattr(splash, "xla_bwd", no_fallback)
    spec = gemma_spec("ulysses", MeshSpec(context=8))
    spec = replace(spec, strategy=replace(spec.strategy, kernel="splash"))
    text = lower_train_step(spec, make_mesh(spec.mesh, aot.devices(spec))).compile().as_text()
    assert "tpu_custom_call" in text and "all-to-all" in text
