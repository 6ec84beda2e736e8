"""Measured against predicted, per trial of a profiled sweep: where the step went (the trace's categories) next to
the planner's step-time terms at the matmul rate the trial measured, both limiters, and what profiling cost.

Run a profiled sweep first, then point this at its store:

    python -m orchestrator +sweep=cp_scaling 'sweep.axes.context_length=[1024,2048,4096]' train.steps=8 \\
        'run.profile_steps=[4]' sweep.id=prof-1
    python benchmarks/profile_table.py prof-1 --uri sqlite:///mlflow.db [--page]

Overhead: the median step time of the steps before the traced one and of the steps after it (profiling must not
slow the others), and the traced step's own time.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from mlflow import MlflowClient

from benchmarks import page
from orchestrator import provenance
from orchestrator.plan.steptime import run_peak, step_time
from orchestrator.results import measured_vs_predicted
from orchestrator.tracking.finished import finished_runs, run_spec

NOTE = """Each row is one trial of a profiled sweep on this machine (`python -m orchestrator +sweep=cp_scaling
'sweep.axes.context_length=[1024,2048,4096]' train.steps=8 'run.profile_steps=[4]' sweep.id=prof-1`, the tiny
model on `cluster=local`, 8 simulated CPU devices, the recall task; on 2 cores shared with a TPU compile) (`run.profile_steps`: one step traced with
jax.profiler after warm-up). *measured* is the trace's seconds per step folded into five groups (matmuls, the
attention kernel under its `cp_attention` scope, collectives of every kind, host transfers, everything else
plus idle; jobs/profile/breakdown.py); *predicted* is the planner's step-time model (orchestrator/plan/steptime.py)
for the same trial at the matmul rate the trial itself measured, folded the same way
(orchestrator/results/report.py). On the simulated CPU devices a collective's time includes waiting for the
other devices to arrive, so "collectives" also holds load imbalance and thread scheduling. *before / traced /
after*: median step time of the steps before the traced one, the traced step, and the median of the steps after
it."""


def rows(client: MlflowClient, sweep_id: str, experiment: str) -> list[dict]:
    exp = client.get_experiment_by_name(experiment)
    out = []
    for r in finished_runs(client, exp.experiment_id, sweep_id):
        m = r.data.metrics
        if "measured/step_s" not in m:
            continue
        spec = run_spec(client, r.info.run_id)
        peak = m.get("peak_tflops_per_device")
        st = step_time(spec, peak=run_peak(spec, peak))
        meas = {
            g: sum(m.get(f"measured/{c}_s", 0.0) for c in cats)
            for g, (_, cats) in measured_vs_predicted.GROUPS.items()
        }
        hist = sorted((x.step, x.value) for x in client.get_metric_history(r.info.run_id, "step_time_s"))
        traced = _traced_step(client, r)
        before = [v for s, v in hist if 0 < s < (traced or 0)]  # step 0 is the warm-up
        after = [v for s, v in hist if traced is not None and s > traced]
        out.append(
            {
                "strategy": spec.strategy.name,
                "L": spec.context_length,
                "mesh": spec.mesh.label(),
                "measured": meas,
                "measured_step": m["measured/step_s"],
                "median": m.get("final_step_time_median_s"),
                "predicted": measured_vs_predicted.predicted_groups(st),
                "predicted_step": st.step_s,
                "measured_limiter": r.data.tags.get("measured_limiter", ""),
                "predicted_limiter": st.limiter,
                "before": statistics.median(before) if before else float("nan"),
                "traced": dict(hist).get(traced, float("nan")) if traced is not None else float("nan"),
                "after": statistics.median(after) if after else float("nan"),
            }
        )
    return sorted(out, key=lambda x: (x["L"], x["strategy"]))


def _traced_step(client: MlflowClient, run) -> int | None:
    """The step the profile covered: where the measured/* metrics were logged (the window's first step)."""
    hist = client.get_metric_history(run.info.run_id, "measured/step_s")
    return hist[0].step if hist else None


def table(rs: list[dict]) -> str:
    groups = list(measured_vs_predicted.GROUPS)
    short = {
        "matmuls": "mm",
        "attention kernel": "attn",
        "collectives": "coll",
        "host transfers": "host",
        "other, idle, overhead": "other",
    }
    head = [
        "strategy",
        "L",
        "step s measured / predicted",
        *(f"{short[g]} meas / pred" for g in groups),
        "measured limiter",
        "predicted limiter",
        "before / traced / after s",
    ]
    lines = []
    for r in rs:
        cells = [r["strategy"], f"{r['L']:,}", f"{r['measured_step']:.3f} / {r['predicted_step']:.3f}"]
        cells += [f"{r['measured'][g]:.3f} / {r['predicted'][g]:.3f}" for g in groups]
        cells += [
            r["measured_limiter"],
            r["predicted_limiter"].split(" (")[0],
            f"{r['before']:.3f} / {r['traced']:.3f} / {r['after']:.3f}",
        ]
        lines.append(cells)
    return page.table(head, lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_id")
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="cp_scaling")
    page.add_argument(ap, "profiles")
    a = ap.parse_args(argv)
    made = provenance.current("python benchmarks/profile_table.py", argv)
    body = table(rows(MlflowClient(a.uri), a.sweep_id, a.experiment))
    page.publish(a.page, "Measured vs predicted step breakdown", made, NOTE, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
