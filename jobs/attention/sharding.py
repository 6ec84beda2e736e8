"""How the global q/k/v are laid out on the mesh: batch over (data, fsdp), sequence over the CP axes, heads
over tensor. Axes a mesh lacks are simply left out, so small test meshes work."""

from __future__ import annotations

from dataclasses import dataclass

from jax.sharding import Mesh, PartitionSpec

from jobs.attention.span import GLOBAL, Span
from jobs.strategies.base import BATCH_AXES
from jobs.strategies.rules import sequence_axes

HEAD_AXIS = "tensor"


def mesh_shape(mesh: Mesh | None) -> dict[str, int]:
    return {} if mesh is None else {str(a): int(s) for a, s in mesh.shape.items()}


def axis_size(mesh: Mesh, axis: str) -> int:
    return int(mesh.shape[axis]) if axis in mesh.axis_names else 1


def sinks_spec(mesh: Mesh) -> PartitionSpec:
    """PartitionSpec of sinks [Hq]: heads over tensor, like q's heads (replicated over everything else)."""
    return PartitionSpec(HEAD_AXIS if HEAD_AXIS in mesh.axis_names else None)


def qkv_spec(mesh: Mesh, strategy: str) -> PartitionSpec:
    """PartitionSpec of q, k, v and out: A[B_(data,fsdp), L_(cp axes), H_tensor, D]."""
    names = set(mesh.axis_names)
    batch = tuple(a for a in BATCH_AXES if a in names) or None
    seq = tuple(a for a in sequence_axes(strategy) if a in names) or None
    heads = HEAD_AXIS if HEAD_AXIS in names else None
    return PartitionSpec(batch, seq, heads, None)


@dataclass(frozen=True)
class Options:
    """What every strategy's per-device body needs besides the mesh and the global length."""

    causal: bool
    layout: str
    kernel: str
    block_q: int
    block_kv: int
    span: Span = GLOBAL  # sliding window or chunk (causal only)
