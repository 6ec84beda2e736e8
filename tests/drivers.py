"""The driver (`python -m orchestrator`) as the suite starts it in a fresh process: its environment, the faults
injected into its trials, a run to its end (run_cli, run_cli_each) or in the background (Driver).

Plain helpers, not fixtures, so a test module and a benchmark (benchmarks/chaos.py, benchmarks/gate.py) start
the driver the same way; the in-process driver is conftest's `cli` fixture.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: conf/, docs/, and the code the processes import


# The smoke sweep cut to three strategies at 512 tokens, two fp32 steps each: the scenarios that kill or move a
# sweep's processes run this grid (add the cluster and sweep.id).
THREE_TRIALS = [
    "+sweep=smoke",
    "sweep.axes.strategy=[all_gather,ulysses,ring]",
    "sweep.axes.context_length=[512]",
    "~sweep.set",
    "train.steps=2",
    "train.dtype=float32",
    "progress=plain",
]


def driver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a driver subprocess, `extra` on top: without the suite's XLA_FLAGS and
    JAX_PLATFORMS (conftest.py sets them for in-process JAX; a driver's trial hosts get their own from the
    cluster), with the checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return env | {"PYTHONPATH": str(ROOT), **(extra or {})}


def fault_env(where: Path, spec: str) -> dict[str, str]:
    """The environment that injects `spec`'s faults into a driver's trials (jobs/faults.py: e.g.
    "kill:1:4:after_report"); each fault leaves its marker in where/faults, made here, and fires once."""
    (where / "faults").mkdir(parents=True, exist_ok=True)
    return {"CP_ORCH_INJECT_FAULTS": spec, "CP_ORCH_INJECT_DIR": str(where / "faults")}


def run_cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    """The real CLI in a subprocess, as a user runs it: where the process is the subject (a SIGKILLed or
    interrupted driver, two drivers racing, what a bad input imports); elsewhere the `cli` fixture."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=driver_env(env),
    )


# Each argv through main() in turn, its output captured apart; a traceback is output like any other.
_EACH = """
import contextlib, io, json, logging, sys, traceback
from orchestrator.__main__ import main

results = []
for args in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except BaseException:
            traceback.print_exc()
            code = 1
    logging.getLogger().handlers.clear()  # main's basicConfig binds the next run's stderr, not this one's
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def run_cli_each(
    arg_lists: list[list[str]], cwd: Path, env: dict | None = None, timeout: float = 600
) -> list[subprocess.CompletedProcess]:
    """Several CLI runs in ONE fresh interpreter (python -m orchestrator's main, one argv after another), as
    run_cli would give them: what a whole list of inputs imports, for the price of one process start."""
    res = subprocess.run(
        [sys.executable, "-c", _EACH],
        input=json.dumps(arg_lists),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=driver_env(env),
        check=True,
    )
    runs = json.loads(res.stdout.splitlines()[-1])
    return [
        subprocess.CompletedProcess(a, r["code"], r["stdout"], r["stderr"])
        for a, r in zip(arg_lists, runs, strict=True)
    ]


class Driver:
    """The CLI in the background, its output (stdout and stderr) read line by line: for waiting on an event of
    the driver's before acting on it (run_cli waits for the end)."""

    def __init__(self, args: list[str], cwd: Path, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=cwd,
            env=driver_env(env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self.pos = 0  # wait_for looks after its previous match
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout: float = 600) -> re.Match:
        """The next line that matches `pattern`; fails with the output's tail if the driver ends first."""
        rx, deadline = re.compile(pattern), time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.pos < len(self.lines):
                line = self.lines[self.pos]
                self.pos += 1
                if m := rx.search(line):
                    return m
            if self.proc.poll() is not None and self.pos == len(self.lines):
                break
            time.sleep(0.2)  # polling the reader's list, not waiting for a duration
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-60:]))

    def finish(self, timeout: float = 1800) -> int:
        """The driver's exit code, once its output is read to the end."""
        code = self.proc.wait(timeout)
        self._reader.join(5)  # to the pipe's end, unless a process the driver started holds it open
        return code
