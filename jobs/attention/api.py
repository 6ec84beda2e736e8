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
from jobs.attention.sharding import Options, mesh_shape, qkv_spec
from jobs.profile.breakdown import ATTENTION_SCOPE
from jobs.strategies import rules as cp_rules


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
) -> jax.Array:
    """Attention of global q [B, L, Hq, D] over k, v [B, L, Hkv, D]; out like q, in the same token order.

    layout="zigzag": inputs are already permuted by cp_rules.zigzag_permutation(L, cp_rules.ring_size(strategy,
    mesh)) (every strategy accepts it; the mask uses true positions). Works eagerly and inside an outer jit.

    Packed documents: segment_ids int32 [B, L] in the same (permuted) order as q; a query sees a key only when
    their ids are equal (and, causal, the key's true row position <= the query's). positions int32 [B, L]:
    the true row position (0..L-1, not a document's RoPE position) of each token; None derives them from
    the layout. layout="balanced" (a loader's data-dependent permutation, L/P tokens per device) needs both.
    segment_ids=None (and positions=None) is the unpacked path, unchanged.
    """
    _check_shapes(q, k, v)
    B, L, Hq, _ = q.shape
    shape = mesh_shape(mesh)
    cp_rules.validate(
        strategy, context_length=L, q_heads=Hq, kv_heads=k.shape[2], mesh=shape, layout=layout, batch=B
    )
    cp_rules.validate_tokens(
        layout,
        kernel,
        positions=positions is not None,
        segment_ids=segment_ids is not None,
        length=L,
        batch=B,
        shapes=[tuple(x.shape) for x in (positions, segment_ids) if x is not None],
    )
    get_kernel(kernel)
    o = Options(causal, layout, kernel, block_q, block_kv)
    # one named scope over forward, backward and remat recompute, so a profile can tell the attention
    # kernels' ops from the layers' matmuls (jobs/profile/breakdown.py reads it from the HLO metadata)
    with jax.named_scope(ATTENTION_SCOPE):
        return _dispatch(q, k, v, strategy, mesh, o, segment_ids, positions)


def _dispatch(q, k, v, strategy: str, mesh: Mesh | None, o: Options, segment_ids, positions) -> jax.Array:
    """The strategy's attention of validated inputs."""
    L = q.shape[1]
    if segment_ids is not None or positions is not None:
        return _packed(q, k, v, strategy, mesh, o, segment_ids, positions)
    if strategy == "reference":
        pos = global_positions(L, o.layout, cp_rules.ring_size(strategy, mesh_shape(mesh)))
        return reference_attention(q, k, v, causal=o.causal, q_pos=pos, kv_pos=pos)
    if mesh is None:
        if strategy == "none":
            return none_local(mesh, L, o)(q, k, v)
        raise ValueError(f"strategy {strategy} needs a mesh with a 'context' axis; pass mesh=")
    spec = qkv_spec(mesh, strategy)
    local = strategies.get(strategy).local_fn()(mesh, L, o)  # per-device body under one shard_map
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)


def _packed(q, k, v, strategy: str, mesh: Mesh | None, o: Options, segment_ids, positions) -> jax.Array:
    """The packed-documents path: per-row positions and segment ids sharded like the sequence."""
    B, L = q.shape[:2]
    shape = mesh_shape(mesh)
    if positions is None:
        positions = global_positions(L, o.layout, cp_rules.ring_size(strategy, shape))
    pos_BxL = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (B, L))
    seg_BxL = jnp.zeros((B, L), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    if strategy == "reference":
        kw = dict(q_pos=pos_BxL, kv_pos=pos_BxL, q_seg=seg_BxL, kv_seg=seg_BxL)
        return reference_attention(q, k, v, causal=o.causal, **kw)
    if mesh is None:
        if strategy == "none":
            return none_local(mesh, L, o)(q, k, v, pos_BxL, seg_BxL)
        raise ValueError(f"strategy {strategy} needs a mesh with a 'context' axis; pass mesh=")
    spec = qkv_spec(mesh, strategy)
    tspec = PartitionSpec(spec[0], spec[1])  # A[B_(data,fsdp), L_(cp axes)]: no heads
    local = strategies.get(strategy).local_fn()(mesh, L, o)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, tspec, tspec), out_specs=spec)(
        q, k, v, pos_BxL, seg_BxL
    )
