"""The hardware as the planner sees it: each cluster's capacities, link rates and fitted step-time constants
(ClusterModel, read from the same conf/cluster/*.yaml as the execution-side ClusterSpec, never sent to a host),
libtpu's names for the TPUs with JAX devices per chip, and a device's peak rate, MFU's denominator (the spec
sheet's, or on CPU the host's matmul rate measured once)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from jobs.fields import key
from jobs.hardware import pinned_cpu_tflops
from jobs.spec import ClusterSpec, TrialSpec
from orchestrator import REPO


@dataclass(frozen=True)
class ClusterModel:
    """What the planner alone knows of a cluster. The defaults price every FLOP at peak (the roofline) and
    leave capacities and budgets unchecked."""

    hbm_bytes_per_device: int = key(
        0,
        doc="Device memory per JAX device, in bytes: points the planner predicts above it are infeasible (0: no "
        "limit).",
        ge=0,
    )
    host_memory_bytes: int = key(
        0,
        doc="Host RAM per host, in bytes: a point whose offloaded activations and host-resident state "
        "(train.memory) overflow it is infeasible (0: not checked).",
        ge=0,
    )
    hbm_bytes_per_s: float = key(
        0.0,
        doc="HBM bandwidth per JAX device, in bytes/s (planner: what merging a ring hop's partial attention into "
        "the running result costs; 0: not priced).",
        ge=0,
    )
    ici_bytes_per_s: float = key(
        0.0, doc="ICI bandwidth of one link, one direction, in bytes/s (planner; 0: 1e11 assumed).", ge=0
    )
    dcn_bytes_per_s: float = key(
        0.0,
        doc="Data-centre network bandwidth per host, one direction, in bytes/s (planner; 0: DCN time not "
        "modelled).",
        ge=0,
    )
    host_bytes_per_s: float = key(
        0.0,
        doc="Step-time model: host offload bandwidth of one device's own link (a chip's PCIe), in bytes/s (0: "
        "offload transfers not modelled).",
        ge=0,
    )
    host_bytes_per_s_per_host: float = key(
        0.0,
        doc="The host's total offload bandwidth shared by its devices, in bytes/s (0: only each device's own "
        "link, `host_bytes_per_s`).",
        ge=0,
    )
    max_step_seconds: float = key(
        0.0,
        doc="Planner's budget, in seconds per step: points predicted slower are infeasible on this cluster (0: no "
        "budget).",
        ge=0,
    )
    # Cost before launch (orchestrator/plan/cost.py): chips are held through the compile and every step.
    compile_seconds: float = key(
        0.0,
        doc="Planner's cost: seconds one attempt's compile holds the trial's chips, added to its steps' "
        "chip-hours (0: not counted).",
        ge=0,
    )
    price_per_chip_hour: float = key(
        0.0,
        doc="What one chip-hour costs you (any currency; no default: prices differ by contract and region). With "
        "it the plan shows each point's cost next to its chip-hours (0: chip-hours only).",
        ge=0,
    )
    # Step-time model (orchestrator/plan/steptime.py), fitted by orchestrator/calibrate.
    matmul_efficiency: float = key(
        1.0, doc="Step-time model: fraction of peak the layer matmuls reach.", gt=0, le=1
    )
    attention_efficiency: float = key(
        1.0,
        doc="Step-time model: the attention kernel's fraction of peak on the tiles it computes, at large "
        "head_dim.",
        gt=0,
        le=1,
    )
    xla_attention_ratio: float = key(
        1.0,
        doc="Step-time model: the xla blockwise kernel's rate on its tiles as a share of the platform's own "
        "kernel's (splash on TPU, flash on GPU), where a trial runs kernel=xla on such a platform (1: priced "
        "alike; on CPU xla is the platform's kernel, priced by attention_efficiency).",
        gt=0,
        le=1,
    )
    attention_block_half: float = key(
        0.0,
        doc="Step-time model: the kernel block (tokens, the smaller of block_q and block_kv) at which a block's "
        "fixed work halves the kernel's rate (x b/(b+half); 0: no block effect).",
        ge=0,
    )
    attention_head_dim_half: float = key(
        0.0,
        doc="Step-time model: head_dim Dh at which softmax work halves the kernel's rate (x D/(D+Dh); 0: no "
        "head_dim effect).",
        ge=0,
    )
    attention_recompute: float = key(
        1.0,
        doc="Step-time model: attention forwards replayed in backward when remat does not keep the attention "
        "output.",
        ge=0,
    )
    call_overhead_s: float = key(
        0.0,
        doc="Step-time model: fixed seconds per attention kernel call (launch, pipeline fill): what makes many "
        "small ring hops slower than one large call.",
        ge=0,
    )
    layer_overhead_s: float = key(
        0.0,
        doc="Step-time model: fixed seconds per layer and pass (dispatch, norms and elementwise work the FLOP "
        "count leaves out): what a few tokens per device cannot amortise.",
        ge=0,
    )
    collective_latency_s: float = key(
        0.0,
        doc="Step-time model: fixed seconds per collective on the critical path (a ring hop's exchange, a K,V "
        "all-gather, an all-to-all).",
        ge=0,
    )
    collective_efficiency: float = key(
        1.0,
        doc="Step-time model: fraction of the links' line rate a collective reaches (ring hops, gathers, "
        "all-to-alls, FSDP and tensor collectives).",
        gt=0,
        le=1,
    )
    collective_links: float = key(
        1.0,
        doc="Step-time model: links an all-gather or all-to-all drives at once where the cluster has no torus "
        "topology (NVSwitch, simulated devices); a TPU slice's come from `topology`.",
        gt=0,
    )
    offload_exposed: float = key(
        0.0,
        doc="Step-time model: share of the host transfers (train.memory.offload, the offload preset) that no "
        "compute hides: DMA to host competes with the step's HBM traffic.",
        ge=0,
        le=1,
    )
    step_overhead_s: float = key(
        0.0,
        doc="Step-time model: fixed seconds per step (dispatch, optimizer update, host loop).",
        ge=0,
    )
    # The band of a predicted step, as multipliers on it: the fit's leave-one-table-out errors
    # (orchestrator/calibrate), for steps its kernels' and matmuls' rates mostly price (steptime.SETTLED or more
    # of the step) and for steps the fixed costs and exposed transfers weigh on, which fewer tables measure.
    step_band_low: float = key(
        1.0,
        doc="Step-time band of a step its kernels and matmuls price (nine tenths of it or more): the fastest it "
        "is expected to be, as a multiple of the prediction (the fit's leave-one-table-out errors; "
        "orchestrator/calibrate).",
        gt=0,
        le=1,
    )
    step_band_high: float = key(1.0, doc="The same band's slowest, as a multiple of the prediction.", ge=1)
    fixed_band_low: float = key(
        1.0,
        doc="Step-time band of a step whose fixed costs and exposed transfers are over a tenth of it (few "
        "tables measure those): the fastest it is expected to be, as a multiple of the prediction.",
        gt=0,
        le=1,
    )
    fixed_band_high: float = key(1.0, doc="The same band's slowest, as a multiple of the prediction.", ge=1)


MODEL_ORDER = tuple(f.name for f in dataclasses.fields(ClusterModel))
MODEL_KEYS = frozenset(MODEL_ORDER)
SPEC_KEYS = frozenset(f.name for f in dataclasses.fields(ClusterSpec))


# The model of each cluster section split in this process, by its spec: what model_of finds for a cluster file
# that is not in conf/cluster/ (a user's own, from --config-dir or hydra.searchpath).
_SPLIT: dict[ClusterSpec, ClusterModel] = {}


def split(cluster: Mapping[str, Any]) -> tuple[ClusterSpec, ClusterModel]:
    """A cluster section (conf/cluster/*.yaml, composed and checked) as what the hosts get and what the planner
    prices with."""
    spec = ClusterSpec(**{k: v for k, v in cluster.items() if k in SPEC_KEYS})
    model = _SPLIT[spec] = ClusterModel(**{k: v for k, v in cluster.items() if k in MODEL_KEYS})
    return spec, model


@functools.cache
def load(name: str) -> tuple[ClusterSpec, ClusterModel]:
    """conf/cluster/<name>.yaml, read as the driver composes it (OmegaConf: YAML 1.1 reads `9.0e10` as a
    string)."""
    path = REPO / "conf" / "cluster" / f"{name}.yaml"
    return split(OmegaConf.to_container(OmegaConf.load(path), resolve=True))


def model_of(cluster: ClusterSpec) -> ClusterModel:
    """The planner's model of a cluster named in conf/cluster/; else of the cluster section this process
    composed for that spec (a user's own cluster file: its constants, never conf/'s); else, for a spec built by
    hand, the defaults: the roofline, nothing checked."""
    if (REPO / "conf" / "cluster" / f"{cluster.name}.yaml").exists():
        return load(cluster.name)[1]
    return _SPLIT.get(cluster, ClusterModel())


# accelerator -> (libtpu's topology name prefix, chip config, JAX devices per chip): a v5p chip is one megacore
# device, a tpu7x chip two, a v5e or v6e chip (one TensorCore) one. v5e is `v5litepod` to Ray and the TPU API
# (slice reservations), `v5e` to libtpu (AOT: "v5e:16x16"; libtpu 0.0.42 rejects "v5litepod:..").
CHIPS = {
    "v5p": ("v5", "megacore", 1),
    "tpu7x": ("tpu7x", "default", 2),
    "v5litepod": ("v5e", "default", 1),
    "v6e": ("v6e", "default", 1),
}


# cluster=local has no spec sheet (peak 0 = measured at run time); the planner measures the host the same way.
# This nominal figure (a bf16 matmul on a 2-core host: ~0.01 TFLOP/s per simulated device of 8) stands in
# where no probe can run.
NOMINAL_CPU_TFLOPS = 0.01
# One probe swings 10x on a shared 2-core host while the trials' own throughput does not: plan with the
# median of several.
CPU_PROBES = 5
ROOT = str(REPO)  # the probe's subprocess finds `jobs`


@functools.cache
def measured_cpu_tflops(devices_per_host: int, dtype: str) -> float:
    """TFLOP/s per simulated device, measured once per process with the job's own matmul probe
    (jobs.hardware.measure_cpu_peak) in a child process with the job's device count: the driver stays free of
    jax, and the number is the one the trial will divide by."""
    if (pinned := pinned_cpu_tflops()) is not None:
        return pinned
    env = {**os.environ, **ClusterSpec(devices_per_host=devices_per_host).host_env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    code = (
        "import statistics; from jobs.hardware import measure_cpu_peak; "
        f"print(statistics.median(measure_cpu_peak({dtype!r}) for _ in range({CPU_PROBES})))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
        )
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return NOMINAL_CPU_TFLOPS  # no probe (no jax here): the nominal 2-core figure


def peak_tflops(spec: TrialSpec) -> float:
    """Peak TFLOP/s per JAX device: the cluster's spec sheet, else the measured host (one rule for the roofline
    and the step-time model)."""
    c = spec.cluster
    peak = float(c.peak_tflops_per_device)
    return peak if peak > 0 else measured_cpu_tflops(c.devices_per_host, spec.train.dtype)


def collective_links(c: ClusterSpec, m: ClusterModel, group: int) -> float:
    """Link directions a gather or all-to-all over `group` devices drives at once. A TPU slice is a torus
    (cluster.topology, e.g. 4x4x4): a group spanning k of its axes uses both directions of each, 2k links (a
    partly spanned axis counts by the log of its share); elsewhere (NVSwitch, simulated devices) the cluster's
    collective_links."""
    if c.platform != "tpu" or not c.topology or group <= 1:
        return float(m.collective_links)
    dims = sorted((int(d) for d in c.topology.split("x") if d.isdigit()), reverse=True)
    chips = group / CHIPS.get(c.accelerator, (None, None, 1))[2]
    spanned = 0.0
    for d in dims:
        if chips <= 1 or d <= 1:
            break
        span = min(float(d), chips)
        spanned += math.log(span) / math.log(d)
        chips /= span
    return max(2.0 * spanned, 1.0)
