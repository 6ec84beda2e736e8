"""Sections 1-3 of the GPU check, in one child process: env (versions, cuDNN, the private API the flash kernel
binds), flash parity (benchmarks/gpu_check_parity.py) and kernel speed.

`python benchmarks/gpu_check_kernels.py --out FILE --t0 EPOCH --budget-s S [--dry-run]` adds its sections to
FILE (benchmarks/gpu_check.py starts it; the time budget counts from the parent's start, EPOCH).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.gpu_check_common import BLOCK, DRY, GPU, Recorder, Sizes
from jobs import flops
from jobs.attention.kernels import flash, get_kernel
from jobs.attention.kernels.mask import Mask

PEAK = flops.PEAK_TFLOPS_PER_DEVICE["h200"]  # dense bf16, the MFU denominator of every figure here
BWD_OVER_FWD = 2.5  # causal backward FLOPs per forward FLOP (the brief's count; cuDNN's bwd reads the stats)
WARMUP, TIMED = 2, 5


def env() -> dict[str, Any]:
    """Section 1: what the check ran on."""
    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except (ImportError, AttributeError) as e:  # a figure to record, not a reason to lose the API check
        jaxlib_version = f"unknown ({type(e).__name__})"
    fa, dev = flash._fa, jax.devices()[0]
    out: dict[str, Any] = {
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": dev.device_kind,
        "compute_capability": getattr(dev, "compute_capability", None),
        "python": sys.version.split()[0],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "bytes_limit": (dev.memory_stats() or {}).get("bytes_limit"),
    }
    try:
        out["cudnn_version"] = fa.check_cudnn_version()
    except Exception as e:  # noqa: BLE001 - no cuDNN (a CPU host) is a finding, not a failure
        out["cudnn_version"] = f"unavailable: {type(e).__name__}: {e}"
    drift = flash.api_drift()
    out["private_api"] = {"ok": not drift, "failed": drift}
    return out


def attention_tflop(L: int, heads: tuple[int, int, int], phase: str) -> float:
    """Causal FLOPs in TFLOP: forward 2*2*B*H*L*L*D/2, backward 2.5x forward."""
    H, _, D = heads
    fwd = 2 * 2 * H * L * L * D / 2 / 1e12
    return fwd * (1 + BWD_OVER_FWD) if phase == "fwd_bwd" else fwd


def time_kernel(kernel: str, phase: str, L: int, heads: tuple[int, int, int]) -> dict[str, Any]:
    """Jitted kernel call at B=1, bf16, causal: 2 warm-ups, then the median of 5 timed calls."""
    H, K, D = heads
    kern = get_kernel(kernel)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (
        jax.random.normal(r, (1, L, h, D), jnp.bfloat16) for r, h in zip(keys, (H, K, K, H), strict=True)
    )
    mask = lambda: Mask(jnp.arange(L), jnp.arange(L), True, min(BLOCK, L), min(BLOCK, L))

    def fwd(q, k, v):
        return kern.fwd(q, k, v, mask())

    def fwd_bwd(q, k, v, do):
        o, lse = kern.fwd(q, k, v, mask())
        return kern.bwd(q, k, v, o, lse, do, mask())

    fn, args = (fwd, (q, k, v)) if phase == "fwd" else (fwd_bwd, (q, k, v, do))
    flash.FALLBACKS.clear()
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    fallbacks = list(flash.FALLBACKS)
    for _ in range(WARMUP):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(TIMED):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    tf = attention_tflop(L, heads, phase) / med
    out = {"kernel": kernel, "phase": phase, "L": L, "heads": list(heads), "median_s": med, "times_s": times}
    out |= {"compile_s": compile_s, "tflops": tf, "frac_peak": tf / PEAK, "peak_tflops": PEAK}
    return out | {"fallbacks": fallbacks, "flash_ran": kernel == "flash" and not fallbacks}


def speed(rec: Recorder, s: Sizes) -> None:
    """Section 3: the flash kernel over the lengths (shortest first, so a tight budget keeps the most points),
    the xla kernel at one length for contrast."""
    for L in s.speed_L:
        for phase in ("fwd", "fwd_bwd"):
            rec.run(
                "speed", f"flash_{phase}_{L}", lambda L=L, p=phase: time_kernel("flash", p, L, s.speed_heads)
            )
        if L == s.xla_L:
            for phase in ("fwd", "fwd_bwd"):
                rec.run(
                    "speed", f"xla_{phase}_{L}", lambda L=L, p=phase: time_kernel("xla", p, L, s.speed_heads)
                )
    rec.data["speed"]["peak_tflops"] = PEAK
    rec.save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    sizes = DRY if a.dry_run else GPU
    rec = Recorder(a.out, a.t0, a.budget_s)
    rec.run("env", "env", env)
    try:
        from benchmarks import gpu_check_parity

        gpu_check_parity.parity(rec, sizes)
    except Exception as e:  # noqa: BLE001 - an import error there must not cost the speed figures
        rec.data.setdefault("parity", {})["error"] = f"{type(e).__name__}: {e}"
        rec.save()
    speed(rec, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
