"""The recommender's answers for the Gemma 3 and Qwen3 families on the seed clusters, from 128K to 1M tokens (no
device, no jax):

    python benchmarks/families.py          # the table, as markdown
    python benchmarks/families.py --page   # docs/results/families.md, through orchestrator.provenance

Each row is `python -m orchestrator recommend=true model=M cluster=C context_length=L`'s first answer, with its
runner-up strategy and, for a model with windowed layers, the seconds its layer types take in the answer's step and
how the best candidate with a strategy per layer type (strategy.local) compares with the answer.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import page
from orchestrator import provenance
from orchestrator.config import grid
from orchestrator.config.load import load
from orchestrator.plan import steptime, work
from orchestrator.plan.memory import gib
from orchestrator.plan.search import Answer, search

PROG = "python benchmarks/families.py"
MIX_LINES = ("a strategy per layer type:", "one strategy for every layer:")
MODELS = ("gemma3_4b", "gemma3_27b", "qwen3_8b", "qwen3_32b")
CLUSTERS = ("v5p_128", "tpu7x_128")
LENGTHS = (131_072, 524_288, 1_048_576)
NOTE = """The planner's answers, not measurements: the step-time model calibrated on published Llama runs
(docs/results/calibration.md), applied to these shapes. A windowed layer's kernel is priced at the calibrated
kernel rate, while on TPU it runs the xla kernel (docs/explanation/models.md). *a strategy per layer type*: the
best candidate whose local layers run another strategy (strategy.local), how far its predicted step is from the
answer's, and whether their bands overlap (a tie, lost on the tie-break)."""


def answer(model: str, cluster: str, length: int) -> Answer:
    (spec,) = grid.expand(load([f"model={model}", f"cluster={cluster}", f"context_length={length}"]))
    return search(spec.model, spec.cluster, length, spec.train, top=5)


def row(model: str, cluster: str, length: int) -> list[str]:
    a = answer(model, cluster, length)
    if not a.top:
        return [model, cluster, f"{length:,}", "nothing fits", "", "", "", a.closest[:80]]
    best = a.top[0]
    r, spec = best.row, best.spec
    runner = next((c for c in a.top[1:] if c.spec.strategy.name != spec.strategy.name), None)
    second = (
        f"{runner.spec.strategy.name} {runner.row.predicted_step_s / r.predicted_step_s:.2f}x"
        if runner
        else "-"
    )
    local = f" (local layers: {spec.strategy.local})" if spec.strategy.local else ""
    w = work.step_work(spec)
    kinds = steptime.layer_words(spec, w).removeprefix("layer types: ")
    # the recommender's word on a strategy per layer type (strategy.local): its best mix against the winner
    mix = next((x for x in a.losers if x.startswith(MIX_LINES)), "")
    if mix:
        kind, rest = mix.split(": ", 1)
        behind, its_best = rest.split(" (its best: ", 1)
        apart = behind.removeprefix("a tie: ").split(",")[0]
        mix = f"{kind}, {its_best.split(', ')[0]}: {apart}" + (
            ", a tie" if behind.startswith("a tie") else ""
        )
    return [
        model,
        cluster,
        f"{length:,}",
        f"{spec.strategy.name}{local} {spec.strategy.layout} {r.mesh}, {best.policy.label()}",
        f"{r.predicted_step_s:,.3g}",
        f"{r.predicted_mfu:.2f}",
        gib(r.predicted_hbm_bytes_per_device),
        f"next: {second}" + (f"; {kinds}" if kinds else ""),
        mix or "-",
    ]


def markdown() -> str:
    head = [
        "model",
        "cluster",
        "tokens",
        "recommended",
        "step s",
        "MFU",
        "HBM/device",
        "runner-up; layer types",
        "a strategy per layer type",
    ]
    rows = [row(m, c, n) for m in MODELS for c in CLUSTERS for n in LENGTHS]
    return page.table(head, rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    page.add_argument(ap, "families")
    a = ap.parse_args(argv)
    made = provenance.current(PROG, argv)
    page.publish(a.page, "Recommendations for Gemma 3 and Qwen3", made, NOTE, markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
