"""Shared test setup: 8 simulated CPU devices for in-process JAX, a fresh MLflow store per test (a copy of one
migrated per session)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Before any jax backend starts (conftest is imported before test modules).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

# One compilation cache for the session: in-process jobs, CLI subprocesses and their Ray workers all
# inherit it, so the same tiny trial compiled by several tests compiles once. Fresh per session: a cache
# shared across sessions once served an executable that deadlocked XLA:CPU's collectives (all-gather vs
# all-reduce rendezvous on different devices), which a fresh cache never reproduced.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="cp-orchestrator-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# The planner measures a CPU host's matmul rate per run, and on a shared 2-core machine one probe swings ~10x;
# tests pin it (the nominal 2-core figure) so a point's verdict does not depend on the neighbours' load.
# tests/test_mfu_model.py runs the probe itself.
os.environ.setdefault("CP_PLAN_CPU_TFLOPS", "0.01")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    """The real CLI in a subprocess, as a user runs it."""
    import subprocess

    full_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    full_env |= {"PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """One sqlite store migrated to MLflow's head schema for the session (tests/stores.py); tests take copies."""
    from stores import sqlite_template

    return sqlite_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture
def store(tmp_path, migrated_sqlite):
    """A fresh sqlite MLflow store URI: tmp_path/mlflow.db, which is also the store of a driver run in tmp_path
    with tracking=local (./mlflow.db)."""
    from stores import sqlite_copy

    return sqlite_copy(migrated_sqlite, tmp_path / "mlflow.db")


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session (tests/postgres.py); a test takes a fresh database of it."""
    from postgres import Postgres, bin_dir

    if bin_dir() is None:
        if os.environ.get("CP_TEST_POSTGRES") == "required":  # .ci/run installs it: missing is a failure
            pytest.fail("PostgreSQL is not installed, and CP_TEST_POSTGRES=required")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    pg = Postgres().start()
    yield pg
    pg.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request, tmp_path):
    """A fresh MLflow store URI on each SQL backend: sqlite, and PostgreSQL as the deployed server's."""
    if request.param == "sqlite":
        return request.getfixturevalue("store")
    return request.getfixturevalue("postgres").database(f"t_{os.urandom(6).hex()}")


@pytest.fixture(scope="module")
def no_ray_no_mlflow(tmp_path_factory):
    """A PYTHONPATH whose `ray` and `mlflow` fail on import: bad input must be rejected before either loads."""
    root = tmp_path_factory.mktemp("poison")
    for name in ("ray", "mlflow"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} imported before validation')\n")
    return {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}


@pytest.fixture
def pinned_cpu_peak(monkeypatch):
    """cluster=local plans with the host's measured matmul rate; pin it so verdicts do not follow the load."""
    from orchestrator.plan import hardware

    monkeypatch.setenv(hardware.CPU_PEAK_ENV, str(hardware.NOMINAL_CPU_TFLOPS))
    hardware.measured_cpu_tflops.cache_clear()
    yield
    hardware.measured_cpu_tflops.cache_clear()


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory) -> Path:
    """A real tokenized corpus without a download: 300 of the standard library's own files, a 512-entry BPE."""
    from jobs.data.documents import corpus

    out = tmp_path_factory.mktemp("corpus") / "stdlib"
    corpus.build(str(out), [corpus.stdlib_dir()], vocab=512, fmt="arrayrecord", max_docs=300, shard_docs=100)
    return out


@pytest.fixture
def gcs():
    """A GCS emulator for the real google-cloud-storage client; yields its bucket as gs://cp-test."""
    from servers import start_gcs_emulator

    from jobs import storage

    url, stop = start_gcs_emulator(bucket="cp-test")
    os.environ["STORAGE_EMULATOR_HOST"] = url
    storage.client.cache_clear()
    yield "gs://cp-test"
    stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    storage.client.cache_clear()
