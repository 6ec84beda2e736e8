"""Does the TPU compiler fit a train step into a given HBM size? (libtpu on a CPU host, no TPU.)

The compiler's `memory_analysis` grows into the HBM it is given: told the chip is smaller it rematerializes and
packs tighter, and refuses only when even that does not fit. So "compiled GiB" at the real HBM overstates what a
point needs; `orchestrator.plan.aot.cache` compiles it again with libtpu's `--xla_tpu_max_hbm_size_mib` set (a
process-wide libtpu flag, hence a child process) and says whether it fits. `benchmarks/aot.py --at-plan` asks
it at the planner's figure; this script asks it for one spec:

    python benchmarks/aot_capped.py MIB < spec.json  # the capped compile as one JSON object (cached)
"""

from __future__ import annotations

import argparse
import sys

from jobs.spec import TrialSpec
from orchestrator.plan import aot


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mib", type=int, help="the HBM per device libtpu is told the chip has, in MiB")
    ap.add_argument("--cached", action="store_true", help="only the cached answer; compile nothing")
    a = ap.parse_args(argv)
    got = aot.cache.fits(TrialSpec.from_json(sys.stdin.read()), a.mib, compile=not a.cached)
    if got is None:
        print("error: not cached", file=sys.stderr)
        return 1
    print(got.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
