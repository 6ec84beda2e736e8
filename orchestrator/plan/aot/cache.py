"""One TPU compile of the train step and its cache: one JSON CompileResult per trial, topology and program (a
large compile takes minutes; a refusal is as deterministic, and as slow to find, as a success), in a directory
or under gs://bucket/prefix.

The compiler's `memory_analysis` grows into the HBM it is given: told the chip is smaller it rematerializes and
packs tighter, and refuses only when even that does not fit. So the sum at the real HBM overstates what a point
needs; the capped compile runs it again with libtpu's `--xla_tpu_max_hbm_size_mib` set (a process-wide libtpu
flag read when libtpu loads, hence a child process) and caches the answer next to the uncapped compile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from jobs import storage
from jobs.hardware import compiled_bytes
from jobs.spec import TrialSpec
from orchestrator import REPO
from orchestrator.plan.aot.result import CompileResult, compiler_rejection
from orchestrator.plan.aot.target import lowered, program_version, topology_tag

ENV = "CP_AOT_CACHE"
DEFAULT = ".cache/aot"
_CAP = re.compile(r"\.cap(\d+)\.json$")  # a capped compile's entry, next to the uncapped one


def cache_dir() -> Path | str:
    """$CP_AOT_CACHE, or .cache/aot: a directory (a Path), or gs://bucket/prefix (kept a str: a Path would fold
    its "//"). Read on every call, so a test, or a pool worker, may point it elsewhere."""
    where = os.environ.get(ENV) or DEFAULT
    return where.rstrip("/") if storage.is_gcs(where) else Path(where)


def location(cache: str = "") -> str:
    """Where a cache named `cache` lives ("": cache_dir()), absolute when local: a Ray worker need not share
    the driver's working directory."""
    where = cache or str(cache_dir())
    return where.rstrip("/") if storage.is_gcs(where) else os.path.abspath(where)


@contextmanager
def using(cache: str) -> Iterator[None]:
    """Read and write the cache at `cache` inside the block ("": leave $CP_AOT_CACHE as it is)."""
    if not cache:
        yield
        return
    before = os.environ.get(ENV)
    os.environ[ENV] = cache
    try:
        yield
    finally:
        os.environ.pop(ENV, None) if before is None else os.environ.__setitem__(ENV, before)


def _entry(name: str) -> Path | str:
    where = cache_dir()
    return storage.join(where, name) if isinstance(where, str) else where / name


def _stem(spec: TrialSpec, topology: str | None) -> str:
    # The trial id leaves the cluster out, so the slice count must be in the tag: one program per topology.
    return f"{spec.trial_id}-{topology_tag(spec, topology).replace(':', '_')}"


def cache_path(
    spec: TrialSpec, topology: str | None = None, *, cap_mib: int | None = None, draw: int = 1
) -> Path | str:
    """`<trial id>-<topology tag>-<program hash>.json` (lowers the step to hash it), `.cap<MiB>.json` for a
    compile capped at `cap_mib` MiB of HBM, `.draw<d>.json` for draw d > 1 (aot_draws): a Path in a directory,
    a gs:// URI (str) in a bucket."""
    name = f"{_stem(spec, topology)}-{program_version(spec, topology)}"
    if cap_mib is not None:
        return _entry(f"{name}.cap{cap_mib}.json")
    return _entry(f"{name}.json" if draw == 1 else f"{name}.draw{draw}.json")


def cached_any(spec: TrialSpec, topology: str | None = None) -> bool:
    """Whether any program of this trial and topology was compiled: a listing, no lowering (which takes
    minutes for some points), to skip points never compiled before asking which program is cached."""
    names = storage.list_names(str(cache_dir()), f"{_stem(spec, topology)}-")
    return any(n.endswith(".json") for n in names)


def cached_caps(spec: TrialSpec, topology: str | None = None) -> list[int]:
    """The HBM caps (MiB) this program was compiled at and cached (fits), in no particular order."""
    stem = os.path.basename(str(cache_path(spec, topology)))[: -len(".json")]
    names = storage.list_names(str(cache_dir()), f"{stem}.cap")
    return [int(m.group(1)) for n in names if (m := _CAP.search(n))]


def read(path: Path | str, program: str = "") -> CompileResult | None:
    """A cached entry, or None when there is none; `program` fills in the hash older entries lack."""
    if (text := storage.read_text(str(path))) is None:
        return None
    got = CompileResult.from_json(text)
    return got if got.program or not program else replace(got, program=program)


def write(path: Path | str, result: CompileResult) -> None:
    storage.write_text(str(path), result.to_json())


def lookup(
    spec: TrialSpec, topology: str | None = None, *, refresh: bool = False, draw: int = 1
) -> tuple[CompileResult, bool]:
    """compiled_memory's answer (draw `draw`'s, aot_draws), and whether it came from the cache (True) or was
    compiled now (False)."""
    path = cache_path(spec, topology, draw=draw)
    if not refresh and (got := read(path, program_version(spec, topology))) is not None:
        return got, True
    got = compile_memory(spec, topology)
    write(path, got)
    return got, False


def compiled_memory(spec: TrialSpec, topology: str | None = None, *, refresh: bool = False) -> CompileResult:
    """Per-device bytes from the TPU compiler's memory_analysis (argument, output, alias, temp, their sum, the
    compiler's peak), from the cache when it holds this program, else compiled now and cached.

    `status` is "compiled", or "rejected" when the compiler ran out of HBM: then the compiler's own figures
    (required_bytes, available_bytes, largest_buffers) instead of a traceback. Both are cached.
    """
    return lookup(spec, topology, refresh=refresh)[0]


def compile_memory(spec: TrialSpec, topology: str | None = None) -> CompileResult:
    """compiled_memory's answer, uncached: compiles now. A refusal for lack of HBM is an answer (status
    "rejected", the compiler's figures); any other compiler error is raised."""
    t0 = time.perf_counter()
    low, program = lowered(spec, topology)
    base = {"trial_id": spec.trial_id, "topology": topology_tag(spec, topology), "program": program}
    try:
        compiled = low.compile()
    except Exception as e:  # noqa: BLE001 -- jaxlib raises its own XlaRuntimeError; only OOM is an answer
        rejected = compiler_rejection(str(e))
        if rejected is None:
            raise
        return replace(rejected, **base, compile_s=round(time.perf_counter() - t0, 2))
    ma = compiled.memory_analysis()
    return CompileResult(
        **base,
        status="compiled",
        argument_bytes=int(ma.argument_size_in_bytes),
        output_bytes=int(ma.output_size_in_bytes),
        alias_bytes=int(ma.alias_size_in_bytes),
        temp_bytes=int(ma.temp_size_in_bytes),
        peak_bytes=compiled_bytes(ma),
        compiler_peak_bytes=int(getattr(ma, "peak_memory_in_bytes", 0)) or None,
        host_temp_bytes=int(getattr(ma, "host_temp_size_in_bytes", 0)) or None,
        compile_s=round(time.perf_counter() - t0, 2),
    )


ROOT = REPO
_CHILD = "import sys; from orchestrator.plan.aot.cache import child; child(sys.stdin.read())"


def fits(spec: TrialSpec, mib: int, *, compile: bool = True) -> CompileResult | None:
    """`spec` compiled as if the chip had `mib` MiB of HBM: status "compiled" (it fits) or "rejected" (with
    what the compiler said it needs); cached. With compile=False: the cached answer or None."""
    path = cache_path(spec, cap_mib=mib)
    if (got := read(path)) is not None:
        return got
    if not compile:
        return None
    env = {**os.environ, "LIBTPU_INIT_ARGS": f"--xla_tpu_max_hbm_size_mib={mib}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=spec.to_json(),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    got = replace(CompileResult.from_json(done.stdout.strip().splitlines()[-1]), cap_mib=mib)
    write(path, got)
    return got


def child(spec_json: str) -> None:
    """The child's side: compile under the LIBTPU_INIT_ARGS it started with, print one JSON line."""

    print(json.dumps(compile_memory(TrialSpec.from_json(spec_json)).as_dict()))
