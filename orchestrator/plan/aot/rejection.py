"""The TPU compiler's own words when a program does not fit HBM, read into a rejected CompileResult."""

from __future__ import annotations

import re

from orchestrator.plan.aot.result import CompileResult

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
