"""The one entry point: validate (same rules as the planner), then dispatch to a CP strategy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from jobs import strategies
from jobs.attention.cp.none import none_local
from jobs.attention.kernels import get_kernel
from jobs.attention.layout import global_positions
from jobs.attention.reference import reference_attention
from jobs.attention.sharding import Options, mesh_shape, qkv_spec, sinks_spec
from jobs.attention.span import Span
from jobs.profile.breakdown import ATTENTION_SCOPE
from jobs.strategies import rules


def _check_shapes(q, k, v) -> None:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(
            f"need q [B, L, Hq, D] and k, v [B, L, Hkv, D]; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k/v {k.shape} must share batch, length and head_dim")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    strategy: str,
    mesh: Mesh | None,
    causal: bool = True,
    layout: str = "contiguous",
    kernel: str = "xla",
    block_q: int = 512,
    block_kv: int = 512,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    window: int | None = None,
    chunk: int | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Attention of global q [B, L, Hq, D] over k, v [B, L, Hkv, D]; out like q, in the same token order.

    layout="zigzag": inputs are already permuted by rules.zigzag_permutation(L, rules.ring_size(strategy,
    mesh)) (every strategy accepts it; the mask uses true positions). Works eagerly and inside an outer jit.

    Packed documents: segment_ids int32 [B, L] in the same (permuted) order as q; a query sees a key only when
    their ids are equal (and, causal, the key's true row position <= the query's). positions int32 [B, L]:
    the true row position (0..L-1, not a document's RoPE position) of each token; None derives them from
    the layout. layout="balanced" (a loader's data-dependent permutation, L/P tokens per device) needs both.
    segment_ids=None (and positions=None) is the unpacked path, unchanged.

    Beyond one causal mask (every strategy and layout; causal only; combine with segment ids freely):
    - window=W (sliding window): a query at true position p sees keys at p-W+1 .. p, W counting the query
      itself (Gemma's, Mistral's and MaxText's sliding_window_size: MaxText masks with
      triu(ones, -W+1) * tril(ones, W-1)).
    - chunk=C (Llama 4's chunked attention): a query sees only the keys of its own chunk p // C.
      Not both (ValueError); a window or chunk >= L is global causal attention, the same program.
    - sinks fp32 [Hq] (gpt-oss): one learnable logit per query head that joins every row's softmax
      denominator and brings no value; it gets its own gradient. It enters once per query, after every
      ring hop is merged (jobs.attention.core.add_sinks). Rows that see no key get out 0.
    Ring, usp and double_ring skip every (query chunk, key chunk) pair of a hop the window or chunk cannot
    reach (jobs.attention.hopcount counts them); all_gather with layout=contiguous gathers only the halo a
    window reaches. Kernels: xla runs all three; splash and flash run sinks; a window or chunk runs on xla
    (flash and auto fall back to it, kernel=splash raises a ValueError).
    """
    _check_shapes(q, k, v)
    B, L, Hq, _ = q.shape
    shape = mesh_shape(mesh)
    rules.validate(
        strategy, context_length=L, q_heads=Hq, kv_heads=k.shape[2], mesh=shape, layout=layout, batch=B
    )
    rules.validate_tokens(
        layout,
        kernel,
        positions=positions is not None,
        segment_ids=segment_ids is not None,
        length=L,
        batch=B,
        shapes=[tuple(x.shape) for x in (positions, segment_ids) if x is not None],
    )
    sinks_shape = None if sinks is None else tuple(jnp.shape(sinks))
    rules.validate_masks(
        causal=causal,
        kernel=kernel,
        q_heads=Hq,
        window=window,
        chunk=chunk,
        sinks_shape=sinks_shape,
        strategy="none" if strategy == "reference" else strategy,
        length=L,
    )
    get_kernel(kernel)
    o = Options(causal, layout, kernel, block_q, block_kv, Span.of(window, chunk, L))
    sinks = None if sinks is None else jnp.asarray(sinks, jnp.float32)
    # one named scope over forward, backward and remat recompute, so a profile can tell the attention
    # kernels' ops from the layers' matmuls (jobs/profile/breakdown.py reads it from the HLO metadata)
    with jax.named_scope(ATTENTION_SCOPE):
        return _dispatch(q, k, v, strategy, mesh, o, segment_ids, positions, sinks)


def _tokens(B: int, L: int, strategy: str, mesh: Mesh | None, o: Options, segment_ids, positions) -> tuple:
    """Packed documents' (pos, seg) [B, L] (positions from the layout when not given); () unpacked."""
    if segment_ids is None and positions is None:
        return ()
    if positions is None:
        positions = global_positions(L, o.layout, rules.ring_size(strategy, mesh_shape(mesh)))
    pos_BxL = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (B, L))
    seg_BxL = jnp.zeros((B, L), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    return pos_BxL, seg_BxL


def _reference(q, k, v, strategy: str, mesh: Mesh | None, o: Options, toks: tuple, sinks) -> jax.Array:
    kw = dict(causal=o.causal, window=o.span.window, chunk=o.span.chunk, sinks=sinks)
    if toks:
        pos_BxL, seg_BxL = toks
        return reference_attention(
            q, k, v, q_pos=pos_BxL, kv_pos=pos_BxL, q_seg=seg_BxL, kv_seg=seg_BxL, **kw
        )
    pos = global_positions(q.shape[1], o.layout, rules.ring_size(strategy, mesh_shape(mesh)))
    return reference_attention(q, k, v, q_pos=pos, kv_pos=pos, **kw)


def _dispatch(
    q, k, v, strategy: str, mesh: Mesh | None, o: Options, segment_ids, positions, sinks
) -> jax.Array:
    """The strategy's attention of validated inputs: one shard_map over q, k, v, then (packed documents)
    per-row positions and segment ids sharded like the sequence, then (sinks) the sinks, heads like q's."""
    B, L = q.shape[:2]
    toks = _tokens(B, L, strategy, mesh, o, segment_ids, positions)
    if strategy == "reference":
        return _reference(q, k, v, strategy, mesh, o, toks, sinks)
    if mesh is None:
        if strategy == "none":
            return none_local(mesh, L, o)(q, k, v, *toks, sinks=sinks)
        raise ValueError(f"strategy {strategy} needs a mesh with a 'context' axis; pass mesh=")
    spec = qkv_spec(mesh, strategy)
    tspec = PartitionSpec(spec[0], spec[1])  # A[B_(data,fsdp), L_(cp axes)]: no heads
    local = strategies.get(strategy).local_fn()(mesh, L, o)  # per-device body under one shard_map
    args, specs = (q, k, v, *toks), (spec, spec, spec, *(tspec for _ in toks))
    if sinks is None:
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec)(*args)
    n = len(toks)
    body = lambda q, k, v, *rest: local(q, k, v, *rest[:n], sinks=rest[n])
    return jax.shard_map(body, mesh=mesh, in_specs=(*specs, sinks_spec(mesh)), out_specs=spec)(*args, sinks)
