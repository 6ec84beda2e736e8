"""The ring train step with packed documents vs one causal row at the same length, on 8 CPU devices.

Run by hand after `python -m jobs.data.documents.corpus --out data/stdlib`:

    python benchmarks/packed_step.py --length 8192 --steps 6

The whole step (tiny model, vocabulary 4,096 both ways, fp32 so the kernels compare like for like), in this
process: unpacked is the recall task (one causal mask a row), packed is the corpus (its documents' masks, the
ring skipping hops that meet no local query). Prints the median step time of each over the steps after the
first two. Simulated devices share the host's cores, so wall time is the sum of all devices' work: skipped
hops show directly, load balance does not.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks import page
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load


def median_step_s(overrides: list[str]) -> float:
    (spec,) = expand(load(overrides))
    summary = next(r for r in train(spec) if r.kind == "summary")
    return summary.step_time_median_s


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--corpus", default="data/stdlib")
    a = ap.parse_args(argv)
    base = [
        "strategy=ring",
        f"context_length={a.length}",
        f"train.steps={a.steps}",
        "train.dtype=float32",
        "model.vocab=4096",
        "cluster.max_step_seconds=1000",
    ]
    docs = ["train.data.kind=documents", f"train.data.sources=[{a.corpus}]"]
    rows = []
    for layout in ("contiguous", "zigzag", "balanced"):
        lay = [f"strategy.layout={layout}"]
        flat = median_step_s([*base, *lay]) if layout != "balanced" else None
        packed = median_step_s([*base, *lay, *docs])
        cells = [f"{flat:.2f}" if flat else "—", f"{packed:.2f}", f"{flat / packed:.2f}x" if flat else "—"]
        print(f"{layout}: {', '.join(cells)}", file=sys.stderr, flush=True)  # each layout takes minutes
        rows.append([layout, *cells])
    print(f"ring, L={a.length:,}, 8 CPU devices:\n")
    print(page.table(["layout", "unpacked s/step", "packed s/step", "speedup"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
