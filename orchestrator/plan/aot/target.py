"""What a TPU compile targets: the virtual slice (libtpu's topology name, the cache's tag, its devices), the
train step lowered for it with the hash of its program that keys the compile cache, and the host memory one
compile needs (what its Ray task reserves, so a node runs only as many compiles at once as its memory holds)."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan.cluster_model import CHIPS


def available() -> bool:
    """libtpu installed and the real train step present: the only two things a TPU compile needs here."""
    return all(importlib.util.find_spec(m) is not None for m in ("libtpu", "jobs.step"))


def topology_name(spec: TrialSpec, topology: str | None = None) -> str:
    """One slice's topology as libtpu names it, e.g. "v5:4x4x4"."""
    accel = spec.cluster.accelerator
    if accel not in CHIPS:
        raise ValueError(f"no TPU topology for accelerator {accel!r}; AOT knows {', '.join(CHIPS)}")
    return f"{CHIPS[accel][0]}:{topology or spec.cluster.topology}"


def topology_tag(spec: TrialSpec, topology: str | None = None) -> str:
    """What was compiled for: the slice topology, and how many slices when more than one ("v5:4x4x4x2slices";
    one slice keeps the bare name, so earlier cache entries stay valid)."""
    n = spec.cluster.slices_per_trial
    return topology_name(spec, topology) + (f"x{n}slices" if n > 1 else "")


def devices(spec: TrialSpec, topology: str | None = None) -> list[Any]:
    """libtpu's virtual devices of the trial's slices (no TPU needed): what a mesh for the compile spans."""
    name = topology_name(spec, topology)
    bounds = host_bounds(spec, dims_of(name))
    return slice_devices(name, CHIPS[spec.cluster.accelerator][1], bounds, spec.cluster.slices_per_trial)


def dims_of(name: str) -> list[int]:
    """A libtpu topology name's three axes: a 2D slice (v5e, v6e: "16x16") has a third of 1."""
    return [*(int(d) for d in name.split(":")[1].split("x")), 1, 1][:3]


def slice_devices(name: str, chip: str, bounds: tuple[int, int, int], slices: int = 1) -> list[Any]:
    """libtpu's virtual devices of `slices` slices of topology `name` ("v5:2x2x1") with chip config `chip`
    and `bounds` chips per host (no TPU needed)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process may hold libtpu's lockfile
    from jax.experimental import topologies

    # Only a full 4-long axis wraps into a torus; a smaller test slice is a mesh.
    wrap = tuple(d >= 4 for d in dims_of(name))
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=name,
        chip_config_name=chip,
        chips_per_host_bounds=bounds,
        num_slices=slices,
        wrap=wrap,
    )
    return desc.devices


# A host's chips as libtpu lays them out, by chips per host: v5e and v6e come as 1-, 4- and 8-chip VMs
# (docs.cloud.google.com/tpu/docs/v5e, /v6e), v5p and tpu7x hosts hold 4.
HOST_SHAPES = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


def host_bounds(spec: TrialSpec, dims: list[int]) -> tuple[int, int, int]:
    """libtpu's chips_per_host_bounds for the cluster's hosts, cut to divide the topology's three axes (it
    must: a 1x1 topology takes (1, 1, 1)), so a slice smaller than one host compiles too."""
    chips = spec.cluster.devices_per_host // CHIPS[spec.cluster.accelerator][2]
    x, y, z = (math.gcd(b, d) for b, d in zip(HOST_SHAPES.get(chips, HOST_SHAPES[4]), dims, strict=True))
    return x, y, z


GIB = 2**30
# Max RSS of one compile process (python, jax, libtpu, the lowering and the compile), measured with jax 0.10.2 and
# libtpu 0.0.42.1 on a 2-core host, against tokens x model width (the activations' size, global):
#   tiny (width 64), tpu7x 2x2x1, ring:          2,048 tokens 1.0 GiB; 262,144: 1.8 GiB; 1,048,576: 1.9 GiB
#   Llama 3.1 8B widths, 2 layers, tpu7x 2x2x1:  65,536 tokens 2.3 GiB
#   llama3_1_8b_long, tpu7x_128 (128 devices):   131,072 tokens 2.2 GiB (186 s)
#   Llama 3.1 8B, 64-128 devices, 14,680,064 tokens: at most 8.2 GiB over docs/results/aot.md's compiles
# A line through a floor above every small compile and 10 % over the largest: an upper bound of each figure
# above (estimates only; what the compiler really takes varies with the program, not just its size).
FLOOR_BYTES = int(2.5 * GIB)
ANCHOR_TOKENS, ANCHOR_WIDTH, ANCHOR_BYTES = 14_680_064, 4096, 9 * GIB
PER_TOKEN_WIDTH = (ANCHOR_BYTES - FLOOR_BYTES) / (ANCHOR_TOKENS * ANCHOR_WIDTH)  # ~0.12 bytes


def compile_host_bytes(spec: TrialSpec, cap: int | None = None) -> int:
    """Host bytes a compile of `spec` needs: FLOOR_BYTES, plus PER_TOKEN_WIDTH per token of the global batch
    and unit of model width; monotone in context length. Capped at `cap` (the largest node's memory): a compile
    asking for more than any node has would wait forever, while one that merely may not fit still gets a node
    to itself and a chance."""
    tokens = spec.train.batch * spec.context_length
    need = int(FLOOR_BYTES + PER_TOKEN_WIDTH * tokens * spec.model.embed)
    return min(need, cap) if cap else need


# The last program lowered (and its hash): a cache miss compiles what was hashed without tracing it again.
_LOWERED: dict[tuple[str, str], tuple[Any, str]] = {}


def lowered(spec: TrialSpec, topology: str | None = None) -> tuple[Any, str]:
    """The train step lowered for the topology's devices, and a short hash of its StableHLO text (no source
    locations): the program itself, whatever in jobs/ changed, so a compile cached for another one is not it."""
    key = (spec.trial_id, topology_tag(spec, topology))  # the program's identity, as the cache's
    if key not in _LOWERED:
        from jobs.mesh import make_mesh
        from jobs.step import lower_train_step

        devs = devices(spec, topology)
        if len(devs) != spec.mesh.size:
            raise ValueError(
                f"topology {key[1]} has {len(devs)} devices but mesh {spec.mesh.label()} needs "
                f"{spec.mesh.size}; pass a topology with {spec.mesh.size} devices"
            )
        # hybrid over slices (jobs.mesh) when the trial spans more than one
        low = lower_train_step(spec, make_mesh(spec.mesh, devs, slices=spec.cluster.slices_per_trial))
        _LOWERED.clear()
        _LOWERED[key] = (low, hashlib.sha256(low.as_text().encode()).hexdigest()[:8])
    return _LOWERED[key]


def program_version(spec: TrialSpec, topology: str | None = None) -> str:
    """The short hash of the lowered step: the last part of its cache file's name."""
    return lowered(spec, topology)[1]


def clear_lowered() -> None:
    """Forget the last lowered program, so the next ask traces jobs/ again (after it changed in-process)."""
    _LOWERED.clear()
