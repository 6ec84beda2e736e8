"""The GPU family: its published runs (orchestrator/calibrate/published_gpu.py) as measured steps, the constants a
fit moves for H100 and B200, and what each GPU takes from elsewhere.

H100's rows pin the layer matmuls (MaxText's BF16 4K step, a rate both GPUs share) and its attention kernel
(NeMo's long rows); B200's rows pin its own kernel. No GPU row varies head_dim, hop length or attention replay, and none has a short
step with many ring hops: those constants are the TPU family's fit (borrowed, `BORROWED`). H200 has no
published row: its constants are H100's (the same GH100 compute; its larger, faster HBM changes only what fits).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.calibrate.fit import Knob, Measured
from orchestrator.calibrate.published_gpu import ROWS, GpuPublished
from orchestrator.calibrate.tpu import as_measured
from orchestrator.plan import cluster_model
from orchestrator.plan.cluster_model import ClusterModel

CHIPS = ("dgx_h100", "dgx_b200")
COPY = {"dgx_h200": "dgx_h100"}  # a GPU without rows: whose constants it takes
# The matmuls' share of peak is the family's (cuBLAS GEMMs on H100 and B200 alike; only H100 has a row that
# pins it); each GPU's own attention kernel rate (cuDNN flash on each).
KNOBS = (
    Knob("matmul_efficiency", 0.3, 1.0),
    Knob("attention_efficiency", 0.2, 1.0, per_chip=True),
)
# From the TPU family's fit (v5p's values), never moved by a GPU fit.
BORROWED = (
    "attention_head_dim_half",
    "attention_recompute",
    "call_overhead_s",
    "layer_overhead_s",
    "collective_latency_s",
)
TPU = "v5p_128"


def measured(rows: Sequence[GpuPublished] = ROWS) -> list[Measured]:
    """Each published GPU row as a measured step."""
    return [
        as_measured(r, f"{r.model} {r.length // 1024:,}K on {r.chips_devices} {r.cluster} GPUs") for r in rows
    ]


def base() -> dict[str, ClusterModel]:
    return {c: cluster_model.load(c)[1] for c in CHIPS}


def borrowed() -> dict[str, dict[str, float]]:
    """The TPU-fitted constants every GPU keeps (the v5p config's values)."""
    tpu = cluster_model.load(TPU)[1]
    return {c: {k: float(getattr(tpu, k)) for k in BORROWED} for c in CHIPS}
