"""One TPU compile's answer (compiled, rejected for lack of HBM, or failed) as the cache stores it, and the
verdict it gives a cluster (run, infeasible, invalid).

The compiler's refusal is read from its own words. One compile is one draw: libtpu's peak for the same lowered
step depends on the process that compiles it (docs/results/aot.md), so `aot_draws=k` compiles each point k
times and judges by the worst draw. Draw 1 is the plain compile; draw d > 1 compiles in its own fresh process
made to differ from draw 1 the way a different calling script does: a heap holding d x 13 MiB more of live
Python objects before the step is traced, and (where Ray starts the worker) its own PYTHONHASHSEED, so dict and
set layouts differ too. Each draw is cached on its own (`.draw<d>.json`), so a rerun compiles nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from jobs.spec import TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.aot.target import CHIPS, topology_tag

STATUSES = ("compiled", "rejected", "failed")


@dataclass(frozen=True)
class CompileResult:
    """Per-device bytes from the TPU compiler for one trial on one topology.

    Field names are the cache's JSON keys, so entries written before this type existed load unchanged.
    `peak_bytes` is memory_analysis's argument + output - alias + temp (jobs.hardware), the sum MaxText prints;
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
    cap_mib: int | None = None  # a capped compile (cache.fits): the HBM libtpu was told the chip has
    program: str = ""  # program_version: the hash of the lowered step
    draw_bytes: tuple[int, ...] = ()  # aot_draws > 1: every draw's judged bytes, in draw order (worst)

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


# e.g. "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. ... the total memory required for HLO
# temporaries (150.60G) exceeds available HBM (94.75G)".
_OOM = re.compile(
    r"total memory required for (?P<what>[\w ]+?) \((?P<need>[\d.]+)\s*(?P<nu>[KMGT]?)i?B?\) exceeds "
    r"available HBM \((?P<have>[\d.]+)\s*(?P<hu>[KMGT]?)i?B?\)"
)
_USED = re.compile(r"Used (?P<need>[\d.]+)(?P<nu>[KMGT]?)i?B? of (?P<have>[\d.]+)(?P<hu>[KMGT]?)i?B? hbm")
# After trying to fit, the compiler splits its heap at the peak into live bytes and allocator fragmentation:
# "HLO temp 45.86G (100.0% utilization: Unpadded (30.75G) Padded (30.75G), 33.0% fragmentation (15.11G))".
_HEAP = re.compile(
    r"HLO temp\s+[\d.]+\s*[KMGT]?i?B? \([\d.]+% utilization: Unpadded \((?P<live>[\d.]+)\s*(?P<lu>[KMGT]?)i?B?\) "
    r"Padded \([^)]*\), [\d.]+% fragmentation \((?P<frag>[\d.]+)\s*(?P<fu>[KMGT]?)i?B?\)\)"
)
_REJECTED = ("RESOURCE_EXHAUSTED", "Ran out of memory", "exceeds available HBM")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Lines of the compiler's "largest program allocations" list worth keeping (size, shape, operator, name).
_BUFFER_LINE = re.compile(r"^\s*(?:\d+\.\s*)?(Size|Shape|Operator|Allocation type|XLA label)\s*:", re.I)


def _size(m: re.Match, number: str, unit: str) -> int:
    return int(float(m[number]) * _UNITS[m[unit]])


def compiler_rejection(message: str) -> CompileResult | None:
    """The figures of a compile the TPU compiler refused for lack of HBM; None if `message` is not that."""
    if not any(m in message for m in _REJECTED):
        return None
    got: dict = {"status": "rejected", "error": message.strip().splitlines()[0][:500]}
    # Two wordings: before trying ("total memory required for HLO temporaries (X) exceeds available HBM (Y)")
    # and after ("Used X of Y hbm"); the first names what overflowed, so it wins when both are there.
    if m := _OOM.search(message) or _USED.search(message):
        got["required_bytes"], got["available_bytes"] = _size(m, "need", "nu"), _size(m, "have", "hu")
        got["required_for"] = m.groupdict().get("what") or "the program"
    if m := _HEAP.search(message):  # what the peak holds, and what packing it lost
        got["live_bytes"], got["fragmentation_bytes"] = _size(m, "live", "lu"), _size(m, "frag", "fu")
    lines = [ln.strip() for ln in message.splitlines() if _BUFFER_LINE.match(ln)]
    # the compiler lists the biggest first; a few are enough to act on
    got["largest_buffers"] = tuple(lines[:24])
    return CompileResult(**got)


_PAD: list[bytes] = []  # the padding stays alive for the compile: it only shifts where later objects land


def perturb(draw: int) -> None:
    """Before a draw's lowering, in its own process: make the heap differ from draw 1's (nothing for draw 1)."""
    if draw > 1:
        _PAD.extend(bytes(4096 + 977 * (i % 7)) for i in range(draw * 13 * 256))


def judged_bytes(got: CompileResult) -> int | None:
    """What a draw is judged by: the compiler's peak on the device, else the sum (or the bytes a refusal asked
    for), as verdicts.verdict judges one compile."""
    return got.device_peak or got.compiled_bytes


def worst(draws: list[CompileResult]) -> CompileResult:
    """The draw a point is judged by, with every draw's judged bytes in `draw_bytes` (in draw order): a refusal
    beats a fit (the compiler may refuse what it once fitted), then the largest figure; a failed draw says the
    point failed, since its figure is unknown."""
    if len(draws) == 1:
        return draws[0]
    if failed := [d for d in draws if d.status == "failed"]:
        return failed[0]
    rank = {"rejected": 1, "compiled": 0}
    pick = max(draws, key=lambda d: (rank[d.status], judged_bytes(d) or 0))
    return replace(pick, draw_bytes=tuple(judged_bytes(d) or 0 for d in draws))


def spread_note(got: CompileResult) -> str:
    """'worst of 3 draws: 50.7-54.4 GiB, spread 7.3%' for a judged result of several draws ('' for one)."""
    figures = [b for b in got.draw_bytes if b]
    if len(got.draw_bytes) < 2 or not figures:
        return ""
    lo, hi = min(figures), max(figures)
    if lo == hi:
        return f"{len(got.draw_bytes)} draws agree"
    return f"worst of {len(got.draw_bytes)} draws: {lo / 2**30:.1f}-{hi / 2**30:.1f} GiB, spread {hi / lo - 1:.1%}"


def verdict(got: CompileResult, hbm: int) -> tuple[str, str]:
    """(run | infeasible | invalid, reason) from a compile: the compiler's refusal, or its peak over the cluster's
    HBM figure, is infeasible (DESIGN: RESOURCE_EXHAUSTED is never retried).

    The compiler's own peak decides, not memory_analysis's argument + output - alias + temp: that sum holds the
    allocator's slack too and can exceed the chip's HBM for a program the compiler fits into it (v5p_128 ring at
    14,680,064 tokens, remat full: 127.1 GiB summed, 93.6 GiB peak, compiled for a 95 GiB chip). Compiles cached
    before the peak was recorded fall back to the sum, and so do compiles with pinned-host temporaries, whose
    reported peak is the host's (CompileResult.device_peak). A point compiled in several draws (aot_draws) is
    judged by its worst and says the draws' spread."""
    gib = memory.gib
    if got.status == "rejected":
        need, have = got.required_bytes, got.available_bytes
        what = got.required_for or "the program"
        figures = f"needs {gib(need)} for {what}, {gib(have)} available" if need and have else got.error
        if got.live_bytes:
            figures += (
                f" (at its peak {gib(got.live_bytes)} live, {gib(got.fragmentation_bytes)} fragmentation)"
            )
        top = "; ".join(got.largest_buffers[:4])
        spread = f"; {note}" if (note := spread_note(got)) else ""
        return "infeasible", f"TPU compiler: {figures}" + (f" (largest: {top})" if top else "") + spread
    if got.status == "failed":
        return "invalid", f"TPU compile failed: {got.error}"
    limit = int(hbm)
    own = got.device_peak
    peak = own or got.peak_bytes
    what = "compiler's peak" if own else "compiled peak"
    summed = f" (memory_analysis sum {gib(got.peak_bytes)})" if own else ""
    spread = f" ({note})" if (note := spread_note(got)) else ""
    if limit and peak > limit:
        return "infeasible", f"{what} {gib(peak)}/device > {gib(limit)} of HBM{summed}{spread}"
    return "run", f"{what} {gib(peak)}/device{summed}{spread}"
