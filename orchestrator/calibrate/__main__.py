"""`python -m orchestrator.calibrate [--fit | --page PATH | --from-sweep ID]`: the TPU calibration (calibrate/tpu.py)."""

import sys

from orchestrator.calibrate import tpu

sys.exit(tpu.main(sys.argv[1:]))
