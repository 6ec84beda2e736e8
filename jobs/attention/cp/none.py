"""No CP: the blockwise kernel per device, batch and heads sharded, the sequence whole."""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh

from jobs.attention.core import match_varying
from jobs.attention.kernels import attend
from jobs.attention.kernels.hop import Order
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, mesh_shape
from jobs.strategies import rules as cp_rules


def none_local(mesh: Mesh | None, L: int, o: Options) -> Callable:
    ring = cp_rules.ring_size("none", mesh_shape(mesh))
    pos = global_positions(L, o.layout, ring)

    def local(q, k, v, pos_BxL=None, seg_BxL=None, sinks=None):
        sinks = None if sinks is None else match_varying(sinks, q)
        kw = dict(span=o.span, sinks=sinks)
        order = Order(o.layout, ring, whole=True)  # queries and keys: the whole sequence
        if seg_BxL is None:
            return attend(q, k, v, pos, pos, o.causal, o.kernel, o.block_q, o.block_kv, order, None, **kw)
        segs = (seg_BxL, seg_BxL)  # packed documents: per-row positions and segment ids
        return attend(q, k, v, pos_BxL, pos_BxL, o.causal, o.kernel, o.block_q, o.block_kv, order, segs, **kw)

    return local
