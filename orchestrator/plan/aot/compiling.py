"""One uncached TPU compile of the train step, read into a CompileResult (with whatever libtpu flags this
process started with)."""

from __future__ import annotations

import time
from dataclasses import replace

from jobs.memstats import compiled_bytes
from jobs.spec import TrialSpec
from orchestrator.plan.aot.lowering import lowered
from orchestrator.plan.aot.rejection import compiler_rejection
from orchestrator.plan.aot.result import CompileResult
from orchestrator.plan.aot.topology import topology_tag


def compile_memory(spec: TrialSpec, topology: str | None = None) -> CompileResult:
    """compiled_memory's answer, uncached: compiles now. A refusal for lack of HBM is an answer (status
    "rejected", the compiler's figures); any other compiler error is raised."""
    t0 = time.perf_counter()
    low, program = lowered(spec, topology)
    base = {"trial_id": spec.trial_id, "topology": topology_tag(spec, topology), "program": program}
    try:
        compiled = low.compile()
    except Exception as e:  # noqa: BLE001 -- jaxlib raises its own XlaRuntimeError; only OOM is an answer
        rejected = compiler_rejection(str(e))
        if rejected is None:
            raise
        return replace(rejected, **base, compile_s=round(time.perf_counter() - t0, 2))
    ma = compiled.memory_analysis()
    return CompileResult(
        **base,
        status="compiled",
        argument_bytes=int(ma.argument_size_in_bytes),
        output_bytes=int(ma.output_size_in_bytes),
        alias_bytes=int(ma.alias_size_in_bytes),
        temp_bytes=int(ma.temp_size_in_bytes),
        peak_bytes=compiled_bytes(ma),
        compiler_peak_bytes=int(getattr(ma, "peak_memory_in_bytes", 0)) or None,
        host_temp_bytes=int(getattr(ma, "host_temp_size_in_bytes", 0)) or None,
        compile_s=round(time.perf_counter() - t0, 2),
    )
