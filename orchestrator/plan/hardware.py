"""The chips the planner knows: libtpu's names for the TPUs and JAX devices per chip, and a device's peak rate,
MFU's denominator (the spec sheet's, or on CPU the host's matmul rate measured once)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

from jobs.spec import ClusterSpec, TrialSpec
from orchestrator import REPO

# accelerator -> (topology name prefix, chip config, JAX devices per chip): a v5p chip is one megacore device,
# a tpu7x chip two.
CHIPS = {"v5p": ("v5", "megacore", 1), "tpu7x": ("tpu7x", "default", 2)}


# cluster=local has no spec sheet (peak 0 = measured at run time); the planner measures the host the same way.
# This nominal figure (a bf16 matmul on a 2-core host: ~0.01 TFLOP/s per simulated device of 8) stands in
# where no probe can run.
NOMINAL_CPU_TFLOPS = 0.01
CPU_PEAK_ENV = "CP_PLAN_CPU_TFLOPS"  # pins the CPU matmul rate (tests, reproducible plans)
# One probe swings 10x on a shared 2-core host while the trials' own throughput does not: plan with the
# median of several.
CPU_PROBES = 5
ROOT = str(REPO)  # the probe's subprocess finds `jobs`


@functools.cache
def measured_cpu_tflops(devices_per_host: int, dtype: str) -> float:
    """TFLOP/s per simulated device, measured once per process with the job's own matmul probe
    (jobs.hardware.measure_cpu_peak) in a child process with the job's device count: the driver stays free of
    jax, and the number is the one the trial will divide by."""
    pinned = os.environ.get(CPU_PEAK_ENV)
    if pinned:
        return float(pinned)
    env = {**os.environ, **ClusterSpec(devices_per_host=devices_per_host).host_env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    code = (
        "import statistics; from jobs.hardware import measure_cpu_peak; "
        f"print(statistics.median(measure_cpu_peak({dtype!r}) for _ in range({CPU_PROBES})))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
        )
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return NOMINAL_CPU_TFLOPS  # no probe (no jax here): the nominal 2-core figure


def peak_tflops(spec: TrialSpec) -> float:
    """Peak TFLOP/s per JAX device: the cluster's spec sheet, else the measured host (one rule for the roofline
    and the step-time model)."""
    c = spec.cluster
    peak = float(c.peak_tflops_per_device)
    return peak if peak > 0 else measured_cpu_tflops(c.devices_per_host, spec.train.dtype)
