"""Does the TPU compiler fit a train step into a given HBM size? (libtpu on a CPU host, no TPU.)

The compiler's `memory_analysis` grows into the HBM it is given: told the chip is smaller it rematerializes and
packs tighter, and refuses only when even that does not fit. So "compiled GiB" at the real HBM overstates what a
point needs; this compiles it again with libtpu's `--xla_tpu_max_hbm_size_mib` set (a process-wide libtpu flag,
hence a child process) and says whether it fits. `benchmarks/aot.py --at-plan` asks it at the planner's figure.

    LIBTPU_INIT_ARGS=--xla_tpu_max_hbm_size_mib=MIB python benchmarks/aot_capped.py < spec.json  # one JSON line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jobs.spec import TrialSpec
from orchestrator.plan import aot

ROOT = Path(__file__).resolve().parent.parent


def fits(spec: TrialSpec, mib: int, *, compile: bool = True) -> dict | None:
    """{"status": "compiled" | "rejected", ...} for `spec` compiled as if the chip had `mib` MiB of HBM; cached
    next to the uncapped compile. With compile=False: the cached answer or None."""
    path = aot._cache_path(spec, None).with_suffix(f".cap{mib}.json")
    if path.exists():
        return json.loads(path.read_text())
    if not compile:
        return None
    # LIBTPU_INIT_ARGS is read when libtpu loads, once per process: hence a child with it in its environment.
    env = {**os.environ, "LIBTPU_INIT_ARGS": f"--xla_tpu_max_hbm_size_mib={mib}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__], input=spec.to_json(), capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True)  # fmt: skip
    out = {"cap_mib": mib, **json.loads(done.stdout.strip().splitlines()[-1])}
    path.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    print(json.dumps(aot.compile_memory(TrialSpec.from_json(sys.stdin.read()))))
