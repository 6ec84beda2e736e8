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
from jobs.strategies.base import Schedule
from orchestrator.plan import cluster_model, packing
from orchestrator.plan.cluster_model import ClusterModel
from orchestrator.plan.memory import BF16, FP32, layer_params, layer_reaches, layer_spec, local_sizes

# The attention backward in forwards of work: model FLOPs count 2 (dQ, and dK with dV); a flash kernel forms
# the scores again, 5 matmuls of the forward's size (QK^T, dP, dS K, dS^T Q, P^T dO) against its 2, so 2.5.
# The roofline prices the model's count (a kernel that re-forms nothing), the step-time model the kernel's.
MODEL_BWD = 2.0
ATTN_BWD = 2.5


@dataclass(frozen=True)
class Work:
    """Per device per step: FLOPs by kind, the attention's schedule, and the bytes each link carries."""

    model_tflops: float  # model FLOPs (MaxText's count; remat recompute not included)
    matmul_tflop: float  # layer matmuls x (3 + a replayed forward), the unembedding x 3 (never replayed)
    attention_flops: float  # one forward's causal attention of one sequence, all layers (model FLOPs)
    per_device: float  # sequences per device, in TFLOP per FLOP
    imbalance: float  # busiest device's attention tiles over the mean
    hop_tokens: int  # keys one kernel call sees: a ring hop's block, or the whole gathered sequence
    replays_layers: bool  # any remat replays the layer forward in backward...
    replays_attention: bool  # ...attention too, unless train.remat / train.memory keep or offload its output
    passes: int  # attention's: forward, backward's two (K,V and dK,dV travel), the replayed forward
    attention_comm_bytes_per_layer: int  # forward, per device
    attention_blocking_bytes: int  # all-gather / all-to-all of K,V: not overlapped
    attention_ring_bytes: int  # ring hops: hidden behind the hop's attention
    fsdp_bytes: float  # bf16 gathers per layer forward, backward and replay, fp32 gradient reduce-scatters
    tensor_bytes: float  # two all-reduces of [tokens, E] per layer and attention pass
    host_bytes: int  # what the remat policy and train.memory send to host: out in forward, back in backward
    # One layer's attention forward as the kernel runs it (jobs/strategies: hops, tiles, collectives), run by
    # `layer_passes` layers (layers x microbatches); `tile_scale` folds packed documents' skipped tiles in.
    schedule: Schedule | None = None
    layer_passes: int = 1
    tile_scale: float = 1.0
    sequences: int = 1  # per device per microbatch (the schedule is one sequence's)
    head_dim: int = 128
    layer_matmul_tflop: float = 0.0  # one layer's forward matmuls per device per microbatch
    fsdp_group: int = 1  # devices a layer's weights are gathered over
    dcn_axis: str = ""  # mesh.dcn when the trial spans slices
    dcn_slices: int = 1
    dcn_blocking_bytes: int = 0  # the strategy's slice-crossing attention traffic (jobs/strategies)
    dcn_ring_bytes: int = 0
    dcn_fsdp_bytes: float = 0.0  # the FSDP gathers' and gradient reduce-scatters' DCN phase
    # Per layer type of model.attention_pattern: (type, its schedule, its layer passes). A window or chunk
    # skips the tiles and hops its queries cannot reach; `schedule` is the global layers' (or the first type's).
    layer_schedules: tuple[tuple[str, Schedule, int], ...] = ()
    host_state_bytes: int = 0  # train.memory.host's state to the device and back each step (host_state_bytes)

    def attention_layers(self) -> tuple[tuple[str, Schedule, int], ...]:
        """Each layer type's schedule and layer passes (one global type when built without them)."""
        if self.layer_schedules:
            return self.layer_schedules
        return (("global", self.schedule, self.layer_passes),) if self.schedule is not None else ()

    def attention_tflop(self, backward: float, replay: float) -> float:
        """Attention's model TFLOP on the busiest device when its backward costs `backward` forwards and a
        replayed forward `replay` (a causal row's count times the busiest device's share)."""
        redo = replay if self.replays_attention else 0.0
        return (1 + backward + redo) * self.attention_flops * self.per_device * self.imbalance


def host_state_bytes(spec: TrialSpec) -> int:
    """train.memory.host's traffic per step and device, both ways: AdamW's moments come to the device for the
    update and go back (params likewise, before the forward)."""
    n = spec.model.n_params() * FP32 // max(spec.mesh.size, 1)
    return 2 * n * sum(k for part, k in (("optimizer", 2), ("params", 1)) if part in spec.train.memory.host)


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
    layout, bq, bk = spec.strategy.layout, spec.strategy.block_q, spec.strategy.block_kv
    kinds = []
    for k, n, r in layer_reaches(spec):  # each type under its strategy (strategy.local: the windowed ones')
        here = layer_spec(spec, k)
        sk, xk = (s, x) if here is spec else (strategies.get(here.strategy.name), local_sizes(here))
        kinds.append((k, n * A, sk.schedule(xk, layout, bq, bk, r), sk.comm_bytes(xk, r, layout, bk)))
    # the global layers' schedule speaks for the step (imbalance, the limiter's words); a model with none, its first type's
    _, _, sched, _ = next((k for k in kinds if k[0] == "global"), kinds[0])
    blocking = sum(n * b for _, n, _, (b, _) in kinds)  # forward, per device, all layers
    ring = sum(n * r for _, n, _, (_, r) in kinds)
    f = devices // x.T
    fsdp = N * layer_params(m) / x.T * (f - 1) / f * (gathers * BF16 + FP32) if f > 1 else 0.0
    tensor = N * passes * 4 * (x.T - 1) / x.T * x.tokens * m.embed * BF16 if x.T > 1 else 0.0
    per_token = {"layer_input": m.embed * BF16, "attn_out": x.hq * m.head_dim * BF16, "mlp_act": x.M * BF16}
    # Simulated CPU devices share the host's cores: what a light device leaves idle the busiest one gets.
    cpu = spec.cluster.platform == "cpu"
    imbalance = 1.0 if cpu else sched.scores() / max(sched.scores(busiest=False), 1e-9)
    tile_scale = 1.0
    if (pk := packing.of(spec)) is not None:  # packed documents: the kernel skips the tiles their mask leaves
        attn *= pk.computed
        # the busiest device's share of the causal row's work; a document mask only removes tiles, so never more
        tile_scale = min(1.0, pk.computed * (pk.imbalance / imbalance if pk.imbalance and not cpu else 1.0))
        imbalance = 1.0 if cpu else pk.imbalance or imbalance
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
        attention_comm_bytes_per_layer=(blocking + ring) // N,
        attention_blocking_bytes=passes * blocking,
        attention_ring_bytes=passes * ring,
        fsdp_bytes=fsdp,
        tensor_bytes=tensor,
        host_bytes=2 * N * x.tokens * sum(per_token[n] for n in names),
        host_state_bytes=host_state_bytes(spec),
        schedule=sched,
        layer_passes=N,
        tile_scale=tile_scale,
        sequences=x.B,
        head_dim=m.head_dim,
        layer_matmul_tflop=(weights - unembed) / m.layers * per_dev / A,
        fsdp_group=f,
        layer_schedules=tuple((k, sc, n) for k, n, sc, _ in kinds),
        **dcn,
    )


@dataclass(frozen=True)
class Rates:
    """What the work runs at; the defaults are the roofline's (every FLOP at peak, the model's FLOP count, links
    at their line rate, no fixed costs). Link bandwidths and topology are the cluster's, the same for both."""

    peak_tflops: float
    matmul_efficiency: float = 1.0
    attention_efficiency: float = 1.0  # of the kernel's tiles, at this head_dim
    attention_backward: float = MODEL_BWD  # forwards of work the attention backward costs
    attention_replay: float = 1.0  # forwards a replayed attention costs
    overhead_s: float = 0.0  # fixed per step
    call_s: float = 0.0  # fixed per attention kernel call (launch, pipeline fill, the partial results' merge)
    layer_s: float = 0.0  # fixed per layer and pass (dispatch, norms and elementwise work between matmuls)
    latency_s: float = 0.0  # per collective on the critical path (a hop's exchange, a gather, an all-to-all)
    collective_efficiency: float = 1.0  # of the links' line rate a collective reaches
    offload_exposed: float = (
        0.0  # share of the host transfers that no compute hides (DMA against HBM traffic)
    )


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
    attention_s: float  # the kernels' tiles
    ring_ici_s: float
    exposed_ring_s: float  # hops whose K,V exchange outlasts their tiles and calls
    collectives_s: float  # all-gathers / all-to-alls of the attention: blocking, with their latency
    fsdp_ici_s: float
    exposed_fsdp_s: float
    tensor_s: float
    exposed_offload_s: float
    dcn: Dcn
    overhead_s: float
    calls_s: float = 0.0  # the kernel calls' fixed cost
    layers_s: float = 0.0  # the layers' fixed cost
    offload_s: float = 0.0  # every host transfer at the host link's rate (hidden or not)

    def parts(self, strategy: str) -> dict[str, float]:
        """The terms that add up to the step, in words (the limiter is the largest)."""
        return {
            "matmuls": self.matmul_s,
            "attention kernel": self.attention_s,
            "attention kernel calls": self.calls_s,
            "exposed ring transfer": self.exposed_ring_s,
            f"{strategy} collectives": self.collectives_s,
            "exposed FSDP gathers": self.exposed_fsdp_s,
            "tensor all-reduces": self.tensor_s,
            "offload bandwidth": self.exposed_offload_s,
            "exposed DCN transfer": self.dcn.exposed_s,
            "fixed per-layer cost": self.layers_s,
            "fixed per-step cost": self.overhead_s,
        }

    @property
    def step_s(self) -> float:
        return sum(self.parts("").values())


def dcn_bytes_per_s(c: ClusterSpec, m: ClusterModel) -> float:
    """One device's share of its host's DCN bandwidth: every device of a host may send across at once (a
    double ring's outer hop does), so a device gets 1/devices_per_host of the NIC."""
    return float(m.dcn_bytes_per_s) / max(c.devices_per_host, 1)


def host_bytes_per_s(c: ClusterSpec, m: ClusterModel) -> float:
    """One device's host link: its own (a chip's PCIe), unless the host's total shared by its devices is less."""
    own = float(m.host_bytes_per_s)
    shared = float(m.host_bytes_per_s_per_host) / max(c.devices_per_host, 1)
    return min(own, shared) if own and shared else own or shared


# Reading the running accumulator and the partial result, writing the merged one.
MERGE_PASSES = 3
# Forward, backward, replayed forward: the attention work and the K,V bytes of each pass, in forward units.
# The backward moves K,V (bf16) with their fp32 gradients: 2 x 2 + 2 x 4 bytes per element against 2 x 2.
BACKWARD_BYTES = 3.0


def _attention(
    w: Work, r: Rates, c: ClusterSpec, m: ClusterModel, bw: float
) -> tuple[float, float, float, float, float]:
    """(kernel tiles, kernel calls, exposed ring, ring bytes at line rate, blocking collectives) in seconds
    per step, layer type by layer type, hop by hop: a hop costs max(its tiles and calls, its K,V exchange), the
    all-gather (or a window's halo) and the all-to-alls around the hops block."""
    total = [0.0] * 5
    for _, sch, n in w.attention_layers():
        for i, v in enumerate(schedule_seconds(sch, w, r, c, m, bw)):
            total[i] += n * v
    return total[0], total[1], total[2], total[3], total[4]


def schedule_seconds(
    sch: Schedule, w: Work, r: Rates, c: ClusterSpec, m: ClusterModel, bw: float | None = None
) -> tuple[float, float, float, float, float]:
    """One layer's attention (forward, backward, replay) under `sch`, in seconds: see _attention."""
    bw = bw or float(m.ici_bytes_per_s) or 1e11
    score_tflop = 4 * w.head_dim * sch.heads * w.sequences * w.tile_scale / 1e12  # QK^T and PV, per score
    t_score = score_tflop / (r.peak_tflops * r.attention_efficiency)
    busiest = c.platform != "cpu"  # simulated devices share the host's cores: the mean is what they see
    passes = [(1.0, 1.0), (r.attention_backward, BACKWARD_BYTES)]
    if w.replays_attention:
        passes.append((r.attention_replay, 1.0))
    # merging a hop's partial result into the running one reads and writes the fp32 accumulators (out and lse)
    # of its queries through HBM: the backward merges dQ as well as it reads out
    hbm = float(m.hbm_bytes_per_s)
    merge = MERGE_PASSES * sch.heads * (w.head_dim + 1) * FP32 * w.sequences / hbm if hbm else 0.0
    kernel = calls = exposed = line = 0.0
    for work_f, bytes_f in passes:
        for h in sch.hops:
            scores = h.scores if busiest else h.mean_scores
            k = scores * t_score * work_f + h.merged * merge * (2 if work_f == r.attention_backward else 1)
            cl = h.calls * r.call_s
            x = h.send_bytes * bytes_f / bw
            xfer = x / r.collective_efficiency + r.latency_s if h.send_bytes else 0.0
            kernel, calls, line = kernel + h.count * k, calls + h.count * cl, line + h.count * x
            exposed += h.count * max(0.0, xfer - k - cl)
    blocking = 0.0
    for _ in passes:  # the backward reduce-scatters dK,dV and all-to-alls the gradients back, as much
        if sch.gather_bytes:
            links = cluster_model.collective_links(c, m, sch.gather_group)
            blocking += sch.gather_bytes / (bw * links * r.collective_efficiency) + r.latency_s
        if sch.a2a_bytes:
            blocking += sch.a2a_bytes / (2 * bw * r.collective_efficiency) + 2 * r.latency_s
    return kernel, calls, exposed, line, blocking


def price(w: Work, r: Rates, c: ClusterSpec, m: ClusterModel) -> Terms:
    """Seconds per term. Compute at the rates; each ring hop costs the larger of its tiles (with the calls'
    fixed cost) and its K,V exchange; all-gathers and all-to-alls block, at the links the cluster's topology gives
    the group; FSDP's weight gathers hide behind the layers' compute; tensor all-reduces sit on the critical path;
    host offload, on its own DMA engines, hides behind all of that except its `offload_exposed` share. Each pair
    of compute and what hides behind it costs max(compute, transfer), so faster rates never make a step slower:
    the roofline's step is at most the model's."""
    bw = float(m.ici_bytes_per_s) or 1e11  # schedule_seconds's default too
    matmul_s = w.matmul_tflop / (r.peak_tflops * r.matmul_efficiency)
    if w.schedule is not None:
        attention_s, calls_s, exposed_ring_s, ring_ici_s, collectives_s = _attention(w, r, c, m, bw)
    else:  # no schedule (a work model built by hand): the causal row's count, as the roofline prices it
        attention_s = w.attention_tflop(r.attention_backward, r.attention_replay) / (
            r.peak_tflops * r.attention_efficiency
        )
        calls_s, ring_ici_s = 0.0, w.attention_ring_bytes / bw
        exposed_ring_s = max(0.0, ring_ici_s - attention_s)
        collectives_s = w.attention_blocking_bytes / (bw * cluster_model.collective_links(c, m, 0))
    fsdp_links = cluster_model.collective_links(c, m, w.fsdp_group)
    fsdp_ici_s = w.fsdp_bytes / (bw * fsdp_links * r.collective_efficiency)
    layer_matmul_s = (
        (3 + w.replays_layers) * w.layer_matmul_tflop * w.layer_passes / (r.peak_tflops * r.matmul_efficiency)
    )
    hiding = layer_matmul_s + attention_s + calls_s + exposed_ring_s
    exposed_fsdp_s = max(0.0, fsdp_ici_s - hiding)
    tensor_s = w.tensor_bytes / (bw * r.collective_efficiency)
    dcn = _dcn(w, dcn_bytes_per_s(c, m), attention_s + calls_s, ring_ici_s, matmul_s, fsdp_ici_s)
    layers_s = r.layer_s * w.layer_passes * (2 + w.replays_layers)
    busy = (
        matmul_s
        + attention_s
        + calls_s
        + exposed_ring_s
        + collectives_s
        + exposed_fsdp_s
        + tensor_s
        + dcn.exposed_s
    )
    host = host_bytes_per_s(c, m)
    offload_s = w.host_bytes / host if host else 0.0
    # host-resident state moves between the backward and the update, where nothing else runs: all exposed
    state_s = w.host_state_bytes / host if host else 0.0
    return Terms(
        matmul_s=matmul_s,
        attention_s=attention_s,
        ring_ici_s=ring_ici_s,
        exposed_ring_s=exposed_ring_s,
        collectives_s=collectives_s,
        fsdp_ici_s=fsdp_ici_s,
        exposed_fsdp_s=exposed_fsdp_s,
        tensor_s=tensor_s,
        exposed_offload_s=max(0.0, offload_s - busy) + r.offload_exposed * offload_s + state_s,
        dcn=dcn,
        overhead_s=r.overhead_s,
        calls_s=calls_s,
        layers_s=layers_s,
        offload_s=offload_s + state_s,
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
