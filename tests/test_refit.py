"""Refitting a cluster's step-time constants on a sweep: child runs written into a real sqlite store as the
tracker writes them, with step times the model itself gives under known constants, so the fit must find them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from omegaconf import OmegaConf

from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.calibrate import refit
from orchestrator.calibrate.__main__ import main
from orchestrator.calibrate.published_tpu import ROWS
from orchestrator.calibrate.refit import BAND, with_constants
from orchestrator.calibrate.tpu import check
from orchestrator.config.load import CONF_DIR, group_option, load
from orchestrator.plan import cluster_model
from orchestrator.plan.steptime import step_time
from orchestrator.tracking.mlflow_names import trial_params

pytestmark = pytest.mark.usefixtures("pinned_cpu_peak")

EXP, SWEEP = "cp_scaling", "cp_scaling-20261202-000000"
POINTS = [
    ("ring", MeshSpec(context=8)),
    ("ulysses", MeshSpec(context=8)),
    ("all_gather", MeshSpec(context=8)),
    ("usp", MeshSpec(context=2, context_ulysses=4)),
    ("double_ring", MeshSpec(context=4, context_ulysses=2)),
]
LENGTHS = (512, 1024, 2048, 4096)
PLAN_PEAK = 0.01  # the rate the planner measured (CP_PLAN_CPU_TFLOPS pins it in tests)
# The "host" the trials ran on: local's matmul rate (a 1.0 efficiency of the probe), a slower attention kernel
# and more fixed cost per step than conf/cluster/local.yaml says.
TRUE = {"attention_efficiency": 0.25, "step_overhead_s": 0.12}


def specs() -> list[tuple[TrialSpec, float]]:
    """Every point of the sweep as it was planned (peak 0: measured), with the peak its trial measured."""
    cluster, model = (
        cluster_model.load("local")[0],
        ModelSpec(**group_option("model", "tiny")),
    )
    out = []
    for i, (name, mesh) in enumerate(POINTS):
        for j, length in enumerate(LENGTHS):
            strategy = StrategySpec(**group_option("strategy", name))
            spec = TrialSpec(
                model=model,
                mesh=mesh,
                strategy=strategy,
                context_length=length,
                train=TrainSpec(remat="full", steps=8),
                cluster=cluster,
            )
            out.append((spec, 0.010 + 0.001 * ((i + j) % 5)))  # the probe moves from trial to trial
    return out


def at(spec: TrialSpec, peak: float) -> TrialSpec:
    return replace(spec, cluster=replace(spec.cluster, peak_tflops_per_device=peak))


def log_sweep(
    client: MlflowClient, artifacts: Path, sweep_id: str = SWEEP, points: int | None = None
) -> None:
    """A parent run and its child runs as orchestrator/tracking/store.py writes them (tags, params, trial_spec.json,
    start/summary metrics and the two predictions), plus a failed run the refit never reads and a finished one
    with no summary (its records never arrived) that it leaves out."""
    exp = client.get_experiment_by_name(EXP)
    eid = exp.experiment_id if exp else client.create_experiment(EXP, artifacts.as_uri())
    parent = client.create_run(eid, tags={"kind": "sweep", "sweep_id": sweep_id, "cluster": "local"})
    finished = specs()[:points]
    for n, (spec, peak) in enumerate([*finished, finished[0], finished[0]]):
        status = "failed" if n == len(finished) else "finished"
        tags = {
            "kind": "trial",
            "trial_id": spec.trial_id,
            "sweep_id": sweep_id,
            "status": status,
            "mlflow.parentRunId": parent.info.run_id,
        }
        rid = client.create_run(eid, tags=tags).info.run_id
        measured = step_time(at(spec, peak), model=with_constants(spec, TRUE)).step_s
        metrics = [
            Metric("peak_tflops_per_device", peak, 0, 1),  # a start record: per attempt
            Metric("final_step_time_median_s", measured, 0, 0),
            Metric("predicted_step_time_s", step_time(spec, peak=PLAN_PEAK).step_s, 0, 0),
            Metric("predicted_step_time_at_run_peak_s", step_time(spec, peak=peak).step_s, 0, 0),
        ]
        params = [Param(k, v) for k, v in trial_params(spec).items()]
        client.log_batch(rid, metrics=metrics[:1] if n > len(finished) else metrics, params=params)
        client.log_text(rid, spec.to_json(), "trial_spec.json")
        client.set_terminated(rid)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> str:
    """One store for the module (creating it and its runs takes seconds): the sweep, and another never read."""
    tmp = tmp_path_factory.mktemp("refit")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(store)
    log_sweep(client, tmp / "artifacts")
    log_sweep(client, tmp / "artifacts", "another-sweep", points=1)
    return store


def test_reads_the_finished_trials_at_their_own_peak(sweep):
    trials, skipped = refit.read_sweep(sweep, SWEEP, EXP)
    assert len(trials) == len(POINTS) * len(LENGTHS)  # the failed run is not read
    [left_out] = skipped
    assert left_out.endswith(": no final_step_time_median_s")
    assert [t.spec.context_length for t in trials] == sorted(L for L in LENGTHS for _ in POINTS)
    by_id = {s.trial_id: p for s, p in specs()}
    assert all(t.spec.cluster.peak_tflops_per_device == by_id[t.spec.trial_id] for t in trials)
    # priced at the trial's own peak, the model gives what the run logged as its at-run-peak figure
    assert all(step_time(t.spec).step_s == pytest.approx(t.at_run_peak_s) for t in trials)


@pytest.fixture(scope="module")
def published() -> list[tuple[str, float, float]]:
    """The published table before any refit ran in this process."""
    return [(c.row.label, c.predicted, c.published) for c in map(check, ROWS)]


@pytest.fixture(scope="module")
def fitted(sweep, published) -> refit.Refit:
    trials, _ = refit.read_sweep(sweep, SWEEP, EXP)
    return refit.refit(trials, SWEEP, sweep)


def test_fit_recovers_the_constants_and_improves_the_held_out_trials(fitted):
    r = fitted
    assert r.hold_out_from == 4096 and sum(map(r.held, r.trials)) == len(POINTS)
    # every constant the trials tell apart is fitted: those the "host" changed move to their true values, the
    # others stay where the sweep's own steps put them, at the base's values
    moved = set(r.fitted) - set(BAND)
    assert set(TRUE) <= moved, moved
    assert {"attention_head_dim_half", "attention_recompute", "offload_exposed"} <= set(r.left)
    for k in moved:
        assert r.fitted[k] == pytest.approx(TRUE.get(k, r.base[k]), rel=0.05, abs=1e-4), k
    before, after = (max(abs(e) for e, _ in r.errors(held=True, after=a)) for a in (False, True))
    assert before > 0.2 and after < 0.02
    # the band: what the refit leaves of the held-out trials' errors (within 2 %), tighter than the base's
    assert 0.98 <= r.fitted["step_band_low"] <= 1.0 <= r.fitted["step_band_high"] <= 1.02
    text = refit.report(r)
    assert "| ring L=4096 context8 | held out |" in text and "not fitted: attention_recompute" in text


def test_one_length_cannot_tell_fixed_cost_from_the_attention_kernel():
    rows = [(at(s, p), 1.0) for s, p in specs() if s.context_length == 1024]
    keys, why = refit.constrained(rows)
    assert "attention_efficiency" in keys and "step_overhead_s" not in keys
    assert "not separable" in why["step_overhead_s"]


def test_writes_a_cluster_config_hydra_composes(sweep, tmp_path, capsys):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    out = conf / "cluster" / "local_fit.yaml"
    args = ["--from-sweep", SWEEP, "--uri", sweep, "--hold-out-from", "2048", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "calibration (L < 2,048), 10 trials" in printed and "held out (L >= 2,048), 10 trials" in printed
    text = out.read_text()
    said = (
        SWEEP,
        sweep,
        "--from-sweep",
        "# Held out 10 trials (",
        "# Verdict: the refit predicts the held-out trials better",
    )
    assert all(x in text for x in said), text
    got = group_option("cluster", "local_fit", conf)
    c, fit = cluster_model.split(got)
    base = group_option("cluster", "local")
    assert c.name == "local_fit" and c.peak_tflops_per_device == 0.0  # still measured on the spot
    own = {*TRUE, *BAND, "name"}
    for (
        k,
        v,
    ) in base.items():  # every other key is the base's (a fitted one the trials left in place, to 4 digits)
        if k not in own:
            assert got[k] == (pytest.approx(v, rel=1e-3) if isinstance(v, float) else v), k
    assert all(getattr(fit, k) == pytest.approx(v, rel=0.1) for k, v in TRUE.items())
    cfg = OmegaConf.to_container(load(["cluster=local_fit"], conf), resolve=True)
    assert cfg["cluster"]["name"] == "local_fit" and cfg["cluster"]["step_overhead_s"] == fit.step_overhead_s


def test_an_unknown_sweep_is_one_error_line(sweep, capsys):
    assert main(["--from-sweep", "nope", "--uri", sweep, "--out", "/nonexistent/x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: sweep 'nope' has no finished trial")


def test_the_published_calibration_is_unchanged(fitted, published):
    """A sweep's refit writes its own config: the published table priced with conf/cluster/ is what it was."""
    assert [(c.row.label, c.predicted, c.published) for c in map(check, ROWS)] == published
