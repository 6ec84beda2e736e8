"""One step's work on one device, computed once from the spec, and the one set of rules that prices it.

The roofline (roofline.py) prices the work at peak, the step-time model (steptime.py) at the calibrated rates of
conf/cluster/*.yaml, both through `price`: each rate of the roofline is at least the model's (efficiencies are
at most 1, a replayed attention costs at least one forward, the links are the same) and the overlap rules are
the same, so each compute term with what hides behind it is at most the model's, and the roofline's MFU bounds
the prediction on every point.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs import strategies
from jobs.flops import layer_flops, train_tflops_per_device
from jobs.spec import ClusterSpec, TrialSpec, residuals
from orchestrator.plan import packing
from orchestrator.plan.hardware import ClusterModel
from orchestrator.plan.memory import BF16, FP32, layer_params, local_sizes

# The attention backward in forwards of work: model FLOPs count 2 (dQ, and dK with dV); a flash kernel forms
# the scores again, 5 matmuls of the forward's size (QK^T, dP, dS K, dS^T Q, P^T dO) against its 2, so 2.5.
# The roofline prices the model's count (a kernel that re-forms nothing), the step-time model the kernel's.
MODEL_BWD = 2.0
ATTN_BWD = 2.5


@dataclass(frozen=True)
class Work:
    """Per device per step: FLOPs by kind, and the bytes each link carries over all layers and passes."""

    model_tflops: float  # model FLOPs (MaxText's count; remat recompute not included)
    matmul_tflop: float  # layer matmuls x (3 + a replayed forward), the unembedding x 3 (never replayed)
    attention_flops: float  # one forward's causal attention of one sequence, all layers
    per_device: float  # sequences per device, in TFLOP per FLOP
    imbalance: float  # busiest device's attention over the mean
    hop_tokens: int  # keys one kernel call sees: a ring hop's block, or the whole gathered sequence
    replays_layers: bool  # any remat replays the layer forward in backward...
    replays_attention: bool  # ...attention too, unless train.remat / train.memory keep or offload its output
    passes: int  # attention's: forward, backward's two (K,V and dK,dV travel), the replayed forward
    attention_comm_bytes_per_layer: int  # forward, per device
    attention_blocking_bytes: int  # all-gather / all-to-all of K,V: not overlapped
    attention_ring_bytes: int  # ring hops: hidden behind the previous hop's attention
    fsdp_bytes: float  # bf16 gathers per layer forward, backward and replay, fp32 gradient reduce-scatters
    tensor_bytes: float  # two all-reduces of [tokens, E] per layer and attention pass
    host_bytes: int  # what the remat policy and train.memory send to host: out in forward, back in backward
    dcn_axis: str = ""  # mesh.dcn when the trial spans slices
    dcn_slices: int = 1
    dcn_blocking_bytes: int = 0  # the strategy's slice-crossing attention traffic (jobs/strategies)
    dcn_ring_bytes: int = 0
    dcn_fsdp_bytes: float = 0.0  # the FSDP gathers' and gradient reduce-scatters' DCN phase

    def attention_tflop(self, backward: float, replay: float) -> float:
        """Attention's TFLOP on the busiest device when its backward costs `backward` forwards and a replayed
        forward `replay`."""
        redo = replay if self.replays_attention else 0.0
        return (1 + backward + redo) * self.attention_flops * self.per_device * self.imbalance


def step_work(spec: TrialSpec, offload: tuple[str, ...] | None = None) -> Work:
    """The work of one trial's step; `offload` overrides what the remat policy sends to host (published runs)."""
    m, t, x = spec.model, spec.train, local_sizes(spec)
    s = strategies.get(spec.strategy.name)
    devices = max(spec.mesh.size, 1)
    weights, attn = layer_flops(m, spec.context_length)
    unembed = 2 * spec.context_length * m.embed * m.vocab
    per_dev = t.batch / devices / 1e12
    redo_layers = t.remat != "none"
    kept, names = residuals(t.remat, t.memory) if redo_layers else ((), ())
    redo_attn = redo_layers and "attn_out" not in kept + names
    names = names if offload is None else offload
    # x is one microbatch: with grad_accum every microbatch repeats the step's traffic (jobs/step.py scans the
    # whole forward and backward per microbatch, so FSDP gathers and reduce-scatters once per microbatch too)
    A = max(t.grad_accum, 1)
    N, passes, gathers = m.layers * A, 3 + redo_attn, 3 + redo_layers
    blocking, ring = s.comm_bytes(x)
    f = devices // x.T
    fsdp = N * layer_params(m) / x.T * (f - 1) / f * (gathers * BF16 + FP32) if f > 1 else 0.0
    tensor = N * passes * 4 * (x.T - 1) / x.T * x.tokens * m.embed * BF16 if x.T > 1 else 0.0
    per_token = {"layer_input": m.embed * BF16, "attn_out": x.hq * m.head_dim * BF16, "mlp_act": x.M * BF16}
    # Simulated CPU devices share the host's cores: what a light device leaves idle the busiest one gets.
    imbalance = 1.0 if spec.cluster.platform == "cpu" else s.imbalance(x, spec.strategy.layout)
    if (pk := packing.of(spec)) is not None:  # packed documents: the kernel skips the tiles their mask leaves
        attn *= pk.computed
        imbalance = 1.0 if spec.cluster.platform == "cpu" else pk.imbalance or imbalance
    axis, S = spec.mesh.dcn, spec.cluster.slices_per_trial
    dcn: dict = {"dcn_axis": axis, "dcn_slices": S}
    if S > 1 and axis:
        d_blocking, d_ring = s.dcn_bytes(x, spec.mesh.shape(), axis, S)
        shard = layer_params(m) / x.T / f if axis != "tensor" else 0.0
        dcn.update(
            dcn_blocking_bytes=N * passes * d_blocking,
            dcn_ring_bytes=N * passes * d_ring,
            dcn_fsdp_bytes=N * shard * (S - 1) * (gathers * BF16 + FP32),
        )
    return Work(
        model_tflops=train_tflops_per_device(m, spec.context_length, t.batch, devices),
        matmul_tflop=((3 + redo_layers) * (weights - unembed) + 3 * unembed) * per_dev,
        attention_flops=attn,
        per_device=per_dev,
        imbalance=imbalance,
        hop_tokens=s.hop_tokens(x),
        replays_layers=redo_layers,
        replays_attention=redo_attn,
        passes=passes,
        attention_comm_bytes_per_layer=blocking + ring,
        attention_blocking_bytes=N * passes * blocking,
        attention_ring_bytes=N * passes * ring,
        fsdp_bytes=fsdp,
        tensor_bytes=tensor,
        host_bytes=2 * N * x.tokens * sum(per_token[n] for n in names),
        **dcn,
    )


@dataclass(frozen=True)
class Rates:
    """What the work runs at; the defaults are the roofline's (every FLOP at peak, the model's FLOP count).
    Links (ICI, collective_links, host, DCN) are the cluster's, the same for both prices."""

    peak_tflops: float
    matmul_efficiency: float = 1.0
    attention_efficiency: float = 1.0  # of the kernel, at this head_dim and hop block
    attention_backward: float = MODEL_BWD  # forwards of work the attention backward costs
    attention_replay: float = 1.0  # forwards a replayed attention costs
    overhead_s: float = 0.0  # fixed per step


@dataclass(frozen=True)
class Dcn:
    """Per device per step: what crosses the data-centre network when mesh.dcn spans slices (seconds)."""

    axis: str = ""
    slices: int = 1
    bytes_per_s: float = 0.0  # per device: its host's DCN bandwidth shared by the host's devices
    attention_s: float = 0.0  # the strategy's slice-crossing attention traffic
    fsdp_s: float = 0.0  # the FSDP gathers' and gradient reduce-scatters' DCN phase
    exposed_s: float = 0.0  # what compute does not hide, beyond what the ICI terms already leave exposed


@dataclass(frozen=True)
class Terms:
    """One step priced, term by term (seconds)."""

    matmul_s: float
    attention_s: float
    ring_ici_s: float
    exposed_ring_s: float
    collectives_s: float
    fsdp_ici_s: float
    exposed_fsdp_s: float
    tensor_s: float
    exposed_offload_s: float
    dcn: Dcn
    overhead_s: float

    def parts(self, strategy: str) -> dict[str, float]:
        """The terms that add up to the step, in words (the limiter is the largest)."""
        return {
            "matmuls": self.matmul_s,
            "attention kernel": self.attention_s,
            "exposed ring transfer": self.exposed_ring_s,
            f"{strategy} collectives": self.collectives_s,
            "exposed FSDP gathers": self.exposed_fsdp_s,
            "tensor all-reduces": self.tensor_s,
            "offload bandwidth": self.exposed_offload_s,
            "exposed DCN transfer": self.dcn.exposed_s,
            "fixed per-step cost": self.overhead_s,
        }

    @property
    def step_s(self) -> float:
        return sum(self.parts("").values())


def dcn_bytes_per_s(c: ClusterSpec, m: ClusterModel) -> float:
    """One device's share of its host's DCN bandwidth: every device of a host may send across at once (a
    double ring's outer hop does), so a device gets 1/devices_per_host of the NIC."""
    return float(m.dcn_bytes_per_s) / max(c.devices_per_host, 1)


def price(w: Work, r: Rates, c: ClusterSpec, m: ClusterModel) -> Terms:
    """Seconds per term. Compute at the rates; K,V gathers and all-to-alls drive collective_links links and
    block; a ring hop hides behind the previous hop's attention, FSDP's collectives behind the previous layer's
    matmuls; tensor all-reduces sit on the critical path; host offload, on its own DMA engines, hides behind
    all of that. Each pair of compute and what hides behind it costs max(compute, transfer), so faster rates
    never make a step slower: the roofline's step is at most the model's."""
    bw = float(m.ici_bytes_per_s) or 1e11
    matmul_s = w.matmul_tflop / (r.peak_tflops * r.matmul_efficiency)
    attention_s = w.attention_tflop(r.attention_backward, r.attention_replay) / (
        r.peak_tflops * r.attention_efficiency
    )
    ring_ici_s, fsdp_ici_s = w.attention_ring_bytes / bw, w.fsdp_bytes / bw
    exposed_ring_s, exposed_fsdp_s = max(0.0, ring_ici_s - attention_s), max(0.0, fsdp_ici_s - matmul_s)
    collectives_s, tensor_s = w.attention_blocking_bytes / (bw * m.collective_links), w.tensor_bytes / bw
    dcn = _dcn(w, dcn_bytes_per_s(c, m), attention_s, ring_ici_s, matmul_s, fsdp_ici_s)
    busy = matmul_s + attention_s + exposed_ring_s + collectives_s + exposed_fsdp_s + tensor_s + dcn.exposed_s
    host = m.host_bytes_per_s
    return Terms(
        matmul_s=matmul_s,
        attention_s=attention_s,
        ring_ici_s=ring_ici_s,
        exposed_ring_s=exposed_ring_s,
        collectives_s=collectives_s,
        fsdp_ici_s=fsdp_ici_s,
        exposed_fsdp_s=exposed_fsdp_s,
        tensor_s=tensor_s,
        exposed_offload_s=max(0.0, w.host_bytes / host - busy) if host else 0.0,
        dcn=dcn,
        overhead_s=r.overhead_s,
    )


def _dcn(
    w: Work, bw: float, attention_s: float, ring_ici_s: float, matmul_s: float, fsdp_ici_s: float
) -> Dcn:
    """A ring hop that crosses takes max(ICI, DCN) and hides behind attention (all hops alike, so totals compare
    as per hop); blocking transfers add; FSDP's collectives over a multislice axis run a DCN phase (each device
    swaps its shard with its S-1 peers) before the ICI one, both behind the matmuls."""
    if w.dcn_slices <= 1 or not w.dcn_axis or bw <= 0:
        return Dcn(axis=w.dcn_axis, slices=w.dcn_slices, bytes_per_s=bw)
    blocking_s, ring_s = w.dcn_blocking_bytes / bw, w.dcn_ring_bytes / bw
    ring_exposed = max(0.0, max(ring_ici_s, ring_s) - attention_s) - max(0.0, ring_ici_s - attention_s)
    fsdp_s = w.dcn_fsdp_bytes / bw
    fsdp_exposed = max(0.0, fsdp_ici_s + fsdp_s - matmul_s) - max(0.0, fsdp_ici_s - matmul_s)
    return Dcn(
        axis=w.dcn_axis,
        slices=w.dcn_slices,
        bytes_per_s=bw,
        attention_s=blocking_s + ring_s,
        fsdp_s=fsdp_s,
        exposed_s=blocking_s + ring_exposed + fsdp_exposed,
    )
