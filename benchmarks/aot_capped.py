"""Does the TPU compiler fit a train step into a given HBM size? (libtpu on a CPU host, no TPU.)

The compiler's `memory_analysis` grows into the HBM it is given: told the chip is smaller it rematerializes and
packs tighter, and refuses only when even that does not fit. So "compiled GiB" at the real HBM overstates what a
point needs; this compiles it again with libtpu's `--xla_tpu_max_hbm_size_mib` set (a process-wide libtpu flag,
hence a child process) and says whether it fits. `benchmarks/aot.py --at-plan` asks it at the planner's figure.

    python benchmarks/aot_capped.py MIB < spec.json      # prints one JSON line
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


def fits(spec: TrialSpec, mib: int) -> dict:
    """{"status": "compiled" | "rejected", ...} for `spec` compiled as if the chip had `mib` MiB of HBM; cached
    next to the uncapped compile."""
    path = aot._cache_path(spec, None).with_suffix(f".cap{mib}.json")
    if path.exists():
        return json.loads(path.read_text())
    env = {**os.environ, "LIBTPU_INIT_ARGS": f"--xla_tpu_max_hbm_size_mib={mib}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, str(mib)], input=spec.to_json(), capture_output=True,
                          text=True, env=env, cwd=ROOT, check=True)  # fmt: skip
    out = json.loads(done.stdout.strip().splitlines()[-1])
    path.write_text(json.dumps(out, indent=1))
    return out


def _child(mib: int) -> dict:
    import jax  # noqa: F401 -- libtpu reads LIBTPU_INIT_ARGS when jax first loads it

    from jobs.step import lower_train_step

    spec = TrialSpec.from_json(sys.stdin.read())
    out: dict = {"cap_mib": mib}
    try:
        compiled = lower_train_step(spec, aot._mesh(spec, aot._devices(spec, None))).compile()
    except Exception as e:  # noqa: BLE001 -- only the compiler's refusal is an answer
        rejected = aot.compiler_rejection(str(e))
        if rejected is None:
            raise
        return {**out, **rejected}
    ma = compiled.memory_analysis()
    used = (
        ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
    )
    return {**out, "status": "compiled", "peak_bytes": int(used)}


if __name__ == "__main__":
    print(json.dumps(_child(int(sys.argv[1]))))
