"""The driver's MLflow tracking: runs, metrics and artifacts as the dashboard needs them, through outages.

Local-store tests are fast; the server tests run a real `mlflow server` (sqlite) whose artifacts go to gs://
on a local GCS emulator, stop it mid-write and start it again.
"""

import dataclasses
import json
import subprocess
import sys
import threading
import time

import mlflow_lookup
import pytest
from drivers import ROOT, run_cli
from matplotlib.figure import Figure
from servers import gcs_client, start_gcs_emulator, start_mlflow_server
from tenacity import wait_fixed
from test_report import fake_records, make_spec

from jobs.records import StepRecord, SummaryRecord, parse
from orchestrator.config.schema import Tracking
from orchestrator.results import report
from orchestrator.tracking import NullTracker, Tracker, open_tracker
from orchestrator.tracking.mlflow_names import STEP_METRICS
from orchestrator.tracking.store import MlflowTracker

BUCKET = "mlflow-art"
# the step metrics a CPU trial logs: the runtime's memory figures are None on CPU, so never logged
CPU_STEP_METRICS = [m for m in STEP_METRICS if m not in ("runtime_peak_bytes", "runtime_bytes_in_use")]


def log_trial(tracker: Tracker, spec, sweep_id: str, chunks: int = 1, pause: float = 0.0) -> None:
    """What the executor does for one finished trial, the records arriving in `chunks` batches."""
    tracker.set_status(spec.trial_id, "running")
    recs = [parse(r) for r in fake_records(spec)]
    for i in range(chunks):
        tracker.log_records(spec.trial_id, recs[i * len(recs) // chunks : (i + 1) * len(recs) // chunks])
        time.sleep(pause)
    tracker.set_status(spec.trial_id, "finished", "", terminal="FINISHED")
    tracker.log_metrics("sweep", {"mfu/" + spec.strategy.name: 0.2}, step=spec.context_length)


# --- local store -----------------------------------------------------------------------------------


def test_parent_and_child_runs(sql_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a SQL store's artifacts go to ./mlruns
    spec = make_spec("ring", 1024, steps=6)
    t = MlflowTracker(sql_store, "exp")
    t.start_sweep("smoke", "sw1", "local")
    t.open_trial(spec, "sw1", "queued")
    t.log_metrics(spec.trial_id, {"predicted_bytes_per_device": 123_456_789, "not_planned": None})
    log_trial(t, spec, "sw1")
    t.log_artifact("sweep", report.png(Figure()), "plots/empty.png")
    t.end("sweep")
    assert t.finish(timeout=60) == 0

    c = mlflow_lookup.client(sql_store)
    [parent], [child] = mlflow_lookup.sweep_runs(c, experiment="exp")
    assert parent.data.tags["sweep_id"] == "sw1" and parent.data.tags["code_revision"]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["trial_id"] == spec.trial_id and child.data.tags["status"] == "finished"
    assert child.data.params["strategy"] == "ring" and child.data.params["context_length"] == "1024"
    m = child.data.metrics
    assert m["predicted_bytes_per_device"] == 123_456_789 and "not_planned" not in m
    assert m["final_mfu"] == pytest.approx(0.2) and m["final_step_time_median_s"] == 0.5
    assert m["final_tokens_per_s"] == 2048 and m["memory_bytes_per_device"] == 2**26
    assert m["compiled_bytes_per_device"] == 2**26 and "final_compiled_bytes_per_device" not in m
    for key in CPU_STEP_METRICS:
        assert len(mlflow_lookup.history(c, child.info.run_id, key)) == 6
    arts = {a.path for a in c.list_artifacts(child.info.run_id)}
    assert {"trial_spec.json", "trial_log.txt"} <= arts
    log_text = open(c.download_artifacts(child.info.run_id, "trial_log.txt", str(tmp_path))).read()
    assert "status finished" in log_text and '"kind": "summary"' in log_text
    assert [a.path for a in c.list_artifacts(parent.info.run_id, "plots")] == ["plots/empty.png"]
    assert [h.step for h in c.get_metric_history(parent.info.run_id, "mfu/ring")] == [1024]
    assert isinstance(t.records(spec.trial_id)[-1], SummaryRecord)
    assert isinstance(t, Tracker)
    # a later driver of this sweep reads the finished trial back for its plots: the very same records
    again = MlflowTracker(sql_store, "exp")
    stored = again.records(spec.trial_id, child.info.run_id)
    # compared as JSON text, where nan equals nan
    as_text = lambda recs: [json.dumps(r.to_dict(), default=str) for r in recs]
    assert as_text(stored) == as_text(t.records(spec.trial_id))
    assert len(stored) == 8  # start, 6 steps, summary
    assert again.records("sweep", parent.info.run_id) == []  # no trial log there: nothing, and no raise


def test_a_trial_taken_over_goes_on_with_the_records_the_store_has(store, tmp_path, monkeypatch):
    """A driver killed mid-trial wrote no trial log; the driver that takes the trial over starts its log from the
    start and step records behind the metrics the store has, so the log the trial ends with (read back for the
    plots) holds both drivers' records, each step once."""
    monkeypatch.chdir(tmp_path)
    spec = make_spec("ring", 512, steps=5)
    start, *steps, summary = [parse(r) for r in fake_records(spec)]
    steps = [dataclasses.replace(r, t_ms=1_000 + r.step) for r in steps]
    first = MlflowTracker(store, "exp")
    first.start_sweep("smoke", "sw", "local")
    first.open_trial(spec, "sw", "queued")
    first.set_status(spec.trial_id, "running")
    first.log_records(spec.trial_id, [start, *steps[:3]])
    assert first.finish(timeout=60) == 0  # then killed: no trial log, status still running
    again = MlflowTracker(store, "exp")
    assert again.resume("sw") == {}
    again.start_sweep("smoke", "sw", "local")
    again.open_trial(spec, "sw", "queued")
    assert [type(r).__name__ for r in again.records(spec.trial_id)] == ["StartRecord"] + ["StepRecord"] * 3
    assert again.records(spec.trial_id)[1:] == steps[:3]  # what MLflow keeps of them: all of these fields
    again.log_records(spec.trial_id, [start, *steps[1:], summary])  # the resumed attempt re-sends 1 and 2
    again.set_status(spec.trial_id, "finished", terminal="FINISHED")
    assert again.finish(timeout=60) == 0
    logged = MlflowTracker(store, "exp").records(spec.trial_id, again.run_id(spec.trial_id))
    assert [r.step for r in logged if isinstance(r, StepRecord)] == [0, 1, 2, 3, 4]
    assert [type(r).__name__ for r in logged].count("StartRecord") == 2 and isinstance(
        logged[-1], SummaryRecord
    )
    c = mlflow_lookup.client(store)
    assert [m.step for m in c.get_metric_history(again.run_id(spec.trial_id), "compile_s")] == [1, 2]


def test_tracking_none_is_the_null_tracker_and_imports_no_mlflow():
    code = (
        "import sys; from orchestrator.config.load import load; from orchestrator.tracking import open_tracker; "
        "t = open_tracker(load(['tracking=none']).tracking); "
        "print(type(t).__name__, 'mlflow' in sys.modules, t.resume('x'), t.finish())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["NullTracker", "False", "{}", "0"], out.stderr[-2000:]


def test_the_null_tracker_keeps_the_protocol_and_records_nothing():
    t = open_tracker(Tracking(uri="none", experiment="x"))
    assert isinstance(t, NullTracker) and isinstance(t, Tracker)
    spec = make_spec("ring", 512)
    assert t.resume("sw") == {}
    t.start_sweep("smoke", "sw", "local")
    t.open_trial(spec, "sw", "queued")
    log_trial(t, spec, "sw")
    assert t.records(spec.trial_id) == [] and t.finish(timeout=1) == 0
    assert "nothing was recorded" in t.dashboard_hint()


@pytest.mark.slow
def test_a_single_trial_with_tracking_none_writes_no_store(tmp_path, local_ray, cli):
    """A quick local debug run: one real trial, exit 0, and no mlflow.db, mlruns or tracking journal."""
    res = cli(["tracking=none", "train.steps=2", "context_length=256", "progress=plain"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "1 finished" in res.stdout and "nothing was recorded" in res.stdout
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert not (tmp_path / ".cache" / "tracking").exists()


def test_lost_answers_are_retried_without_duplicates(sql_store, tmp_path, monkeypatch):
    """A request that reached the store but whose answer was lost is sent again: still one run, one point each."""
    monkeypatch.chdir(tmp_path)
    t = MlflowTracker(sql_store, "exp")
    real = {name: getattr(t.client, name) for name in ("create_run", "log_batch")}
    lost = {"create_run": 2, "log_batch": 3}  # the first answers of each kind never arrive

    def flaky(name):
        def call(*a, **k):
            out = real[name](*a, **k)
            if lost[name] > 0:
                lost[name] -= 1
                raise ConnectionError(f"{name}: connection reset after the store committed")
            return out

        return call

    for name in real:
        monkeypatch.setattr(t.client, name, flaky(name))
    monkeypatch.setattr("orchestrator.tracking.queue.BACKOFF", wait_fixed(0.05))
    spec = make_spec("all_gather", 512, steps=5)
    t.start_sweep("smoke", "sw1", "local")
    t.open_trial(spec, "sw1", "queued")
    log_trial(t, spec, "sw1", chunks=3)
    assert t.finish(timeout=60) == 0
    assert lost == {"create_run": 0, "log_batch": 0}
    c = mlflow_lookup.client(sql_store)
    parents, children = mlflow_lookup.sweep_runs(c, experiment="exp")
    assert len(parents) == 1 and len(children) == 1
    assert len(mlflow_lookup.history(c, children[0].info.run_id, "loss")) == 5


def test_rejected_write_is_dropped_and_does_not_block(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = MlflowTracker(store, "exp")
    t.set_status("never-opened", "running")  # a bug (unknown run): logged and dropped, not retried forever
    t.start_sweep("smoke", "sw1", "local")
    t.log_metrics("sweep", {"x": 1.0})
    assert t.finish(timeout=30) == 0
    [parent], _ = mlflow_lookup.sweep_runs(mlflow_lookup.client(store), experiment="exp")
    assert parent.data.metrics["x"] == 1.0


def test_a_relative_sqlite_uri_is_the_store_in_the_working_directory(tmp_path, monkeypatch, migrated_sqlite):
    """tracking=local's sqlite:///mlflow.db is ./mlflow.db wherever a driver starts, for a second driver in the
    same process too (MLflow keeps one store per URI for the process's life, so the tracker opens the absolute
    path); what it prints keeps the URI as given."""
    from stores import sqlite_copy

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        sqlite_copy(migrated_sqlite, tmp_path / d / "mlflow.db")
        monkeypatch.chdir(tmp_path / d)
        t = MlflowTracker("sqlite:///mlflow.db", "exp")
        t.start_sweep("smoke", f"sw-{d}", "local")
        assert t.finish(timeout=60) == 0
        assert "--backend-store-uri sqlite:///mlflow.db," in t.dashboard_hint()
    for d in ("a", "b"):
        [parent], _ = mlflow_lookup.sweep_runs(mlflow_lookup.client(tmp_path / d), experiment="exp")
        assert parent.data.tags["sweep_id"] == f"sw-{d}"


def test_resumed_sweep_reuses_its_runs(sql_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = make_spec("ring", 512)
    for _ in range(2):
        t = MlflowTracker(sql_store, "exp")
        t.start_sweep("smoke", "sw1", "local")
        t.open_trial(spec, "sw1", "queued")
        t.end("sweep")
        assert t.finish(timeout=30) == 0
    parents, children = mlflow_lookup.sweep_runs(mlflow_lookup.client(sql_store), experiment="exp")
    assert len(parents) == 1 and len(children) == 1


# --- a real server, artifacts on the GCS emulator ----------------------------------------------------


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory, postgres):
    """The deployed layout: an MLflow server on PostgreSQL (Cloud SQL there), artifacts on GCS."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    host, stop_gcs = start_gcs_emulator(BUCKET, log=tmp / "gcs.log")
    server = start_mlflow_server(
        tmp, f"gs://{BUCKET}/mlflow", gcs_host=host, backend=postgres.database("srv")
    )
    yield server, host, postgres
    server.stop()
    stop_gcs()


def blobs(host: str) -> list[str]:
    return [b.name for b in gcs_client(host).list_blobs(BUCKET)]


def test_outage_buffers_every_write_and_a_run_waits_for_the_store(gcs_server, tmp_path, monkeypatch):
    """The server is down when the parent run is opened (opening waits for it), then again while the trials'
    metrics, statuses and artifacts stream (nothing waits); once it is back, everything arrives once."""
    server, host, pg = gcs_server
    # opening waits for the store until it is back, however slowly a loaded host restarts the server
    monkeypatch.setattr("orchestrator.tracking.store.STORE_WAIT_S", 900.0)
    monkeypatch.chdir(tmp_path)  # the sweep's journal goes to ./.cache/tracking
    t = MlflowTracker(server.url, "outage")
    assert t.resume("sw-out") == {}  # the store is up at launch (a read)
    specs = [make_spec("ring", 512, steps=20), make_spec("all_gather", 1024, steps=20)]
    server.stop()
    opening = threading.Thread(target=t.start_sweep, args=("smoke", "sw-out", "local"))
    opening.start()
    opening.join(timeout=3)
    assert opening.is_alive() and t.run_id("sweep") is None  # waiting for the store, not giving up
    server.start()
    opening.join(timeout=120)
    assert t.run_id("sweep")
    for s in specs:
        t.open_trial(s, "sw-out")
    server.stop()
    t0 = time.monotonic()
    for s in specs:
        t.open_trial(s, "sw-out", "queued")
        t.log_metrics(s.trial_id, {"predicted_bytes_per_device": 1})
        log_trial(t, s, "sw-out", chunks=4, pause=0.5)
    assert time.monotonic() - t0 < 6  # the caller never waits on the store
    assert t.finish(timeout=2) > 10  # buffered, in order
    server.start()
    left = t.finish(timeout=180)
    assert left == 0, f"{left} writes left; server log:\n{server.tail()}"
    assert not list((tmp_path / ".cache" / "tracking").glob("*.jsonl"))  # all delivered: the journal went

    c = mlflow_lookup.client(server.url)
    parents, children = mlflow_lookup.sweep_runs(c, experiment="outage")
    assert len(parents) == 1 and len(children) == 2
    for r in children:
        assert r.data.tags["status"] == "finished" and r.info.status == "FINISHED"
        for key in CPU_STEP_METRICS:
            assert len(mlflow_lookup.history(c, r.info.run_id, key)) == 20, key
        assert r.data.metrics["final_mfu"] > 0 and r.data.metrics["predicted_bytes_per_device"] == 1
        assert r.info.artifact_uri.startswith("mlflow-artifacts:")
        assert f"mlflow/{r.info.experiment_id}/{r.info.run_id}/artifacts/trial_spec.json" in blobs(host)
    assert sorted(h.step for h in c.get_metric_history(parents[0].info.run_id, "mfu/ring")) == [512]


@pytest.mark.slow
def test_smoke_sweep_on_server_with_gcs_artifacts_and_an_outage(gcs_server, tmp_path):
    """The real CLI against the server; the server is stopped once the first trial streams, then restarted,
    then PostgreSQL under it is restarted: every point arrives once."""
    server, host, pg = gcs_server
    exp = "cli-smoke"
    args = [
        "+sweep=smoke",
        "progress=plain",
        *server.overrides,
        f"tracking.experiment={exp}",
        "sweep.id=smoke-srv",
    ]
    result = {}
    cli = threading.Thread(target=lambda: result.setdefault("res", run_cli(args, cwd=tmp_path, timeout=1500)))
    cli.start()
    c = mlflow_lookup.client(server.url)
    outage, pg_restarted_mid_sweep = None, False
    while cli.is_alive() and outage is None:  # wait for the first streamed step, then pull the plug
        try:
            runs = mlflow_lookup.runs(c, kind="trial", experiment=exp)
            if any(len(mlflow_lookup.history(c, r.info.run_id, "loss")) for r in runs):
                server.stop()
                t0 = time.monotonic()
                time.sleep(8)
                server.start()
                outage = time.monotonic() - t0
                pg.restart_after(5)  # then the database under the server: its pooled connections die
                pg_restarted_mid_sweep = cli.is_alive()
        except Exception:  # noqa: BLE001 - the store is being created
            pass
        time.sleep(0.5)
    cli.join()
    res = result["res"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert outage and outage >= 8, "the sweep finished before the outage could start"
    assert pg_restarted_mid_sweep, "the sweep finished before PostgreSQL restarted"
    assert "tracking store unavailable" in res.stderr and "tracking store back" in res.stderr
    # the dashboard's link opens a fresh browser on MLflow's training view; the sweep's page is the last line
    assert (
        f"dashboard: {server.url}/#/experiments/" in res.stdout
        and "workflowType=machine_learning" in res.stdout
    )
    last = res.stdout.strip().splitlines()[-1]
    assert last == "report: reports/smoke-srv.html", last
    page = (tmp_path / "reports" / "smoke-srv.html").read_text()
    assert "4 grid points: 4 finished" in page and "ran on CPU" in page

    [parent], children = mlflow_lookup.sweep_runs(c, experiment=exp)
    assert len(children) == 4 and parent.info.status == "FINISHED"
    assert parent.data.tags["sweep_name"] == "smoke" and parent.data.tags["cluster"] == "local"
    assert parent.data.tags["regression"] == "false"  # no earlier sweep in this experiment
    for r in children:
        rid, steps = r.info.run_id, int(r.data.params["steps"])
        assert r.data.tags["status"] == "finished" and r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"strategy", "context_length", "mesh", "model", "cp"} <= set(r.data.params)
        for key in CPU_STEP_METRICS:
            hist = c.get_metric_history(rid, key)
            assert sorted(h.step for h in hist) == list(range(steps)), (key, r.data.params)
        m = r.data.metrics
        assert m["final_mfu"] > 0 and m["final_tflops_per_s_per_device"] > 0 and m["final_tokens_per_s"] > 0
        assert m["final_step_time_median_s"] > 0 and m["memory_bytes_per_device"] > 0
        assert m["predicted_bytes_per_device"] > 0
        (tmp_path / rid).mkdir()
        with open(c.download_artifacts(rid, "trial_spec.json", str(tmp_path / rid))) as f:
            spec = json.load(f)
        assert spec["context_length"] == int(r.data.params["context_length"])
    for strategy in ("ring", "all_gather"):
        for key in ("mfu", "memory_gib", "step_time_s", "tokens_per_s"):
            hist = c.get_metric_history(parent.info.run_id, f"{key}/{strategy}")
            assert sorted(h.step for h in hist) == [512, 1024], (key, strategy)
    plots = {a.path for a in c.list_artifacts(parent.info.run_id, "plots")}
    assert plots == {
        f"plots/{n}.png"
        for n in (
            "mfu_vs_context",
            "memory_vs_context",
            "step_time_vs_context",
            "loss_curves",
            "loss_by_position",
            "accuracy_by_distance",
        )
    }
    assert c.download_artifacts(parent.info.run_id, "report.html", str(tmp_path)).endswith("report.html")
    assert (tmp_path / "report.html").read_text() == page  # the same page on the parent run
    in_bucket = blobs(host)
    prefix = f"mlflow/{parent.info.experiment_id}/{parent.info.run_id}/artifacts"
    assert f"{prefix}/plots/mfu_vs_context.png" in in_bucket and f"{prefix}/grid.json" in in_bucket
    png = gcs_client(host).bucket(BUCKET).blob(f"{prefix}/plots/mfu_vs_context.png").download_as_bytes()
    assert png[:4] == b"\x89PNG"
