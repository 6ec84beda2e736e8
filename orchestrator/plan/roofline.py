"""Step time from compute at peak and ICI traffic per layer (docs/explanation/strategies.md), and the MFU it implies."""

from __future__ import annotations

from dataclasses import dataclass

from jobs import strategies
from jobs.flops import layer_flops, train_tflops_per_device
from jobs.spec import ClusterSpec, TrialSpec
from orchestrator.plan.memory import BF16, FP32, Local, layer_params, local_sizes

# cluster=local has no spec sheet (peak 0 = measured at run time). The planner measures the host the same way,
# once per process (steptime.measured_cpu_tflops); this nominal figure (a bf16 matmul on this 2-core host:
# ~0.06-0.09 TFLOP/s in all, ~0.01 per simulated device of 8) stands in where no probe can run.
NOMINAL_CPU_TFLOPS = 0.01
# Training traffic per forward pass's worth: forward once, backward twice (dK, dV travel or are reduced)...
TRAIN_PASSES = 3
# ...and once more when full remat recomputes the forward (collectives included).
RECOMPUTE = {"full": 1, "offload": 1, "save_attn": 0, "none": 0}  # offload replays the layer like full


@dataclass(frozen=True)
class Roofline:
    tflops_per_device: float  # model FLOPs (MaxText's count; remat recompute not included)
    compute_s: float  # hardware FLOPs at peak, recompute included
    attention_comm_bytes_per_layer: int  # forward, per device
    comm_s: float  # all ICI traffic of the step
    exposed_comm_s: float  # what compute does not hide
    step_s: float
    mfu: float
    note: str
    dcn_exposed_s: float = 0.0  # part of exposed_comm_s: slice-crossing traffic compute does not hide


def peak_tflops(spec: TrialSpec) -> float:
    c = spec.cluster
    peak = float(c.peak_tflops_per_device)
    if peak > 0:
        return peak
    from orchestrator.plan.steptime import measured_cpu_tflops  # imports this module

    return measured_cpu_tflops(c.devices_per_host, spec.train.dtype)


def attention_comm_bytes(spec: TrialSpec, x: Local | None = None) -> tuple[int, int]:
    """Forward bytes one device sends per layer: (not overlappable, overlappable by the ring)."""
    return strategies.get(spec.strategy.name).comm_bytes(x or local_sizes(spec))


@dataclass(frozen=True)
class Dcn:
    """Per device per step: what crosses the data-centre network when mesh.dcn spans slices (seconds)."""

    axis: str = ""
    slices: int = 1
    bytes_per_s: float = 0.0  # per device: its host's DCN bandwidth shared by the host's devices
    attention_s: float = 0.0  # the strategy's slice-crossing attention traffic (jobs/strategies: dcn_bytes)
    fsdp_s: float = 0.0  # the FSDP gathers' and gradient reduce-scatters' DCN phase
    exposed_s: float = 0.0  # what compute does not hide, beyond what the ICI terms already leave exposed


def dcn_bytes_per_s(c: ClusterSpec) -> float:
    """One device's share of its host's DCN bandwidth: every device of a host may send across at once (a
    double ring's outer hop does), so a device gets 1/devices_per_host of the NIC."""
    return float(c.dcn_bytes_per_s) / max(c.devices_per_host, 1)


def dcn(
    spec: TrialSpec, x: Local, *, passes: int, attention_s: float, ring_ici_s: float, matmul_s: float,
    fsdp_ici_s: float, fsdp_gathers: int,
) -> Dcn:  # fmt: skip
    """The DCN terms of one step. A ring hop that crosses takes max(ICI, DCN) and hides behind attention (all
    hops alike, so totals compare as per hop); blocking transfers (a gather) add; FSDP's collectives over a
    multislice axis run a DCN phase (each device swaps its shard with its S-1 peers) before the ICI one, both
    behind the matmuls. Memory is per device and does not change with slices."""
    c, axis, S = spec.cluster, spec.mesh.dcn, spec.cluster.slices_per_trial
    bw = dcn_bytes_per_s(c)
    if S <= 1 or not axis or bw <= 0:
        return Dcn(axis=axis, slices=S, bytes_per_s=bw)
    m, N = spec.model, spec.model.layers
    blocking, ring = strategies.get(spec.strategy.name).dcn_bytes(x, spec.mesh.shape(), axis, S)
    blocking_s, ring_s = N * passes * blocking / bw, N * passes * ring / bw
    ring_exposed = max(0.0, max(ring_ici_s, ring_s) - attention_s) - max(0.0, ring_ici_s - attention_s)
    f = spec.mesh.size // x.T
    shard = layer_params(m) / x.T / f if axis != "tensor" else 0.0
    fsdp_s = N * shard * (S - 1) * (fsdp_gathers * BF16 + FP32) / bw
    fsdp_exposed = max(0.0, fsdp_ici_s + fsdp_s - matmul_s) - max(0.0, fsdp_ici_s - matmul_s)
    return Dcn(
        axis=axis, slices=S, bytes_per_s=bw, attention_s=blocking_s + ring_s, fsdp_s=fsdp_s,
        exposed_s=blocking_s + ring_exposed + fsdp_exposed,
    )  # fmt: skip


def roofline(spec: TrialSpec) -> Roofline:
    m, t, c, x = spec.model, spec.train, spec.cluster, local_sizes(spec)
    peak, bw = peak_tflops(spec), float(c.ici_bytes_per_s) or 1e11
    devices = spec.mesh.size
    model_tf = train_tflops_per_device(m, spec.context_length, t.batch, devices)
    weights, attn = layer_flops(m, spec.context_length)
    per_dev = t.batch / devices / 1e12
    # Hardware FLOPs: full remat replays the whole forward, save_attn all but the attention.
    redo = {"full": (1, 1), "offload": (1, 1), "save_attn": (1, 0)}.get(t.remat, (0, 0))
    weights_s = (3 + redo[0]) * weights * per_dev / peak
    attn_s = (3 + redo[1]) * attn * per_dev / peak
    passes = TRAIN_PASSES + RECOMPUTE.get(t.remat, 0)
    blocking, ring = attention_comm_bytes(spec, x)
    N = m.layers
    attn_blocking_s = N * passes * blocking / bw
    # The ring hides a hop's transfer behind the previous hop's attention: exposed only where a hop's
    # transfer outlasts its compute (small blocks, few heads or a slow link).
    attn_ring_s = N * passes * ring / bw
    ring_exposed = max(0.0, attn_ring_s - attn_s)
    # FSDP: gather each layer (bf16) per pass over the non-tensor devices, reduce-scatter fp32 grads;
    # XLA overlaps this with the previous layer's matmuls.
    f = devices // x.T
    fsdp_bytes = N * layer_params(m) / x.T * (f - 1) / f * (passes * BF16 + FP32) if f > 1 else 0.0
    fsdp_s = fsdp_bytes / bw
    fsdp_exposed = max(0.0, fsdp_s - weights_s)
    # Tensor parallelism: two all-reduces of [tokens, E] per layer and pass, on the critical path.
    tp_s = N * passes * 2 * 2 * (x.T - 1) / x.T * x.tokens * m.embed * BF16 / bw if x.T > 1 else 0.0
    compute_s = weights_s + attn_s
    d = dcn(spec, x, passes=passes, attention_s=attn_s, ring_ici_s=attn_ring_s, matmul_s=weights_s,
            fsdp_ici_s=fsdp_s, fsdp_gathers=passes)  # fmt: skip
    exposed = attn_blocking_s + ring_exposed + fsdp_exposed + tp_s + d.exposed_s
    step = compute_s + exposed
    if ring and attn_ring_s > attn_s:
        note = f"ring transfer {attn_ring_s:.3g} s outlasts attention compute {attn_s:.3g} s"
    elif ring:
        note = f"ring transfer {attn_ring_s:.3g} s hidden behind attention compute {attn_s:.3g} s"
    elif blocking:
        note = f"{spec.strategy.name} collectives {attn_blocking_s:.3g} s not overlapped"
    else:
        note = "no attention traffic"
    if d.slices > 1:
        note += f"; DCN over {d.axis} across {d.slices} slices: {d.exposed_s:.3g} s exposed"
    return Roofline(
        tflops_per_device=model_tf, compute_s=compute_s, attention_comm_bytes_per_layer=blocking + ring,
        comm_s=attn_blocking_s + attn_ring_s + fsdp_s + tp_s + d.attention_s + d.fsdp_s, exposed_comm_s=exposed,
        step_s=step,
        mfu=model_tf / (step * peak) if step > 0 else 0.0, note=note, dcn_exposed_s=d.exposed_s,
    )  # fmt: skip
