"""Faults through the real CLI: a host process killed mid-trial, and the driver SIGKILLed mid-sweep."""

import json
import os
import re
import signal
import time

import mlflow_lookup
import pytest
from drivers import THREE_TRIALS, Driver, fault_env
from servers import start_mlflow_server

from jobs.records import StartRecord, StepRecord
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.tracking.trial_log import LOG_ARTIFACT, parse_trial_log

PLACED = re.compile(r"attempt (\d+) on (?:\S+: )?0=pid (\d+)@\S+?(?:, 1=pid (\d+)@\S+)?$")


def _store_shows(tmp_path, sweep_id: str, seen, timeout: float = 600) -> None:
    """Wait until the store's runs of the sweep satisfy `seen` (an event the driver's writer thread makes)."""
    deadline = time.monotonic() + timeout
    while not seen(mlflow_lookup.runs(mlflow_lookup.client(tmp_path), sweep_id)):
        assert time.monotonic() < deadline, f"the store never showed the awaited state of sweep {sweep_id}"
        time.sleep(0.2)


def _one_trial(tmp_path) -> tuple:
    client = mlflow_lookup.client(tmp_path)
    return client, mlflow_lookup.trial(client)


def _assert_every_step_once(client, run, steps: int) -> None:
    """Each step's loss is in the store exactly once (a lost record or a duplicate fails)."""
    got = mlflow_lookup.steps(client, run)
    assert got == list(range(steps)), got


# checkpoint_every=3 saves after steps 2, 5, 8, 11; the kills are the injected faults' own events
KILL_ARGS = [
    "context_length=512",
    "train.steps=12",
    "train.dtype=float32",
    "run.checkpoint_every=3",
    "progress=plain",
]


@pytest.mark.slow
def test_killed_host_is_preempted_and_the_trial_resumes(tmp_path, stdlib_corpus, local_ray, store, cli):
    """Host 1 (not the one reporting) dies after step 4's record; host 0 loses its peer mid-collective.
    On packed documents: the retry restores the loader's state, so its steps equal an uninterrupted run's."""
    env = fault_env(tmp_path, "kill:1:4:after_report")
    data = ["train.data.kind=documents", f"train.data.sources=[{stdlib_corpus}]", "model.vocab=512"]
    args = ["cluster=local_multihost", *KILL_ARGS, *data, "+sweep.id=kill-host"]
    res = cli(args, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "preempted: retrying" in res.stdout and (tmp_path / "faults" / "kill-1-4-after_report").exists()
    client, run = _one_trial(tmp_path)
    # attempts: 2, or more when gloo timed out a CPU-starved host (retried as a preemption; the data holds)
    assert run.data.tags["status"] == "finished" and int(run.data.tags["attempts"]) >= 2
    resumed = mlflow_lookup.values(client, run, "resumed_from_step")
    assert 3 in resumed, resumed  # the retry after the kill started from the checkpoint after step 2
    _assert_every_step_once(client, run, 12)
    # a fresh loader would have fed batches 0, 1, ... again from step 3; fp32, gloo sums in its own order
    (spec,) = expand(load([*KILL_ARGS[:3], *data, "cluster=local"]))
    whole = [r.loss for r in train(spec) if r.kind == "step"]
    got = mlflow_lookup.values(client, run)
    assert got == pytest.approx(whole, rel=1e-5, abs=1e-6), (got, whole)


@pytest.mark.slow
def test_host_killed_at_each_point_of_the_step_loop_loses_no_step(tmp_path, local_ray, store, cli):
    """Process 0 (the one reporting) is killed before a save, between a save and its step's report, and
    after a report: every step's loss reaches the store exactly once. One host: what is killed is the
    reporting process's step loop, the same on every layout (a multi-host kill is the test above)."""
    env = fault_env(tmp_path, "kill:0:2:before_save,kill:0:5:after_save,kill:0:8:after_report")
    args = ["cluster=local", *KILL_ARGS, "retries.preemption=6", "+sweep.id=kill-points"]
    res = cli(args, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(list((tmp_path / "faults").iterdir())) == 3  # all three kills happened
    client, run = _one_trial(tmp_path)
    attempts = int(run.data.tags["attempts"])  # 4; more if gloo timed out a CPU-starved host (a preemption)
    assert run.data.tags["status"] == "finished" and attempts >= 4
    _assert_every_step_once(client, run, 12)
    # no checkpoint before the first kill; then the saves after steps 5 and 8
    resumed = mlflow_lookup.values(client, run, "resumed_from_step")
    assert resumed[:2] == [0, 0] and resumed[-1] == 9 and 6 in resumed, resumed
    # per attempt, not per step: one point per attempt that compiled (an attempt whose peer missed gloo's
    # window can die before its start record, so its number may be absent; none is repeated or out of range)
    compiled = mlflow_lookup.steps(client, run, "compile_s")
    assert compiled == sorted(set(compiled)) and len(compiled) >= 4 and compiled[-1] == attempts, compiled
    assert set(compiled) <= set(range(1, attempts + 1)) and len(compiled) == len(resumed), (compiled, resumed)
    assert run.data.tags["summary_covers"] == f"steps 10-11 of attempt {attempts} (resumed at step 9)"


@pytest.mark.slow
def test_driver_killed_mid_trial_then_rerun_logs_every_step_once(tmp_path, local_ray, store, cli):
    """The driver dies while a checkpointing trial runs; the rerun resumes the trial from its checkpoint,
    re-sends what the checkpoint holds, and the store ends with each step once."""
    env = fault_env(tmp_path, "hold:0:8:after_report")  # the job stops after step 8's save and report
    args = ["cluster=local", *KILL_ARGS, "+sweep.id=kill-driver"]
    drv = Driver(args, tmp_path, env)
    marker = tmp_path / "faults" / "hold-0-8-after_report"
    drv.wait_for(r"attempt 1 on ")
    deadline = time.monotonic() + 600
    while not marker.exists() and time.monotonic() < deadline and drv.proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "\n".join(drv.lines[-60:])
    drv.proc.send_signal(signal.SIGKILL)
    drv.proc.wait(timeout=60)
    res = cli(args, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client, run = _one_trial(tmp_path)
    assert run.data.tags["status"] == "finished"
    assert mlflow_lookup.values(client, run, "resumed_from_step")[-1] == 9
    _assert_every_step_once(client, run, 12)
    # the trial log, read back for plots, holds both drivers' records: the killed one's steps too, each once
    logged = parse_trial_log(mlflow_lookup.artifact_text(client, run, LOG_ARTIFACT, tmp_path))
    assert [r.step for r in logged if isinstance(r, StepRecord)] == list(range(12))
    starts = [r.resumed_from_step for r in logged if isinstance(r, StartRecord)]
    assert starts[0] == 0 and starts[-1] == 9, starts


@pytest.mark.slow
def test_driver_sigkill_then_rerun_finishes_without_repeats(tmp_path, local_ray, store, cli):
    args = [*THREE_TRIALS, "sweep.id=resume-me"]
    drv = Driver(args, tmp_path)
    drv.wait_for(r": done loss=")
    drv.wait_for(r"attempt 1 on ")  # the second trial is running
    # the first trial's finished status reaches the store through the write-behind queue: wait for that event
    _store_shows(
        tmp_path, "resume-me", lambda runs: any(r.data.tags.get("status") == "finished" for r in runs)
    )
    drv.proc.send_signal(signal.SIGKILL)
    drv.proc.wait(timeout=60)
    runs = mlflow_lookup.runs(mlflow_lookup.client(tmp_path), "resume-me")
    finished_before = {r.data.tags["trial_id"] for r in runs if r.data.tags.get("status") == "finished"}
    assert 1 <= len(finished_before) < 3
    res = cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"{len(finished_before)} skipped" in res.stdout
    client = mlflow_lookup.client(tmp_path)
    parents = mlflow_lookup.runs(client, "resume-me", "sweep")
    children = mlflow_lookup.runs(client, "resume-me", "trial")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # the rerun's plots cover the trials the killed driver finished too, read back from their runs
    assert parents[0].data.tags["plots_trials"] == "3"
    assert len(children) == 3 and len({r.data.tags["trial_id"] for r in children}) == 3  # runs reused
    for r in children:
        assert r.data.tags["status"] == "finished" and r.info.status == "FINISHED", r.data.tags
        # one summary per trial: no trial ran to completion twice
        assert len(client.get_metric_history(r.info.run_id, "final_loss")) == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_ctrl_c_cancels_running_trials_and_frees_their_slices(tmp_path, store):
    args = [
        "cluster=local_multihost",
        "context_length=512",
        "train.steps=500",
        "progress=plain",
        "+sweep.id=ctrl-c",
    ]
    drv = Driver(args, tmp_path)
    m = drv.wait_for(PLACED.pattern)
    drv.proc.send_signal(signal.SIGINT)
    assert drv.proc.wait(timeout=120) == 1
    drv.wait_for(r"placement groups still reserved: 0")
    time.sleep(3)
    assert not _alive(int(m.group(2))) and not _alive(int(m.group(3)))  # no host process left behind
    trial = mlflow_lookup.trial(mlflow_lookup.client(tmp_path), "ctrl-c")
    assert trial.data.tags["status"] == "cancelled" and trial.info.status == "KILLED"


@pytest.mark.slow
def test_driver_sigkill_before_the_queue_drains_loses_no_write(tmp_path, postgres, local_ray, cli):
    """The tracking server (on PostgreSQL, as deployed) is down while a trial finishes; the driver is SIGKILLed right after the trial's last
    record and its finished status were queued (so journaled). The rerun replays the journal: every step once,
    the trial finished and not run again."""
    server = start_mlflow_server(tmp_path / "server", backend=postgres.database("journal"))
    try:
        args = [
            "cluster=local",
            "context_length=512",
            "train.steps=6",
            "train.dtype=float32",
            "progress=plain",
            *server.overrides,
            "+sweep.id=journal",
        ]
        drv = Driver(args, tmp_path)
        drv.wait_for(r"attempt 1 on ")  # its runs exist: the driver opens them before launching
        server.stop()
        drv.wait_for(r": done loss=")  # printed after the finished status is queued
        drv.proc.send_signal(signal.SIGKILL)
        drv.proc.wait(timeout=60)
        (journal,) = (tmp_path / ".cache" / "tracking").glob("*.jsonl")
        text = journal.read_text()
        assert '"finished"' in text
        # an artifact is journaled as the path of a file kept beside the journal, never as its bytes
        files = [json.loads(line)["write"].get("file") for line in text.splitlines() if '"file"' in line]
        assert any(f.endswith("/trial_log.txt") and os.path.isfile(f) for f in files), files
        server.start()
        c = mlflow_lookup.client(server.url)
        run = mlflow_lookup.trial(c)
        assert run.data.tags["status"] != "finished"  # the store never heard of the end
        res = cli(args, cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "replaying" in res.stderr and "0 finished, 0 failed, 1 skipped" in res.stdout, res.stdout[
            -2000:
        ]
        run = mlflow_lookup.trial(c)
        assert run.data.tags["status"] == "finished" and run.info.status == "FINISHED"
        _assert_every_step_once(c, run, 6)
        assert len(c.get_metric_history(run.info.run_id, "final_loss")) == 1
        assert not list((tmp_path / ".cache" / "tracking").iterdir())  # delivered: the journal is gone
    finally:
        server.stop()
