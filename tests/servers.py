"""Real servers for tests: an MLflow tracking server (sqlite or PostgreSQL, optional gs:// artifacts), a GCS emulator.

Plain helpers, not pytest fixtures, so any test module (tracking, data, checkpoints) can wrap them in its own
fixtures. Every process is started in its own session and stopped by process group, so uvicorn's workers go too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jax_processes(script: str, n: int, *args: str, env: dict | None = None) -> list[str]:
    """`script` in n fresh processes of one jax.distributed runtime on this machine (2 CPU devices each), each
    given (its process id, a free coordinator port, *args); their outputs, once every one exited 0."""
    full_env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        **(env or {}),
    }
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i), str(port), *args],
            env=full_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(n)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    return outs


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers 2xx; fail early with the process's output if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered:\n{out[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if 200 <= r.status < 300:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` s, and reap stragglers (a server's workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(grace)


def _spawn(cmd: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen:
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


# --- GCS emulator -------------------------------------------------------------------------------------

# gcp-storage-emulator serves one request at a time on http.server's listen backlog of 5; gcsfs sends a
# directory's files concurrently, and the connections past the fifth were dropped and retried by TCP after
# 1, 3, 7... s (a checkpoint round trip took minutes). A deeper backlog queues them instead.
EMULATOR = """
import sys
from http import server
server.HTTPServer.request_queue_size = 1024
from gcp_storage_emulator.__main__ import main
sys.argv[0] = "gcp-storage-emulator"
sys.exit(main())
"""


def start_gcs_emulator(bucket: str | None = None, log: Path | None = None) -> tuple[str, Callable[[], None]]:
    """Start `gcp-storage-emulator` in memory on a free port; returns (host_url, stop).

    Point google-cloud-storage at it with STORAGE_EMULATOR_HOST=host_url. If `bucket` is given it is created
    through google-cloud-storage, as a real user would.
    """
    port = free_port()
    cmd = [
        sys.executable,
        "-c",
        EMULATOR,
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--in-memory",
    ]
    proc = _spawn(cmd + ["--quiet"], dict(os.environ), log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/storage/v1/b", timeout=30, proc=proc)
        if bucket:
            gcs_client(url).create_bucket(bucket)
    except BaseException:
        _stop(proc)
        raise
    return url, lambda: _stop(proc)


def gcs_client(host_url: str):
    """A google-cloud-storage client on the emulator (anonymous: the emulator checks no credentials)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    # api_endpoint rather than STORAGE_EMULATOR_HOST: no process-wide setting outlives the emulator
    return storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": host_url}
    )


# --- MLflow server ------------------------------------------------------------------------------------


class Server:
    """A real `mlflow server` subprocess on 127.0.0.1 that a test can stop and start again on the same port."""

    def __init__(
        self,
        tmp: Path,
        artifacts_destination: str | None = None,
        env: dict[str, str] | None = None,
        workers: int = 1,
        backend: str | None = None,
    ):
        tmp = Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend = backend or f"sqlite:///{tmp / 'server.db'}"  # or postgresql://... (tests/postgres.py)
        self.log = tmp / "mlflow-server.log"
        dest = artifacts_destination or (tmp / "mlartifacts").as_uri()
        self.cmd = [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            self.backend,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--artifacts-destination",
            dest,
        ]
        # the GenAI job runner (a runner and three huey consumers) only costs start-up time here
        self.env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> Server:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = _spawn(self.cmd, self.env, self.log)
            try:
                wait_http(f"{self.url}/health", timeout, self.proc)
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    @property
    def overrides(self) -> list[str]:
        """The driver's command-line overrides that track to this server."""
        return ["tracking=server", f"tracking.uri={self.url}"]

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_mlflow_server(
    tmp: Path,
    artifacts_destination: str | None = None,
    gcs_host: str | None = None,
    workers: int = 1,
    backend: str | None = None,
) -> Server:
    """Start `mlflow server` (sqlite in `tmp`, or the `backend` store URI) and wait for /health.

    `artifacts_destination` may be gs://bucket/prefix: pass the emulator's `gcs_host` so the server's
    google-cloud-storage talks to it. Clients then upload through the server (mlflow-artifacts: URIs).
    """
    env = {"STORAGE_EMULATOR_HOST": gcs_host, "GOOGLE_CLOUD_PROJECT": "test"} if gcs_host else {}
    return Server(tmp, artifacts_destination, env, workers, backend).start()
