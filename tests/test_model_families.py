"""Model families beyond one causal mask: the per-layer attention pattern (sliding windows, chunks, NoPE),
sinks, QK-norm; the sourced Gemma 3 and Qwen3 configs; existing trial ids unchanged.

Cheap on purpose: tiny shapes, two CP compiles (a windowed pattern under ring, sinks with chunks under
ulysses), the masks checked through gradients of a one-device forward."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs import flops
from jobs.mesh import make_mesh
from jobs.model import forward, init_params, layers_in_pattern
from jobs.spec import MeshSpec, ModelSpec, StrategySpec
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import ConfigError, load


def spec_of(*overrides: str):
    return expand(load(list(overrides)))[0]


# Measured before the layer pattern existed (commit a06e943): the new model keys at their defaults stay out.
IDS = {
    ("model=tiny",): "40dadaf211279009",
    ("model=llama3_1_8b", "context_length=131072", "cluster=tpu7x_128"): "698d51e319bccc29",
    (
        "model=llama3_1_8b_long",
        "context_length=1048576",
        "cluster=tpu7x_128",
        "strategy=usp",
    ): "f5952150f60cadb5",
    ("model=llama3_1_70b", "context_length=131072", "cluster=v5p_128"): "0dd854bf683be424",
    ("model=tiny", "strategy=ulysses", "train.dtype=float32"): "80183a3ba2c280e6",
}


@pytest.mark.parametrize("overrides", list(IDS))
def test_existing_trial_ids_are_unchanged(overrides):
    spec = spec_of(*overrides)
    assert spec.trial_id == IDS[overrides]
    assert (
        spec_of(*overrides, "model.sinks=true").trial_id != spec.trial_id
    )  # a new key off its default enters


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ["model.attention_pattern=[local,global]", "model.window=8", "model.layers=3"],
            "model.attention_pattern=['local', 'global'] has 2 layer types, which do not divide model.layers=3",
        ),
        (["model.attention_pattern=[local,global]"], "model.window=0 is not set but"),
        (["model.attention_pattern=[chunked]"], "model.chunk=0 is not set but"),
        (["model.attention_pattern=[sliding]"], "names 'sliding', not an allowed value"),
        (["model.attention_pattern=[]"], "model.attention_pattern=[] is empty"),
    ],
)
def test_a_bad_layer_pattern_is_one_clear_line_before_launch(overrides, words):
    with pytest.raises(ConfigError) as e:
        spec_of(*overrides)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and "—" in msg, msg


def test_a_partial_pattern_cuts_the_last_repeat_as_hugging_face_does():
    m = spec_of("model=gemma3_27b").model
    assert m.layers == 62 and len(m.layer_types()) == 62
    # Hugging Face's Gemma 3 layer_types: layer i is global iff (i + 1) % 6 == 0
    assert m.layer_types() == tuple("global" if (i + 1) % 6 == 0 else "local" for i in range(62))
    with pytest.raises(ValueError, match="do not divide model.layers=62"):
        dataclasses.replace(m, partial_pattern=False)  # a ModelSpec built in code refuses it too


@pytest.mark.parametrize(
    "name", ["gemma3_1b", "gemma3_4b", "gemma3_27b", "qwen3_0_6b", "qwen3_8b", "qwen3_32b"]
)
def test_sourced_configs_load_with_their_published_sizes(name):
    # parameter counts of the text models as their model cards give them (our count leaves out the post-norms)
    billions = {
        "gemma3_1b": 1.0,
        "gemma3_4b": 3.9,
        "gemma3_27b": 27.0,
        "qwen3_0_6b": 0.6,
        "qwen3_8b": 8.2,
        "qwen3_32b": 32.8,
    }[name]
    m = spec_of(f"model={name}").model
    assert m.n_params() / 1e9 == pytest.approx(billions, rel=0.1)


def test_gemma3_27b_plans_at_128k_on_tpu7x(cli, tmp_path):
    res = cli(["model=gemma3_27b", "cluster=tpu7x_128", "context_length=131072", "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stderr


def test_windowed_flops_follow_maxtext():
    """Hand-computed, MaxText's convention: a window layer counts 4*L*W*Hq*D / 2, a chunked one
    4*(n*C^2 + r^2)*Hq*D / 2, a global one 4*L^2*Hq*D / 2 (forward)."""
    m = ModelSpec("m", vocab=10, embed=8, layers=6, q_heads=2, kv_heads=1, head_dim=4, mlp=16)
    L, Hq, D = 100, 2, 4
    local = dataclasses.replace(m, attention_pattern=("local",) * 5 + ("global",), window=16)
    assert flops.layer_flops(local, L)[1] == 5 * 2 * L * 16 * Hq * D + 1 * 2 * L * L * Hq * D  # 153,600
    chunked = dataclasses.replace(m, attention_pattern=("chunked", "chunked", "global"), chunk=32)
    chunk_work = 3 * 32**2 + 4**2  # 100 = 3 chunks of 32 + one of 4
    assert flops.layer_flops(chunked, L)[1] == 4 * 2 * chunk_work * Hq * D + 2 * 2 * L * L * Hq * D
    assert flops.layer_flops(dataclasses.replace(local, window=1000), L) == flops.layer_flops(m, L)
    assert flops.layer_flops(local, L)[0] == flops.layer_flops(m, L)[0]  # the weights do not change


# --- the masks, through gradients of a one-device forward ------------------------------------------------
L = 32


def _model(pattern: tuple[str, ...], layers: int, **kw) -> ModelSpec:
    base = ModelSpec("t", vocab=L, embed=16, layers=layers, q_heads=2, kv_heads=1, head_dim=8, mlp=32)
    return dataclasses.replace(base, attention_pattern=pattern, **kw)


def _seen(model: ModelSpec, p: int) -> np.ndarray:
    """Positions whose token moves the hidden state at position p: tokens 0..L-1, one per position, so the
    embedding table's gradient row t is position t's."""
    mesh = make_mesh(MeshSpec(), jax.devices()[:1])
    params = init_params(model, jax.random.key(0))
    tokens = jnp.arange(L, dtype=jnp.int32)[None]
    kw = dict(model=model, strategy=StrategySpec("none"), mesh=mesh, dtype=jnp.float32, remat="none")

    def out_at_p(table):
        return forward({**params, "embed": table}, tokens, tokens, **kw)[0, p].sum()

    g = jax.jit(jax.grad(out_at_p))(params["embed"])
    return np.flatnonzero(np.abs(np.asarray(g)).sum(-1) > 0)


@pytest.mark.parametrize(
    ("pattern", "layers", "kw", "seen"),
    [
        (("local",), 1, {"window": 5}, range(16, 21)),  # W counts the query: p-W+1 .. p
        (("local",), 2, {"window": 5}, range(12, 21)),  # two windowed layers reach 2(W-1) back
        (("chunked",), 1, {"chunk": 8}, range(16, 21)),  # its own chunk 16..23, up to p
        (("local", "global"), 2, {"window": 5}, range(0, 21)),  # the global layer sees everything before
        (("global",), 1, {"global_rope": False, "sinks": True, "qk_norm": True}, range(0, 21)),
    ],
)
def test_each_layer_applies_its_own_mask(pattern, layers, kw, seen):
    assert list(_seen(_model(pattern, layers, **kw), 20)) == list(seen)


def test_a_partial_repeat_runs_the_same_layers_as_a_loop():
    """layers_in_pattern: scan over whole repeats, the cut repeat unrolled = each layer i by steps[i % K]."""
    steps = [lambda x, p, c=c: (x * p["w"] + c, None) for c in (1.0, 10.0)]
    stacked = {"w": jnp.arange(1.0, 6.0)}  # 5 layers over a 2-layer pattern
    x = jnp.float32(1.0)
    want = x
    for i in range(5):
        want = steps[i % 2](want, {"w": stacked["w"][i]})[0]
    assert layers_in_pattern(steps, x, stacked, 5) == want


# --- the same loss curve with and without CP --------------------------------------------------------------
# MFU is no concern here: a given peak spares each run the CPU matmul probe
CURVE = [
    "context_length=128",
    "train.steps=3",
    "train.dtype=float32",
    "train.lr=1e-2",
    "cluster.peak_tflops_per_device=1",
]
ONE_DEVICE = ["strategy=none", "cluster.devices_per_host=1", "train.remat=none"]


@functools.cache
def losses(*overrides: str) -> list[float]:
    return [r.to_dict()["loss"] for r in train(spec_of(*overrides, *CURVE)) if r.to_dict()["kind"] == "step"]


@pytest.mark.parametrize(
    ("family", "cp"),
    [
        # windows of 32 over 16 tokens per device: each local layer reaches 2-3 shards back; QK-norm, GeGLU, tied
        # and scaled embeddings with them; remat with an offload (checkpoint names inside the pattern's scan
        # body) against no remat at all. Two layers of tiny_gemma's pattern: one of each type, one compile
        (
            ("model=tiny_gemma", "model.layers=2", "model.attention_pattern=[local,global]"),
            ("strategy=ring", "train.remat=full", "train.memory.offload=[layer_input]"),
        ),
        # gpt-oss's sinks with Llama 4's chunks and NoPE global layers
        (
            (
                "model=tiny",
                "model.sinks=true",
                "model.attention_pattern=[chunked,global]",
                "model.chunk=48",
                "model.global_rope=false",
            ),
            ("strategy=ulysses", "train.remat=none"),
        ),
        # a strategy per layer type: the global layer swaps heads (ulysses), the local one rotates K,V over the
        # two ring steps its window reaches (contiguous order, shared by both)
        (
            ("model=tiny_gemma", "model.layers=2", "model.attention_pattern=[local,global]"),
            ("strategy=ulysses", "strategy.local=ring", "strategy.layout=contiguous", "train.remat=none"),
        ),
    ],
)
def test_cp_matches_no_cp(family, cp):
    with_cp = losses(*family, *cp)
    dense = losses(*family, *ONE_DEVICE)
    assert len(with_cp) == 3 and np.isfinite(with_cp).all()
    np.testing.assert_allclose(with_cp, dense, rtol=0, atol=2e-5)  # fp32: reduction order only
    assert with_cp[-1] < with_cp[0]  # it learns: the new parameters get gradients that move the loss


def _collectives(strategy: StrategySpec) -> dict[str, int]:
    """How often each collective appears in the lowered forward of a [local, global] tiny model on 8 devices
    under `strategy`."""
    model = _model(("local", "global"), 2, window=8)
    model = dataclasses.replace(model, q_heads=8, kv_heads=8)
    mesh = make_mesh(MeshSpec(context=8), jax.devices()[:8])
    params = init_params(model, jax.random.key(0))
    tokens = jnp.zeros((1, 64), jnp.int32)
    kw = dict(model=model, strategy=strategy, mesh=mesh, dtype=jnp.float32, remat="none")
    text = jax.jit(lambda p, t: forward(p, t, t, **kw)).lower(params, tokens).as_text()
    return {op: text.count(f"stablehlo.{op}") for op in ("all_to_all", "collective_permute", "all_gather")}


def test_a_strategy_per_layer_type_runs_both_strategies():
    """strategy.local: the local layer's collectives are its strategy's, the global layer's the other's."""
    one = StrategySpec("ulysses", layout="contiguous")
    alone = _collectives(one)
    assert alone["all_to_all"] > 0 and alone["collective_permute"] == 0
    ring = _collectives(dataclasses.replace(one, local="ring"))
    assert 0 < ring["all_to_all"] < alone["all_to_all"] and ring["collective_permute"] > 0  # one layer each
    # all_gather's halo is a collective-permute, no gather of the whole K,V beyond what ulysses alone has
    halo = _collectives(dataclasses.replace(one, local="all_gather"))
    assert halo["all_to_all"] == ring["all_to_all"] and halo["collective_permute"] > 0
    assert halo["all_gather"] == alone["all_gather"]
