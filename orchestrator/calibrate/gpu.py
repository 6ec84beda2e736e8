"""The step-time model against published GPU runs: the fit behind conf/cluster/dgx_*.yaml's constants and the
table of docs/results/calibration-gpu.md.

`python -m orchestrator.calibrate.gpu` prints predicted vs published MFU for every row of
orchestrator/calibrate/published_gpu.py (calibration rows, then held-out rows) with the constants the dgx configs
carry; `--fit` refits them on the calibration rows only and prints them (to copy into the configs by hand, as
orchestrator/calibrate/tpu.py does for the TPUs); `--page [PATH]` writes the results page. `section()` is
the page's body, for a page that wants it under its own header.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from orchestrator import provenance
from orchestrator.calibrate.fit import FITTED, search, with_constants
from orchestrator.calibrate.published_gpu import (
    CHECKS,
    FLOP_TOLERANCE,
    FP8_SHARE,
    ROWS,
    SOURCES,
    GpuPublished,
)
from orchestrator.calibrate.tpu import CONSTANTS, Check, check, markdown, print_fits, rows_markdown, write
from orchestrator.plan import hardware

CLUSTERS = (("H100", "dgx_h100"), ("H200", "dgx_h200"), ("B200", "dgx_b200"))
# What each GPU's fit may move (FITTED's bounds); every other constant stays at its config's value. H100's
# calibration rows pin the layer matmuls (MaxText's BF16 4K step) and the attention kernel (NeMo's 512K and 1M);
# B200's two rows pin only the kernel. The rest is a first-principles or borrowed value the configs say.
FREE = {"dgx_h100": ("matmul_efficiency", "attention_efficiency"), "dgx_b200": ("attention_efficiency",)}
# Chips without rows of their own take these chips' fitted constants (H200: the same GH100 compute as H100).
COPY = {"dgx_h200": "dgx_h100", "dgx_b200": "dgx_h100"}
# Kept at v5p's (v5p_128.yaml) on every GPU: no GPU row varies head_dim, hop length or attention replay.
BORROWED = ("attention_head_dim_half", "attention_block_half", "attention_recompute")
START = "v5p_128"  # every fit starts its free constants at this TPU config's, so a refit does not drift
# The H100 loss has a long shallow valley (matmul against attention efficiency through the 4K row): the
# coordinate search needs many rounds to walk it (each costs ~10 ms here).
ROUNDS = 128


def rows_of(cluster: str, held_out: bool = False) -> list[GpuPublished]:
    return [r for r in ROWS if r.cluster == cluster and bool(r.held_out) == held_out]


def table(rows: Sequence[GpuPublished] | None = None) -> list[Check]:
    """Every GPU row with the constants in conf/cluster: calibration rows first, then held-out rows."""
    rows = ROWS if rows is None else rows
    return [check(r) for r in sorted(rows, key=lambda r: bool(r.held_out))]


def loss(rows: Sequence[GpuPublished], params: dict[str, float]) -> float:
    """Squared log error of predicted against published MFU, as the TPU fit counts it."""
    total = 0.0
    for r in rows:
        c = check(r, with_constants(r.spec, params))
        total += math.log(c.predicted / c.published) ** 2
    return total


def constants(cluster: str) -> dict[str, float]:
    """The fitted-constant keys as conf/cluster/<cluster>.yaml holds them."""
    c = hardware.load(cluster)[1]
    return {k: float(getattr(c, k)) for k in FITTED}


def fit_gpu(cluster: str, fixed: dict[str, float] | None = None, rounds: int = ROUNDS) -> dict[str, float]:
    """Coordinate search (orchestrator/calibrate/fit.py) of FREE[cluster] on that cluster's calibration rows,
    from START's values (the rest at the config's, or `fixed`); held-out rows never enter."""
    rows, fixed = rows_of(cluster), fixed or {}
    free = [k for k in FREE.get(cluster, ()) if k not in fixed]
    start = hardware.load(START)[1]
    params = constants(cluster) | fixed | {k: float(getattr(start, k)) for k in free}
    return search(lambda p: loss(rows, p), params, free, rounds)


def fit_all(rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """H100 first; B200 fits its kernel with H100's other constants; H200 is H100's."""
    out = {"dgx_h100": fit_gpu("dgx_h100", rounds=rounds)}
    h100 = out["dgx_h100"]
    out["dgx_b200"] = fit_gpu(
        "dgx_b200", {k: v for k, v in h100.items() if k not in FREE["dgx_b200"]}, rounds
    )
    out["dgx_h200"] = dict(h100)
    return out


def constants_markdown() -> str:
    """The step-time constants per GPU as the configs hold them, each borrowed one marked with its origin."""
    have = {name: constants(name) for _, name in CLUSTERS}
    lines = [
        "| GPU | " + " | ".join(col for col, _, _ in CONSTANTS) + " |",
        "|---" * (len(CONSTANTS) + 1) + "|",
    ]
    for gpu, name in CLUSTERS:
        cells = []
        for _, key, fmt in CONSTANTS:
            v, mark = have[name][key], ""
            if key in BORROWED:
                mark = " (v5p's)"
            elif name in COPY and key in FREE[COPY[name]] and key not in FREE.get(name, ()):
                mark = " (H100's)"
            cells.append(fmt.format(v) + mark)
        lines.append(f"| {gpu} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks_markdown() -> str:
    lines = [
        "| source figure | tokens/s/GPU | its TFLOP/s/GPU | ours (full attention) | difference |",
        "|---|---|---|---|---|",
    ]
    for c in CHECKS:
        lines.append(
            f"| {c.label} | {c.tokens_per_s:,.0f} | {c.tflops:,.0f} | {c.ours:,.1f} | {c.error:+.2%} |"
        )
    return "\n".join(lines)


NOTE = """\
Each row is one published GPU training step (orchestrator/calibrate/published_gpu.py, with its source and how its
figure was converted) set against the planner's step-time model with the constants `conf/cluster/dgx_*.yaml`
carry at this commit. *Published MFU* is against dense BF16 peak with jobs/flops.py's causal FLOP count (NeMo's
TFLOP/s, which count the whole attention square, are scaled to it); *predicted MFU* is the model's; *error* is
predicted / published − 1. Calibration rows are what `--fit` fits on; held-out rows never enter the fit. The
model itself: [the step-time model](../explanation/step-time-model.md)."""


def section(checks: list[Check] | None = None) -> str:
    """The page's body (constants, both tables, the FLOP-count check, caveats, sources) as markdown."""
    checks = table() if checks is None else checks
    cal = [c for c in checks if not c.row.held_out]
    held = [c for c in checks if c.row.held_out]
    worst = max(held, key=lambda c: abs(c.error))
    under = sum(c.error < 0 for c in held if "FP8" in c.row.held_out)
    fp8 = sum("FP8" in c.row.held_out for c in held)
    return f"""\
## Constants

Keys of `conf/cluster/dgx_*.yaml` (the columns of the TPU page). *collective links* is 1: NVSwitch gives one
all-gather or all-to-all the GPU's whole NVLink bandwidth, which `ici_bytes_per_s` already is; *overhead* is not
fitted (two constants fit H100's three rows). "(H100's)" marks a constant fitted on H100 only (H200 has no
published row; B200's rows pin only its kernel); "(v5p's)" one kept at v5p's: every GPU row has head_dim 128,
hops of 4K tokens or more, and none replays attention in a way that would pin it.

{constants_markdown()}

## Calibration rows

Fitted on ({len(cal)} rows): the H100 and B200 rows whose FP8 linear layers are at most {FP8_SHARE:.0%} of the
FLOPs, and the one BF16 H100 row.

{rows_markdown(cal, held_out=False)}

## Held-out rows

Never fitted on ({len(held)} rows; largest error: {worst.row.label}, {worst.error:+.0%}). {under} of the {fp8}
rows held out for FP8 are predicted below their published MFU: the model runs their linear layers at BF16 rates.

{rows_markdown(held, held_out=True)}

## FLOP count

Where NeMo gives both tokens/s and TFLOP/s per GPU, jobs/flops.py with the whole attention square counted
reproduces its TFLOP/s within {FLOP_TOLERANCE:.1%} (`tests/test_calibration_gpu.py` holds it there); the causal
count the rows use is that count times the causal share of attention.

{checks_markdown()}

## Caveats

- Every NeMo row is one model replica: its data-parallel replicas and their gradient reduction are left out, and
  remat is taken as none (the tables do not say).
- torchtitan's H100s ran at a 500 W limit with HBM2e: their peak is below the 989 TFLOP/s the MFU divides by.
- No H200 run is published here: H200's constants are H100's; its extra HBM changes only what fits.
- No GPU run at head_dim 256 or with Ulysses CP: those predictions rest on v5p's Dh and on NVLink's rate alone.

## Sources

""" + "\n".join(f"- {tag}: {where}" for tag, where in SOURCES.items())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the GPU constants on the calibration rows")
    provenance.add_page_argument(ap, "calibration-gpu")
    a = ap.parse_args(argv)
    if a.fit:
        return print_fits(fit_all())
    if a.page:
        return write(
            a.page,
            "python -m orchestrator.calibrate.gpu",
            argv,
            "Step-time calibration on GPUs",
            NOTE,
            section(),
        )
    print(markdown(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
