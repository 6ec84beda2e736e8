"""A compile's verdict for a cluster: run, infeasible (the compiler refused, or its peak is over HBM) or invalid."""

from __future__ import annotations

from jobs.spec import TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.aot import draws
from orchestrator.plan.aot.result import CompileResult


def verdict(spec: TrialSpec, got: CompileResult) -> tuple[str, str]:
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
        spread = f"; {note}" if (note := draws.spread_note(got)) else ""
        return "infeasible", f"TPU compiler: {figures}" + (f" (largest: {top})" if top else "") + spread
    if got.status == "failed":
        return "invalid", f"TPU compile failed: {got.error}"
    limit = int(spec.cluster.hbm_bytes_per_device)
    own = got.device_peak
    peak = own or got.peak_bytes
    what = "compiler's peak" if own else "compiled peak"
    summed = f" (memory_analysis sum {gib(got.peak_bytes)})" if own else ""
    spread = f" ({note})" if (note := draws.spread_note(got)) else ""
    if limit and peak > limit:
        return "infeasible", f"{what} {gib(peak)}/device > {gib(limit)} of HBM{summed}{spread}"
    return "run", f"{what} {gib(peak)}/device{summed}{spread}"
