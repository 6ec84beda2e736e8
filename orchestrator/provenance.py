"""Where figures came from: the command, the day, the code revision (commit, uncommitted changes) and the machine.

A sweep's runs are tagged with its code revision; the calibration refit (orchestrator.calibrate) and the results
pages the benchmarks write (benchmarks/page.py) state the whole provenance of their figures.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator import REPO


@dataclass(frozen=True)
class Provenance:
    """Who made the figures: the exact command, the day, the commit (short hash, "+ uncommitted changes")."""

    command: str
    date: str
    commit: str
    machine: str = ""


def command(prog: str, argv: list[str]) -> str:
    """The command line as a reader would type it: `prog` (e.g. "python benchmarks/plan_table.py") + argv."""
    return " ".join([prog, *(shlex.quote(a) for a in argv)])


def git_commit(root: Path = REPO) -> str:
    """Short hash of HEAD, with " + uncommitted changes" when tracked or untracked files differ from it (the
    results pages themselves do not count: writing one page must not mark the next as uncommitted)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--", ".", ":(exclude)docs/results").strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def code_revision(root: Path = REPO) -> str:
    """Short hash of HEAD for a sweep's code_revision tag, "unknown" outside a git checkout (no dirty marker:
    a sweep runs whatever the checkout holds)."""
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=root)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine(load: bool = False) -> str:
    """The host the figures came from: the cores this process may use (nproc), OS and Python; with `load`, the
    1-minute load average at the start (timings on a shared host move with it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = f"{cores} cores ({platform.system()} {platform.machine()}), Python {platform.python_version()}"
    if load and hasattr(os, "getloadavg"):
        text += f", load average {os.getloadavg()[0]:.2f} at the start"
    return text


def current(prog: str, argv: list[str], load: bool = False) -> Provenance:
    """Provenance of figures made now, by this process (`load`: say how busy the host was; for timings)."""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return Provenance(command(prog, argv), today, git_commit(), machine(load))
