"""The train step lowered for a topology's devices, and the hash of its program that keys the compile cache."""

from __future__ import annotations

import hashlib
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan.aot.topology import devices, topology_tag

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
