"""The TPU family: its published runs (orchestrator/calibrate/published_tpu.py) as measured steps, the constants a
fit moves for v5p and tpu7x, and the check of the model against every table with that table held out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.calibrate.fit import Knob, Measured
from orchestrator.calibrate.published_tpu import ROWS, Published
from orchestrator.plan import cluster_model
from orchestrator.plan.cluster_model import ClusterModel
from orchestrator.plan.steptime import step_time

CHIPS = ("v5p_128", "tpu7x_128")
# Each chip's own matmul rate and per-step cost; the rest one value for the family: both chips run the same
# splash kernels (its rate a multiple of the chip's matmul rate), the same XLA collectives and the same MaxText
# step, and one chip's tables alone (tpu7x's: one strategy, one remat policy) could not pin them.
KNOBS = (
    Knob("matmul_efficiency", 0.3, 1.0, per_chip=True),
    Knob("attention_efficiency", 0.3, 2.0, relative_to="matmul_efficiency", ceiling=1.0),
    Knob("step_overhead_s", 0.0, 1.0, per_chip=True),
    Knob("attention_head_dim_half", 0.0, 512.0),
    Knob("attention_recompute", 1.0, 4.0),
    Knob("call_overhead_s", 0.0, 1e-3),
    Knob("layer_overhead_s", 0.0, 0.05),
    Knob("collective_efficiency", 0.1, 1.0),
    Knob("collective_latency_s", 0.0, 2e-4),
    Knob("offload_exposed", 0.0, 1.0),
)


def choice(r: Published) -> str:
    """What a table compares at a point: the strategy, with USP's ring x Ulysses split."""
    if r.strategy == "usp":
        return f"usp{r.mesh.context}x{r.mesh.context_ulysses}"
    return r.strategy


def as_measured(r, point: str) -> Measured:
    """One published row (a TPU's, or published_gpu's) as a measured step: an MFU becomes model FLOPs over
    MFU x peak. `point`: the row in words."""
    t = step_time(r.spec, offload=r.offload)
    return Measured(
        label=r.label,
        table=r.table,
        chip=r.cluster,
        spec=r.spec,
        step_s=r.published_step(t.tflops_per_device, t.peak_tflops),
        offload=r.offload,
        point=point,
        choice=choice(r),
        excluded=r.excluded,
    )


def measured(rows: Sequence[Published] = ROWS) -> list[Measured]:
    """Each published row as a measured step."""
    return [
        as_measured(
            r, f"{r.model} {r.length // 1024:,}K on {r.chips_devices} {r.cluster} devices, batch {r.batch}"
        )
        for r in rows
    ]


def base() -> dict[str, ClusterModel]:
    """Each chip's model as conf/cluster/ holds it: where every fit starts, what it keeps fixed."""
    return {c: cluster_model.load(c)[1] for c in CHIPS}


@dataclass(frozen=True)
class Check:
    """A published row against the model with the constants conf/cluster/ holds: MFU, predicted and published."""

    row: Published
    predicted: float
    published: float
    limiter: str

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def check(row: Published, model: ClusterModel | None = None) -> Check:
    st = step_time(row.spec, offload=row.offload, model=model)
    return Check(row, st.mfu, row.published_mfu(st.tflops_per_device, st.peak_tflops), st.limiter)
