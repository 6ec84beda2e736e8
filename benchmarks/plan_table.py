"""The planner's verdicts for the four published strategies at 131,072 and 14,680,064 tokens, as the README's
markdown tables (no device, no jax):

    python benchmarks/plan_table.py cluster=v5p_128 model=llama3_1_8b train.remat=offload
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from orchestrator import grid
from orchestrator.config import load
from orchestrator.plan import plan, to_markdown

STRATEGIES = ["all_gather", "ulysses", "ring", "usp"]
LENGTHS = [131_072, 14_680_064]


def main(overrides: list[str]) -> int:
    cfg = load(["+sweep=cp_scaling", *overrides])
    OmegaConf.update(cfg, "sweep.axes.strategy", STRATEGIES, force_add=True)
    OmegaConf.update(cfg, "sweep.axes.context_length", LENGTHS, force_add=True)
    print(to_markdown(plan(grid.expand(cfg))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
