"""Chaos soak: a 20-trial local sweep while a seeded schedule kills a trial's host process, the driver (then runs
it again) and the tracking server, at points chosen per seed. Every event is waited for on the driver's output,
never slept for. Afterwards the store must hold every trial once, every step once, no run left RUNNING, and the
same losses as an undisturbed run of the same grid.

    python benchmarks/chaos.py [--seeds 0 1 2] [--page]      # --page: write docs/results/chaos.md

One MLflow server (sqlite) for all runs; one JAX compilation cache, so only the undisturbed run compiles cold.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlflow import MlflowClient  # noqa: E402
from servers import start_mlflow_server  # noqa: E402

from orchestrator import provenance  # noqa: E402
from orchestrator.ui import markdown  # noqa: E402

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


class Driver:
    """`python -m orchestrator` in the background, its output read line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self.pos = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout: float = 1200) -> re.Match:
        rx, deadline = re.compile(pattern), time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.pos < len(self.lines):
                self.pos += 1
                if m := rx.search(self.lines[self.pos - 1]):
                    return m
            if self.proc.poll() is not None and self.pos == len(self.lines):
                break
            time.sleep(0.1)  # polling the reader's list, not waiting for a duration
        raise RuntimeError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-40:]))

    def finish(self, timeout: float = 1800) -> int:
        code = self.proc.wait(timeout)
        time.sleep(0.5)  # let the reader drain the pipe
        return code


def schedule(seed: int) -> dict:
    """Where in the step loop the first trial's host dies (jobs/faults.py), at which placement the driver
    dies, after which finished trial of the rerun the tracking server goes away."""
    rng = random.Random(seed)
    worker = f"{rng.randrange(STEPS)}:{rng.choice(['before_save', 'after_save', 'after_report'])}"
    return {"worker": worker, "driver": rng.randrange(4, 13), "server": rng.randrange(1, 5)}


def losses(client: MlflowClient, sweep_id: str) -> dict[str, list]:
    exp = client.get_experiment_by_name("cp_scaling")
    runs = client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial'")
    out: dict[str, list] = {}
    for r in runs:
        hist = client.get_metric_history(r.info.run_id, "loss")
        out.setdefault(r.data.tags["trial_id"], []).append(
            (r.data.tags.get("status"), r.info.status, sorted((m.step, m.value) for m in hist))
        )
    return out


def soak(seed: int, args: list[str], cwd: Path, env: dict, server) -> dict:
    at = schedule(seed)
    t0 = time.monotonic()
    (cwd / "faults").mkdir()
    env = env | {"CP_ORCH_INJECT_FAULTS": f"kill:0:{at['worker']}", "CP_ORCH_INJECT_DIR": str(cwd / "faults")}
    d = Driver(args, cwd, env)
    d.wait_for(r"preempted: retrying")  # 1. the first trial's host, at its seeded point of the step loop
    placed = sum(bool(PLACED.search(line)) for line in d.lines[: d.pos])
    while placed < at["driver"]:  # 2. the driver itself, as a trial starts
        d.wait_for(PLACED.pattern)
        placed += 1
    d.proc.send_signal(signal.SIGKILL)
    d.finish()
    d = Driver(args, cwd, env)  # the rerun resumes the sweep
    for _ in range(at["server"]):  # 3. the tracking server, until the rerun notices it is gone
        d.wait_for(r": done loss=")
    server.stop()
    d.wait_for(r"tracking store unavailable")
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
    provenance.add_page_argument(ap, "chaos")
    a = ap.parse_args(argv)
    made = provenance.current("python benchmarks/chaos.py", argv, load=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-chaos-"))
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env |= {"PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax-cache")}
    server = start_mlflow_server(tmp / "server")
    rows = []
    try:
        base = [*GRID, "tracking=server", f"tracking.uri={server.url}"]
        t0 = time.monotonic()
        ref_driver = Driver([*base, "+sweep.id=chaos-ref"], tmp, env)
        assert ref_driver.finish() == 0, "\n".join(ref_driver.lines[-40:])
        print(f"undisturbed run: {time.monotonic() - t0:.0f} s", flush=True)
        client = MlflowClient(server.url)
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
    body = markdown.table(cols, ([cell(r[c]) for c in cols] for r in rows))
    print(body)
    if a.page:
        print(f"wrote {provenance.write_page(a.page, 'Chaos soak', made, NOTE, body)}")
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
