"""jax.profiler traces of the steps run.profile_steps names, as ProfileRecords (trace files and breakdown).

A window is a run of consecutive profiled steps: one trace from its first step to its last. The host loop
(jobs/train.py) finishes the step before a window first, so the trace holds only the window's own steps, and
finishes the window's last step before the trace stops. Every process keeps the same rhythm; only those that
trace (process 0, or all with run.profile_hosts=all) pay for writing and reading a trace.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

import jax

from jobs.profile import breakdown
from jobs.records import ProfileRecord
from jobs.spec import TrialSpec

PERFETTO = "perfetto_trace.json.gz"  # what create_perfetto_trace=True writes next to <host>.xplane.pb
MAX_FILE_BYTES = 256 * 2**20  # a larger trace file stays out of the record (the note says so)


class Profiler:
    """The trial's profile windows; `on`: whether this process writes traces."""

    def __init__(self, spec: TrialSpec, compiled: Any, on: bool):
        self.steps = frozenset(spec.run.profile_steps)
        self.on, self.compiled = on and bool(self.steps), compiled
        self.first: int | None = None  # the open window's first step
        self.dir = ""

    def covers(self, step: int) -> bool:
        return step in self.steps

    def opens(self, step: int) -> bool:
        """`step` starts a window (also a window entered mid-way, by an attempt resumed inside it)."""
        return step in self.steps and self.first is None

    def closes(self, step: int) -> bool:
        return step in self.steps and step + 1 not in self.steps

    def start(self, step: int) -> None:
        """Before `step` is dispatched: start the trace if `step` opens a window."""
        if not self.opens(step):
            return
        self.first = step
        if self.on:
            self.dir = tempfile.mkdtemp(prefix="cp-profile-")
            jax.profiler.start_trace(self.dir, create_perfetto_trace=True)

    def stop(self, step: int, state: Any) -> ProfileRecord | None:
        """After the window's last step finished: stop the trace and read it (None: not traced here)."""
        first, self.first = self.first, None
        if not self.on or first is None:
            return None
        jax.block_until_ready(state)  # the step's every output, not only the loss the host read
        jax.profiler.stop_trace()
        try:
            return self._record(first, step)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _record(self, first: int, last: int) -> ProfileRecord:
        files: dict[str, bytes] = {}
        notes, perfetto = [], ""
        for root, _, names in os.walk(self.dir):  # plugins/profile/<session>/{<host>.xplane.pb, ...}
            for name in names:
                path = os.path.join(root, name)
                perfetto = path if name == PERFETTO else perfetto
                if os.path.getsize(path) > MAX_FILE_BYTES:
                    notes.append(f"{name} left out: {os.path.getsize(path) / 2**20:.0f} MiB")
                    continue
                with open(path, "rb") as f:
                    files[name] = f.read()
        fields: dict[str, Any] = {}
        try:
            trace = breakdown.load(perfetto)
            b = breakdown.breakdown(trace, self.compiled.as_text(), steps=last - first + 1)
            fields = dict(
                devices=b.devices,
                step_s=b.step_s,
                seconds=b.seconds,
                limiter=b.limiter(),
                collective_exposed_s=b.collective_exposed_s,
                collective_overlapped_s=b.collective_overlapped_s,
            )
        except (ValueError, OSError, KeyError) as e:  # a trace the parser cannot read is still sent
            notes.append(f"no breakdown: {type(e).__name__}: {e}")
        return ProfileRecord(
            first_step=first,
            last_step=last,
            process=jax.process_index(),
            host=socket.gethostname(),
            files={k: ProfileRecord.encode(v) for k, v in files.items()},
            note="; ".join(notes),
            **fields,
        )
