"""Achievable step time per device: each kind of work at the rate the chip reaches, plus what is not hidden.

The step's work is work.py's, the same the roofline (roofline.py) prices at peak; this model prices it as
measured runs spend it (constants per chip in conf/cluster/*.yaml, fitted on the published runs in
orchestrator/calibrate/ and checked table by table, each held out of its own fit):

  step = matmuls / (peak x matmul_efficiency)                         layer weights, unembedding
       + per ring hop and pass: max(tiles / (peak x e(D)) + calls x call_overhead_s, K,V exchange)
           tiles: the busiest device's live (block_q x block_kv) tiles under the causal mask, so a contiguous
           layout's imbalance and zigzag's half-size chunks come out of the schedule (jobs/strategies);
           e(D) = attention_efficiency x D / (D + attention_head_dim_half)
       + blocking collectives: K,V all-gather, the all-to-alls, over the links the torus gives the group
       + exposed FSDP gathers (behind the layers' compute), tensor all-reduces
       + exposed host offload (its offload_exposed share, and what the rest does not hide)
       + exposed DCN (mesh.dcn across slices)                          ring hops at max(ICI, DCN), hidden as above
       + layer_overhead_s per layer and pass + step_overhead_s

Remat recompute enters as extra hardware FLOPs; it is never model FLOPs, so it lowers the MFU. Every
prediction carries a band, the leave-one-table-out errors of the fit (step_band_low, step_band_high).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from jobs.spec import OWN_KERNEL, TrialSpec
from orchestrator.plan.cluster_model import ClusterModel, model_of, peak_tflops
from orchestrator.plan.memory import layer_reaches
from orchestrator.plan.work import ATTN_BWD, Dcn, Rates, Terms, Work, price, schedule_seconds, step_work

__all__ = ["SETTLED", "StepTime", "band_of", "kernel_efficiency", "layer_words", "rates", "step_time"]

# A step whose kernels and matmuls are at least this share of it is priced mostly by the rates every table pins
# (long steps): its band is step_band_*; below, fixed_band_* (held-out errors grow there: the calibration page).
SETTLED = 0.9


@dataclass(frozen=True)
class StepTime:
    """One step on one device, term by term (seconds); `step_s` is their sum."""

    tflops_per_device: float  # model FLOPs (MaxText's count)
    peak_tflops: float
    matmul_s: float
    attention_s: float
    attention_efficiency: float  # of the kernel on its tiles, at this head_dim
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
    calls_s: float = 0.0  # the attention kernel calls' fixed cost
    layers_s: float = 0.0  # the layers' fixed cost
    offload_s: float = 0.0  # host transfers at the host link's rate, hidden or not
    step_low_s: float = 0.0  # the band: where the fit's held-out errors say the real step lies
    step_high_s: float = 0.0

    @property
    def settled(self) -> float:
        """The share of the step its kernels' and matmuls' rates price: what long steps of every table pin.
        The rest (fixed costs per step, layer and call, exposed transfers and collectives) is what only a few
        tables' short steps measure, and where held-out predictions miss most (docs/results/calibration.md)."""
        return (self.matmul_s + self.attention_s) / self.step_s if self.step_s > 0 else 1.0

    @property
    def mfu_band(self) -> tuple[float, float]:
        """(low, high) MFU: the band's slow end gives the low MFU."""
        f = self.tflops_per_device / self.peak_tflops if self.peak_tflops else 0.0
        return (
            f / self.step_high_s if self.step_high_s else 0.0,
            f / self.step_low_s if self.step_low_s else 0.0,
        )


# The terms a StepTime keeps as work.price priced them: the fields it shares by name with plan.work.Terms.
AS_PRICED = tuple(f.name for f in fields(StepTime) if f.name in {t.name for t in fields(Terms)})


def kernel_efficiency(c: ClusterModel, head_dim: int, spec: TrialSpec | None = None) -> float:
    """The kernel's rate on its tiles: softmax work per score is fixed while MXU work grows with D, so
    D/(D+Dh) of the asymptote; a block's fixed work weighs more on small blocks, b/(b+half); the xla kernel on a
    platform with a kernel of its own runs at xla_attention_ratio of it. A call's fixed cost is priced apart
    (call_overhead_s)."""
    d = head_dim / (head_dim + c.attention_head_dim_half)
    if spec is not None:
        b = min(int(spec.strategy.block_q), int(spec.strategy.block_kv))
        d *= b / (b + c.attention_block_half)
        if spec.kernel == "xla" and spec.cluster.platform in OWN_KERNEL:
            d *= c.xla_attention_ratio
    return max(c.attention_efficiency * d, 1e-6)


def rates(c: ClusterModel, head_dim: int, peak: float, spec: TrialSpec | None = None) -> Rates:
    """The model's rates for a cluster (the roofline's are Rates(peak)); `spec` prices its kernel and blocks."""
    return Rates(
        peak,
        matmul_efficiency=c.matmul_efficiency,
        attention_efficiency=kernel_efficiency(c, head_dim, spec),
        attention_backward=ATTN_BWD,
        attention_replay=c.attention_recompute,
        overhead_s=float(c.step_overhead_s),
        call_s=float(c.call_overhead_s),
        layer_s=float(c.layer_overhead_s),
        latency_s=float(c.collective_latency_s),
        collective_efficiency=float(c.collective_efficiency),
        offload_exposed=float(c.offload_exposed),
    )


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
    r = rates(c, m.head_dim, peak, spec)
    t = price(w, r, spec.cluster, c)
    terms = t.parts(spec.strategy.name)
    step = sum(terms.values())
    band = band_of(c, (t.matmul_s + t.attention_s) / step if step > 0 else 1.0)
    return StepTime(
        tflops_per_device=w.model_tflops,
        peak_tflops=peak,
        attention_efficiency=r.attention_efficiency,
        hop_tokens=w.hop_tokens,
        dcn_exposed_s=t.dcn.exposed_s,
        step_s=step,
        mfu=w.model_tflops / (step * peak) if step > 0 else 0.0,
        limiter=_limiter(terms, step, r.attention_efficiency, m.head_dim, w) + _dcn_note(t.dcn),
        step_low_s=step * band[0],
        step_high_s=step * band[1],
        **{k: getattr(t, k) for k in AS_PRICED},
    )


def band_of(c: ClusterModel, settled: float) -> tuple[float, float]:
    """The (low, high) multipliers of a step whose `settled` share the well-pinned rates price."""
    if settled >= SETTLED:
        return float(c.step_band_low), float(c.step_band_high)
    return float(c.fixed_band_low), float(c.fixed_band_high)


def run_peak(spec: TrialSpec, measured: float | None) -> float | None:
    """The rate a finished trial divided its MFU by, where the plan's differs: a CPU trial's own matmul probe.
    None where the cluster has a spec-sheet peak (the plan used it already) or nothing was measured; pass it as
    step_time's `peak` to price the trial as it ran."""
    if spec.cluster.peak_tflops_per_device > 0 or not measured or measured != measured:
        return None
    return float(measured)


def _limiter(terms: dict[str, float], step: float, eff: float, head_dim: int, w: Work) -> str:
    name, secs = max(terms.items(), key=lambda kv: kv[1])
    share = f"{name} {secs / step:.0%} of the step" if step > 0 else name
    if name == "attention kernel":
        hops = w.schedule.steps if w.schedule else 1
        where = f"{hops} hops of {w.hop_tokens:,} tokens" if hops > 1 else f"{w.hop_tokens:,}-token blocks"
        share += f" (kernel at {eff:.0%} of peak on its tiles: head_dim {head_dim}, {where})"
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


def layer_words(spec: TrialSpec, w: Work, model: ClusterModel | None = None) -> str:
    """The attention of each layer type in words, where the model has more than one or a window or chunk:
    its layers, how far back they see, its seconds per step (tiles, calls, exposed transfers and blocking
    collectives, as the step-time model prices them) and the ring steps whose kernels run. A window or chunk at
    least the context length is said to be global: the job runs those layers as global ones."""
    m, L = spec.model, spec.context_length
    reaches = layer_reaches(spec)
    wide = [
        f"model.{key}={size:,} >= context length {L:,}: its {kind} layers attend globally"
        for kind, key, size in (("local", "window", m.window), ("chunked", "chunk", m.chunk))
        if kind in m.attention_pattern and size >= L
    ]
    if len(reaches) == 1 and not reaches[0][2].limited:
        return "; ".join(wide)
    c = model or model_of(spec.cluster)
    r = rates(c, m.head_dim, peak_tflops(spec), spec)
    notes = []
    for (kind, layers, reach), (_, sched, passes) in zip(reaches, w.attention_layers(), strict=True):
        kernel, calls, exposed, _, blocking = schedule_seconds(sched, w, r, spec.cluster, c)
        secs = passes * (kernel + calls + exposed + blocking)
        span = (
            f" (window {reach.window:,})"
            if reach.window
            else f" (chunk {reach.chunk:,})"
            if reach.chunk
            else ""
        )
        run = sum(h.count for h in sched.hops if h.scores)
        steps = f", kernels on {run} of {sched.steps} ring steps" if sched.steps > 1 else ""
        under = f" under {spec.strategy.for_layer(kind)}" if spec.strategy.local else ""
        notes.append(
            f"{layers} {kind} layer{'s' * (layers != 1)}{span}{under}: attention {secs:.3g} s{steps}"
        )
    return "; ".join(wide + ["layer types: " + ", ".join(notes)])
