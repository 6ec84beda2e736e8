"""The step-time model against published runs: the table of docs/results/calibration.md, and the fit behind
the constants.

`python -m orchestrator.calibrate.tpu` prints predicted vs published MFU for every row of
orchestrator/calibrate/published_tpu.py (calibration rows, then held-out rows) with the constants the cluster configs
carry; `--page` writes the same as docs/results/calibration.md (constants, both tables, caveats; see
orchestrator.provenance); `--fit` refits the constants on the calibration rows only and prints them (to copy
into conf/cluster/*.yaml by hand: the configs, not this script, are what the planner uses); `--from-sweep ID`
refits a cluster on a finished sweep's own trials and writes the config (orchestrator/calibrate/refit.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from orchestrator import provenance
from orchestrator.calibrate import refit
from orchestrator.calibrate.fit import FITTED, SHARED, search, with_constants
from orchestrator.calibrate.published_tpu import ROWS, SOURCES, Published
from orchestrator.plan import hardware
from orchestrator.plan.hardware import ClusterModel, model_of
from orchestrator.plan.steptime import step_time

TOLERANCE = 0.25  # held-out target: |predicted / published - 1| for every TPU row


@dataclass(frozen=True)
class Check:
    row: Published
    predicted: float  # MFU
    published: float  # MFU (midpoint of a range, or from a published step time)
    limiter: str

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def check(row: Published, model: ClusterModel | None = None) -> Check:
    """The row against the model, with its cluster's constants (or `model`'s)."""
    st = step_time(row.spec, offload=row.offload, model=model)
    return Check(row, st.mfu, row.published_mfu(st.tflops_per_device, st.peak_tflops), st.limiter)


def table(rows: list[Published] | None = None) -> list[Check]:
    """Every row with the constants in conf/cluster: calibration rows first, then held-out rows."""
    rows = ROWS if rows is None else rows
    return [check(r) for r in sorted(rows, key=lambda r: bool(r.held_out))]


def _loss(rows: list[Published], params: dict[str, float]) -> float:
    total = 0.0
    for r in rows:
        c = check(r, with_constants(r.spec, params))
        total += math.log(c.predicted / c.published) ** 2
    return total


def fit(cluster: str, fixed: dict[str, float] | None = None, rounds: int = 12) -> dict[str, float]:
    """Coordinate search on the calibration rows of one cluster (held-out rows never enter); a sweep's trials
    are refitted with the same search by orchestrator/calibrate/refit.py."""
    rows = [r for r in ROWS if r.cluster == cluster and not r.held_out]
    fixed = fixed or {}
    base = model_of(rows[0].spec.cluster)
    params = {k: float(getattr(base, k)) for k in FITTED if k not in fixed} | fixed
    free = [k for k in FITTED if k not in fixed]
    return search(lambda p: _loss(rows, p), params, free, rounds)


def markdown(checks: list[Check]) -> str:
    lines = [
        "| run | source | published MFU | predicted MFU | error | role | limiter (model) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        r = c.row
        role = f"held out: {r.held_out}" if r.held_out else "calibration"
        lines.append(
            f"| {r.label} | {r.source} | {c.published:.1%} | "
            f"{c.predicted:.1%} | {c.error:+.0%} | {role} | {c.limiter} |"
        )
    return "\n".join(lines)


# The page's constants table: (column, ClusterSpec key, format) and the chips it shows.
CONSTANTS = [
    ("matmul eff.", "matmul_efficiency", "{:.2f}"),
    ("attention eff.", "attention_efficiency", "{:.2f}"),
    ("Dh", "attention_head_dim_half", "{:.4g}"),
    ("bh (tokens)", "attention_block_half", "{:.4g}"),
    ("attention replay (forwards)", "attention_recompute", "{:.2f}"),
    ("collective links", "collective_links", "{:.0f}"),
    ("overhead", "step_overhead_s", "{:.2g} s"),
]
CHIPS = (("v5p", "v5p_128"), ("tpu7x", "tpu7x_128"), ("local CPU", "local"))

NOTE = """\
Each row is one published TPU training step (orchestrator/calibrate/published_tpu.py, with its source) set against the
planner's step-time model with the constants `conf/cluster/*.yaml` carries at this commit. *Published MFU* is
the source's figure (the midpoint where it gives a range, or model FLOPs / (its step time × peak)), against bf16
peak with MaxText's causal FLOP count; *predicted MFU* is the model's; *error* is predicted / published − 1.
Calibration rows are what `--fit` fits the constants on; held-out rows never enter the fit. The model itself:
[the step-time model](../explanation/step-time-model.md)."""


def constants_markdown() -> str:
    """The fitted constants per chip, as conf/cluster holds them; tpu7x's shared ones say they are v5p's."""
    specs = {c: hardware.load(c)[1] for _, c in CHIPS}
    lines = [
        "| chip | " + " | ".join(col for col, _, _ in CONSTANTS) + " |",
        "|---" * (len(CONSTANTS) + 1) + "|",
    ]
    for chip, name in CHIPS:
        cells = []
        for _, key, fmt in CONSTANTS:
            v = float(getattr(specs[name], key))
            cell = fmt.format(v)
            if name == "tpu7x_128" and key in SHARED and v == float(getattr(specs["v5p_128"], key)):
                cell += " (v5p's)"
            if name == "local" and key == "matmul_efficiency":
                cell += " (of the measured matmul rate)"
            cells.append(cell)
        lines.append(f"| {chip} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_markdown(checks: list[Check], held_out: bool) -> str:
    head = ["run", "source", "published MFU", "predicted MFU", "error"] + (
        ["held out because"] if held_out else []
    )
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in checks:
        r = c.row
        cells = [r.label, r.source, f"{c.published:.1%}", f"{c.predicted:.1%}", f"{c.error:+.0%}"]
        lines.append("| " + " | ".join(cells + ([r.held_out] if held_out else [])) + " |")
    return "\n".join(lines)


def page_body(checks: list[Check] | None = None) -> str:
    checks = table() if checks is None else checks
    cal = [c for c in checks if not c.row.held_out]
    held = [c for c in checks if c.row.held_out]
    within = sum(abs(c.error) <= TOLERANCE for c in held)
    v5p = hardware.load("v5p_128")[1]
    worst = max(held, key=lambda c: abs(c.error))
    held_text = (
        f"all within {TOLERANCE:.0%}"
        if within == len(held)
        else f"{within} of {len(held)} within {TOLERANCE:.0%}"
    )
    return f"""\
## Constants

What each chip's constants are (keys of `conf/cluster/*.yaml`): *matmul eff.* the share of peak the layer
matmuls reach; *attention eff.* the attention kernel's asymptote at large head_dim and blocks; *Dh* and *bh* the
head_dim and hop length (tokens per device per hop) at which the kernel runs at half that asymptote; *attention
replay* what an attention replay under full remat costs, in forwards; *collective links* the ICI links an
all-gather or all-to-all drives; *overhead* a fixed cost per step. "(v5p's)" marks a constant tpu7x takes from
v5p (see the caveats); `--fit` refits them all.

{constants_markdown()}

## Calibration rows

Fitted on: every run below 8M tokens that is not held out ({len(cal)} rows).

{rows_markdown(cal, held_out=False)}

## Held-out rows

Never fitted on: every run of 8M tokens or more, plus the ones named with their reason; {held_text}
(largest: {worst.row.label}, {worst.error:+.0%}; `tests/test_mfu_model.py` recomputes both tables and holds
every held-out row to {TOLERANCE:.0%}).

{rows_markdown(held, held_out=True)}

## Caveats

- The 10M and 14M v5p runs (full remat, so attention is replayed) are predicted well only because the attention
  replay cost was fitted on PR #4836's full-remat 64K/128K runs, at {v5p.attention_recompute:.2f} forwards: more
  than the single forward a first-principles count gives, and not explained by the model.
- Ironwood (tpu7x) has no calibration run at head_dim 128, under full remat, or with all-gather / all-to-all CP,
  so those three constants are v5p's.
- GPU chips are calibrated on published GPU runs on [their own page](calibration-gpu.md).
- `jobs/flops.py` reproduces every TFLOP/s a source gives to within 0.6 % and every source is from 2026, so no
  row needs the pre-mid-2025 full-attention FLOP correction.

## Sources

""" + "\n".join(f"- {tag}: {where}" for tag, where in SOURCES.items())


def print_fits(fits: dict[str, dict[str, float]]) -> int:
    """`--fit`'s output: each cluster's refitted constants, to copy into its conf/cluster/*.yaml."""
    for name, p in fits.items():
        print(name, {k: round(v, 4) for k, v in p.items()})
    return 0


def write(page: str, prog: str, argv: list[str], title: str, note: str, body: str) -> int:
    """`--page`: the page with this commit's provenance."""
    print(f"wrote {provenance.write_page(page, title, provenance.current(prog, argv), note, body)}")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--fit", action="store_true", help="refit the constants on the calibration rows and print them"
    )
    provenance.add_page_argument(ap, "calibration")
    refit.add_arguments(ap)
    a = ap.parse_args(argv)
    if a.from_sweep:
        return refit.main(a, argv)
    if a.fit:
        v5p = fit("v5p_128")
        return print_fits({"v5p_128": v5p, "tpu7x_128": fit("tpu7x_128", fixed={k: v5p[k] for k in SHARED})})
    if a.page:
        return write(
            a.page, "python -m orchestrator.calibrate", argv, "Step-time calibration", NOTE, page_body()
        )
    print(markdown(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
