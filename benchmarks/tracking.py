"""How fast the driver's Tracker gets metric points into a local MLflow server (target: 10,000 in < 3 s).

    python benchmarks/tracking.py [--uri http://127.0.0.1:5000] [--points 10000]

Without --uri it starts a throwaway `mlflow server` (sqlite) on a free port. The points arrive as the executor
sends them: one call per step record (10 metrics each), and the clock stops when the store has them all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from orchestrator import REPO
from orchestrator.tracking.store import MlflowTracker

# The suite's own throwaway MLflow server (tests/servers.py), which is no package.
sys.path.append(str(REPO / "tests"))
import servers

KEYS = [f"m{i}" for i in range(10)]


def bench(uri: str, points: int) -> tuple[float, float, int]:
    """(seconds until stored, seconds the caller spent enqueueing, points found in the store)."""
    t = MlflowTracker(uri, f"bench-{time.time_ns()}")
    t.start_sweep("bench", f"bench-{time.time_ns()}", "local")
    t.log_metrics("sweep", {"warmup": 0.0})  # a fresh server imports its handlers on first use
    assert t.finish(timeout=60) == 0, "store not reachable"
    steps = points // len(KEYS)
    t0 = time.perf_counter()
    for step in range(steps):
        t.log_metrics("sweep", {k: step * 0.5 for k in KEYS}, step=step)
    enqueue = time.perf_counter() - t0
    assert t.finish(timeout=300) == 0, "store did not take the points"
    stored = time.perf_counter() - t0
    got = sum(len(t.client.get_metric_history(t.run_id("sweep"), k)) for k in KEYS)
    return stored, enqueue, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="")
    ap.add_argument("--points", type=int, default=10_000)
    a = ap.parse_args()
    server = None
    if not a.uri:
        server = servers.start_mlflow_server(Path(tempfile.mkdtemp(prefix="bench-mlflow-")))
        a.uri = server.url
    try:
        stored, enqueue, got = bench(a.uri, a.points)
    finally:
        if server:
            server.stop()
    n = a.points // len(KEYS) * len(KEYS)
    ok = got == n and stored < 3.0
    print(
        f"tracking: {n:,} metric points to {a.uri} in {stored:.2f} s ({n / stored:,.0f} points/s); "
        f"caller blocked {enqueue * 1e3:.0f} ms; {got:,} stored; target < 3 s: {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
