"""Shared parts of benchmarks/gpu_check*.py: the sizes (one H200, or a CPU dry run), the time budget, and the
JSON recorder that keeps every section's figures when one item fails.

Pure Python (no jax): the parent process of the check never starts a JAX backend, so the processes that do
(the kernel sections, each trial) see the whole device and their own memory counters.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.spec import ModelSpec

# Same as tests/test_attention.py BF16_TOL (importing the test would force JAX onto the CPU): bf16 inputs with
# fp32 softmax statistics, measured <= ~1e-2 abs on unit-normal inputs there; tests/test_gpu_check.py keeps
# the two equal.
BF16_TOL = 3e-2
BLOCK = 512  # the kernels' block_q/block_kv, StrategySpec's default
# Fraction of --budget-s after which a section starts no new item (its rest is recorded "skipped: time"); a
# started child process is killed at HARD x budget, so the whole check ends inside the device's command limit.
DEADLINE = {"env": float("inf"), "parity": 0.30, "speed": 0.45, "trials": 0.72, "host_memory": 0.92}
HARD = 1.1
SECTIONS = tuple(DEADLINE)
SKIPPED = {"skipped": "time"}

# conf/model/tiny.yaml's values (this script may run where Hydra is not installed; the test compares them)
TINY = ModelSpec(
    name="tiny",
    vocab=256,
    embed=64,
    layers=2,
    q_heads=8,
    kv_heads=4,
    head_dim=16,
    mlp=192,
    rope_theta=10000.0,
    norm_eps=1e-5,
)
ONE_B = ModelSpec(
    name="llama_1b", vocab=32000, embed=2048, layers=16, q_heads=16, kv_heads=8, head_dim=128, mlp=8192
)


@dataclass(frozen=True)
class Sizes:
    """Every size the check uses; `GPU` on the H200, `DRY` for a CPU host (same code paths, small shapes)."""

    parity_L: int  # the hop-merging check's sequence, cut into `chunks` ring positions
    chunks: int
    parity_heads: tuple[int, int, int]  # (Hq, Hkv, D)
    wide_L: int  # the head_dim 256 check
    strategy_L: int  # every strategy through attention(...)
    speed_L: tuple[int, ...]
    speed_heads: tuple[int, int, int]
    xla_L: int  # the xla kernel's contrast point
    tiny_L: int
    big_L: int
    big_model: ModelSpec
    steps: int
    trial_kernel: str  # auto on the GPU (= flash there); flash on a CPU, where it must fall back
    budget_s: float


GPU = Sizes(
    parity_L=4096,
    chunks=4,
    parity_heads=(8, 2, 128),
    wide_L=4096,
    strategy_L=4096,
    speed_L=(8192, 32768, 131072),
    speed_heads=(32, 8, 128),
    xla_L=8192,
    tiny_L=2048,
    big_L=32768,
    big_model=ONE_B,
    steps=6,
    trial_kernel="auto",
    budget_s=480.0,
)
DRY = Sizes(
    parity_L=256,
    chunks=2,
    parity_heads=(4, 2, 32),
    wide_L=256,
    strategy_L=256,
    speed_L=(256, 512, 1024),
    speed_heads=(4, 2, 32),
    xla_L=256,
    tiny_L=256,
    big_L=512,
    big_model=TINY,
    steps=3,
    trial_kernel="flash",
    budget_s=240.0,
)


def error_of(e: BaseException) -> dict[str, str]:
    """An item's failure as the JSON keeps it: the message and the end of the traceback."""
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-3000:]}


class Recorder:
    """The check's JSON, saved after every item, so a crash or a kill loses only the item that was running."""

    def __init__(self, path: Path, t0: float, budget_s: float) -> None:
        self.path, self.t0, self.budget_s = Path(path), t0, budget_s
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def elapsed(self) -> float:
        return time.time() - self.t0

    def hard_left(self) -> float:
        """Seconds until a running child is killed."""
        return max(HARD * self.budget_s - self.elapsed(), 1.0)

    def items(self, section: str) -> dict[str, Any]:
        return self.data.setdefault(section, {}).setdefault("items", {})

    def run(self, section: str, key: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """fn's figures under data[section]["items"][key], or its error, or "skipped: time" past the deadline.

        An item already there is kept (a restarted process goes on after what its predecessor recorded); the
        item in progress is named in data["running"], so a process that dies takes only that item with it."""
        if key in self.items(section):
            return self.items(section)[key]
        if self.elapsed() > DEADLINE[section] * self.budget_s:
            res: dict[str, Any] = dict(SKIPPED)
        else:
            self.data["running"] = [section, key]
            self.save()
            t = time.perf_counter()
            try:
                res = fn()
            except Exception as e:  # noqa: BLE001 - one item's failure must not lose the other figures
                res = error_of(e)
            res["seconds"] = round(time.perf_counter() - t, 2)
        self.data.pop("running", None)
        self.items(section)[key] = res
        self.save()
        print(f"[{self.elapsed():6.1f}s] {section}/{key}: {brief(res)}", flush=True)
        return res

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def brief(res: dict[str, Any]) -> str:
    """One line of an item for the log."""
    if "skipped" in res:
        return f"skipped: {res['skipped']}"
    if "error" in res:
        return res["error"].splitlines()[0][:160]
    keys = ("max_error", "within_tol", "flash_ran", "tflops", "frac_peak", "step_time_median_s", "mfu")
    return ", ".join(
        f"{k}={res[k]:.4g}" if isinstance(res[k], float) else f"{k}={res[k]}" for k in keys if k in res
    )
