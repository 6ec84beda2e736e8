"""Scheduling overhead: N short trials on local Ray, 2 at a time, through our scheduler and through Ray Tune.

    python benchmarks/overhead.py [--trials 16] [--steps 3] [--concurrency 2] [--length 256] [--page]

Both runs train the same trials (tiny model, ring over 8 simulated CPU devices, one seed per trial), each
in a fresh process, with MLflow tracking (ours: the orchestrator's Tracker; Tune: MLflowLoggerCallback).
Compilation is taken out of the picture the honest way: a warm-up trial fills the JAX persistent compilation
cache first, and every figure that claims "without compile" subtracts the compile time the job measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import page
from orchestrator import provenance

ROOT = Path(__file__).resolve().parent.parent


def overrides(args, sweep_id: str, seeds: list[int]) -> list[str]:
    return [
        "+sweep=smoke",
        "sweep.axes.strategy=[ring]",
        f"sweep.axes.context_length=[{args.length}]",
        f"+sweep.axes.train.seed=[{','.join(map(str, seeds))}]",
        "~sweep.set",
        f"train.steps={args.steps}",
        "train.dtype=float32",
        f"cluster.concurrency={args.concurrency}",
        "progress=plain",
        f"sweep.id={sweep_id}",
        # a fixed peak skips the per-trial CPU matmul peak measurement (MFU is not what this measures)
        "cluster.peak_tflops_per_device=1.0",
        "gate.enabled=false",
    ]


def summarise(trials: list[dict], total: float, conc: int) -> dict:
    """Per-trial overhead (submit -> first step, compile and step 0 excluded), the slot handoff, and the span.

    The handoff uses the jobs' clocks only, so it reads the same for both schedulers: with `conc` slots, the
    k-th trial to start took the slot the (k - conc)-th trial to finish left, so its handoff is its first
    step minus that trial's last step, less its own compile and step 0 (teardown, the scheduler noticing,
    process start, imports and setup are what remains)."""
    for t in trials:
        t["overhead_s"] = t["first_step"] - t["submitted"] - t["compile_s"] - t["step0_s"]
        t["to_process_s"] = t["process_start"] - t["submitted"]
    ends = sorted(t["last_step"] for t in trials)
    for k, t in enumerate(sorted(trials, key=lambda t: t["process_start"])):
        if k >= conc:
            t["handoff_s"] = t["first_step"] - ends[k - conc] - t["compile_s"] - t["step0_s"]
    span = max(t["ended"] for t in trials) - min(t["submitted"] for t in trials)
    return {"trials": trials, "span_s": span, "total_s": total}


def ours(args, seeds: list[int], sweep_id: str) -> dict:
    """Our sweep through the real entry points; per-attempt timings come back from the tracking store."""
    from mlflow import MlflowClient

    from orchestrator.config.grid import expand_points
    from orchestrator.config.load import load_typed
    from orchestrator.driver import run
    from orchestrator.plan import auto, plan

    loaded = load_typed(overrides(args, sweep_id, seeds))  # as `python -m orchestrator` composes and plans
    points = expand_points(loaded.tree)
    models = [p.cluster for p in points]
    specs = auto.resolve_all([p.spec for p in points], models)
    rows = plan(specs, models)
    t0 = time.time()
    code = run(loaded.options, specs, rows)
    total = time.time() - t0
    assert code == 0, f"sweep {sweep_id} failed"
    tracking = loaded.options.tracking
    client = MlflowClient(tracking.uri)
    exp = client.get_experiment_by_name(tracking.experiment)
    trials = []
    for r in client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'"):
        path = client.download_artifacts(r.info.run_id, "attempts.json", tempfile.mkdtemp())
        (att,) = json.loads(Path(path).read_text())
        steps = sorted(client.get_metric_history(r.info.run_id, "step_time_s"), key=lambda m: m.step)
        host0 = min(att["hosts"], key=lambda h: h["process_id"])
        trials.append(
            {
                "submitted": att["submitted"],
                "ended": att["ended"],
                "process_start": host0["t"],
                # the job's own clock, as Tune's figure is (tune.report's time.time()); the driver's receipt below
                "first_step": att.get("first_step_in_job", att["first_step"]),
                "first_step_at_driver": att["first_step"],
                "compile_s": r.data.metrics["compile_s"],
                "step0_s": steps[0].value,
                "job_s": att["ended"] - host0["t"],
                "last_step": steps[-1].timestamp / 1000,  # the record's t_ms
            }
        )
    return summarise(trials, total, args.concurrency)


def tune_trial(config: dict) -> None:
    """A Tune function trainable running the same job code (fresh actor per trial: reuse_actors=False)."""
    t_enter = time.time()  # the trainable's process is running (before the job's imports, as ours is stamped)
    from ray import tune

    from jobs.spec import TrialSpec
    from jobs.train import train

    t_start, compile_s = time.time(), 0.0
    for rec in train(TrialSpec.from_json(config["spec"])):
        if rec.kind == "start":
            compile_s = rec.compile_s
        elif rec.kind == "step":
            tune.report(
                {
                    "loss": rec.loss,
                    "step": rec.step,
                    "step_time_s": rec.step_time_s,
                    "t_enter": t_enter,
                    "t_start": t_start,
                    "t_now": time.time(),
                    "compile_s": compile_s,
                }
            )


def tune_reference(args, specs, workdir: Path) -> dict:
    from ray import tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune import Callback
    from ray.tune.execution.tune_controller import TuneController

    marks: dict[str, dict[str, float]] = {}

    class Times(Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            marks.setdefault(trial.trial_id, {})["ended"] = time.time()

    # Tune's submit, as ours is: the moment the controller asks Ray for the trial's actor (a slot is free). No
    # callback marks it (on_trial_start fires once the actor is up, after its process start and imports), so the
    # controller's own method is wrapped, in this process, for the length of the run.
    schedule = TuneController._schedule_trial_actor

    def stamped(self, trial):
        marks.setdefault(trial.trial_id, {}).setdefault("submitted", time.time())
        return schedule(self, trial)

    mlflow_cb = MLflowLoggerCallback(
        tracking_uri=f"sqlite:///{workdir / 'tune-mlflow.db'}", experiment_name="tune"
    )
    tuner = tune.Tuner(
        tune.with_resources(tune_trial, {"cpu": 1}),
        param_space={"spec": tune.grid_search([s.to_json() for s in specs])},
        tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency, reuse_actors=False),
        run_config=tune.RunConfig(
            storage_path=str(workdir / "tune"), callbacks=[mlflow_cb, Times()], verbose=0
        ),
    )
    TuneController._schedule_trial_actor = stamped
    try:
        t0 = time.time()
        grid = tuner.fit()
        total = time.time() - t0
    finally:
        TuneController._schedule_trial_actor = schedule
    trials = []
    for res in grid:
        df = res.metrics_dataframe
        first, last = df.iloc[0], df.iloc[-1]
        m = marks[res.metrics["trial_id"]]  # every trial was scheduled, so it has its submit
        trials.append(
            {
                "submitted": m["submitted"],
                "ended": m.get("ended", last["t_now"]),
                "process_start": first["t_enter"],
                "first_step": first["t_now"],
                "compile_s": first["compile_s"],
                "step0_s": first["step_time_s"],
                "job_s": last["t_now"] - first["t_enter"],
                "last_step": last["t_now"],
            }
        )
    return summarise(trials, total, args.concurrency)


def report(name: str, r: dict, conc: int) -> dict:
    ts = r["trials"]
    trial_s = [t["ended"] - t["submitted"] for t in ts]
    ideal = sum(trial_s) / conc
    ideal_job = sum(t["job_s"] for t in ts) / conc
    ov = [t["overhead_s"] for t in ts]
    hand = [t["handoff_s"] for t in ts if "handoff_s" in t]
    out = {
        "trials": len(ts),
        "handoff_median_s": statistics.median(hand),
        "handoff_max_s": max(hand),
        "overhead_median_s": statistics.median(ov),
        "overhead_max_s": max(ov),
        "submit_to_process_median_s": statistics.median(t["to_process_s"] for t in ts),
        "compile_median_s": statistics.median(t["compile_s"] for t in ts),
        "trial_median_s": statistics.median(trial_s),
        "span_s": r["span_s"],
        "ideal_s": ideal,
        "span_over_ideal": r["span_s"] / ideal,
        "span_over_ideal_in_process": r["span_s"] / ideal_job,
        "total_s": r["total_s"],
        # ours only: the first step record's trip from the job to the driver (Tune's figure has no such leg)
        "to_driver_median_s": statistics.median(t["first_step_at_driver"] - t["first_step"] for t in ts)
        if all("first_step_at_driver" in t for t in ts)
        else float("nan"),
    }
    print(f"\n== {name}: {len(ts)} trials, {conc} at a time")
    print(
        f"  slot handoff, a trial's last step -> the next one's first step, minus its compile and step 0 "
        f"(jobs' clocks): median {out['handoff_median_s']:.2f} s, max {out['handoff_max_s']:.2f} s"
    )
    print(
        f"  per-trial overhead, submit -> first step, minus compile and step 0: median {out['overhead_median_s']:.2f} s,"
        f" max {out['overhead_max_s']:.2f} s  (of which submit -> job process running: median "
        f"{out['submit_to_process_median_s']:.2f} s; compile from the persistent cache: median "
        f"{out['compile_median_s']:.2f} s)"
    )
    print(
        f"  sweep span {out['span_s']:.1f} s vs ideal {ideal:.1f} s (sum of submit->end trial times / {conc}):"
        f" x{out['span_over_ideal']:.3f}; vs in-process job time only: x{out['span_over_ideal_in_process']:.3f}"
    )
    print(f"  whole call incl. tracking setup and teardown: {out['total_s']:.1f} s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--skip-tune", action="store_true")
    page.add_argument(ap, "overhead")
    args = ap.parse_args()
    made = provenance.current(
        "python benchmarks/overhead.py", sys.argv[1:], load=True
    )  # before the run: its commit
    out = page.path(args.page).resolve() if args.page else None  # before the chdir
    work = Path(tempfile.mkdtemp(prefix="overhead-"))
    os.chdir(work)
    # Workers inherit the driver's environment on a local Ray: one shared persistent compilation cache.
    os.environ |= {
        "JAX_COMPILATION_CACHE_DIR": str(work / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "PYTHONPATH": str(ROOT),
    }
    import ray

    ray.init(address="local", num_cpus=args.concurrency, include_dashboard=False, log_to_driver=False)
    print(f"work dir {work}; warming the compilation cache with one trial ...", flush=True)
    ours(argparse.Namespace(**{**vars(args), "concurrency": 1}), [10_000], "warmup")
    seeds = list(range(args.trials))
    res = report(
        "ours (orchestrator.launch.executor + MLflow Tracker)",
        ours(args, seeds, "overhead"),
        args.concurrency,
    )
    results = {"ours": res}
    if not args.skip_tune:
        from orchestrator.config.grid import expand
        from orchestrator.config.load import load

        specs = expand(load(overrides(args, "tune", seeds)))
        results["Ray Tune"] = report(
            "Ray Tune reference (function trainable, MLflowLoggerCallback)",
            tune_reference(args, specs, work),
            args.concurrency,
        )
    tune = results.get("Ray Tune", res)
    ok = (
        res["overhead_median_s"] <= tune["overhead_median_s"]
        and res["handoff_median_s"] <= tune["handoff_median_s"]
        and res["span_over_ideal"] <= 1.10
    )
    print(f"\ntargets ({TARGETS}): {'met' if ok else 'NOT met'}")
    if out:
        body = page_body(args, results, ok)
        print(f"wrote {page.write(out, 'Launch overhead', made, NOTE, body)}")
    return 0 if ok else 1


NOTE = """\
The same short trials (tiny model, ring over 8 simulated CPU devices, each trial in a fresh process, MLflow
tracking) through our scheduler (`orchestrator.launch.executor` with the driver's Tracker) and through Ray Tune (a
function trainable with `MLflowLoggerCallback`, a fresh actor per trial, the same job code), in one run on a
local Ray. A warm-up trial fills the JAX persistent compilation cache first, and every "overhead" figure
subtracts the compile time and step 0 that the job measured, so what is left is scheduling, process start and
tracking. Load from other processes on the host moves these figures: run it on a quiet machine."""

TARGETS = "per-trial overhead and slot handoff medians at most Ray Tune's, span at most 1.10 × ideal"

# (row label, key in report()'s dict, format, what it means)
ROWS = [
    (
        "slot handoff, median",
        "handoff_median_s",
        "{:.2f} s",
        "a trial's last step → the first step of the trial that took its slot, minus that trial's compile and "
        "step 0; the jobs' own clocks, so the same measure for both",
    ),
    ("slot handoff, max", "handoff_max_s", "{:.2f} s", "the worst handoff"),
    (
        "per-trial overhead, median",
        "overhead_median_s",
        "{:.2f} s",
        "submit → first step (the job's clock), minus compile and step 0; submit is when the scheduler asks Ray "
        "for the trial's process (ours: the executor's submit; Tune: its controller scheduling the trial's actor)",
    ),
    ("per-trial overhead, max", "overhead_max_s", "{:.2f} s", "the worst trial"),
    (
        "submit → job process running, median",
        "submit_to_process_median_s",
        "{:.2f} s",
        "until the trial's host code runs in its process (ours: on the local Ray, the next trial's process is "
        "started ahead, while the running trials run)",
    ),
    ("compile from the persistent cache, median", "compile_median_s", "{:.2f} s", "as the job measured it"),
    (
        "first step's record to the driver, median",
        "to_driver_median_s",
        "{:.2f} s",
        "ours: the stream's round trip, outside the overhead above (both measure the first step by the job's clock)",
    ),
    ("trial, median", "trial_median_s", "{:.2f} s", "submit → end of one trial"),
    ("sweep span", "span_s", "{:.1f} s", "first submit → last trial's end"),
    ("ideal span", "ideal_s", "{:.1f} s", "sum of the trials' submit → end times / concurrency"),
    ("span / ideal", "span_over_ideal", "{:.3f} ×", "1.0 = no time lost between trials"),
    (
        "span / in-process ideal",
        "span_over_ideal_in_process",
        "{:.3f} ×",
        "against the trials' time inside their job process only",
    ),
    ("whole call", "total_s", "{:.1f} s", "including tracking setup and teardown"),
]


def page_body(args, results: dict[str, dict], ok: bool) -> str:
    names = list(results)
    table = page.table(
        ["figure", *names, "what it is"],
        ([label, *(fmt.format(results[n][key]) for n in names), what] for label, key, fmt, what in ROWS),
    )
    trials = results["ours"]["trials"]
    return (
        f"Setup: {trials} trials of {args.steps} steps at {args.length} tokens, {args.concurrency} at a time.\n\n"
        + table
        + f"\n\nTargets for ours ({TARGETS}): {'met' if ok else 'not met'}.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
