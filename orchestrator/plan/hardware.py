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

from jobs.spec import ClusterSpec, TrialSpec
from orchestrator import REPO


@dataclass(frozen=True)
class ClusterModel:
    """What the planner alone knows of a cluster. The defaults price every FLOP at peak (the roofline) and
    leave capacities and budgets unchecked."""

    hbm_bytes_per_device: int = 0  # 0: HBM not checked
    host_memory_bytes: int = (
        0  # host RAM per host, for offloaded activations and host-resident state (0: not checked)
    )
    hbm_bytes_per_s: float = (
        0.0  # HBM bandwidth per device (what a ring hop's merge of partial results costs)
    )
    ici_bytes_per_s: float = 0.0  # one ICI link, one direction (0: the planner assumes 1e11)
    dcn_bytes_per_s: float = 0.0  # data-centre network bandwidth per host, one direction (0: not modelled)
    host_bytes_per_s: float = (
        0.0  # host offload bandwidth of one device's own link (0: transfers not modelled)
    )
    host_bytes_per_s_per_host: float = (
        0.0  # the host's total for its devices' offload (0: only their own links)
    )
    max_step_seconds: float = 0.0  # predicted-slower points are infeasible here (0: no budget)
    # Cost before launch (orchestrator/plan/cost.py): chips are held through the compile and every step.
    compile_seconds: float = 0.0  # an attempt's compile, chips held (0: not counted)
    price_per_chip_hour: float = 0.0  # what a chip-hour costs you, any currency (0: chip-hours only)
    # Step-time model (orchestrator/plan/steptime.py), fitted by orchestrator/calibrate.
    matmul_efficiency: float = 1.0  # fraction of peak the layer matmuls reach
    attention_efficiency: float = 1.0  # attention kernel's fraction of peak on its tiles at large head_dim
    attention_head_dim_half: float = 0.0  # head_dim at which softmax work halves the kernel's rate
    attention_recompute: float = 1.0  # attention forwards replayed in backward when its output is not saved
    call_overhead_s: float = (
        0.0  # fixed per attention kernel call: launch, pipeline fill, the merge of results
    )
    layer_overhead_s: float = 0.0  # fixed per layer and pass: dispatch, norms, elementwise work
    collective_latency_s: float = 0.0  # per collective on the critical path
    collective_efficiency: float = 1.0  # of the links' line rate a collective reaches
    collective_links: float = (
        1.0  # links a gather or all-to-all drives without a torus topology (a switch: 1)
    )
    offload_exposed: float = 0.0  # share of host transfers no compute hides
    step_overhead_s: float = 0.0  # fixed cost per step (optimizer update, host loop)
    # The band of a predicted step, as multipliers on it: the fit's leave-one-table-out errors
    # (orchestrator/calibrate), for steps its kernels' and matmuls' rates mostly price (steptime.SETTLED or more
    # of the step) and for steps the fixed costs and exposed transfers weigh on, which fewer tables measure.
    step_band_low: float = 1.0
    step_band_high: float = 1.0
    fixed_band_low: float = 1.0
    fixed_band_high: float = 1.0


MODEL_ORDER = tuple(f.name for f in dataclasses.fields(ClusterModel))
MODEL_KEYS = frozenset(MODEL_ORDER)
SPEC_KEYS = frozenset(f.name for f in dataclasses.fields(ClusterSpec))


def split(cluster: Mapping[str, Any]) -> tuple[ClusterSpec, ClusterModel]:
    """A cluster section (conf/cluster/*.yaml, composed and checked) as what the hosts get and what the planner
    prices with."""
    spec = ClusterSpec(**{k: v for k, v in cluster.items() if k in SPEC_KEYS})
    return spec, ClusterModel(**{k: v for k, v in cluster.items() if k in MODEL_KEYS})


@functools.cache
def load(name: str) -> tuple[ClusterSpec, ClusterModel]:
    """conf/cluster/<name>.yaml, read as the driver composes it (OmegaConf: YAML 1.1 reads `9.0e10` as a
    string)."""
    path = REPO / "conf" / "cluster" / f"{name}.yaml"
    return split(OmegaConf.to_container(OmegaConf.load(path), resolve=True))


def model_of(cluster: ClusterSpec) -> ClusterModel:
    """The planner's model of a cluster named in conf/cluster/ (a spec built by hand for a cluster of another
    name gets the defaults: the roofline, nothing checked)."""
    if (REPO / "conf" / "cluster" / f"{cluster.name}.yaml").exists():
        return load(cluster.name)[1]
    return ClusterModel()


# accelerator -> (topology name prefix, chip config, JAX devices per chip): a v5p chip is one megacore device,
# a tpu7x chip two.
CHIPS = {"v5p": ("v5", "megacore", 1), "tpu7x": ("tpu7x", "default", 2)}


# cluster=local has no spec sheet (peak 0 = measured at run time); the planner measures the host the same way.
# This nominal figure (a bf16 matmul on a 2-core host: ~0.01 TFLOP/s per simulated device of 8) stands in
# where no probe can run.
NOMINAL_CPU_TFLOPS = 0.01
CPU_PEAK_ENV = "CP_PLAN_CPU_TFLOPS"  # pins the CPU matmul rate (tests, reproducible plans)
# One probe swings 10x on a shared 2-core host while the trials' own throughput does not: plan with the
# median of several.
CPU_PROBES = 5
ROOT = str(REPO)  # the probe's subprocess finds `jobs`


@functools.cache
def measured_cpu_tflops(devices_per_host: int, dtype: str) -> float:
    """TFLOP/s per simulated device, measured once per process with the job's own matmul probe
    (jobs.hardware.measure_cpu_peak) in a child process with the job's device count: the driver stays free of
    jax, and the number is the one the trial will divide by."""
    pinned = os.environ.get(CPU_PEAK_ENV)
    if pinned:
        return float(pinned)
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
