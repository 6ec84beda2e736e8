"""Expanding, validating and planning a 1,000-point grid must take well under 2 s (no device, no jax)."""

from __future__ import annotations

import sys
import time

from omegaconf import OmegaConf

from orchestrator import grid
from orchestrator.config import load
from orchestrator.plan import plan, validate

BUDGET_S = 2.0


def main() -> int:
    t0 = time.perf_counter()
    cfg = load(["+sweep=cp_scaling", "cluster=v5p_128", "model=llama3_1_8b"])
    # 4 strategies x 250 lengths (multiples of 1,024 up to 256K plus the powers of two): 1,000 points,
    # some invalid on purpose (lengths that do not tile 2 x context for zigzag).
    lengths = [1024 * k for k in range(1, 251)]
    OmegaConf.update(cfg, "sweep.axes.context_length", lengths, force_add=True)
    t1 = time.perf_counter()
    specs = grid.expand(cfg)
    t2 = time.perf_counter()
    problems = validate.validate(specs)
    t3 = time.perf_counter()
    rows = plan(specs)
    t4 = time.perf_counter()
    counts = {v: sum(r.verdict == v for r in rows) for v in ("run", "infeasible", "invalid")}
    total = t4 - t1
    print(f"compose (once, Hydra)     {t1 - t0:6.3f} s")
    print(f"expand {len(specs):,} points       {t2 - t1:6.3f} s")
    print(f"validate ({len(problems)} problems)  {t3 - t2:6.3f} s")
    print(f"plan                      {t4 - t3:6.3f} s   {counts}")
    print(f"expand + validate + plan  {total:6.3f} s   (budget {BUDGET_S} s)")
    return 0 if total < BUDGET_S and len(specs) == 1000 else 1


if __name__ == "__main__":
    sys.exit(main())
