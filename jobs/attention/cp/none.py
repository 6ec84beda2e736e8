"""No CP: the blockwise kernel per device, batch and heads sharded, the sequence whole."""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh

from jobs.attention.core import match_varying
from jobs.attention.kernels import attend
from jobs.attention.kernels.mask import Mask, Order
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, mesh_shape
from jobs.strategies import rules


def none_local(mesh: Mesh | None, L: int, o: Options) -> Callable:
    ring = rules.ring_size("none", mesh_shape(mesh))
    pos = global_positions(L, o.layout, ring)
    order = Order(o.layout, ring, whole=True)  # queries and keys: the whole sequence

    def local(q, k, v, pos_BxL=None, seg_BxL=None, sinks=None):
        sinks = None if sinks is None else match_varying(sinks, q)
        if seg_BxL is None:
            mask = Mask(pos, pos, o.causal, o.block_q, o.block_kv, order, o.span)
        else:  # packed documents: per-row positions and segment ids
            mask = Mask(pos_BxL, pos_BxL, o.causal, o.block_q, o.block_kv, order, o.span, seg_BxL, seg_BxL)
        return attend(q, k, v, mask, o.kernel, sinks)

    return local
