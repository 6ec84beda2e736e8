"""Test-only fault injection at named points of the step loop, set through the environment (never the trial id).

CP_ORCH_INJECT_SLEEP_S=2                   sleep inside every timed step (the regression gate must notice)
CP_ORCH_INJECT_FAULTS=kill:0:5:after_save  SIGKILL process 0 at step 5 right after the checkpoint save,
                      hold:0:8:after_report  or stop there (until killed) so a test can kill the driver
CP_ORCH_INJECT_DIR=/some/dir               each fault fires once: it leaves a marker file here first, which
                                           is also the event a test waits for; the retry runs through it
Points: before_save, after_save (saved, record not yet reported), after_report (record handed on).
Several faults are separated by commas.
"""

from __future__ import annotations

import os
import signal
import time

ENV = ("CP_ORCH_INJECT_SLEEP_S", "CP_ORCH_INJECT_FAULTS", "CP_ORCH_INJECT_DIR")  # the driver hands them on
POINTS = ("before_save", "after_save", "after_report")
ACTIONS = ("kill", "hold")
HOLD_S = 600  # a held process gives up eventually, should nobody kill it


def _faults() -> dict[tuple[int, int, str], str]:
    """(process, step, point) -> action, from CP_ORCH_INJECT_FAULTS."""
    out = {}
    for item in filter(None, (s.strip() for s in os.environ.get("CP_ORCH_INJECT_FAULTS", "").split(","))):
        action, proc, step, point = item.split(":")
        if action not in ACTIONS or point not in POINTS:
            raise ValueError(
                f"CP_ORCH_INJECT_FAULTS: bad fault {item!r}; ACTION:PROCESS:STEP:POINT with action in "
                f"{ACTIONS} and point in {POINTS}"
            )
        out[(int(proc), int(step), point)] = action
    return out


class Faults:
    """The faults asked for this process; `at(...)` is a no-op unless one matches."""

    def __init__(self, process_index: int):
        self.process_index = process_index
        self.sleep_s = float(os.environ.get("CP_ORCH_INJECT_SLEEP_S") or 0)
        self.faults = _faults()
        self.marker_dir = os.environ.get("CP_ORCH_INJECT_DIR", "")
        if self.faults and not self.marker_dir:
            raise ValueError(
                "CP_ORCH_INJECT_FAULTS needs CP_ORCH_INJECT_DIR (where each fault marks itself done)"
            )

    def slow_step(self) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # inside the timed step, so the regression gate sees it

    def at(self, step: int, point: str) -> None:
        action = self.faults.get((self.process_index, step, point))
        if action is None:
            return
        marker = os.path.join(self.marker_dir, f"{action}-{self.process_index}-{step}-{point}")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # fires once across attempts
        except FileExistsError:
            return
        os.close(fd)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # a preemption: no cleanup, no goodbye
        time.sleep(HOLD_S)
