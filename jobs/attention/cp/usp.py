"""USP: Ulysses over `context_ulysses` (inner) inside a ring over `context` (outer); zigzag by ring size."""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh

from jobs import strategies
from jobs.attention.cp.ring import RingConfig, ring_core, with_tokens
from jobs.attention.cp.ulysses import ulysses_exchange
from jobs.attention.sharding import Options, axis_size


def usp_local(mesh: Mesh, L: int, o: Options) -> Callable:
    """Per-device body over A[B, L_(context,context_ulysses), H, D]: the U devices of ring position r together
    hold ring block r, which the all-to-all reassembles (with H/U heads) before the ring runs."""
    s = strategies.get("usp")
    a2a = s.ulysses_axis
    ring_axis = next(a for a in s.axes if a != a2a)
    R, U = axis_size(mesh, ring_axis), axis_size(mesh, a2a)
    cfg = RingConfig(ring_axis, R, o.causal, o.layout, o.kernel, o.block_q, o.block_kv, o.span)
    inner = with_tokens(ring_core, cfg)  # packed documents: the ring block's pos, seg gathered over a2a
    # sinks: the all-to-all slices them to the heads each device holds; the ring corrects its merged result
    return lambda q, k, v, pos=None, seg=None, sinks=None: ulysses_exchange(
        q, k, v, axis=a2a, size=U, inner=inner, pos_BxLl=pos, seg_BxLl=seg, sinks_H=sinks
    )
