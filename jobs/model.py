"""A dense decoder (RMSNorm, RoPE, GQA, gated MLP; Llama, Gemma 3, Qwen3): pure functions over a param tree.

Layers are stacked and scanned so compile time does not grow with depth (a repeating pattern of layer types:
the scan runs over the pattern's repeats, its layers unrolled inside); attention goes through the
context-parallel library, so the same model runs with every strategy and every layer type's mask.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs import strategies, tuning
from jobs.attention import attention
from jobs.data.buckets import position_buckets
from jobs.mesh import activation_spec, param_specs, token_spec
from jobs.spec import REMAT_PRESETS, MemorySpec, ModelSpec, StrategySpec, loss_chunk_tokens, residuals
from jobs.strategies.base import BATCH_AXES


def _offload_policy(saved: tuple[str, ...], offloaded: tuple[str, ...]) -> Callable:
    """Save `saved` in HBM and move `offloaded` to pinned host memory between forward and backward."""
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=list(saved),
        names_which_can_be_offloaded=list(offloaded),
        offload_src="device",
        offload_dst="pinned_host",
    )


def _preset_policy(saved: tuple[str, ...], offloaded: tuple[str, ...]) -> Callable:
    """The plainest jax policy for a preset's names (nothing_saveable when it keeps none): the one it has always
    compiled with."""
    if offloaded:
        return _offload_policy(saved, offloaded)
    if saved:
        return jax.checkpoint_policies.save_only_these_names(*saved)
    return jax.checkpoint_policies.nothing_saveable


# jobs.spec owns the preset names and residuals; this maps each to its jax.checkpoint policy ("none": no remat)
REMAT_POLICIES = {"none": None, **{name: _preset_policy(*names) for name, names in REMAT_PRESETS.items()}}
PRESET_ONLY = MemorySpec()  # train.memory adds nothing to the train.remat preset


def remat_policy(remat: str, memory: MemorySpec = PRESET_ONLY) -> Callable | None:
    """The layer's jax.checkpoint policy: the preset's saved / offloaded names plus train.memory's.

    Nothing added: the preset's own policy object, so existing trials trace and compile exactly as before.
    No CPU fallback is needed: jax 0.10's CPU backend has a pinned_host memory space and compiles offloads (host
    and device are the same RAM there, so nothing moves); the losses equal plain remat=full
    (tests/test_memory_policy.py)."""
    if remat == "none":
        if memory.save or memory.offload:
            raise ValueError(
                f"train.memory.save={list(memory.save)} / offload={list(memory.offload)} need a remat policy "
                "but train.remat=none keeps every residual; use train.remat=full with them"
            )
        return None
    if not (memory.save or memory.offload):
        return REMAT_POLICIES[remat]
    saved, offloaded = residuals(remat, memory)
    if both := sorted(set(saved) & set(offloaded)):
        raise ValueError(f"residuals {both} are both saved and offloaded (train.remat={remat}, train.memory)")
    return _offload_policy(saved, offloaded)


def init_params(model: ModelSpec, key: jax.Array) -> dict:
    """fp32 parameters; the layer dimension leads every per-layer array."""
    E, N, Hq, Hkv, D, M, V = (
        model.embed,
        model.layers,
        model.q_heads,
        model.kv_heads,
        model.head_dim,
        model.mlp,
        model.vocab,
    )
    ks = jax.random.split(key, 9)

    def normal(k, shape, fan_in):
        return jax.random.normal(k, shape, jnp.float32) * fan_in**-0.5

    layers = {
        "attn_norm": jnp.ones((N, E), jnp.float32),
        "wq": normal(ks[1], (N, E, Hq, D), E),
        "wk": normal(ks[2], (N, E, Hkv, D), E),
        "wv": normal(ks[3], (N, E, Hkv, D), E),
        "wo": normal(ks[4], (N, Hq, D, E), Hq * D),
        "mlp_norm": jnp.ones((N, E), jnp.float32),
        "w_gate": normal(ks[5], (N, E, M), E),
        "w_up": normal(ks[6], (N, E, M), E),
        "w_down": normal(ks[7], (N, M, E), M),
    }
    if model.qk_norm:
        layers |= {"q_norm": jnp.ones((N, D), jnp.float32), "k_norm": jnp.ones((N, D), jnp.float32)}
    if model.sinks:  # logit 0: at init a sink weighs like one key of score 0
        layers["sinks"] = jnp.zeros((N, Hq), jnp.float32)
    # tied: the unembedding's scale (E^-1/2, unit logits from a normed x); embed_scale restores unit inputs
    table = normal(ks[0], (V, E), E if model.tie_embeddings else 1.0)
    params = {"embed": table, "layers": layers, "final_norm": jnp.ones((E,), jnp.float32)}
    if not model.tie_embeddings:
        params["unembed"] = normal(ks[8], (E, V), E)
    return params


def unembedding(params: dict) -> jax.Array:
    """The E x V unembedding: its own table, or the input embedding's transposed (model.tie_embeddings)."""
    return params["unembed"] if "unembed" in params else params["embed"].T


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


def embed(
    table_VxE: jax.Array, tokens_BxL: jax.Array, *, model: ModelSpec, strategy: str, mesh: Mesh
) -> jax.Array:
    """Token embeddings [B, L, E], sequence-sharded like the tokens: each device gathers the vocab-sharded table
    and looks up its own tokens, so the backward scatters into one table-sized gradient and sums it across
    devices (the gather's transpose): O(V*E) per device. Left to the partitioner, the lookup's transpose gathered
    the whole sequence's [L, E] gradient onto every device (tpu7x_128 at 131,072 tokens: 2 GiB of a 4.9 GiB
    peak, by the compile's live ranges; docs/explanation/memory-model.md)."""
    table_spec = param_specs(model, mesh)["embed"]
    vocab_axes = table_spec[0]

    def local(t_VxE, tok_BxL):
        full = jax.lax.all_gather(t_VxE, vocab_axes, axis=0, tiled=True) if vocab_axes else t_VxE
        return full[tok_BxL]

    specs = (table_spec, token_spec(strategy))
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=activation_spec(strategy))(
        table_VxE, tokens_BxL
    )


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
    memory: MemorySpec = PRESET_ONLY,
    segment_ids_BxL: jax.Array | None = None,
    row_pos_BxL: jax.Array | None = None,
) -> jax.Array:
    """Final normed hidden states [B, L, E], sequence-sharded like the input (the loss unembeds in chunks).

    Packed documents: `pos_BxL` restarts in each document (RoPE), `segment_ids_BxL` keeps attention inside
    one, and `row_pos_BxL` (balanced layout only) is each token's true place in the row, for the causal mask."""
    act = NamedSharding(mesh, activation_spec(strategy.name))
    seq = activation_spec(strategy.name)[1]
    heads = NamedSharding(mesh, P(BATCH_AXES, seq, "tensor" if mesh.shape["tensor"] > 1 else None, None))
    constrain = jax.lax.with_sharding_constraint

    x = embed(params["embed"].astype(dtype), tokens_BxL, model=model, strategy=strategy.name, mesh=mesh)
    if model.embed_scale:  # Gemma: sqrt(E) in the compute dtype, as its reference rounds it
        x = x * jnp.asarray(model.embed**0.5, dtype)

    def layer(x_BxLxE, p, kind: str):
        x_BxLxE = checkpoint_name(x_BxLxE, "layer_input")
        h = rms_norm(x_BxLxE, p["attn_norm"], model.norm_eps)
        q = constrain(jnp.einsum("ble,ehd->blhd", h, p["wq"].astype(dtype)), heads)
        k = constrain(jnp.einsum("ble,ehd->blhd", h, p["wk"].astype(dtype)), heads)
        v = constrain(jnp.einsum("ble,ehd->blhd", h, p["wv"].astype(dtype)), heads)
        if model.qk_norm:
            q, k = rms_norm(q, p["q_norm"], model.norm_eps), rms_norm(k, p["k_norm"], model.norm_eps)
        if (theta := rope_theta(model, kind)) is not None:
            q, k = rope(q, pos_BxL, theta), rope(k, pos_BxL, theta)
        o = attention(
            q,
            k,
            v,
            strategy=strategy.for_layer(kind),
            mesh=mesh,
            causal=True,
            layout=strategy.layout,
            kernel=strategy.kernel,
            block_q=tuning.concrete(strategy.block_q),  # a TrialSpec's are integers already
            block_kv=tuning.concrete(strategy.block_kv),
            segment_ids=segment_ids_BxL,
            positions=row_pos_BxL,
            window=model.window if kind == "local" else None,
            chunk=model.chunk if kind == "chunked" else None,
            sinks=p["sinks"] if model.sinks else None,
        )
        o = checkpoint_name(o, "attn_out")
        x_BxLxE = constrain(x_BxLxE + jnp.einsum("blhd,hde->ble", o, p["wo"].astype(dtype)), act)
        h = rms_norm(x_BxLxE, p["mlp_norm"], model.norm_eps)
        g = jnp.einsum("ble,em->blm", h, p["w_gate"].astype(dtype))
        u = jnp.einsum("ble,em->blm", h, p["w_up"].astype(dtype))
        a_BxLxM = checkpoint_name(MLP_ACTIVATIONS[model.mlp_activation](g) * u, "mlp_act")  # w_down's input
        y = jnp.einsum("blm,me->ble", a_BxLxM, p["w_down"].astype(dtype))
        return constrain(x_BxLxE + y, act), None

    policy = remat_policy(remat, memory)
    pattern = model.attention_pattern
    steps = [functools.partial(layer, kind=kind) for kind in pattern]
    if remat != "none":
        steps = [jax.checkpoint(f, policy=policy, prevent_cse=False) for f in steps]
    x = layers_in_pattern(steps, x, params["layers"], model.layers)
    return rms_norm(x, params["final_norm"], model.norm_eps)


# model.mlp_activation -> the gate's activation (GeGLU: Gemma's gelu_pytorch_tanh, the tanh approximation)
MLP_ACTIVATIONS: dict[str, Callable] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
}


def rope_theta(model: ModelSpec, kind: str) -> float | None:
    """The RoPE base of a layer of type `kind`; None: no positional encoding (NoPE)."""
    if kind == "global":
        return model.rope_theta if model.global_rope else None
    return model.local_rope_theta or model.rope_theta


def layers_in_pattern(steps: list[Callable], x: jax.Array, stacked: dict, n: int) -> jax.Array:
    """Run n layers whose parameters are stacked [n, ...], layer i by steps[i % K] (K = the pattern's length),
    under one scan over the pattern's whole repeats with its K layers unrolled in the body, then the last
    partial repeat's n % K layers unrolled: compile time grows with K, never with depth.

    One layer type: the scan over [n, ...] as it always was (the same program for the models before the
    pattern); otherwise the first n // K * K layers are viewed as [n // K, K, ...] (a reshape of the leading
    dim, no copy when K divides n)."""
    k = len(steps)
    if k == 1:
        return jax.lax.scan(steps[0], x, stacked)[0]
    repeats = n // k

    def body(x_BxLxE, p_group):
        for j, step in enumerate(steps):
            x_BxLxE, _ = step(x_BxLxE, jax.tree.map(lambda a, j=j: a[j], p_group))
        return x_BxLxE, None

    if repeats:
        grouped = jax.tree.map(lambda a: a[: repeats * k].reshape(repeats, k, *a.shape[1:]), stacked)
        x, _ = jax.lax.scan(body, x, grouped)
    for i in range(repeats * k, n):
        x, _ = steps[i % k](x, jax.tree.map(lambda a, i=i: a[i], stacked))
    return x


def loss_fn(params: dict, batch: dict, **kw) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """Mean masked next-token cross-entropy, and (the number of counted tokens, the loss summed and the tokens
    counted per position bucket, jobs.spec.position_buckets: by position within the document when packed);
    with a `distance` in the batch (the recall task: each query's distance back to its key) also the correct
    argmax predictions and the counted tokens per distance bucket.

    The [B, L/P, V] logits never exist whole: each device unembeds its local sequence in chunks of
    jobs.spec.loss_chunk_tokens under remat (at 14M tokens over 64 devices they would be ~270 GiB per device)."""
    x_BxLxE = forward(
        params,
        batch["tokens"],
        batch["positions"],
        segment_ids_BxL=batch.get("segment_ids"),
        row_pos_BxL=batch.get("row_positions"),
        **kw,
    )
    B, L, E = x_BxLxE.shape
    P = strategies.get(kw["strategy"].name).cp(dict(kw["mesh"].shape))
    Ll = L // P
    w = unembedding(params).astype(kw["dtype"])
    axes = dict(kw["mesh"].shape)
    # what one device holds: its rows of the (micro)batch, its share of the vocabulary
    rows = max(B // (axes.get("data", 1) * axes.get("fsdp", 1)), 1)
    c = loss_chunk_tokens(Ll, rows, w.shape[1] // axes.get("tensor", 1))
    k = Ll // c

    def local_chunks(a):  # [B, L, ...] -> [k, B, P, c, ...]: chunk i of every device's local shard
        a = a.reshape(B, P, k, c, *a.shape[2:])
        return jnp.moveaxis(a, 2, 0)

    upper = jnp.asarray(position_buckets(L)[1:], jnp.int32)
    K = upper.shape[0] + 1
    keys = ("targets", "mask", "positions", *(("distance",) if "distance" in batch else ()))

    def buckets(at, v):  # [K]: v summed per bucket of `at`
        return jnp.einsum("bpck,bpc->k", jax.nn.one_hot(jnp.searchsorted(upper, at, side="right"), K), v)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk_loss(carry, xs):
        x, tgt, mask, pos, *dist = xs
        logits = jnp.einsum("bpce,ev->bpcv", x, w).astype(jnp.float32)
        logz = jax.nn.logsumexp(logits, axis=-1)
        gold = jnp.take_along_axis(logits, tgt[..., None].astype(jnp.int32), axis=-1)[..., 0]
        m = mask.astype(jnp.float32)
        nll = jax.lax.stop_gradient(logz - gold) * m  # the buckets are a report, not part of the loss
        tot, n, *sums = carry
        out = [buckets(pos, nll), buckets(pos, m)]
        if dist:  # a report too: the argmax carries no gradient
            # right when the answer's logit is the largest: the same max logsumexp takes, so no second
            # pass over the [.., V] logits (an argmax kept another logits-sized buffer: +2 GiB at 128K vocab)
            hit = (gold >= jnp.max(logits, axis=-1)).astype(jnp.float32) * m
            out += [buckets(dist[0], hit), buckets(dist[0], m)]
        return (
            tot + ((logz - gold) * m).sum(),
            n + m.sum(),
            *(a + b for a, b in zip(sums, out, strict=True)),
        ), None

    zero = (jnp.float32(0), jnp.float32(0), *(jnp.zeros(K, jnp.float32) for _ in range(len(keys) * 2 - 4)))
    (tot, n, *sums), _ = jax.lax.scan(
        chunk_loss, zero, (local_chunks(x_BxLxE), *map(local_chunks, map(batch.get, keys)))
    )
    n = jnp.maximum(n, 1.0)
    return tot / n, (n, *sums)
