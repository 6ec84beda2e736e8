"""The one owner of mesh axes and the logical -> physical sharding map."""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.spec import MeshSpec, ModelSpec
from jobs.strategies import rules
from jobs.strategies.base import BATCH_AXES, MESH_AXES

# Parameters are sharded FSDP-style over every axis but tensor (MaxText also folds context into FSDP).
FSDP_AXES = ("data", "fsdp", "context", "context_ulysses")
_AUTO = (AxisType.Auto,) * len(MESH_AXES)


def make_mesh(shape: MeshSpec, devices: list | None = None, slices: int = 1) -> Mesh:
    """A mesh with the fixed axis names over `devices` (default: all devices of the runtime). With `slices` > 1
    the mesh is hybrid: `shape.dcn`'s outer factor indexes the slice, everything else stays inside one."""
    devices = list(jax.devices()) if devices is None else list(devices)
    if shape.size != len(devices):
        raise ValueError(
            f"mesh {shape.label()} has {shape.size} devices but {len(devices)} are available; "
            f"make data*fsdp*context*context_ulysses*tensor = {len(devices)}"
        )
    if slices > 1:
        return _hybrid_mesh(shape, devices, slices)
    return Mesh(_ici_devices([getattr(shape, a) for a in MESH_AXES], devices), MESH_AXES, axis_types=_AUTO)


def _ici_devices(sizes: list[int], devices: list) -> np.ndarray:
    """`devices` laid out as `sizes`, topologically where jax can (TPU), else in their order."""
    try:
        return jax.make_mesh(sizes, MESH_AXES, _AUTO, devices=devices).devices
    except (ValueError, NotImplementedError, AssertionError):
        # Device sets that make_mesh cannot lay out topologically (e.g. multi-process CPU) keep their order.
        return np.array(devices).reshape(sizes)


def _knows_slice(device) -> bool:
    # CPU devices of a multi-process runtime carry slice_index too (always 0), and a GPU's need not be its
    # node: only a TPU's is the slice; the others go by process (one GPU node per slice, processes in order)
    return device.platform == "tpu" and hasattr(device, "slice_index")


def device_slice(device, slices: int) -> int:
    """The slice a device belongs to: TPU devices (AOT topology ones too) know it; CPU processes posing as
    slices are numbered slice-major, so a slice is a run of process_count // slices processes."""
    if _knows_slice(device):
        return int(device.slice_index)
    return device.process_index // (jax.process_count() // slices)


def _hybrid_mesh(shape: MeshSpec, devices: list, slices: int) -> Mesh:
    """Like jax's create_hybrid_device_mesh: one ICI mesh per slice, the slices stacked along the dcn axis
    (outer factor), so only that axis's collectives cross the data-centre network."""
    if shape.dcn not in MESH_AXES:
        raise ValueError(
            f"a trial over {slices} slices needs mesh.dcn naming the axis laid across them; "
            f"got {shape.dcn!r}, choose one of {', '.join(MESH_AXES)}"
        )
    if getattr(shape, shape.dcn) % slices:
        raise ValueError(
            f"mesh.dcn={shape.dcn} has size {getattr(shape, shape.dcn)}, not divisible by {slices} slices; "
            f"make {shape.dcn} a multiple of {slices}"
        )
    if not all(_knows_slice(d) for d in devices) and jax.process_count() % slices:
        raise ValueError(
            f"{jax.process_count()} processes cannot pose as {slices} slices; "
            f"run a multiple of {slices} processes (hosts per slice x slices)"
        )
    groups: dict[int, list] = {}
    for d in devices:
        groups.setdefault(device_slice(d, slices), []).append(d)
    per_slice = len(devices) // slices
    if sorted(groups) != list(range(slices)) or any(len(g) != per_slice for g in groups.values()):
        counts = {s: len(g) for s, g in sorted(groups.items())}
        raise ValueError(
            f"devices do not split evenly into {slices} slices (devices per slice: {counts}); "
            f"each slice must hold {per_slice}"
        )
    dcn = [slices if a == shape.dcn else 1 for a in MESH_AXES]
    ici = [getattr(shape, a) // n for a, n in zip(MESH_AXES, dcn, strict=True)]
    # [slice, *ici] -> axis by axis (dcn factor, ici factor) -> each axis dcn*ici, slice-major on the dcn axis
    blocks = np.stack([_ici_devices(ici, groups[s]) for s in range(slices)])
    blocks = blocks.reshape(dcn + ici)
    n = len(MESH_AXES)
    order = [i for a in range(n) for i in (a, n + a)]
    grid = blocks.transpose(order).reshape([getattr(shape, a) for a in MESH_AXES])
    return Mesh(grid, MESH_AXES, axis_types=_AUTO)


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
    layers = {
        "attn_norm": P(None, None),
        "wq": P(None, fsdp_E, tq, None),
        "wk": P(None, fsdp_E, tkv, None),
        "wv": P(None, fsdp_E, tkv, None),
        "wo": P(None, tq, None, fsdp_E),
        "mlp_norm": P(None, None),
        "w_gate": P(None, fsdp_E, tm),
        "w_up": P(None, fsdp_E, tm),
        "w_down": P(None, tm, fsdp_E),
    }
    if model.qk_norm:  # [N, D] each: tiny, replicated
        layers |= {"q_norm": P(None, None), "k_norm": P(None, None)}
    if model.sinks:  # [N, Hq]: heads over tensor like wq's (the attention takes them sharded so)
        layers["sinks"] = P(None, tq)
    specs = {"embed": P(_fit(mesh, V, FSDP_AXES), None), "layers": layers, "final_norm": P(None)}
    if not model.tie_embeddings:
        specs["unembed"] = P(fsdp_E, tv)
    return specs


def activation_spec(strategy: str) -> P:
    """[B, L, E] activations: batch over data/fsdp, sequence over the strategy's context axes."""
    seq = rules.sequence_axes(strategy) or None
    return P(BATCH_AXES, seq, None)


def token_spec(strategy: str) -> P:
    seq = rules.sequence_axes(strategy) or None
    return P(BATCH_AXES, seq)


def named(mesh: Mesh, tree):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda x: isinstance(x, P))
