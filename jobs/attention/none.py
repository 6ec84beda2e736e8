"""No CP: the blockwise kernel per device, batch and heads sharded, the sequence whole."""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh

from jobs import cp_rules
from jobs.attention.kernel import attend
from jobs.attention.layout import global_positions
from jobs.attention.sharding import Options, mesh_shape


def none_local(mesh: Mesh | None, L: int, o: Options) -> Callable:
    pos = global_positions(L, o.layout, cp_rules.ring_size("none", mesh_shape(mesh)))
    return lambda q, k, v: attend(q, k, v, pos, pos, o.causal, o.kernel, o.block_q, o.block_kv)
