"""Faults of the environment found before anything starts: the tracking server, the Ray cluster, gs:// credentials.

Each is bad input (ConfigError: one `error:` line, exit 2) when the sweep is about to run, found in seconds by a
probe with a deadline, so nothing is recorded or launched. A server that goes away later is an outage, which the
tracker's journal rides out."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.config.data import gcs_credentials
from orchestrator.config.schema import ConfigError

TIMEOUT_S = 5.0  # per probe: a reachable server answers in milliseconds


def check(tracking: Any, specs: list[TrialSpec]) -> None:
    """Raise ConfigError for the first start-up fault: `tracking` (schema.Tracking) and the trials to launch."""
    _tracking(tracking)
    if specs:
        _ray(specs[0].cluster)
    _gcs(tracking, specs)


def _tracking(tracking: Any) -> None:
    uri = str(getattr(tracking, "uri", "") or "")
    if not uri.startswith(("http://", "https://")):
        return  # a local store (sqlite, file) is created on first write
    try:  # every MLflow server answers /health
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=TIMEOUT_S) as r:
            r.read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return  # an authenticating proxy answered: the server is there, the job's client logs in
        raise ConfigError(
            f"tracking server {uri} answered /health with HTTP {e.code}; nothing started — is it an "
            "MLflow server? Fix tracking.uri (or $MLFLOW_TRACKING_URI), or pass tracking=local"
        ) from None
    except (OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        raise ConfigError(
            f"tracking server {uri} does not answer ({why}); nothing started — start it "
            "(mlflow server --host 127.0.0.1 --port ...), fix tracking.uri, or pass "
            "tracking=local"
        ) from None


def _ray(cluster: Any) -> None:
    """A cluster.address that names no live Ray head: none found, or one whose head is gone (a stale
    ray_current_cluster file makes ray.init wait minutes for it)."""
    if not cluster.address:
        return  # the orchestrator starts its own Ray
    address, source = _resolve(cluster.address)
    if address is None:
        raise ConfigError(
            f"cluster {cluster.name}: no Ray cluster found for cluster.address={cluster.address} "
            f"({source}); nothing started — start one (ray start --head), or set "
            "cluster.address=host:port (or $RAY_ADDRESS)"
        )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cluster {cluster.name}: the Ray head at {address} ({source}) does not answer "
            f"({e}); nothing started — is the head node gone? Restart it (ray start --head), "
            "or fix cluster.address (or $RAY_ADDRESS)"
        ) from None


def _resolve(address: str) -> tuple[str | None, str]:
    """(host:port or None, where it came from), in the order ray.init documents: $RAY_ADDRESS, then for "auto"
    the address of the latest cluster `ray start` began, from the file it writes in Ray's temp directory
    ($RAY_TMPDIR, else $TMPDIR, else /tmp)."""
    env = os.environ.get("RAY_ADDRESS", "")
    if env:
        return env, "$RAY_ADDRESS"
    if address != "auto":
        return address, "cluster.address"
    temp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(temp, "ray", "ray_current_cluster")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip(), f"from {path}"
    return None, f"no $RAY_ADDRESS, no {path}"


def _gcs(tracking: Any, specs: list[TrialSpec]) -> None:
    """gs:// paths need credentials: an emulator, a key file, gcloud's ADC or (on GCP) the metadata server."""
    paths = [p for s in specs for p in (s.run.checkpoint_dir, s.train.data.path, *s.train.data.sources)]
    paths.append(str(getattr(tracking, "artifact_location", "") or ""))
    uses = sorted({p for p in paths if p.startswith("gs://")})
    if not uses or gcs_credentials(metadata_server=True):
        return
    more = f" (and {len(uses) - 1} more)" if len(uses) > 1 else ""
    raise ConfigError(
        f"{uses[0]}{more} needs Google Cloud credentials and none were found; nothing started "
        "— run `gcloud auth application-default login`, or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a key file"
    )
