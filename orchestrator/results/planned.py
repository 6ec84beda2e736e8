"""`dry_run=true record=true`: the plan as MLflow runs, so the dashboard shows 1K -> 14M on a machine with no TPU.

A parent run and one child run per grid point, all tagged `planned=true` under the sweep id `<id>-plan` (so a
real run of the same sweep never reuses them), with the planner's predictions and, with `aot=true`, the TPU
compiler's memory. Their status tag is the verdict (`planned`, `infeasible`, `invalid`), never `finished`, so
neither resume nor the regression gate ever mistakes one for a measured trial.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan import aot
from orchestrator.plan.cluster_model import model_of
from orchestrator.results import report
from orchestrator.tracking import Tracker, profiles
from orchestrator.tracking.mlflow_names import GIB

PLANNED_TAG = "planned"


def planned_sweep_id(sweep_id: str) -> str:
    return f"{sweep_id}-plan"


def point_metrics(row: Any, compiled: aot.CompileResult | None) -> dict[str, float]:
    """What one planned point logs: the planner's figures and, when compiled, the compiler's."""
    out = {
        "predicted_bytes_per_device": row.predicted_hbm_bytes_per_device,
        "predicted_step_time_s": row.predicted_step_s,
        "predicted_mfu": row.predicted_mfu,
        "roofline_mfu": row.roofline_mfu,
        "tflops_per_device_per_step": row.tflops_per_device_per_step,
        "predicted_chip_hours": row.chip_hours,
    }
    if compiled and compiled.compiled_bytes:
        out["compiled_bytes_per_device"] = compiled.compiled_bytes
    if compiled and (peak := compiled.device_peak):  # what the compiler checks against HBM (aot.verdict)
        out["compiler_peak_bytes_per_device"] = peak
    return {k: float(v) for k, v in out.items() if v is not None} | profiles.band_metrics(row)


def figures(points: list[tuple[TrialSpec, dict[str, float]]]) -> dict[str, Any]:
    """Predicted MFU and memory (analytic, compiled) vs context length per strategy, from runnable points."""
    series: dict[str, list] = defaultdict(list)
    for spec, m in sorted(points, key=lambda p: p[0].context_length):
        series[spec.strategy.name].append((spec.context_length, m))
    where = f"{points[0][0].model.name} on {points[0][0].cluster.name} (planned)"
    mfu_fig, ax = report.context_axes(f"Predicted MFU vs context length — {where}", "MFU")
    for name, pts in sorted(series.items()):
        xs = [x for x, _ in pts]
        ax.plot(
            xs, [m.get("predicted_mfu", float("nan")) for _, m in pts], marker="o", label=f"{name} predicted"
        )
    ax.set_ylim(bottom=0)
    mem_fig, bx = report.context_axes(
        f"Memory per device vs context length — {where}", "GiB per device", logy=True
    )
    for i, (name, pts) in enumerate(sorted(series.items())):
        xs = [x for x, _ in pts]
        pred = [m.get("predicted_bytes_per_device", float("nan")) / GIB for _, m in pts]
        bx.plot(xs, pred, ls="--", marker="x", color=f"C{i}", label=f"{name} analytic")
        comp = [m.get("compiled_bytes_per_device", float("nan")) / GIB for _, m in pts]
        if any(c == c for c in comp):
            bx.plot(xs, comp, marker="o", color=f"C{i}", label=f"{name} TPU-compiled")
    hbm = model_of(points[0][0].cluster).hbm_bytes_per_device
    if hbm:
        bx.axhline(hbm / GIB, color="red", ls=":", label=f"HBM per device ({hbm / GIB:g} GiB)")
    return {
        "planned_mfu_vs_context": report.finish(mfu_fig, ax),
        "planned_memory_vs_context": report.finish(mem_fig, bx),
    }


def record(
    tracker: Tracker,
    name: str,
    sweep_id: str,
    specs: list[TrialSpec],
    rows: list,
    compiled: dict[str, aot.Comparison] | None = None,
) -> str:
    """Queue the plan as planned runs; returns the planned sweep id. `compiled`: trial id -> aot.compare row."""
    sid = planned_sweep_id(sweep_id)
    tracker.start_sweep(name, sid, specs[0].cluster.name, tags={PLANNED_TAG: "true"})
    runnable, seen = [], set()
    for spec, row in zip(specs, rows, strict=True):
        tid = spec.trial_id
        if tid in seen:
            continue
        seen.add(tid)
        status = "planned" if row.verdict == "run" else row.verdict
        tracker.open_trial(spec, sid, status, row.reason)
        tracker.set_tags(tid, {PLANNED_TAG: "true"})
        got = (compiled or {}).get(tid)
        m = point_metrics(row, got.result if got else None)
        tracker.log_metrics(tid, m)
        tracker.end(tid, "FINISHED")
        if row.verdict == "run":
            runnable.append((spec, m))
            for k in ("predicted_mfu", "predicted_step_time_s"):
                if k in m:
                    tracker.log_metrics(
                        "sweep", {f"{k}/{spec.strategy.name}": m[k]}, step=spec.context_length
                    )
            for k, label in (
                ("predicted_bytes_per_device", "predicted"),
                ("compiled_bytes_per_device", "compiled"),
                ("compiler_peak_bytes_per_device", "compiler_peak"),
            ):
                if k in m:
                    key = f"{label}_memory_gib/{spec.strategy.name}"
                    tracker.log_metrics("sweep", {key: m[k] / GIB}, step=spec.context_length)
    if runnable:
        for fname, fig in figures(runnable).items():
            tracker.log_artifact("sweep", report.png(fig), f"plots/{fname}.png")
    tracker.set_tags("sweep", {"status": "planned", "points": str(len(seen)), "runnable": str(len(runnable))})
    tracker.end("sweep", "FINISHED")
    return sid
