"""The virtual TPU slice a trial compiles for: libtpu's topology name, the cache's tag, and its devices."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan.chips import CHIPS


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
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process may hold libtpu's lockfile
    from jax.experimental import topologies

    name = topology_name(spec, topology)
    dims = [int(d) for d in name.split(":")[1].split("x")]
    chip = CHIPS[spec.cluster.accelerator][1]
    # Only a full 4-long axis wraps into a torus; a smaller test slice is a mesh.
    wrap = tuple(d >= 4 for d in dims)
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=name, chip_config_name=chip, chips_per_host_bounds=(2, 2, 1),
        num_slices=spec.cluster.slices_per_trial, wrap=wrap,
    )  # fmt: skip
    return desc.devices
