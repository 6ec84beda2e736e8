"""The one entry point: validate (same rules as the planner), then dispatch to a CP strategy."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from jobs import cp_rules, strategies
from jobs.attention.kernel import get_kernel
from jobs.attention.layout import global_positions
from jobs.attention.none import none_local
from jobs.attention.reference import reference_attention
from jobs.attention.sharding import Options, mesh_shape, qkv_spec


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
) -> jax.Array:
    """Attention of global q [B, L, Hq, D] over k, v [B, L, Hkv, D]; out like q, in the same token order.

    layout="zigzag": inputs are already permuted by cp_rules.zigzag_permutation(L, cp_rules.ring_size(strategy,
    mesh)) (every strategy accepts it; the mask uses true positions). Works eagerly and inside an outer jit.
    """
    _check_shapes(q, k, v)
    B, L, Hq, _ = q.shape
    shape = mesh_shape(mesh)
    cp_rules.validate(
        strategy, context_length=L, q_heads=Hq, kv_heads=k.shape[2], mesh=shape, layout=layout, batch=B
    )
    get_kernel(kernel)
    o = Options(causal, layout, kernel, block_q, block_kv)
    if strategy == "reference":
        pos = global_positions(L, layout, cp_rules.ring_size(strategy, shape))
        return reference_attention(q, k, v, causal=causal, q_pos=pos, kv_pos=pos)
    if mesh is None:
        if strategy == "none":
            return none_local(mesh, L, o)(q, k, v)
        raise ValueError(f"strategy {strategy} needs a mesh with a 'context' axis; pass mesh=")
    spec = qkv_spec(mesh, strategy)
    local = strategies.get(strategy).local_fn()(mesh, L, o)  # per-device body under one shard_map
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)
