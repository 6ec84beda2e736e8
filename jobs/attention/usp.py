"""USP: Ulysses over `context_ulysses` (inner) inside a ring over `context` (outer); zigzag by ring size."""

from __future__ import annotations

from functools import partial

import jax
from jax.sharding import Mesh

from jobs.attention.ring import RingConfig, ring_core
from jobs.attention.sharding import axis_size, qkv_spec
from jobs.attention.ulysses import ulysses_exchange

RING_AXIS, ULYSSES_AXIS = "context", "context_ulysses"


def usp_attention(
    q_BxLxHxD: jax.Array,
    k_BxLxKxD: jax.Array,
    v_BxLxKxD: jax.Array,
    *,
    mesh: Mesh,
    causal: bool,
    layout: str,
    kernel: str,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Inputs A[B, L_(context,context_ulysses), H, D]; the U devices of ring position r together hold ring
    block r, which the all-to-all reassembles (with H/U heads) before the ring runs."""
    R, U = axis_size(mesh, RING_AXIS), axis_size(mesh, ULYSSES_AXIS)
    cfg = RingConfig(RING_AXIS, R, causal, layout, kernel, block_q, block_kv)
    spec = qkv_spec(mesh, "usp")

    def local(q, k, v):
        return ulysses_exchange(q, k, v, axis=ULYSSES_AXIS, size=U, inner=partial(ring_core, cfg))

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(
        q_BxLxHxD, k_BxLxKxD, v_BxLxKxD
    )
