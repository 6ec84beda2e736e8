"""The one owner of mesh axes and the logical -> physical sharding map."""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs import cp_rules
from jobs.spec import BATCH_AXES, MESH_AXES, MeshSpec, ModelSpec

# Parameters are sharded FSDP-style over every axis but tensor (MaxText also folds context into FSDP).
FSDP_AXES = ("data", "fsdp", "context", "context_ulysses")


def make_mesh(shape: MeshSpec, devices: list | None = None) -> Mesh:
    """A mesh with the fixed axis names over `devices` (default: all devices of the runtime)."""
    devices = list(jax.devices()) if devices is None else list(devices)
    if shape.size != len(devices):
        raise ValueError(
            f"mesh {shape.label()} has {shape.size} devices but {len(devices)} are available; "
            f"make data*fsdp*context*context_ulysses*tensor = {len(devices)}"
        )
    sizes = [getattr(shape, a) for a in MESH_AXES]
    try:
        return jax.make_mesh(sizes, MESH_AXES, (AxisType.Auto,) * len(MESH_AXES), devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        # Device sets that make_mesh cannot lay out topologically (e.g. multi-process CPU) keep their order.
        return Mesh(np.array(devices).reshape(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def small_mesh(shape: Mapping[str, int]) -> Mesh:
    """A mesh of only the named axes over the first devices, in order (tests and benchmarks: the attention
    API leaves out whatever axes a mesh lacks)."""
    n = math.prod(shape.values())
    return Mesh(np.array(jax.devices()[:n]).reshape(tuple(shape.values())), tuple(shape))


def _fit(mesh: Mesh, dim: int, axes: tuple[str, ...]) -> tuple[str, ...] | None:
    """The largest prefix-free subset of `axes` (in order) whose product divides `dim`; None if none."""
    keep = []
    prod = 1
    for a in axes:
        n = mesh.shape[a]
        if n > 1 and dim % (prod * n) == 0:
            keep.append(a)
            prod *= n
    return tuple(keep) or None


def param_specs(model: ModelSpec, mesh: Mesh) -> dict:
    """PartitionSpecs of the parameter tree of jobs.model (stacked layers lead with the layer dim)."""
    E, M, V = model.embed, model.mlp, model.vocab
    fsdp_E = _fit(mesh, E, FSDP_AXES)
    tq, tkv, tm, tv = (_fit(mesh, dim, ("tensor",)) for dim in (model.q_heads, model.kv_heads, M, V))
    return {
        "embed": P(_fit(mesh, V, FSDP_AXES), None),
        "layers": {
            "attn_norm": P(None, None),
            "wq": P(None, fsdp_E, tq, None),
            "wk": P(None, fsdp_E, tkv, None),
            "wv": P(None, fsdp_E, tkv, None),
            "wo": P(None, tq, None, fsdp_E),
            "mlp_norm": P(None, None),
            "w_gate": P(None, fsdp_E, tm),
            "w_up": P(None, fsdp_E, tm),
            "w_down": P(None, tm, fsdp_E),
        },
        "final_norm": P(None),
        "unembed": P(fsdp_E, tv),
    }


def activation_spec(strategy: str) -> P:
    """[B, L, E] activations: batch over data/fsdp, sequence over the strategy's context axes."""
    seq = cp_rules.sequence_axes(strategy) or None
    return P(BATCH_AXES, seq, None)


def token_spec(strategy: str) -> P:
    seq = cp_rules.sequence_axes(strategy) or None
    return P(BATCH_AXES, seq)


def named(mesh: Mesh, tree):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda x: isinstance(x, P))
