"""Optional ground truth: compile the real train step for the cluster's TPU topology and read its memory.

libtpu compiles for a virtual TPU slice on a CPU host. jax is imported only inside
functions: the control plane stays importable without it. Results are cached on disk by trial id,
topology and program (a hash of the lowered step), because a large compile takes minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
        num_slices=spec.cluster.slices_per_trial, wrap=wrap,
    )  # fmt: skip
    return desc.devices


def _mesh(spec: TrialSpec, devices: list):
    """The trial's mesh over the topology's devices: hybrid (jobs.mesh) when it spans slices."""
    from jobs.mesh import make_mesh

    return make_mesh(spec.mesh, devices, slices=spec.cluster.slices_per_trial)


# The last program lowered (and its hash): a cache miss compiles what was hashed without tracing it again.
_LOWERED: dict[tuple[str, str], tuple[Any, str]] = {}


def lowered(spec: TrialSpec, topology: str | None = None) -> tuple[Any, str]:
    """The train step lowered for the topology's devices, and a short hash of its StableHLO text (no source
    locations): the program itself, whatever in jobs/ changed, so a compile cached for another one is not it."""
    key = (spec.trial_id, topology_tag(spec, topology))  # the program's identity, as the cache's
    if key not in _LOWERED:
        from jobs.step import lower_train_step

        devices = _devices(spec, topology)
        if len(devices) != spec.mesh.size:
            raise ValueError(
                f"topology {key[1]} has {len(devices)} devices but mesh {spec.mesh.label()} needs "
                f"{spec.mesh.size}; pass a topology with {spec.mesh.size} devices"
            )
        low = lower_train_step(spec, _mesh(spec, devices))
        _LOWERED.clear()
        _LOWERED[key] = (low, hashlib.sha256(low.as_text().encode()).hexdigest()[:8])
    return _LOWERED[key]


def program_version(spec: TrialSpec, topology: str | None = None) -> str:
    return lowered(spec, topology)[1]


def _cache_stem(spec: TrialSpec, topology: str | None) -> str:
    # The trial id leaves the cluster out, so the slice count must be in the tag: one program per topology.
    return f"{spec.trial_id}-{topology_tag(spec, topology).replace(':', '_')}"


def _cache_path(spec: TrialSpec, topology: str | None) -> Path:
    return CACHE_DIR / f"{_cache_stem(spec, topology)}-{program_version(spec, topology)}.json"


def cached_any(spec: TrialSpec, topology: str | None = None) -> bool:
    """Whether any program of this trial and topology was compiled: a glob, no lowering (which takes minutes
    for some points), to skip points never compiled before asking which program is cached."""
    return any(CACHE_DIR.glob(f"{_cache_stem(spec, topology)}-*.json"))


# The TPU compiler's own words when a program does not fit, e.g. "RESOURCE_EXHAUSTED: Ran out of memory in
# memory space hbm. ... the total memory required for HLO temporaries (150.60G) exceeds available HBM (94.75G)".
_OOM = re.compile(
    r"total memory required for (?P<what>[\w ]+?) \((?P<need>[\d.]+)\s*(?P<nu>[KMGT]?)i?B?\) exceeds "
    r"available HBM \((?P<have>[\d.]+)\s*(?P<hu>[KMGT]?)i?B?\)"
)
_USED = re.compile(r"Used (?P<need>[\d.]+)(?P<nu>[KMGT]?)i?B? of (?P<have>[\d.]+)(?P<hu>[KMGT]?)i?B? hbm")
# After trying to fit, the compiler splits its heap at the peak into live bytes and allocator fragmentation:
# "HLO temp 45.86G (100.0% utilization: Unpadded (30.75G) Padded (30.75G), 33.0% fragmentation (15.11G))".
_HEAP = re.compile(
    r"HLO temp\s+[\d.]+\s*[KMGT]?i?B? \([\d.]+% utilization: Unpadded \((?P<live>[\d.]+)\s*(?P<lu>[KMGT]?)i?B?\) "
    r"Padded \([^)]*\), [\d.]+% fragmentation \((?P<frag>[\d.]+)\s*(?P<fu>[KMGT]?)i?B?\)\)"
)
_REJECTED = ("RESOURCE_EXHAUSTED", "Ran out of memory", "exceeds available HBM")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Lines of the compiler's "largest program allocations" list worth keeping (size, shape, operator, name).
_BUFFER_LINE = re.compile(r"^\s*(?:\d+\.\s*)?(Size|Shape|Operator|Allocation type|XLA label)\s*:", re.I)


def _size(m: re.Match, number: str, unit: str) -> int:
    return int(float(m[number]) * _UNITS[m[unit]])


def compiler_rejection(message: str) -> dict[str, Any] | None:
    """The figures of a compile the TPU compiler refused for lack of HBM; None if `message` is not that."""
    if not any(m in message for m in _REJECTED):
        return None
    out: dict[str, Any] = {"status": "rejected", "error": message.strip().splitlines()[0][:500]}
    # Two wordings: before trying ("total memory required for HLO temporaries (X) exceeds available HBM (Y)")
    # and after ("Used X of Y hbm"); the first names what overflowed, so it wins when both are there.
    if m := _OOM.search(message) or _USED.search(message):
        out["required_bytes"], out["available_bytes"] = _size(m, "need", "nu"), _size(m, "have", "hu")
        out["required_for"] = m.groupdict().get("what") or "the program"
    if m := _HEAP.search(message):  # what the peak holds, and what packing it lost
        out["live_bytes"], out["fragmentation_bytes"] = _size(m, "live", "lu"), _size(m, "frag", "fu")
    lines = [ln.strip() for ln in message.splitlines() if _BUFFER_LINE.match(ln)]
    out["largest_buffers"] = lines[:24]  # the compiler lists the biggest first; a few are enough to act on
    return out


def compiled_memory(spec: TrialSpec, topology: str | None = None, *, refresh: bool = False) -> dict[str, Any]:
    """Per-device bytes from the TPU compiler's memory_analysis (argument, output, alias, temp, peak).

    `status` is "compiled", or "rejected" when the compiler ran out of HBM: then the compiler's own figures
    (required_bytes, available_bytes, largest_buffers) instead of a traceback. Both are cached: a rejection
    of the same program on the same topology is as deterministic, and as slow to find, as a success.
    """
    path = _cache_path(spec, topology)
    if path.exists() and not refresh:
        return json.loads(path.read_text())
    out = compile_memory(spec, topology)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def compile_memory(spec: TrialSpec, topology: str | None = None) -> dict[str, Any]:
    """compiled_memory's answer, uncached: compiles now (with whatever libtpu flags this process started with)."""
    t0 = time.perf_counter()
    base = {"trial_id": spec.trial_id, "topology": topology_tag(spec, topology)}
    try:
        compiled = lowered(spec, topology)[0].compile()
    except Exception as e:  # noqa: BLE001 -- jaxlib raises its own XlaRuntimeError; only OOM is an answer
        rejected = compiler_rejection(str(e))
        if rejected is None:
            raise
        return {**base, **rejected, "compile_s": round(time.perf_counter() - t0, 2)}
    ma = compiled.memory_analysis()
    out = {
        **base,
        "status": "compiled",
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "compile_s": round(time.perf_counter() - t0, 2),
    }
    # Donated state aliases its output: the high-water mark is arguments + fresh outputs + scratch.
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    # The compiler's own high-water mark of the scheduled program, what it keeps under the chip's HBM (told the
    # chip is smaller it packs and rematerializes tighter), while temp_bytes also holds allocator slack: the sum
    # can exceed the chip (docs/results/aot.md). Kept beside peak_bytes, the headline.
    if getattr(ma, "peak_memory_in_bytes", 0):
        out["compiler_peak_bytes"] = int(ma.peak_memory_in_bytes)
    # Pinned-host temporaries (remat=offload's layer inputs): not HBM, kept to tell the two memory spaces apart.
    if getattr(ma, "host_temp_size_in_bytes", 0):
        out["host_temp_bytes"] = int(ma.host_temp_size_in_bytes)
    return out


def device_peak(got: dict[str, Any]) -> int | None:
    """The compiler's own peak, when it is HBM's: with pinned-host temporaries (remat=offload) libtpu reports
    arguments + host temporaries as its peak (tpu7x_128 ring at 14M: 0.7 + 28.0 GiB), the host's figure, so
    there is none for the device (its sum stays, an upper bound)."""
    return None if got.get("host_temp_bytes") else got.get("compiler_peak_bytes")


def verdict(spec: TrialSpec, got: dict[str, Any]) -> tuple[str, str]:
    """(run | infeasible | invalid, reason) from a compile: the compiler's refusal, or its peak over the cluster's
    HBM figure, is infeasible (DESIGN: RESOURCE_EXHAUSTED is never retried).

    The compiler's own peak decides, not memory_analysis's argument + output - alias + temp: that sum holds the
    allocator's slack too and can exceed the chip's HBM for a program the compiler fits into it (v5p_128 ring at
    14,680,064 tokens, remat full: 127.1 GiB summed, 93.6 GiB peak, compiled for a 95 GiB chip). Compiles cached
    before the peak was recorded fall back to the sum, and so do compiles with pinned-host temporaries, whose
    reported peak is the host's (device_peak)."""
    gib = memory.gib
    if got.get("status") == "rejected":
        need, have = got.get("required_bytes"), got.get("available_bytes")
        what = got.get("required_for", "the program")
        figures = f"needs {gib(need)} for {what}, {gib(have)} available" if need and have else got["error"]
        if got.get("live_bytes"):
            figures += f" (at its peak {gib(got['live_bytes'])} live, {gib(got['fragmentation_bytes'])} fragmentation)"
        top = "; ".join(got.get("largest_buffers", [])[:4])
        return "infeasible", f"TPU compiler: {figures}" + (f" (largest: {top})" if top else "")
    if got.get("status") == "failed":
        return "invalid", f"TPU compile failed: {got['error']}"
    limit = int(spec.cluster.hbm_bytes_per_device)
    own = device_peak(got)
    peak = own or got["peak_bytes"]
    what = "compiler's peak" if own else "compiled peak"
    summed = f" (memory_analysis sum {gib(got['peak_bytes'])})" if own else ""
    if limit and peak > limit:
        return "infeasible", f"{what} {gib(peak)}/device > {gib(limit)} of HBM{summed}"
    return "run", f"{what} {gib(peak)}/device{summed}"


def compare(specs: list[TrialSpec], topology: str | None = None) -> list[dict[str, Any]]:
    """Analytic vs compiled per-device memory, side by side, with the verdict of the compile. The ratio is
    analytic / the compiler's peak (what the planner models and the verdict judges by; the memory_analysis sum
    where a cached compile predates the peak). A refused compile counts its required bytes as compiled (a lower
    bound: the compiler names only the part that overflowed); any other compile error is reported on its row,
    not raised."""
    rows = []
    for spec in specs:
        try:
            got = compiled_memory(spec, topology)
        except Exception as e:  # noqa: BLE001 -- one broken point must not hide the others' answers
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:500]
            got = {"status": "failed", "error": f"{type(e).__name__}: {msg}", "compile_s": 0.0}
            got["topology"] = topology_tag(spec, topology) if spec.cluster.accelerator in CHIPS else "-"
        predicted = memory.total(spec)
        compiled = got.get("peak_bytes", got.get("required_bytes"))
        # the sum only where a cached compile predates the peak; with host temporaries there is no device peak,
        # so no ratio (docs/results/aot.md, remat=offload)
        judged = compiled if "compiler_peak_bytes" not in got else device_peak(got)
        v, reason = verdict(spec, got)
        rows.append({
            "trial_id": spec.trial_id, "strategy": spec.strategy.name, "mesh": spec.mesh.label(),
            "context_length": spec.context_length, "remat": spec.train.remat, "topology": got["topology"],
            "analytic_bytes": predicted, "compiled_bytes": compiled, "status": got.get("status", "compiled"),
            "compiler_peak_bytes": got.get("compiler_peak_bytes"), "host_temp_bytes": got.get("host_temp_bytes"),
            "ratio": predicted / judged if judged else None, "compile_s": got["compile_s"],
            "verdict": v, "reason": reason,
        })  # fmt: skip
    return rows


def _gib_cell(r: dict[str, Any]) -> str:
    if r["compiled_bytes"] is None:
        return "-"
    return ("≥ " if r["status"] == "rejected" else "") + f"{r['compiled_bytes'] / 2**30:,.1f} GiB"


def _peak_cell(r: dict[str, Any]) -> str:
    """The compiler's own peak (compiled_memory's compiler_peak_bytes); "-" for compiles cached before it."""
    if not r.get("compiler_peak_bytes"):
        return "-"
    host = " (host)" if r.get("host_temp_bytes") else ""  # arguments + pinned-host temporaries
    return f"{r['compiler_peak_bytes'] / 2**30:,.1f} GiB{host}"


def render_comparison(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="analytic vs TPU-compiled memory per device")
    heads = "strategy mesh context remat topology analytic compiled compiler-peak ratio verdict reason"
    for h in heads.split():
        table.add_column(h, overflow="fold")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        table.add_row(
            r["strategy"], r["mesh"], f"{r['context_length']:,}", r["remat"], r["topology"],
            f"{r['analytic_bytes'] / 2**30:,.1f} GiB", _gib_cell(r), _peak_cell(r), ratio, r["verdict"],
            r["reason"],
        )  # fmt: skip
    console.print(table)
