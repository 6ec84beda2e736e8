"""Analytic vs TPU-compiled per-device memory, one Comparison row per grid point, with the compile's verdict."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.aot.cache import compiled_memory
from orchestrator.plan.aot.result import CompileResult
from orchestrator.plan.aot.topology import CHIPS, topology_tag
from orchestrator.plan.aot.verdicts import verdict


@dataclass(frozen=True)
class Comparison:
    """One point: the planner's figure, the compiler's answer, and the verdict the compile gives."""

    trial_id: str
    strategy: str
    mesh: str
    context_length: int
    remat: str
    analytic_bytes: int  # memory.total: the planner's predicted peak HBM per device
    result: CompileResult
    verdict: str  # run | infeasible | invalid
    reason: str
    # analytic / the compiler's peak (the sum where a cached compile predates the peak, the stated need where
    # it refused); None where there is no device figure (pinned-host temporaries) or no compile
    ratio: float | None

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def topology(self) -> str:
        return self.result.topology

    @property
    def compiled_bytes(self) -> int | None:
        return self.result.compiled_bytes

    @property
    def compile_s(self) -> float:
        return self.result.compile_s


def _failed(spec: TrialSpec, topology: str | None, e: Exception) -> CompileResult:
    msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:500]
    tag = topology_tag(spec, topology) if spec.cluster.accelerator in CHIPS else "-"
    return CompileResult(
        trial_id=spec.trial_id, topology=tag, status="failed", error=f"{type(e).__name__}: {msg}"
    )


def compare(specs: list[TrialSpec], topology: str | None = None) -> list[Comparison]:
    """Analytic vs compiled per-device memory, side by side, with the verdict of the compile. A refused compile
    counts its required bytes as compiled (a lower bound: the compiler names only the part that overflowed); any
    other compile error is reported on its row, not raised."""
    rows = []
    for spec in specs:
        try:
            got = compiled_memory(spec, topology)
        except Exception as e:  # noqa: BLE001 -- one broken point must not hide the others' answers
            got = _failed(spec, topology, e)
        predicted = memory.total(spec)
        # the sum only where a cached compile predates the peak; with host temporaries there is no device peak,
        # so no ratio (docs/results/aot.md, remat=offload)
        judged = got.compiled_bytes if got.compiler_peak_bytes is None else got.device_peak
        v, reason = verdict(spec, got)
        rows.append(Comparison(
            trial_id=spec.trial_id, strategy=spec.strategy.name, mesh=spec.mesh.label(),
            context_length=spec.context_length, remat=spec.train.remat, analytic_bytes=predicted, result=got,
            verdict=v, reason=reason, ratio=predicted / judged if judged else None,
        ))  # fmt: skip
    return rows
