"""The roofline: the step's work (work.py) with every FLOP at peak and every byte at its link's rate, and the MFU
bound it implies (docs/explanation/strategies.md)."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import TrialSpec
from orchestrator.plan.cluster_model import ClusterModel, model_of, peak_tflops
from orchestrator.plan.work import Rates, Work, price, step_work

__all__ = ["Roofline", "roofline"]


@dataclass(frozen=True)
class Roofline:
    tflops_per_device: float  # model FLOPs (MaxText's count; remat recompute not included)
    compute_s: float  # FLOPs at peak, remat recompute included
    attention_comm_bytes_per_layer: int  # forward, per device
    comm_s: float  # all ICI and DCN traffic of the step
    exposed_comm_s: float  # what compute does not hide (host offload included)
    step_s: float
    mfu: float
    note: str
    dcn_exposed_s: float = 0.0  # part of exposed_comm_s: slice-crossing traffic compute does not hide


def roofline(spec: TrialSpec, work: Work | None = None, model: ClusterModel | None = None) -> Roofline:
    """The bound for one trial; `work` is its step_work when the caller has it already, `model` the
    cluster's (its links; default: its conf/cluster/ file's)."""
    w = step_work(spec) if work is None else work
    peak = peak_tflops(spec)
    t = price(w, Rates(peak), spec.cluster, model or model_of(spec.cluster))
    d, step = t.dcn, t.step_s
    compute_s = t.matmul_s + t.attention_s
    if w.attention_ring_bytes and t.ring_ici_s > t.attention_s:
        note = f"ring transfer {t.ring_ici_s:.3g} s outlasts attention compute {t.attention_s:.3g} s"
    elif w.attention_ring_bytes:
        note = f"ring transfer {t.ring_ici_s:.3g} s hidden behind attention compute {t.attention_s:.3g} s"
    elif w.attention_blocking_bytes:
        note = f"{spec.strategy.name} collectives {t.collectives_s:.3g} s not overlapped"
    else:
        note = "no attention traffic"
    if d.slices > 1:
        note += f"; DCN over {d.axis} across {d.slices} slices: {d.exposed_s:.3g} s exposed"
    return Roofline(
        tflops_per_device=w.model_tflops,
        compute_s=compute_s,
        attention_comm_bytes_per_layer=w.attention_comm_bytes_per_layer,
        comm_s=t.collectives_s + t.ring_ici_s + t.fsdp_ici_s + t.tensor_s + d.attention_s + d.fsdp_s,
        exposed_comm_s=step - compute_s,
        step_s=step,
        mfu=w.model_tflops / (step * peak) if step > 0 else 0.0,
        note=note,
        dcn_exposed_s=d.exposed_s,
    )
