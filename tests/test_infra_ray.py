"""The nightly CronJob's exact submission (infra/cron/submit.sh) against a real local Ray job API.

A head started with `ray start --head` on 127.0.0.1, with token auth on as in production (RAY_AUTH_MODE=token,
RAY_AUTH_TOKEN), every port its own, and a private temp dir, so it neither collides with nor is found by other
tests' Ray instances (no /tmp/ray/ray_current_cluster). It is stopped by its process group, never `ray stop`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from drivers import ROOT
from servers import free_port

pytestmark = pytest.mark.ray  # a `ray start --head` of its own

SUBMIT = ROOT / "infra" / "cron" / "submit.sh"
BIN = Path(sys.executable).parent


def _stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the `ray start --block` session (it stops its daemons gracefully), then SIGKILL what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ray_head():
    """(job API URL, GCS address, env for clients) of a private single-node Ray with token auth."""
    temp = tempfile.mkdtemp(prefix="rayinfra", dir="/tmp")  # short: Ray's unix sockets live under it
    ports = {
        k: free_port()
        for k in ("gcs", "dash", "agent_http", "agent_grpc", "metrics", "rtenv", "nm", "om", "client")
    }
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "XLA_"))}
    # The head's environment is the job driver's: as on the cluster's head pod, no accelerator for the driver.
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "JAX_PLATFORMS": "cpu",
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--port={ports['gcs']}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={ports['dash']}",
        f"--dashboard-agent-listen-port={ports['agent_http']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--metrics-export-port={ports['metrics']}",
        f"--runtime-env-agent-port={ports['rtenv']}",
        f"--node-manager-port={ports['nm']}",
        f"--object-manager-port={ports['om']}",
        f"--ray-client-server-port={ports['client']}",
        "--num-cpus=2",
        f"--temp-dir={temp}",
    ]
    log = open(Path(temp) / "ray_start.log", "wb")  # noqa: SIM115 - lives as long as the head
    proc = subprocess.Popen(
        cmd, env=env, cwd=temp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{ports['dash']}"
    try:
        _wait_for_jobs(url, env, proc, Path(temp) / "ray_start.log")
        yield url, f"127.0.0.1:{ports['gcs']}", env
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_jobs(url: str, env: dict, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Until a trivial job runs: the dashboard answers before its agent can take submissions."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        r = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", url, "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode == 0:
            return
        time.sleep(2)
    raise TimeoutError(
        f"Ray job API at {url} did not take a job within {timeout:.0f} s:\n{r.stdout}{r.stderr}"
    )


def submit(env: dict, args: list[str], **extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the CronJob's script; returns the process and its last line parsed as the JSON summary."""
    full = env | {"SUMMARY_POLL_S": "1", **extra}
    r = subprocess.run([str(SUBMIT), *args], env=full, capture_output=True, text=True, timeout=600)
    lines = r.stdout.strip().splitlines()
    assert lines, r.stderr[-3000:]
    return r, json.loads(lines[-1])


@pytest.mark.slow
def test_token_auth_is_enforced_and_ray_cli_only_says_failed(ray_head):
    url, _, env = ray_head
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"} | {"RAY_AUTH_MODE": "disabled"}
    r = subprocess.run(
        [str(BIN / "ray"), "job", "list", "--address", url],
        env=no_token,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "Authentication" in r.stdout + r.stderr
    # Why submit.sh reads driver_exit_code back: the CLI maps any entrypoint failure to 1.
    r = subprocess.run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            url,
            "--",
            "python",
            "-c",
            "import sys; sys.exit(3)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1


@pytest.mark.slow
def test_submission_propagates_the_orchestrator_exit_code(ray_head, tmp_path):
    url, gcs, env = ray_head
    db = tmp_path / "mlflow.db"
    args = ["+sweep=smoke", "model=nope", f"cluster.address={gcs}", f"tracking.uri=sqlite:///{db}"]
    r, summary = submit(env, args, RAY_DASHBOARD_URL=url, SWEEP_SLOT="bad-input")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert summary["status"] == "FAILED" and summary["exit_code"] == 2 and summary["driver_exit_code"] == 2
    assert summary["submission_id"] == summary["sweep_id"] == "smoke-bad-input"


@pytest.mark.slow
def test_nightly_submission_runs_once_per_slot_and_resumes(ray_head, tmp_path):
    import mlflow_lookup

    url, gcs, env = ray_head
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # The smoke sweep at one length (2 trials) keeps this test short on 2 cores; the brackets also check that
    # overrides reach the driver intact through `ray job submit` (it shell-quotes the entrypoint).
    args = [
        "+sweep=smoke",
        "sweep.axes.context_length=[512]",
        "cluster=local",
        f"cluster.address={gcs}",
        f"tracking.uri={store}",
        "progress=plain",
    ]
    slot = {"RAY_DASHBOARD_URL": url, "SWEEP_SLOT": "20250101"}

    t0 = time.monotonic()
    r, first = submit(env, args, **slot)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert first["status"] == "SUCCEEDED" and first["exit_code"] == 0
    assert first["sweep_id"] == "smoke-20250101"
    assert first["result"].startswith("sweep smoke-20250101: 2 finished")
    client = mlflow_lookup.client(store)

    def runs() -> tuple[list, list]:
        return mlflow_lookup.runs(client, kind="sweep"), mlflow_lookup.runs(client, kind="trial")

    parents, trials = runs()
    assert len(trials) == 2 and all(t.data.tags["status"] == "finished" for t in trials)
    print(f"first nightly submission: {time.monotonic() - t0:.1f} s")

    # The CronJob fires again in the same slot: no second job, no second set of runs, same verdict.
    r, again = submit(env, args, **slot)
    assert r.returncode == 0 and "already exists (SUCCEEDED)" in r.stdout, r.stdout[-3000:]
    assert again["submission_id"] == first["submission_id"] and again["result"] == first["result"]
    assert [len(x) for x in runs()] == [len(parents), 2]

    # A manual retry of the night (fresh submission id, same sweep id) resumes: every trial is skipped.
    r, retry = submit(env, args, **slot, SUBMISSION_ID="smoke-20250101-retry1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert retry["result"].startswith("sweep smoke-20250101: 0 finished, 0 failed, 2 skipped")
    assert len(runs()[1]) == 2
