"""Does the TPU compiler fit the train step into a given HBM size? A compile with libtpu told the chip is smaller.

The compiler's `memory_analysis` grows into the HBM it is given: told the chip is smaller it rematerializes and
packs tighter, and refuses only when even that does not fit. So the sum at the real HBM overstates what a point
needs; this compiles it again with libtpu's `--xla_tpu_max_hbm_size_mib` set (a process-wide libtpu flag read
when libtpu loads, hence a child process) and caches the answer next to the uncapped compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from jobs.spec import TrialSpec
from orchestrator.plan.aot.cache import cache_path, read, write
from orchestrator.plan.aot.result import CompileResult

ROOT = Path(__file__).resolve().parents[3]
_CHILD = "import sys; from orchestrator.plan.aot.capped import child; child(sys.stdin.read())"


def fits(spec: TrialSpec, mib: int, *, compile: bool = True) -> CompileResult | None:
    """`spec` compiled as if the chip had `mib` MiB of HBM: status "compiled" (it fits) or "rejected" (with
    what the compiler said it needs); cached. With compile=False: the cached answer or None."""
    path = cache_path(spec, cap_mib=mib)
    if (got := read(path)) is not None:
        return got
    if not compile:
        return None
    env = {**os.environ, "LIBTPU_INIT_ARGS": f"--xla_tpu_max_hbm_size_mib={mib}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD], input=spec.to_json(), capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True)  # fmt: skip
    got = replace(CompileResult.from_json(done.stdout.strip().splitlines()[-1]), cap_mib=mib)
    write(path, got)
    return got


def child(spec_json: str) -> None:
    """The child's side: compile under the LIBTPU_INIT_ARGS it started with, print one JSON line."""
    from orchestrator.plan.aot.compiling import compile_memory

    print(json.dumps(compile_memory(TrialSpec.from_json(spec_json)).as_dict()))
