"""Achievable step time per device: each kind of work at the rate the chip reaches, plus what is not hidden.

The step's work is work.py's, the same the roofline (roofline.py) prices at peak; this model prices it as
measured runs spend it (constants per chip in conf/cluster/*.yaml, fitted on the published runs in
orchestrator/calibrate/published_tpu.py):

  step = matmuls / (peak x matmul_efficiency)                         layer weights, unembedding
       + attention x imbalance / (peak x attention kernel efficiency)  efficiency(D, b) = e x D/(D+Dh) x b/(b+bh)
       + exposed communication                                         as the roofline: what compute does not hide
       + exposed host offload                                          layer inputs / attention outputs over PCIe
       + exposed DCN (mesh.dcn across slices)                          ring hops at max(ICI, DCN), hidden as above
       + step_overhead_s                                               dispatch, optimizer, host loop

Remat recompute enters as extra hardware FLOPs; it is never model FLOPs, so it lowers the MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import TrialSpec
from orchestrator.plan.hardware import ClusterModel, model_of, peak_tflops
from orchestrator.plan.work import ATTN_BWD, Dcn, Rates, Work, price, step_work

__all__ = ["StepTime", "kernel_efficiency", "step_time"]


@dataclass(frozen=True)
class StepTime:
    """One step on one device, term by term (seconds); `step_s` is their sum."""

    tflops_per_device: float  # model FLOPs (MaxText's count)
    peak_tflops: float
    matmul_s: float
    attention_s: float
    attention_efficiency: float  # of the kernel, at this head_dim and hop block
    hop_tokens: int  # tokens per device per hop (per kernel call where nothing rotates)
    exposed_ring_s: float
    collectives_s: float  # all-to-all / all-gather of K,V: not overlapped
    exposed_fsdp_s: float
    tensor_s: float
    exposed_offload_s: float
    dcn_exposed_s: float  # slice-crossing traffic (mesh.dcn) that compute does not hide
    overhead_s: float
    step_s: float
    mfu: float
    limiter: str  # what the step spends most of its time on, in words


def kernel_efficiency(c: ClusterModel, head_dim: int, block: int) -> float:
    """Softmax work per score is fixed while MXU work grows with D (so D/(D+Dh)); a hop's fixed cost
    (launch, pipeline fill, merge) is spread over its block (so b/(b+bh))."""
    d = head_dim / (head_dim + c.attention_head_dim_half)
    b = block / (block + c.attention_block_half)
    return max(c.attention_efficiency * d * b, 1e-6)


def step_time(
    spec: TrialSpec,
    offload: tuple[str, ...] | None = None,
    peak: float | None = None,
    work: Work | None = None,
    model: ClusterModel | None = None,
) -> StepTime:
    """The model for one trial; `offload` overrides what the remat policy sends to host (published runs),
    `peak` the chip's rate (a CPU trial's own measurement, after the fact), `work` its step_work when the
    caller has it already, `model` the cluster's (default: its conf/cluster/ file's)."""
    m, c = spec.model, model or model_of(spec.cluster)
    w = step_work(spec, offload) if work is None else work
    peak = peak or peak_tflops(spec)
    eff = kernel_efficiency(c, m.head_dim, w.hop_tokens)
    rates = Rates(
        peak,
        matmul_efficiency=c.matmul_efficiency,
        attention_efficiency=eff,
        attention_backward=ATTN_BWD,
        attention_replay=c.attention_recompute,
        overhead_s=float(c.step_overhead_s),
    )
    t = price(w, rates, spec.cluster, c)
    terms = t.parts(spec.strategy.name)
    step = sum(terms.values())
    return StepTime(
        tflops_per_device=w.model_tflops,
        peak_tflops=peak,
        matmul_s=t.matmul_s,
        attention_s=t.attention_s,
        attention_efficiency=eff,
        hop_tokens=w.hop_tokens,
        exposed_ring_s=t.exposed_ring_s,
        collectives_s=t.collectives_s,
        exposed_fsdp_s=t.exposed_fsdp_s,
        tensor_s=t.tensor_s,
        exposed_offload_s=t.exposed_offload_s,
        dcn_exposed_s=t.dcn.exposed_s,
        overhead_s=t.overhead_s,
        step_s=step,
        mfu=w.model_tflops / (step * peak) if step > 0 else 0.0,
        limiter=_limiter(terms, step, eff, m.head_dim, w.hop_tokens) + _dcn_note(t.dcn),
    )


def run_peak(spec: TrialSpec, measured: float | None) -> float | None:
    """The rate a finished trial divided its MFU by, where the plan's differs: a CPU trial's own matmul probe.
    None where the cluster has a spec-sheet peak (the plan used it already) or nothing was measured; pass it as
    step_time's `peak` to price the trial as it ran."""
    if spec.cluster.peak_tflops_per_device > 0 or not measured or measured != measured:
        return None
    return float(measured)


def _limiter(terms: dict[str, float], step: float, eff: float, head_dim: int, hop: int) -> str:
    name, secs = max(terms.items(), key=lambda kv: kv[1])
    share = f"{name} {secs / step:.0%} of the step" if step > 0 else name
    if name == "attention kernel":
        share += f" (kernel at {eff:.0%} of peak: head_dim {head_dim}, {hop:,}-token blocks)"
    return share


def _dcn_note(d: Dcn) -> str:
    """Across slices, the DCN's share said next to the limiter, hidden or not."""
    if d.slices <= 1:
        return ""
    if d.bytes_per_s <= 0:
        return f"; DCN across {d.slices} slices not modelled (cluster.dcn_bytes_per_s = 0)"
    return (
        f"; DCN over {d.axis} across {d.slices} slices: {d.exposed_s:.3g} s exposed of "
        f"{d.attention_s + d.fsdp_s:.3g} s of transfers"
    )
