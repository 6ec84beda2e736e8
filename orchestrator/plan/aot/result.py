"""One TPU compile's answer (compiled, rejected for lack of HBM, or failed), as the disk cache stores it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan.aot.topology import CHIPS, topology_tag

STATUSES = ("compiled", "rejected", "failed")


@dataclass(frozen=True)
class CompileResult:
    """Per-device bytes from the TPU compiler for one trial on one topology.

    Field names are the cache's JSON keys, so entries written before this type existed load unchanged.
    `peak_bytes` is memory_analysis's argument + output - alias + temp (jobs.memstats), the sum MaxText prints;
    `compiler_peak_bytes` the compiler's own high-water mark of the scheduled program.
    """

    trial_id: str = ""
    topology: str = ""  # topology_tag: the slice topology, and the slice count when more than one
    status: str = "compiled"  # compiled | rejected | failed; the oldest entries have no status: compiled
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    peak_bytes: int | None = None
    # What the compiler keeps under the chip's HBM (told the chip is smaller it packs and rematerializes
    # tighter), while temp_bytes also holds allocator slack: the sum can exceed the chip (docs/results/aot.md).
    compiler_peak_bytes: int | None = None
    # Pinned-host temporaries (remat=offload's layer inputs): not HBM, kept to tell the two memory spaces apart.
    host_temp_bytes: int | None = None
    error: str = ""  # the compiler's first line, for a rejected or failed compile
    required_bytes: int | None = None  # a rejection: what the compiler said it needed ...
    available_bytes: int | None = None  # ... of this much HBM
    required_for: str = ""  # ... for what ("HLO temporaries", "the program")
    live_bytes: int | None = None  # a rejection after trying to fit: the heap at its peak, live ...
    fragmentation_bytes: int | None = None  # ... and lost to packing
    largest_buffers: tuple[str, ...] = ()  # the compiler's largest allocations, biggest first
    compile_s: float = 0.0
    cap_mib: int | None = None  # a capped compile (aot.capped): the HBM libtpu was told the chip has
    program: str = ""  # program_version: the hash of the lowered step
    draw_bytes: tuple[int, ...] = ()  # aot_draws > 1: every draw's judged bytes, in draw order (aot.draws)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"compile status {self.status!r} is none of {', '.join(STATUSES)}")

    @property
    def compiled_bytes(self) -> int | None:
        """The sum; for a refused compile the bytes it asked for (a lower bound: it names only the part that
        overflowed); None for a failed one."""
        return self.peak_bytes if self.peak_bytes is not None else self.required_bytes

    @property
    def device_peak(self) -> int | None:
        """The compiler's own peak, when it is HBM's: with pinned-host temporaries (remat=offload) libtpu reports
        arguments + host temporaries as its peak (tpu7x_128 ring at 14M: 0.7 + 28.0 GiB), the host's figure, so
        there is none for the device (its sum stays, an upper bound)."""
        return None if self.host_temp_bytes else self.compiler_peak_bytes

    def as_dict(self) -> dict[str, Any]:
        """The JSON object the cache holds: unset fields left out, as the dicts before this type had them."""
        out = {k: v for k, v in asdict(self).items() if v is not None and v != "" and v != ()}
        for key in ("largest_buffers", "draw_bytes"):
            if key in out:
                out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileResult:
        """From a cache entry; keys of no field (written by another version) are ignored."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for key in ("largest_buffers", "draw_bytes"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> CompileResult:
        return cls.from_dict(json.loads(text))


def failed(spec: TrialSpec, topology: str | None, error: BaseException) -> CompileResult:
    """A compile that broke (neither compiled nor refused for lack of HBM): its row says why, so one broken point
    does not hide the others' answers. Never cached: the next ask tries again."""
    msg = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
    tag = topology_tag(spec, topology) if spec.cluster.accelerator in CHIPS else "-"
    return CompileResult(
        trial_id=spec.trial_id, topology=tag, status="failed", error=f"{type(error).__name__}: {msg}"
    )
