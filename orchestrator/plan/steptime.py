"""Achievable step time per device: each kind of work at the rate the chip reaches, plus what is not hidden.

The roofline (roofline.py) prices every FLOP at peak, so its MFU is a bound nobody plans with. This model
keeps the same terms and prices them as measured runs do (constants per chip in conf/cluster/*.yaml,
fitted on the published runs in orchestrator/plan/published.py):

  step = matmuls / (peak x matmul_efficiency)                         layer weights, unembedding
       + attention x imbalance / (peak x attention kernel efficiency)  efficiency(D, b) = e x D/(D+Dh) x b/(b+bh)
       + exposed communication                                         as the roofline: what compute does not hide
       + exposed host offload                                          layer inputs / attention outputs over PCIe
       + exposed DCN (mesh.dcn across slices)                          ring hops at max(ICI, DCN), hidden as above
       + step_overhead_s                                               dispatch, optimizer, host loop

Remat recompute enters as extra hardware FLOPs; it is never model FLOPs, so it lowers the MFU.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jobs import strategies
from jobs.flops import layer_flops, train_tflops_per_device
from jobs.spec import ClusterSpec, TrialSpec, residuals
from orchestrator.plan import roofline
from orchestrator.plan.memory import BF16, FP32, Local, layer_params, local_sizes
from orchestrator.plan.roofline import NOMINAL_CPU_TFLOPS, attention_comm_bytes

# Flash backward forms the scores again: 5 matmuls of the forward's size (QK^T, dP, dS K, dS^T Q, P^T dO)
# against the forward's 2, so attention's hardware work is 1 + 2.5 forwards where model FLOPs count 3.
ATTN_BWD = 2.5
ROOT = str(Path(__file__).resolve().parents[2])  # the repository, so the probe finds `jobs`
CPU_PEAK_ENV = "CP_PLAN_CPU_TFLOPS"
# One probe swings 10x on a shared 2-core host (0.005-0.048 TFLOP/s per device in one sweep here), while the
# trials' own throughput does not: plan with the median of several.
CPU_PROBES = 5  # pins the CPU matmul rate (tests, reproducible plans)


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
    dcn_exposed_s: float  # slice-crossing traffic (mesh.dcn) that compute does not hide: roofline.dcn
    overhead_s: float
    step_s: float
    mfu: float
    limiter: str  # what the step spends most of its time on, in words


@functools.cache
def measured_cpu_tflops(devices_per_host: int, dtype: str) -> float:
    """TFLOP/s per simulated device, measured once per process with the job's own matmul probe
    (jobs.train.measure_cpu_peak) in a child process with the job's device count: the driver stays free of
    jax, and the number is the one the trial will divide by."""
    pinned = os.environ.get(CPU_PEAK_ENV)
    if pinned:
        return float(pinned)
    env = {**os.environ, **ClusterSpec(devices_per_host=devices_per_host).host_env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    code = (
        "import statistics; from jobs.train import measure_cpu_peak; "
        f"print(statistics.median(measure_cpu_peak({dtype!r}) for _ in range({CPU_PROBES})))"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=120, check=True)  # fmt: skip
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return NOMINAL_CPU_TFLOPS  # no probe (no jax here): the nominal 2-core figure


def peak_tflops(spec: TrialSpec) -> float:
    return roofline.peak_tflops(spec)  # one rule for both: the spec sheet, else the measured host


def hop_tokens(spec: TrialSpec, x: Local) -> int:
    """Keys one kernel call sees: a ring hop's block, or the whole gathered sequence."""
    return strategies.get(spec.strategy.name).hop_tokens(x)


def imbalance(spec: TrialSpec, x: Local) -> float:
    """Busiest device's causal work over the mean (zigzag: 1; contiguous shards leave the last device more)."""
    # Simulated CPU devices share the host's cores: what a light device leaves idle the busiest one gets.
    if spec.cluster.platform == "cpu":
        return 1.0
    return strategies.get(spec.strategy.name).imbalance(x, spec.strategy.layout)


def kernel_efficiency(c: ClusterSpec, head_dim: int, block: int) -> float:
    """Softmax work per score is fixed while MXU work grows with D (so D/(D+Dh)); a hop's fixed cost
    (launch, pipeline fill, merge) is spread over its block (so b/(b+bh))."""
    d = head_dim / (head_dim + c.attention_head_dim_half)
    b = block / (block + c.attention_block_half)
    return max(c.attention_efficiency * d * b, 1e-6)


def step_time(spec: TrialSpec, offload: tuple[str, ...] | None = None, peak: float | None = None) -> StepTime:
    """The model for one trial; `offload` overrides what the remat policy sends to host (published runs),
    `peak` the chip's rate (a CPU trial's own measurement, after the fact)."""
    m, t, c, x = spec.model, spec.train, spec.cluster, local_sizes(spec)
    peak = peak or peak_tflops(spec)
    devices = max(spec.mesh.size, 1)
    model_tf = train_tflops_per_device(m, spec.context_length, t.batch, devices)
    weights, attn = layer_flops(m, spec.context_length)
    unembed = 2 * spec.context_length * m.embed * m.vocab
    per_dev = t.batch / devices / 1e12
    # Any remat replays the layer forward in backward, attention too unless its output is kept (or offloaded);
    # what the preset plus train.memory send to host (`names`) costs host traffic.
    redo_layers = t.remat != "none"
    kept, names = residuals(t.remat, t.memory) if redo_layers else ((), ())
    redo_attn = redo_layers and "attn_out" not in kept + names
    names = names if offload is None else offload
    matmul_s = (
        ((3 + redo_layers) * (weights - unembed) + 3 * unembed) * per_dev / (peak * c.matmul_efficiency)
    )
    hop = hop_tokens(spec, x)
    eff = kernel_efficiency(c, m.head_dim, hop)
    replay = c.attention_recompute if redo_attn else 0.0
    attention_s = (1 + ATTN_BWD + replay) * attn * per_dev * imbalance(spec, x) / (peak * eff)

    bw, N = float(c.ici_bytes_per_s) or 1e11, m.layers
    passes = 3 + redo_attn  # forward, backward's two (K,V and dK,dV travel), the replayed forward
    blocking, ring = attention_comm_bytes(spec, x)
    collectives_s = N * passes * blocking / (bw * c.collective_links)
    # A hop's transfer hides behind the previous hop's attention; what is left over is exposed.
    ring_ici_s = N * passes * ring / bw
    exposed_ring_s = max(0.0, ring_ici_s - attention_s)
    f = devices // x.T
    fsdp_bytes = N * layer_params(m) / x.T * (f - 1) / f * ((3 + redo_layers) * BF16 + FP32) if f > 1 else 0.0
    exposed_fsdp_s = max(0.0, fsdp_bytes / bw - matmul_s)  # gathers overlap the previous layer's matmuls
    tensor_s = N * passes * 4 * (x.T - 1) / x.T * x.tokens * m.embed * BF16 / bw if x.T > 1 else 0.0
    per_token = {"layer_input": m.embed * BF16, "attn_out": x.hq * m.head_dim * BF16, "mlp_act": x.M * BF16}
    host = 2 * N * x.tokens * sum(per_token[n] for n in names)  # out in forward, back in backward
    exposed_offload_s = (
        max(0.0, host / c.host_bytes_per_s - matmul_s - attention_s) if c.host_bytes_per_s else 0.0
    )
    d = roofline.dcn(spec, x, passes=passes, attention_s=attention_s, ring_ici_s=ring_ici_s, matmul_s=matmul_s,
                     fsdp_ici_s=fsdp_bytes / bw, fsdp_gathers=3 + redo_layers)  # fmt: skip
    overhead_s = float(c.step_overhead_s)
    terms = {
        "matmuls": matmul_s,
        "attention kernel": attention_s,
        "exposed ring transfer": exposed_ring_s,
        f"{spec.strategy.name} collectives": collectives_s,
        "exposed FSDP gathers": exposed_fsdp_s,
        "tensor all-reduces": tensor_s,
        "offload bandwidth": exposed_offload_s,
        "exposed DCN transfer": d.exposed_s,
        "fixed per-step cost": overhead_s,
    }
    step = sum(terms.values())
    return StepTime(
        tflops_per_device=model_tf, peak_tflops=peak, matmul_s=matmul_s, attention_s=attention_s,
        attention_efficiency=eff, hop_tokens=hop, exposed_ring_s=exposed_ring_s, collectives_s=collectives_s,
        exposed_fsdp_s=exposed_fsdp_s, tensor_s=tensor_s, exposed_offload_s=exposed_offload_s,
        dcn_exposed_s=d.exposed_s, overhead_s=overhead_s, step_s=step,
        mfu=model_tf / (step * peak) if step > 0 else 0.0,
        limiter=_limiter(terms, step, eff, m.head_dim, hop) + _dcn_note(d),
    )  # fmt: skip


def _limiter(terms: dict[str, float], step: float, eff: float, head_dim: int, hop: int) -> str:
    name, secs = max(terms.items(), key=lambda kv: kv[1])
    share = f"{name} {secs / step:.0%} of the step" if step > 0 else name
    if name == "attention kernel":
        share += f" (kernel at {eff:.0%} of peak: head_dim {head_dim}, {hop:,}-token blocks)"
    return share


def _dcn_note(d: roofline.Dcn) -> str:
    """Across slices, the DCN's share said next to the limiter, hidden or not."""
    if d.slices <= 1:
        return ""
    if d.bytes_per_s <= 0:
        return f"; DCN across {d.slices} slices not modelled (cluster.dcn_bytes_per_s = 0)"
    return (
        f"; DCN over {d.axis} across {d.slices} slices: {d.exposed_s:.3g} s exposed of "
        f"{d.attention_s + d.fsdp_s:.3g} s of transfers"
    )
