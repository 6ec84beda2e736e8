"""Optional ground truth: compile the real train step for the cluster's TPU topology and read its memory.

libtpu compiles for a virtual TPU slice on a CPU host. jax and ray are imported only inside functions: the
control plane stays importable without them. Results are cached by trial id, topology and program (a hash of
the lowered step), because a large compile takes minutes. The parts: target (the virtual slice, the lowered
step, the host memory a compile needs), result (a compile's answer, the compiler's refusal, draws, verdicts),
cache (one compile, its cache in a directory or gs://, the HBM-capped compile), pool (many compiles at once as
Ray tasks); this module compares analytic with compiled memory, one Comparison row per grid point. The tables
are drawn by orchestrator.plan.render.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobs.spec import TrialSpec
from orchestrator.plan import memory
from orchestrator.plan.aot import cache, pool
from orchestrator.plan.aot.cache import (
    cache_dir,
    cache_path,
    cached_any,
    cached_caps,
    compile_memory,
    compiled_memory,
    using,
)
from orchestrator.plan.aot.result import CompileResult, compiler_rejection, failed, verdict
from orchestrator.plan.aot.target import (
    CHIPS,
    available,
    clear_lowered,
    compile_host_bytes,
    devices,
    lowered,
    program_version,
    topology_name,
    topology_tag,
)
from orchestrator.plan.cluster_model import model_of

__all__ = [
    "CHIPS",
    "CompileResult",
    "Comparison",
    "available",
    "cache_dir",
    "cache_path",
    "cached_any",
    "cache",
    "cached_caps",
    "clear_lowered",
    "compare",
    "compile_host_bytes",
    "compile_memory",
    "compiled_memory",
    "compiler_rejection",
    "devices",
    "lowered",
    "program_version",
    "topology_name",
    "topology_tag",
    "verdict",
]


if TYPE_CHECKING:
    from rich.console import Console


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


def compare(
    specs: list[TrialSpec],
    topology: str | None = None,
    *,
    workers: int | None = None,
    cache: str = "",
    progress: str = "auto",
    console: Console | None = None,
    draws: int = 1,
    hbm: list[int] | None = None,
) -> list[Comparison]:
    """Analytic vs compiled per-device memory, side by side, with the verdict of the compile. A refused compile
    counts its required bytes as compiled (a lower bound: the compiler names only the part that overflowed); any
    other compile error is reported on its row, not raised.

    workers=None compiles here, one point after another; a number compiles on a Ray pool, that many at once
    (0: one per CPU of the Ray cluster; aot.pool), with a progress bar (`progress`: auto | rich | plain).
    `cache`: the compile cache, a directory or gs://bucket/prefix ("": $CP_AOT_CACHE, else .cache/aot).
    `draws` k > 1: each point compiled k times and judged by its worst draw (result.worst), always on the pool:
    a draw needs a process of its own. `hbm`: each point's HBM per device to judge by (default: its
    cluster's, conf/cluster/)."""
    if draws > 1 and workers is None:
        workers = 0
    if workers is None:
        with using(cache):
            results = [_compiled(spec, topology) for spec in specs]
    else:
        got = pool.compile_all(
            specs,
            topology,
            workers=workers,
            cache_at=cache,
            progress=progress,
            console=console,
            draws_per_point=draws,
        )
        results = [result for result, _ in got]
    limits = hbm or [model_of(s.cluster).hbm_bytes_per_device for s in specs]
    return [_row(s, got, limit) for s, got, limit in zip(specs, results, limits, strict=True)]


def _compiled(spec: TrialSpec, topology: str | None) -> CompileResult:
    try:
        return compiled_memory(spec, topology)
    except Exception as e:  # noqa: BLE001 -- one broken point must not hide the others' answers
        return failed(spec, topology, e)


def _row(spec: TrialSpec, got: CompileResult, hbm: int) -> Comparison:
    predicted = memory.total(spec)
    # the sum only where a cached compile predates the peak; with host temporaries there is no device peak,
    # so no ratio (docs/results/aot.md, remat=offload)
    judged = got.compiled_bytes if got.compiler_peak_bytes is None else got.device_peak
    v, reason = verdict(got, hbm)
    return Comparison(
        trial_id=spec.trial_id,
        strategy=spec.strategy.name,
        mesh=spec.mesh.label(),
        context_length=spec.context_length,
        remat=spec.train.remat,
        analytic_bytes=predicted,
        result=got,
        verdict=v,
        reason=reason,
        ratio=predicted / judged if judged else None,
    )
