"""Chaos soak: a 20-trial local sweep while a seeded schedule kills a trial's host process, the driver (then runs
it again) and the tracking server, at points chosen per seed. Every event is waited for on the driver's output,
never slept for. Afterwards the store must hold every trial once, every step once, no run left RUNNING, and the
same losses as an undisturbed run of the same grid.

    python benchmarks/chaos.py [--seeds 0 1 2] [--page]      # --page: write docs/results/chaos.md

One MLflow server (sqlite) for all runs; one JAX compilation cache, so only the undisturbed run compiles cold.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient

from benchmarks import page
from orchestrator import REPO, provenance

# The suite's own helpers, which are no package: the driver in a subprocess (tests/drivers.py), a throwaway
# MLflow server (tests/servers.py), the store read back (tests/mlflow_lookup.py).
sys.path.append(str(REPO / "tests"))
import drivers
import mlflow_lookup
import servers

GRID = [
    "-m",
    "strategy=all_gather,ulysses,ring,usp,double_ring",
    "context_length=256,512,768,1024",
    "train.steps=4",
    "train.dtype=float32",
    "run.checkpoint_every=1",
    "progress=plain",
    "gate.enabled=false",
]
STEPS = 4
PLACED = re.compile(r"\] (.+?): attempt \d+ on (?:\S+: )?0=pid (\d+)@")
WAIT_S = 1200  # for one event on a driver's output


def schedule(seed: int) -> dict:
    """Where in the step loop the first trial's host dies (jobs/faults.py), at which placement the driver
    dies, after which finished trial of the rerun the tracking server goes away."""
    rng = random.Random(seed)
    worker = f"{rng.randrange(STEPS)}:{rng.choice(['before_save', 'after_save', 'after_report'])}"
    return {"worker": worker, "driver": rng.randrange(4, 13), "server": rng.randrange(1, 5)}


def losses(client: MlflowClient, sweep_id: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in mlflow_lookup.runs(client, sweep_id, "trial"):
        out.setdefault(r.data.tags["trial_id"], []).append(
            (r.data.tags.get("status"), r.info.status, mlflow_lookup.history(client, r))
        )
    return out


def soak(seed: int, args: list[str], cwd: Path, env: dict, server) -> dict:
    at = schedule(seed)
    t0 = time.monotonic()
    env = env | drivers.fault_env(cwd, f"kill:0:{at['worker']}")
    d = drivers.Driver(args, cwd, env)
    d.wait_for(
        r"preempted: retrying", WAIT_S
    )  # 1. the first trial's host, at its seeded point of the step loop
    placed = sum(bool(PLACED.search(line)) for line in d.lines[: d.pos])
    while placed < at["driver"]:  # 2. the driver itself, as a trial starts
        d.wait_for(PLACED.pattern, WAIT_S)
        placed += 1
    d.proc.send_signal(signal.SIGKILL)
    d.finish()
    d = drivers.Driver(args, cwd, env)  # the rerun resumes the sweep
    for _ in range(at["server"]):  # 3. the tracking server, until the rerun notices it is gone
        d.wait_for(r": done loss=", WAIT_S)
    server.stop()
    d.wait_for(r"tracking store unavailable", WAIT_S)
    server.start()
    code = d.finish()
    return {"seed": seed, **at, "exit": code, "s": time.monotonic() - t0}


def check(client: MlflowClient, sweep_id: str, ref: dict[str, list]) -> dict:
    got = losses(client, sweep_id)
    dup = sum(len(v) - 1 for v in got.values())
    steps_ok = all(len(v) == 1 and [s for s, _ in v[0][2]] == list(range(STEPS)) for v in got.values())
    orphans = sum(1 for v in got.values() for status, st, _ in v if st == "RUNNING" or status != "finished")
    same = all(
        len(got.get(t, [])) == 1
        and all(
            abs(a[1] - b[1]) <= 1e-6 * max(1.0, abs(b[1]))
            for a, b in zip(got[t][0][2], ref[t][0][2], strict=True)
        )
        for t in ref
    )
    return {
        "trials": len(got),
        "duplicate runs": dup,
        "every step once": steps_ok,
        "orphans": orphans,
        "losses equal": same,
    }


NOTE = """
A 20-point local sweep (5 strategies x 4 context lengths, 4 steps each, fp32, a checkpoint every step) on one
MLflow server, run once undisturbed and then once per seed under a seeded schedule of faults, each waited for
on the driver's output (never slept for): (1) the first trial's host process is SIGKILLed at the seed's point
of its step loop (`worker`: step:point) and the trial is retried; (2) the driver itself is SIGKILLed as its
`driver`-th attempt is placed, and the same command is run again, resuming the sweep; (3) after `server` trials
of the rerun are done, the tracking server is stopped until the driver reports the outage, then started again.
Afterwards the store must hold one child run per trial, every step once, no run left RUNNING or unfinished,
and per trial the same losses as the undisturbed run (relative 1e-6).
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    page.add_argument(ap, "chaos")
    a = ap.parse_args(argv)
    made = provenance.current("python benchmarks/chaos.py", argv, load=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-chaos-"))
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp / "jax-cache")}  # on top of drivers.driver_env's
    server = servers.start_mlflow_server(tmp / "server")
    rows = []
    try:
        base = [*GRID, *server.overrides]
        t0 = time.monotonic()
        ref_driver = drivers.Driver([*base, "+sweep.id=chaos-ref"], tmp, env)
        assert ref_driver.finish() == 0, "\n".join(ref_driver.lines[-40:])
        print(f"undisturbed run: {time.monotonic() - t0:.0f} s", flush=True)
        client = mlflow_lookup.client(server.url)
        ref = losses(client, "chaos-ref")
        for seed in a.seeds:
            (tmp / str(seed)).mkdir()
            row = soak(seed, [*base, f"+sweep.id=chaos-{seed}"], tmp / str(seed), env, server)
            row |= check(client, f"chaos-{seed}", ref)
            print(row, flush=True)
            rows.append(row)
    finally:
        server.stop()
    cols = list(rows[0])
    cell = lambda v: f"{v:.0f}" if isinstance(v, float) else str(v)
    body = page.table(cols, ([cell(r[c]) for c in cols] for r in rows))
    print(body)
    if a.page:
        print(f"wrote {page.write(a.page, 'Chaos soak', made, NOTE, body)}")
    ok = all(
        r["exit"] == 0
        and r["duplicate runs"] == 0
        and r["every step once"]
        and not r["orphans"]
        and r["losses equal"]
        for r in rows
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
