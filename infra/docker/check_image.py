"""Self-test of the image: can it compose, expand and plan the nightly sweep, and reach Ray, MLflow and GCS?

Run by `entrypoint.sh --check` at build time and by the tests. CP_REQUIRE_LIBTPU=1 (set in the Dockerfile) also
requires libtpu, which the TPU hosts need and a CPU-only dev checkout does not have.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import shutil
import sys

NIGHTLY = ["+sweep=cp_scaling", "cluster=v5p_128", "model=llama3_1_8b", "tracking=server"]


def main() -> int:
    problems = []
    for mod in ("ray", "jax", "mlflow", "google.cloud.storage", "orchestrator.driver", "jobs.spec"):
        try:
            importlib.import_module(mod)
        except Exception as e:  # any import failure means the image cannot run a sweep
            problems.append(f"import {mod}: {e}")
    for exe in ("ray", "mlflow"):
        if shutil.which(exe) is None:
            problems.append(f"{exe} CLI not on PATH")
    if os.environ.get("CP_REQUIRE_LIBTPU") == "1" and importlib.util.find_spec("libtpu") is None:
        problems.append("libtpu is not installed (pip install '.[tpu]')")
    if not problems:
        from orchestrator.config.grid import expand
        from orchestrator.config.load import load
        from orchestrator.plan import plan

        try:
            rows = plan(expand(load(NIGHTLY)))
            print(f"nightly sweep plans {len(rows)} points on v5p_128")
        except Exception as e:
            problems.append(f"planning {' '.join(NIGHTLY)}: {e}")
    for p in problems:
        print(f"image check: {p}", file=sys.stderr)
    if problems:
        return 1
    versions = {d: md.version(d) for d in ("ray", "jax", "mlflow")}
    versions["libtpu"] = md.version("libtpu") if importlib.util.find_spec("libtpu") else "absent"
    print("image check ok: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
