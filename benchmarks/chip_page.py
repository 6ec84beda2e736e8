"""What benchmarks/chip.py measured on a real chip, against the planner: the calibration table and the page.

    python benchmarks/chip_page.py --runs benchmarks/chip_runs/2026-12-07 --write-table
        # orchestrator/calibrate/chip_v5e_1.json: each point that ran (spec, median step, program peak) and the
        # kernel constants the splash sweep gives; then `python -m orchestrator.calibrate --chip --fit --write`
    python benchmarks/chip_page.py --runs benchmarks/chip_runs/2026-12-07 --page   # docs/results/v5e.md

No device and no jax here: the chip's figures come from the run folder (chip.py's JSON lines and the specs it ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from benchmarks import page
from jobs.spec import TrialSpec
from orchestrator import provenance
from orchestrator.calibrate import chip, family
from orchestrator.plan import cluster_model, plan_one, steptime

PROG = "python benchmarks/chip_page.py"
CLUSTER = "v5e_1"
GIB = 2**30
HBM_GOAL = 0.10  # the planner's HBM within 10 % of the program's own peak
# Points measured before the job's rules changed, so they no longer say what the job runs (shown, not judged)
SUPERSEDED = {
    "p10": "ran with splash's fused backward, whose partial dq at 131,072 tokens (64 GiB: the OOM's 65.07G) no "
    "longer fuses (jobs.tuning.FUSED_DQ_BYTES); the two-kernel backward's program (3.0 GiB, libtpu for v5e:1x1) "
    "was not run on the chip",
}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    spec: TrialSpec  # as it ran: its blocks, on this cluster
    ok: bool
    step_s: float | None
    mfu: float | None
    program_peak: int | None
    runtime_peak: int | None
    compile_s: float | None
    error: str


def runs(folder: Path) -> list[Run]:
    """Each train point of the run folder, its spec as it ran (the block the run recorded) on CLUSTER."""
    cluster = cluster_model.load(CLUSTER)[0]
    specs = {d["name"]: d["spec"] for d in lines(folder / "specs.jsonl")}
    out = []
    for r in lines(folder / "train.jsonl"):
        if r.get("skipped"):
            continue
        d = dict(specs[r["name"]])
        d["strategy"] = dict(d["strategy"], block_q=r["block"], block_kv=r["block"])
        spec = dataclasses.replace(TrialSpec.from_dict(d), cluster=cluster)
        start, summary = r.get("start") or {}, r.get("summary") or {}
        runtime = (r.get("runtime") or [None, None])[1]
        error = (r.get("error") or "").split("\n")[0]
        out.append(
            Run(
                r["name"],
                spec,
                bool(r["ok"]),
                summary.get("step_time_median_s"),
                summary.get("mfu"),
                start.get("program_peak_bytes"),
                runtime,
                start.get("compile_s"),
                error[error.find("RESOURCE_EXHAUSTED") :] if "RESOURCE_EXHAUSTED" in error else error,
            )
        )
    return out


def block_half(splash: list[dict]) -> float:
    """The block at which a block's fixed work halves splash's rate, rate = a_L x b/(b + half), least squares in
    log over the bare two-kernel sweep at the blocks a job runs (512 and up; one a_L per length). Smaller blocks
    fall off faster than this form (128: 15 TFLOP/s): the planner's block effect is for 512 and up."""
    rows = [
        r
        for r in splash
        if r.get("path") == "bare" and not r.get("fused_bwd") and r.get("seconds") and r["block"] >= 512
    ]
    best, best_err = 0.0, math.inf
    for half in np.linspace(0, 2048, 513):
        err = 0.0
        for L in {r["length"] for r in rows}:
            at = [(r["block"], math.log(r["tflops"])) for r in rows if r["length"] == L]
            res = [y - math.log(b / (b + half)) for b, y in at]
            err += float(np.var(res)) * len(res)
        if err < best_err:
            best, best_err = float(half), err
    return best


def xla_ratio(splash: list[dict]) -> float:
    """The xla kernel's rate over splash's at the job's own blocks (the job path, same shapes), block effect
    taken out: what xla_attention_ratio prices; the geometric mean over the shapes measured."""
    half = block_half(splash)
    job = [r for r in splash if r.get("path") == "job" and r.get("seconds")]
    ratios = []
    for sp in (r for r in job if r["kernel"] == "splash"):
        for x in (r for r in job if r["kernel"] == "xla" and r["length"] == sp["length"]):
            raw = x["tflops"] / sp["tflops"]
            blocks = (x["block"] / (x["block"] + half)) / (sp["block"] / (sp["block"] + half))
            ratios.append(raw / blocks)
    return float(math.exp(np.mean(np.log(ratios)))) if ratios else 1.0


def write_table(folder: Path) -> Path:
    """orchestrator/calibrate/chip_<cluster>.json: the points that ran as the job runs today, and the kernel
    constants."""
    env = (lines(folder / "env.jsonl") or [{}])[0]
    stamp = f"{env.get('device_kind', 'tpu')}, jax {env.get('versions', {}).get('jax', '?')}, {folder.name}"
    splash = lines(folder / "splash.jsonl")
    points = [
        {
            "name": r.name,
            "spec": json.loads(r.spec.to_json()),
            "step_s": r.step_s,
            "program_peak_bytes": r.program_peak,
            "mfu": r.mfu,
            "measured": stamp,
        }
        for r in runs(folder)
        if r.ok and r.name not in SUPERSEDED
    ]
    kernel = {"attention_block_half": block_half(splash), "xla_attention_ratio": xla_ratio(splash)}
    out = chip.path(CLUSTER)
    out.write_text(json.dumps({"kernel": kernel, "points": points}, indent=1) + "\n")
    return out


def _g(b: float | None) -> str:
    return f"{b / GIB:.2f}" if b else "-"


def body(folder: Path) -> str:
    env = (lines(folder / "env.jsonl") or [{}])[0]
    out = [
        "## The chip",
        "",
        f"{env.get('device_kind')}: {env.get('devices')} device, "
        f"{env.get('memory_stats', {}).get('bytes_limit', 0) / GIB:.3f} GiB usable to JAX "
        f"(memory_stats bytes_limit), {env.get('cpus')} host cores; "
        + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
        + ".",
        "",
    ]
    mm = lines(folder / "matmul.jsonl")
    out += [
        page.table(
            ["bf16 matmul", "TFLOP/s", "of 197"],
            [[r["n"], f"{r['tflops']:.1f}", f"{r['tflops'] / 197:.0%}"] for r in mm],
        ),
        "",
    ]
    hl = lines(folder / "hostlink.jsonl")
    out += [
        "## The host link",
        "",
        "A jitted copy between device memory and pinned host memory (`out_shardings` with memory kind "
        "`pinned_host`, then back), median of five. Host to device is what `train.memory.host` and "
        "`remat=offload` pay coming back; device to host here includes the pinned pages' first touch in this VM, "
        "and inside a step it ran far faster (the host-optimizer point below moves 9.5 GB in 0.56 s of exposed "
        "time): the planner prices the host link at the host-to-device rate.",
        "",
        page.table(
            ["bytes", "host -> device GB/s", "device -> host GB/s"],
            [
                [
                    f"{r['bytes'] / 2**20:,.0f} MiB",
                    f"{r['host_to_device_bytes_per_s'] / 1e9:.1f}",
                    f"{r['device_to_host_bytes_per_s'] / 1e9:.2f}",
                ]
                for r in hl
            ],
        ),
        "",
    ]
    splash = lines(folder / "splash.jsonl")
    bare = [r for r in splash if r.get("path") == "bare"]
    out += [
        "## Splash: block sizes and the fused backward",
        "",
        "One causal call, forward and backward (`jax.value_and_grad` of its sum), bf16, q heads x kv heads x "
        "head_dim as the train points' (Qwen3 0.6B: 16 x 8 x 128), median of five; TFLOP/s counts the causal "
        "half, forward once and backward 2.5 times. `bare` is `make_splash_mha` as jax ships it; `job` is the "
        "job's own path (`jobs.attention.attention`, strategy none, its layout [B, L, H, D]) at the block "
        "jobs/tuning.py holds and the fused backward where jobs.tuning.fused_backward allows it.",
        "",
        page.table(
            ["path", "kernel", "length", "block", "fused bwd", "ms", "TFLOP/s", "note"],
            [
                [
                    r["path"],
                    r.get("kernel", "splash"),
                    f"{r['length']:,}",
                    r["block"],
                    "yes" if r.get("fused_bwd") else ("-" if r["path"] == "job" else "no"),
                    f"{r['seconds'] * 1e3:.2f}" if r.get("seconds") else "-",
                    f"{r['tflops']:.1f}" if r.get("tflops") else "-",
                    (r.get("error") or "")[:48],
                ]
                for r in splash
                if r.get("path")
            ],
        ),
        "",
    ]
    job = {(r["length"], r["kernel"]): r for r in splash if r.get("path") == "job" and r.get("seconds")}
    ok_bare = [r for r in bare if r.get("seconds")]
    cmp = []
    for (L, k), r in sorted(job.items()):
        if k != "splash":
            continue
        best = min((b for b in ok_bare if b["length"] == L), key=lambda b: b["seconds"])
        same = [b for b in ok_bare if b["length"] == L and b["block"] == r["block"] and b["fused_bwd"]]
        xla = job.get((L, "xla"))
        cmp.append(
            [
                f"{L:,}",
                f"{best['seconds'] / r['seconds']:.3f}",
                f"{same[0]['seconds'] / r['seconds']:.3f}" if same else "-",
                f"{xla['seconds'] / r['seconds']:.2f}" if xla else "-",
            ]
        )
    out += [
        "Our path against bare splash (speed ratio: bare's time over ours; at least 0.95 is the goal), and the "
        "xla kernel's time over splash's on the same path:",
        "",
        page.table(["length", "vs bare's best", "vs bare, same block", "xla / splash time"], cmp),
        "",
        f"Fitted from the sweep (`--write-table`): a block's fixed work halves splash's rate at "
        f"{block_half(splash):.0f}-token blocks (attention_block_half), the xla kernel runs at "
        f"{xla_ratio(splash):.2f} of splash's rate block for block (xla_attention_ratio).",
        "",
    ]
    out += train_section(folder)
    return "\n".join(out)


def train_section(folder: Path) -> list[str]:
    result = family.calibrate(family.CHIP) if chip.points(CLUSTER) else None
    held = {c.row.spec.trial_id: c for c in (result.held_out if result else [])}
    model = cluster_model.load(CLUSTER)[1]
    rows, verdicts, hbm_ok, band_ok, judged, hbm_n = [], 0, 0, 0, 0, 0
    points = runs(folder)
    for r in points:
        row = plan_one(r.spec, model)
        pred_hbm = row.predicted_hbm_bytes_per_device or 0
        outcome = "ran" if r.ok else "OOM at compile" if "RESOURCE_EXHAUSTED" in r.error else r.error[:40]
        right = (row.verdict == "run") == r.ok
        note = SUPERSEDED.get(r.name, "")
        if not note:
            verdicts += right
        hbm_err = pred_hbm / r.program_peak - 1 if r.ok and r.program_peak else None
        if hbm_err is not None and not note:
            hbm_n += 1
            hbm_ok += abs(hbm_err) <= HBM_GOAL
        cell = held.get(r.spec.trial_id)
        band = "-"
        if cell and r.ok and not note:
            st = steptime.step_time(r.spec, model=model)
            lo, hi = steptime.band_of(model, st.settled)
            ratio = r.step_s / cell.predicted_s
            inside = lo <= ratio <= hi
            judged += 1
            band_ok += inside
            band = f"{cell.predicted_s:.3f} ({ratio:.2f}x, {'in' if inside else 'OUT'})"
        s = r.spec
        what = (
            f"{s.model.name} {s.context_length // 1024}K b{s.train.batch} {s.kernel}/{s.strategy.block_q} "
            f"{s.train.remat}" + (f" host={','.join(s.train.memory.host)}" if s.train.memory.host else "")
        )
        rows.append(
            [
                r.name,
                what,
                row.verdict,
                outcome,
                "yes" if right else "NO",
                _g(pred_hbm),
                _g(r.program_peak),
                f"{hbm_err:+.1%}" if hbm_err is not None else "-",
                _g(r.runtime_peak) if r.ok else "-",
                f"{row.predicted_step_s:.3f}" if row.predicted_step_s else "-",
                band,
                f"{r.step_s:.3f}" if r.step_s else "-",
                f"{r.mfu:.3f}" if r.mfu else "-",
                note,
            ]
        )
    n = sum(1 for r in points if r.name not in SUPERSEDED)
    bands = result.bands if result else {}
    return [
        "## Train steps: the planner against the chip",
        "",
        "Each point through the job's own `jobs.train.train` on the chip (strategy none, one device), five or "
        "four steps, the median of all but the first. *planner* is `plan_one` with conf/cluster/v5e_1.yaml as "
        "fitted now; *program GiB* the compiled step's own peak (`program_peak_bytes`: libtpu's "
        "`peak_memory_in_bytes` less host memory), *runtime GiB* the runtime's `peak_bytes_in_use` counter "
        "(the process's high-water mark over every point before it); *held out* the step predicted by the fit on "
        "every other point, measured over it, and whether that lies in the band.",
        "",
        page.table(
            [
                "point",
                "what",
                "planner",
                "chip",
                "verdict right",
                "planner GiB",
                "program GiB",
                "HBM error",
                "runtime GiB",
                "planner step s",
                "held out s (measured/held out)",
                "measured s",
                "MFU",
                "note",
            ],
            rows,
        ),
        "",
        f"Verdicts right: {verdicts} of {n}. HBM within {HBM_GOAL:.0%} of the program's peak: {hbm_ok} of "
        f"{hbm_n} points that ran. Held-out steps inside their band: {band_ok} of {judged}"
        + (
            f" (band: {', '.join(f'{k} {lo:.3f}x-{hi:.3f}x' for k, (lo, hi) in bands.items())})."
            if bands
            else "."
        ),
        "",
    ]


NOTE = """\
One TPU v5e chip (a v5litepod-1 VM), reached through this project's device tool, measured with
`python -m benchmarks.chip env hostlink matmul splash train --specs DIR` on the chip (the specs: one JSON per
point, as `python -m orchestrator ... specs=DIR` writes them); this page reads that run's JSON lines
(benchmarks/chip_runs/) and prices every point with the planner as conf/cluster/v5e_1.yaml holds it now. The
step-time constants are fitted on these points (`python -m orchestrator.calibrate --chip --fit --write`), each
point held out of its own fit for the band."""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="a folder of benchmarks/chip.py's JSON lines")
    ap.add_argument("--write-table", action="store_true", help="write orchestrator/calibrate/chip_v5e_1.json")
    page.add_argument(ap, "v5e")
    a = ap.parse_args(argv)
    if a.write_table:
        print(f"wrote {write_table(a.runs)}")
        return 0
    page.publish(a.page, "A real TPU v5e chip", provenance.current(PROG, argv), NOTE, body(a.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
