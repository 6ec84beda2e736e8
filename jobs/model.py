"""A Llama-family dense decoder (RMSNorm, RoPE, GQA, SwiGLU) as pure functions over a parameter tree.

Layers are stacked and scanned so compile time does not grow with depth; attention goes through the
context-parallel library, so the same model runs with every strategy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.attention import attention
from jobs.mesh import BATCH_AXES, activation_spec
from jobs.spec import ModelSpec, StrategySpec

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_attn": jax.checkpoint_policies.save_only_these_names("attn_out"),
}


def init_params(model: ModelSpec, key: jax.Array) -> dict:
    """fp32 parameters; the layer dimension leads every per-layer array."""
    E, N, Hq, Hkv, D, M, V = (
        model.embed, model.layers, model.q_heads, model.kv_heads, model.head_dim, model.mlp, model.vocab,
    )  # fmt: skip
    ks = jax.random.split(key, 9)

    def normal(k, shape, fan_in):
        return jax.random.normal(k, shape, jnp.float32) * fan_in**-0.5

    return {
        "embed": normal(ks[0], (V, E), 1.0),
        "layers": {
            "attn_norm": jnp.ones((N, E), jnp.float32),
            "wq": normal(ks[1], (N, E, Hq, D), E),
            "wk": normal(ks[2], (N, E, Hkv, D), E),
            "wv": normal(ks[3], (N, E, Hkv, D), E),
            "wo": normal(ks[4], (N, Hq, D, E), Hq * D),
            "mlp_norm": jnp.ones((N, E), jnp.float32),
            "w_gate": normal(ks[5], (N, E, M), E),
            "w_up": normal(ks[6], (N, E, M), E),
            "w_down": normal(ks[7], (N, M, E), M),
        },
        "final_norm": jnp.ones((E,), jnp.float32),
        "unembed": normal(ks[8], (E, V), E),
    }


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w).astype(x.dtype)


def rope(x_BxLxHxD: jax.Array, pos_BxL: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding from true positions (zigzag-permuted batches carry their own positions)."""
    D = x_BxLxHxD.shape[-1]
    freq = theta ** (-jnp.arange(0, D, 2, dtype=jnp.float32) / D)
    ang_BxLxF = pos_BxL[..., None].astype(jnp.float32) * freq
    cos, sin = jnp.cos(ang_BxLxF)[:, :, None, :], jnp.sin(ang_BxLxF)[:, :, None, :]
    x1, x2 = jnp.split(x_BxLxHxD.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxD.dtype)


def forward(
    params: dict,
    tokens_BxL: jax.Array,
    pos_BxL: jax.Array,
    *,
    model: ModelSpec,
    strategy: StrategySpec,
    mesh: Mesh,
    dtype: jnp.dtype,
    remat: str,
) -> jax.Array:
    """Logits [B, L, V] in fp32, sequence-sharded like the input."""
    act = NamedSharding(mesh, activation_spec(strategy.name))
    seq = activation_spec(strategy.name)[1]
    heads = NamedSharding(mesh, P(BATCH_AXES, seq, "tensor" if mesh.shape["tensor"] > 1 else None, None))
    constrain = jax.lax.with_sharding_constraint

    x = constrain(params["embed"].astype(dtype)[tokens_BxL], act)

    def layer(x_BxLxE, p):
        h = rms_norm(x_BxLxE, p["attn_norm"], model.norm_eps)
        q = constrain(jnp.einsum("ble,ehd->blhd", h, p["wq"].astype(dtype)), heads)
        k = constrain(jnp.einsum("ble,ehd->blhd", h, p["wk"].astype(dtype)), heads)
        v = constrain(jnp.einsum("ble,ehd->blhd", h, p["wv"].astype(dtype)), heads)
        q, k = rope(q, pos_BxL, model.rope_theta), rope(k, pos_BxL, model.rope_theta)
        o = attention(
            q, k, v,
            strategy=strategy.name, mesh=mesh, causal=True, layout=strategy.layout,
            kernel=strategy.kernel, block_q=strategy.block_q, block_kv=strategy.block_kv,
        )  # fmt: skip
        o = jax.ad_checkpoint.checkpoint_name(o, "attn_out")
        x_BxLxE = constrain(x_BxLxE + jnp.einsum("blhd,hde->ble", o, p["wo"].astype(dtype)), act)
        h = rms_norm(x_BxLxE, p["mlp_norm"], model.norm_eps)
        g = jnp.einsum("ble,em->blm", h, p["w_gate"].astype(dtype))
        u = jnp.einsum("ble,em->blm", h, p["w_up"].astype(dtype))
        y = jnp.einsum("blm,me->ble", jax.nn.silu(g) * u, p["w_down"].astype(dtype))
        return constrain(x_BxLxE + y, act), None

    if remat != "none":
        layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=False)
    x, _ = jax.lax.scan(layer, x, params["layers"])
    x = rms_norm(x, params["final_norm"], model.norm_eps)
    return jnp.einsum("ble,ev->blv", x, params["unembed"].astype(dtype)).astype(jnp.float32)


def loss_fn(params: dict, batch: dict, **kw) -> tuple[jax.Array, jax.Array]:
    """Mean masked next-token cross-entropy and the number of counted tokens."""
    logits = forward(params, batch["tokens"], batch["positions"], **kw)
    logz = jax.nn.logsumexp(logits, axis=-1)
    gold = jnp.take_along_axis(logits, batch["targets"][..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = batch["mask"].astype(jnp.float32)
    n = jnp.maximum(mask.sum(), 1.0)
    return ((logz - gold) * mask).sum() / n, n
