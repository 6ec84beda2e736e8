"""Optional ground truth: compile the real train step for the cluster's TPU topology and read its memory.

libtpu compiles for a virtual TPU slice on a CPU host (DESIGN section 6). jax is imported only inside
functions: the control plane stays importable without it. Results are cached on disk by trial id and
topology, because a large compile takes minutes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan import memory

CACHE_DIR = Path(os.environ.get("CP_AOT_CACHE", ".cache/aot"))
# accelerator -> (topology name prefix, chip config); a v5p chip is one megacore device, a tpu7x chip two.
CHIPS = {"v5p": ("v5", "megacore", 1), "tpu7x": ("tpu7x", "default", 2)}


def available() -> bool:
    """libtpu installed and the real train step present: the only two things a TPU compile needs here."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("libtpu", "jobs.step"))


def topology_name(spec: TrialSpec, topology: str | None = None) -> str:
    accel = spec.cluster.accelerator
    if accel not in CHIPS:
        raise ValueError(f"no TPU topology for accelerator {accel!r}; AOT knows {', '.join(CHIPS)}")
    return f"{CHIPS[accel][0]}:{topology or spec.cluster.topology}"


def _devices(spec: TrialSpec, topology: str | None):
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process may hold libtpu's lockfile
    from jax.experimental import topologies

    name = topology_name(spec, topology)
    dims = [int(d) for d in name.split(":")[1].split("x")]
    chip = CHIPS[spec.cluster.accelerator][1]
    # Only a full 4-long axis wraps into a torus; a smaller test slice is a mesh.
    wrap = tuple(d >= 4 for d in dims)
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=name, chip_config_name=chip, chips_per_host_bounds=(2, 2, 1),
        num_slices=1, wrap=wrap,
    )  # fmt: skip
    return desc.devices


def _cache_path(spec: TrialSpec, topology: str | None) -> Path:
    tag = topology_name(spec, topology).replace(":", "_")
    return CACHE_DIR / f"{spec.trial_id}-{tag}.json"


def compiled_memory(spec: TrialSpec, topology: str | None = None, *, refresh: bool = False) -> dict[str, Any]:
    """Per-device bytes from the TPU compiler's memory_analysis (argument, output, alias, temp, peak)."""
    path = _cache_path(spec, topology)
    if path.exists() and not refresh:
        return json.loads(path.read_text())
    from jobs.mesh import make_mesh
    from jobs.step import lower_train_step

    devices = _devices(spec, topology)
    if len(devices) != spec.mesh.size:
        raise ValueError(
            f"topology {topology_name(spec, topology)} has {len(devices)} devices but mesh {spec.mesh.label()} "
            f"needs {spec.mesh.size}; pass a topology with {spec.mesh.size} devices"
        )
    t0 = time.perf_counter()
    compiled = lower_train_step(spec, make_mesh(spec.mesh, devices)).compile()
    ma = compiled.memory_analysis()
    out = {
        "trial_id": spec.trial_id,
        "topology": topology_name(spec, topology),
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "compile_s": round(time.perf_counter() - t0, 2),
    }
    # Donated state aliases its output: the high-water mark is arguments + fresh outputs + scratch.
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def compare(specs: list[TrialSpec], topology: str | None = None) -> list[dict[str, Any]]:
    """Analytic vs compiled per-device memory, side by side (ratio = analytic / compiled)."""
    rows = []
    for spec in specs:
        got = compiled_memory(spec, topology)
        predicted = memory.total(spec)
        rows.append({
            "trial_id": spec.trial_id, "strategy": spec.strategy.name, "mesh": spec.mesh.label(),
            "context_length": spec.context_length, "remat": spec.train.remat, "topology": got["topology"],
            "analytic_bytes": predicted, "compiled_bytes": got["peak_bytes"],
            "ratio": predicted / max(got["peak_bytes"], 1), "compile_s": got["compile_s"],
        })  # fmt: skip
    return rows


def render_comparison(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="analytic vs TPU-compiled memory per device")
    for h in ("strategy", "mesh", "context", "remat", "topology", "analytic", "compiled", "ratio"):
        table.add_column(h)
    for r in rows:
        table.add_row(
            r["strategy"], r["mesh"], f"{r['context_length']:,}", r["remat"], r["topology"],
            f"{r['analytic_bytes'] / 2**20:,.1f} MiB", f"{r['compiled_bytes'] / 2**20:,.1f} MiB", f"{r['ratio']:.2f}",
        )  # fmt: skip
    console.print(table)
