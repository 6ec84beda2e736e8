"""`python -m orchestrator.calibrate`: the step-time model against the published runs, each table held out of
its own fit; `--fit` fits every table and prints the constants and bands, `--write` puts them into
conf/cluster/*.yaml; `--from-sweep ID` refits a cluster on a finished sweep's own trials (refit.py).

    python -m orchestrator.calibrate [--gpu]            # held-out errors per cell, the picks, the bands
    python -m orchestrator.calibrate [--gpu] --fit      # the constants and bands the fit on every table gives
    python -m orchestrator.calibrate [--gpu] --fit --write
    python -m orchestrator.calibrate --from-sweep SWEEP_ID [--uri URI] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.calibrate import configs, family, refit


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the GPU family (default: the TPU family)")
    ap.add_argument(
        "--chip", action="store_true", help="our own runs on a real chip (orchestrator/calibrate/chip_*.json)"
    )
    ap.add_argument("--fit", action="store_true", help="fit on every table; print the constants and bands")
    ap.add_argument("--write", action="store_true", help="with --fit: write them into conf/cluster/*.yaml")
    refit.add_arguments(ap)
    a = ap.parse_args(argv)
    if a.from_sweep:
        return refit.main(a, argv)
    fam = family.GPU if a.gpu else family.CHIP if a.chip else family.TPU
    result = family.calibrate(fam)
    if a.fit:
        for chip, values in result.constants.items():
            print(chip, {k: float(f"{v:.4g}") for k, v in values.items()})
        if a.write:
            for chip, values in result.constants.items():
                print(f"wrote {configs.write(chip, values, family.header(result, chip))}")
        return 0
    print(family.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
