"""Faults through the real CLI: a host process killed mid-trial, and the driver SIGKILLed mid-sweep."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, run_cli
from mlflow import MlflowClient

PLACED = re.compile(r"attempt (\d+) on (?:\S+: )?0=pid (\d+)@\S+?(?:, 1=pid (\d+)@\S+)?$")


class Driver:
    """The CLI in the background, its stdout read line by line (run_cli waits for the end)."""

    def __init__(self, args: list[str], cwd):
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
        env["PYTHONPATH"] = str(ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: list[str] = []
        self.pos = 0  # wait_for looks after its previous match
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout: float = 600) -> re.Match:
        rx, deadline = re.compile(pattern), time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.pos < len(self.lines):
                line = self.lines[self.pos]
                self.pos += 1
                if m := rx.search(line):
                    return m
            if self.proc.poll() is not None and self.pos == len(self.lines):
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-60:]))


def _trials(tmp_path, sweep_id: str) -> tuple:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("cp_scaling")
    return client, client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}'")


@pytest.mark.slow
def test_killed_host_is_preempted_and_the_trial_resumes(tmp_path):
    args = ["cluster=local_multihost", "context_length=512", "train.steps=12", "train.dtype=float32",
            "run.checkpoint_every=3", "progress=plain", "+sweep.id=kill-host"]  # fmt: skip
    drv = Driver(args, tmp_path)
    m = drv.wait_for(PLACED.pattern)
    host1 = int(m.group(3))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("cp_scaling")
    # kill process 1 once training is under way (a checkpoint is due every 3 steps)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        runs = client.search_runs([exp.experiment_id], "tags.kind = 'trial'")
        if runs and len(client.get_metric_history(runs[0].info.run_id, "loss")) >= 4:
            break
        time.sleep(0.5)
    os.kill(host1, signal.SIGKILL)
    drv.wait_for(r"preempted: retrying")
    drv.wait_for(r"attempt 2 on ")
    assert drv.proc.wait(timeout=600) == 0, "\n".join(drv.lines[-60:])
    (run,) = client.search_runs([exp.experiment_id], "tags.kind = 'trial'")
    assert run.data.tags["status"] == "finished" and run.data.tags["attempts"] == "2"
    resumed = [m.value for m in client.get_metric_history(run.info.run_id, "resumed_from_step")]
    assert min(resumed) == 0 and max(resumed) >= 3, resumed  # the retry started from the last checkpoint
    steps = {m.step for m in client.get_metric_history(run.info.run_id, "loss")}
    assert steps == set(range(12))


@pytest.mark.slow
def test_driver_sigkill_then_rerun_finishes_without_repeats(tmp_path):
    args = ["+sweep=smoke", "sweep.axes.strategy=[all_gather,ulysses,ring]", "sweep.axes.context_length=[512]",
            "~sweep.set", "train.steps=2", "train.dtype=float32", "progress=plain", "sweep.id=resume-me"]  # fmt: skip
    drv = Driver(args, tmp_path)
    drv.wait_for(r": done loss=")
    drv.wait_for(r"attempt 1 on ")  # the second trial is running
    drv.proc.send_signal(signal.SIGKILL)
    drv.proc.wait(timeout=60)
    client, runs = _trials(tmp_path, "resume-me")
    finished_before = {r.data.tags["trial_id"] for r in runs if r.data.tags.get("status") == "finished"}
    assert 1 <= len(finished_before) < 3
    res = run_cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"{len(finished_before)} skipped" in res.stdout
    client, runs = _trials(tmp_path, "resume-me")
    parents = [r for r in runs if r.data.tags["kind"] == "sweep"]
    children = [r for r in runs if r.data.tags["kind"] == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
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
def test_ctrl_c_cancels_running_trials_and_frees_their_slices(tmp_path):
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
    client, runs = _trials(tmp_path, "ctrl-c")
    (trial,) = [r for r in runs if r.data.tags["kind"] == "trial"]
    assert trial.data.tags["status"] == "cancelled" and trial.info.status == "KILLED"
