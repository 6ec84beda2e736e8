"""Expanding, validating and planning a 1,000-point grid must take well under 2 s (no device, no jax)."""

from __future__ import annotations

import sys
import time

from omegaconf import OmegaConf

from orchestrator.config import grid
from orchestrator.config.load import load
from orchestrator.plan import plan, validity

BUDGET_S = 2.0
POINTS = 1000


def over_hbm_cost(cfg) -> str:
    """Points over HBM also plan the other remat presets (to name one that fits): what that costs per point."""
    OmegaConf.update(cfg, "sweep.axes.context_length", [2**17 * k for k in range(64, 113)], force_add=True)
    specs = grid.expand(cfg)
    t0 = time.perf_counter()
    rows = plan(specs)
    dt = time.perf_counter() - t0
    over = sum(r.reason.startswith("needs ") for r in rows)
    return f"plan {len(rows)} points of 8M-14M tokens ({over} over HBM): {dt:.3f} s, {dt / len(rows) * 1e3:.2f} ms/point"


def main() -> int:
    t0 = time.perf_counter()
    cfg = load(["+sweep=cp_scaling", "cluster=v5p_128", "model=llama3_1_8b"])
    # every registered strategy x lengths (multiples of 1,024 from 1K up) to make ~1,000 points, some invalid on
    # purpose (lengths that do not tile 2 x context for zigzag).
    strategies = list(cfg.sweep.axes.strategy)
    lengths = [1024 * k for k in range(1, POINTS // len(strategies) + 1)]
    OmegaConf.update(cfg, "sweep.axes.context_length", lengths, force_add=True)
    t1 = time.perf_counter()
    specs = grid.expand(cfg)
    t2 = time.perf_counter()
    problems = validity.validate(specs)
    t3 = time.perf_counter()
    rows = plan(specs)
    t4 = time.perf_counter()
    counts = {v: sum(r.verdict == v for r in rows) for v in ("run", "infeasible", "invalid")}
    total = t4 - t1
    print(f"compose (once, Hydra)     {t1 - t0:6.3f} s")
    print(f"expand {len(specs):,} points       {t2 - t1:6.3f} s   ({len(strategies)} strategies)")
    print(f"validate ({len(problems)} problems)  {t3 - t2:6.3f} s")
    print(f"plan                      {t4 - t3:6.3f} s   {counts}")
    print(f"expand + validate + plan  {total:6.3f} s   (budget {BUDGET_S} s)")
    print(over_hbm_cost(cfg))
    return 0 if total < BUDGET_S and len(specs) == len(strategies) * len(lengths) else 1


if __name__ == "__main__":
    sys.exit(main())
