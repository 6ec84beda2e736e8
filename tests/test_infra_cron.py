"""The nightly CronJob against the docs, the image's entrypoint and Dockerfile, and the cron summary's exit codes
(offline; the manifests' own schema checks are tests/test_infra.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from drivers import ROOT, run_cli
from test_infra import INFRA, VENV_PATH, cron_container, documented, one


def test_cronjob_command_is_the_documented_command():
    cron = one("CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    command = cron_container()["command"]
    assert command == shlex.split(documented("cronjob-command"))
    # The script is baked into the image at /app (WORKDIR) by `COPY infra/cron ./infra/cron`.
    script = ROOT / Path(command[0]).relative_to("/app")
    assert script == INFRA / "cron" / "submit.sh" and os.access(script, os.X_OK)


def test_submit_runs_the_documented_submission():
    c = cron_container()
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    r = subprocess.run(
        [str(INFRA / "cron" / "submit.sh"), "--print", *c["command"][1:]],
        capture_output=True,
        text=True,
        env=os.environ | env | {"SWEEP_SLOT": "20250101"},
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert shlex.split(r.stdout) == shlex.split(documented("cronjob-submission"))
    assert "--submission-id cp-scaling-20250101 " in r.stdout and r.stdout.strip().endswith(
        "sweep.id=cp-scaling-20250101"
    )


def test_cronjob_sweep_composes_and_plans(tmp_path):

    args = cron_container()["command"][1:]
    res = run_cli([*args, "dry_run=true", "output=json"], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout)
    assert {r["cluster"] for r in rows} == {"v5p_128"} and any(r["verdict"] == "run" for r in rows)


# --- image ------------------------------------------------------------------------------------------------


def test_image_entrypoint_check_and_exec(tmp_path):
    entry = INFRA / "docker" / "entrypoint.sh"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "PATH": VENV_PATH,
        "PYTHONPATH": str(ROOT),
    }
    r = subprocess.run(
        [str(entry), "--check"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 0 and "image check ok" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(entry), "ray", "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "2.60" in r.stdout


def test_dockerfile_builds_from_the_project():
    text = (INFRA / "docker" / "Dockerfile").read_text()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY")]
    sources = [s for srcs in copies for s in srcs if not s.startswith("--")]
    assert {"pyproject.toml", "orchestrator", "jobs", "conf", "infra/cron"} <= set(sources)
    for s in sources:
        assert (ROOT / s).exists(), s
    ignore = (INFRA / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    for s in sources:  # the allow-list must let every COPY source into the build context
        assert f"!{s}" in ignore or f"!{s}/" in ignore, s
    # the tpu extra, and the server extra: psycopg 3 for the MLflow server's PostgreSQL store
    assert 'pip install ".[tpu,server]"' in text, "install the project with its tpu and server extras"
    assert "FROM python:3.11" in text and ">=3.11,<3.12" in (ROOT / "pyproject.toml").read_text()
    assert "wget" in text  # KubeRay's probes exec wget
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/app/infra/docker/entrypoint.sh"]' in text


@pytest.mark.parametrize("script", ["infra/cron/submit.sh", "infra/docker/entrypoint.sh"])
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    assert os.access(ROOT / script, os.X_OK)


# --- the cron summary ---------------------------------------------------------------------------------------


def _job_summary():
    spec = importlib.util.spec_from_file_location("job_summary", INFRA / "cron" / "job_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "status, driver, code",
    [
        ("SUCCEEDED", 0, 0),
        ("FAILED", 1, 1),
        ("FAILED", 2, 2),
        ("FAILED", 3, 3),
        ("FAILED", None, 4),
        ("STOPPED", None, 4),
    ],
)
def test_cron_exit_code_is_the_orchestrators(status, driver, code):
    assert _job_summary().exit_code(status, driver) == code


def test_cron_summary_reads_the_orchestrators_last_lines():
    logs = (
        "noise\n{not json}\nsweep s-1: 3 finished, 1 failed, 0 skipped (already finished)\n"
        'dashboard: http://mlflow:5000/#/experiments/1\n{"gate": "regression", "max_drop": 0.05}\n'
    )
    out = _job_summary().from_logs(logs)
    assert out["result"].startswith("sweep s-1: 3 finished") and out["sweep"] == {
        "gate": "regression",
        "max_drop": 0.05,
    }
    assert out["dashboard"] == "http://mlflow:5000/#/experiments/1"
