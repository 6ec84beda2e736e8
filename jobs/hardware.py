"""What a trial's devices can do and hold: the MFU denominator (a spec sheet, or a CPU host's matmul rate
measured on the spot), the runtime's device memory counters, and a compiled program's per-device memory.

jax is imported inside the functions: the control plane's AOT compile reads `compiled_bytes` without it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from jobs import flops
from jobs.spec import TrialSpec

# Pins a CPU host's matmul rate (TFLOP/s per simulated device) for the planner and for the trials' MFU alike, so
# that both divide by the same number: reproducible plans and tests (a probe swings ~10x on a shared host).
CPU_PEAK_ENV = "CP_PLAN_CPU_TFLOPS"


def pinned_cpu_tflops() -> float | None:
    """The pinned CPU matmul rate, or None where $CP_PLAN_CPU_TFLOPS is unset (or empty): measure it."""
    pinned = os.environ.get(CPU_PEAK_ENV)
    return float(pinned) if pinned else None


def measure_cpu_peak(dtype: str = "float32", n: int = 1024, reps: int = 5) -> float:
    """TFLOP/s per local device from a matmul running on every local device at once (CPU has no spec sheet)."""
    import jax

    devs = jax.local_devices()
    mesh = jax.sharding.Mesh(np.array(devs), ("d",))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.device_put(np.ones((len(devs), n, n), dtype=dtype), sh)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(reps):
        f(x).block_until_ready()
    dt = (time.perf_counter() - t0) / reps
    return 2 * n**3 / dt / 1e12


def peak_tflops(spec: TrialSpec) -> tuple[float, str]:
    """(peak TFLOP/s per device, where it comes from: the accelerator, cpu_measured_<dtype>, or cpu_pinned_<dtype>
    where CP_PLAN_CPU_TFLOPS gives a CPU host's rate)."""
    c = spec.cluster
    if c.peak_tflops_per_device > 0:
        return c.peak_tflops_per_device, c.accelerator
    if c.platform == "cpu":
        if (pinned := pinned_cpu_tflops()) is not None:
            return pinned, f"cpu_pinned_{spec.train.dtype}"
        return measure_cpu_peak(spec.train.dtype), f"cpu_measured_{spec.train.dtype}"
    return flops.PEAK_TFLOPS_PER_DEVICE.get(c.accelerator, 0.0) or float("nan"), c.accelerator


def device_memory() -> tuple[int | None, int | None]:
    """(bytes in use now, peak bytes in use), each the most over this host's devices; None where the backend
    keeps no counters (CPU). One memory_stats() call per device: a host call, so once per step at most."""
    import jax

    stats = [s for s in (d.memory_stats() for d in jax.local_devices()) if s]
    now = [s["bytes_in_use"] for s in stats if "bytes_in_use" in s]
    peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    return (max(now) if now else None), (max(peaks) if peaks else None)


def program_peak_bytes(ma: Any) -> int | None:
    """The compiled program's own high-water mark in device memory: the compiler's peak (the figure libtpu
    refuses a program by), less what lives in host memory (train.memory's pinned-host state, which the TPU
    compiler counts in its peak). None where the backend gives no peak (CPU reports 0)."""
    peak = int(getattr(ma, "peak_memory_in_bytes", 0) or 0)
    if peak <= 0:
        return None
    host = sum(int(getattr(ma, f"host_{k}_size_in_bytes", 0) or 0) for k in ("argument", "output", "temp"))
    return peak - host + int(getattr(ma, "host_alias_size_in_bytes", 0) or 0)


def compiled_bytes(ma: Any) -> int:
    """argument + output - alias + temp: donated state aliases its output, so the high-water mark is the
    arguments, the fresh outputs and the scratch."""
    return int(
        ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
    )
