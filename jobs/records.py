"""The records a trial emits (start, step, summary, profile) as frozen dataclasses, and the JSON-able dicts
they cross a process boundary as (a Ray batch, a line of `python -m jobs.train`, a checkpoint's step history).

Reading is lenient both ways, so drivers and jobs of different revisions interoperate: a key this code does
not know (a newer job's) is kept in `extra` and written back by `to_dict`, so nothing is lost on the way to the
trial log; a key an older record lacks reads as the field's default. A record of an unknown kind is an error
for `parse` and skipped by `parse_known`.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

NAN = float("nan")


def _optional() -> Any:
    """A field whose key is left out of the dict form while it is None (as the job leaves it out)."""
    return field(default=None, metadata={"omit_none": True})


def _flag() -> Any:
    """A bool left out of the dict form while False, so records (and checkpoints) without it read the same."""
    return field(default=False, metadata={"omit_false": True})


class _Record:
    kind: ClassVar[str]
    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The dict form, keys in the order the job has always written them, `extra` last."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            omit = (value is None and f.metadata.get("omit_none")) or (
                value is False and f.metadata.get("omit_false")
            )
            if f.name != "extra" and not omit:
                out[f.name] = value
        return out | {k: v for k, v in self.extra.items() if k not in out}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}  # type: ignore[arg-type]
        known = {k: v for k, v in d.items() if k in names}
        return cls(**known, extra={k: v for k, v in d.items() if k not in names and k != "kind"})

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class StartRecord(_Record):
    """Once per attempt, after the compile (and restore): what the attempt runs on and what it costs."""

    kind: ClassVar[str] = "start"
    trial_id: str = ""
    devices: int = 0
    processes: int = 1
    platform: str = ""
    compile_s: float = NAN
    restore_s: float = 0.0
    peak_tflops_per_device: float = NAN  # the MFU denominator
    peak_source: str = ""  # the accelerator, or cpu_measured_<dtype>
    tflops_per_device_per_step: float = NAN
    resumed_from_step: int = 0
    # the compiled step's memory_analysis (absent where the backend gives none)
    argument_bytes: int | None = _optional()
    output_bytes: int | None = _optional()
    alias_bytes: int | None = _optional()
    temp_bytes: int | None = _optional()
    compiled_bytes_per_device: int | None = _optional()
    # the compiler's peak in device memory (jobs.hardware.program_peak_bytes): what the program needs
    program_peak_bytes: int | None = _optional()
    # multislice trials only: slices spanned, and per position along the dcn axis the processes holding it
    slices: int | None = _optional()
    dcn_processes: list[list[int]] | None = _optional()
    # why the chosen attention kernel ran the xla one instead, per reason (jobs/attention/kernels/flash.py)
    kernel_fallbacks: list[str] | None = _optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord(_Record):
    """One training step, stamped with the job's own time so a copy re-sent after a resume is the same point."""

    kind: ClassVar[str] = "step"
    step: int
    t_ms: int | None = _optional()
    loss: float = NAN
    grad_norm: float = NAN
    step_time_s: float = NAN
    tokens_per_s: float = NAN
    tflops_per_s_per_device: float = NAN
    mfu: float = NAN
    # The runtime allocator's counters (device.memory_stats()), most over the host's devices: a high-water mark
    # over the process's life that on TPU does not see the program's temporaries (the start record's
    # program_peak_bytes is what the step needs). None on CPU and on every process but 0.
    runtime_peak_bytes: int | None = None
    runtime_bytes_in_use: int | None = _optional()  # after the step
    # mean loss per position bucket (jobs.spec.bucket_labels -> loss), buckets with a counted token only
    loss_by_position: dict[str, float] | None = _optional()
    # the recall task: the fraction of queries answered right (argmax) per bucket of distance to their key
    accuracy_by_distance: dict[str, float] | None = _optional()
    profiled: bool = _flag()  # traced by run.profile_steps: its time carries the trace, not in the median
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SummaryRecord(_Record):
    """The end of a trial: medians over the attempt's timed steps and which steps those are."""

    kind: ClassVar[str] = "summary"
    steps: int = 0
    final_loss: float = NAN
    steps_run: int | None = _optional()
    attempt_from_step: int | None = _optional()
    timed_from_step: int | None = _optional()
    timed_to_step: int | None = _optional()
    step_time_median_s: float = NAN
    tokens_per_s: float = NAN
    tflops_per_s_per_device: float = NAN
    mfu: float = NAN
    runtime_peak_bytes: int | None = None
    argument_bytes: int | None = _optional()
    output_bytes: int | None = _optional()
    alias_bytes: int | None = _optional()
    temp_bytes: int | None = _optional()
    compiled_bytes_per_device: int | None = _optional()
    program_peak_bytes: int | None = _optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileRecord(_Record):
    """A jax.profiler trace of steps first_step..last_step on one process (run.profile_steps), and where their
    time went (jobs/profile/breakdown.py). Never part of a checkpoint's history: a resumed trial re-traces."""

    kind: ClassVar[str] = "profile"
    first_step: int = 0
    last_step: int = 0
    process: int = 0
    host: str = ""
    # path inside the trace's session directory -> the file's bytes, gzipped, as base64 (the wire is JSON)
    files: dict[str, str] = field(default_factory=dict)
    devices: int = 0  # devices the trace has ops of
    step_s: float = NAN  # traced wall time per step, first op to last
    seconds: dict[str, float] = field(default_factory=dict)  # per category, per step; adds up to step_s
    collective_exposed_s: float = NAN  # collective time with no compute beside it
    collective_overlapped_s: float = NAN
    limiter: str = ""
    note: str = ""  # what could not be read or sent
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def encode(data: bytes) -> str:
        """A file's bytes as `files` carries them."""
        return base64.b64encode(gzip.compress(data, compresslevel=6)).decode()

    def file_bytes(self) -> dict[str, bytes]:
        return {name: gzip.decompress(base64.b64decode(text)) for name, text in self.files.items()}


Record = StartRecord | StepRecord | SummaryRecord | ProfileRecord
KINDS: dict[str, type[Record]] = {c.kind: c for c in (StartRecord, StepRecord, SummaryRecord, ProfileRecord)}


def parse(d: Mapping[str, Any]) -> Record:
    """A record from its dict form, by its `kind`."""
    kind = d.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind].from_dict(d)


def as_record(r: Record | Mapping[str, Any]) -> Record:
    """A record as is, or parsed from its dict form."""
    return r if isinstance(r, _Record) else parse(r)  # type: ignore[return-value]


def parse_known(ds: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """The records of the kinds this code knows, in order; a newer job's other kinds are skipped."""
    return [as_record(d) for d in ds if isinstance(d, _Record) or d.get("kind") in KINDS]
