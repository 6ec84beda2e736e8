"""The compile cache on disk: one JSON CompileResult per trial, topology and program (a large compile takes
minutes; a refusal is as deterministic, and as slow to find, as a success)."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from jobs.spec import TrialSpec
from orchestrator.plan.aot.compiling import compile_memory
from orchestrator.plan.aot.lowering import program_version
from orchestrator.plan.aot.result import CompileResult
from orchestrator.plan.aot.topology import topology_tag

_CAP = re.compile(r"\.cap(\d+)\.json$")  # a capped compile's entry, next to the uncapped one


def cache_dir() -> Path:
    """$CP_AOT_CACHE, or .cache/aot: read on every call, so a test may point it at a temporary directory."""
    return Path(os.environ.get("CP_AOT_CACHE", ".cache/aot"))


def _stem(spec: TrialSpec, topology: str | None) -> str:
    # The trial id leaves the cluster out, so the slice count must be in the tag: one program per topology.
    return f"{spec.trial_id}-{topology_tag(spec, topology).replace(':', '_')}"


def cache_path(spec: TrialSpec, topology: str | None = None, *, cap_mib: int | None = None) -> Path:
    """`<trial id>-<topology tag>-<program hash>.json` (lowers the step to hash it), `.cap<MiB>.json` for a
    compile capped at `cap_mib` MiB of HBM."""
    path = cache_dir() / f"{_stem(spec, topology)}-{program_version(spec, topology)}.json"
    return path if cap_mib is None else path.with_suffix(f".cap{cap_mib}.json")


def cached_any(spec: TrialSpec, topology: str | None = None) -> bool:
    """Whether any program of this trial and topology was compiled: a glob, no lowering (which takes minutes
    for some points), to skip points never compiled before asking which program is cached."""
    return any(cache_dir().glob(f"{_stem(spec, topology)}-*.json"))


def cached_caps(spec: TrialSpec, topology: str | None = None) -> list[int]:
    """The HBM caps (MiB) this program was compiled at and cached (aot.capped), in no particular order."""
    path = cache_path(spec, topology)
    return [int(m.group(1)) for p in path.parent.glob(f"{path.stem}.cap*.json") if (m := _CAP.search(p.name))]


def read(path: Path, program: str = "") -> CompileResult | None:
    """A cached entry, or None when there is none; `program` fills in the hash older entries lack."""
    if not path.exists():
        return None
    got = CompileResult.from_json(path.read_text())
    return got if got.program or not program else replace(got, program=program)


def write(path: Path, result: CompileResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.to_json())


def compiled_memory(spec: TrialSpec, topology: str | None = None, *, refresh: bool = False) -> CompileResult:
    """Per-device bytes from the TPU compiler's memory_analysis (argument, output, alias, temp, their sum, the
    compiler's peak), from the cache when it holds this program, else compiled now and cached.

    `status` is "compiled", or "rejected" when the compiler ran out of HBM: then the compiler's own figures
    (required_bytes, available_bytes, largest_buffers) instead of a traceback. Both are cached.
    """
    path = cache_path(spec, topology)
    if not refresh and (got := read(path, program_version(spec, topology))) is not None:
        return got
    got = compile_memory(spec, topology)
    write(path, got)
    return got
