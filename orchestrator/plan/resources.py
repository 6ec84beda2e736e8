"""Every resource a planned step uses, against what the cluster has: HBM per device, host RAM per host, the host
link each device offloads over, the ICI links and the DCN. A capacity that overflows makes the point infeasible
(HBM, host RAM); a link is reported by how busy the step keeps it and whether the step waits on it.

Capacities and rates are the cluster's (conf/cluster/*.yaml, each with its source); the uses are the memory
model's (memory.py) and the work model's (work.py) figures, so nothing here is measured on a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec import TrialSpec
from orchestrator.plan import cluster_model, memory
from orchestrator.plan.cluster_model import ClusterModel
from orchestrator.plan.steptime import StepTime
from orchestrator.plan.work import Work, dcn_bytes_per_s, host_bytes_per_s

# A link the step keeps waiting (its exposed time) for more than this share of the step limits it.
LIMITS = 0.05
IDLE = 0.01  # a link the step uses for less than this share of its rate is idle
NAMES = {"hbm": "HBM", "host_memory": "host RAM", "host_link": "host link", "ici": "ICI", "dcn": "DCN"}
# The input pipeline: every host builds the step's whole batch (tokens, targets, positions, segment ids as
# int32) and keeps the next one prefetched (jobs/data).
BATCH_ARRAYS, PREFETCH = 4, 2


@dataclass(frozen=True)
class Resource:
    """One resource of one point: what the step uses of it, what there is, and the verdict."""

    name: str  # hbm | host_memory | host_link | ici | dcn
    used: float  # bytes (capacities) or bytes per second at the predicted step (links)
    capacity: float  # 0: the cluster config does not say (not checked)
    unit: str  # "B" for a capacity held, "B/s" for a link's rate
    verdict: str  # fits | over | unchecked | idle | busy | limits
    note: str = ""

    @property
    def share(self) -> float | None:
        return self.used / self.capacity if self.capacity else None

    def words(self) -> str:
        name = NAMES.get(self.name, self.name)
        if self.unit == "B":
            held = memory.gib(self.used)
            cap = f" of {memory.gib(self.capacity)}" if self.capacity else " (no capacity set)"
        else:
            held = f"{self.used / 1e9:,.3g} GB/s"
            cap = f" of {self.capacity / 1e9:,.3g} GB/s" if self.capacity else ""
        return f"{name} {held}{cap}: {self.verdict}" + (f" ({self.note})" if self.note else "")


def host_memory_bytes(spec: TrialSpec, mem: dict[str, int]) -> int:
    """Host RAM one host holds for the step: each of its devices' offloaded activations and host-resident train
    state (memory.breakdown's host_offload), and the input pipeline's batches."""
    per_device = mem.get("host_offload", 0)
    batch = BATCH_ARRAYS * 4 * spec.train.batch * spec.context_length * PREFETCH
    return spec.cluster.devices_per_host * per_device + batch


def resources(
    spec: TrialSpec, model: ClusterModel, mem: dict[str, int], hbm: int, w: Work, st: StepTime
) -> tuple[Resource, ...]:
    """The point's resources at its predicted step."""
    c = spec.cluster
    out = [_capacity("hbm", hbm, model.hbm_bytes_per_device)]
    if c.platform == "cpu":  # simulated devices' memory is the host's: HBM above already is it
        out.append(
            Resource("host_memory", host_memory_bytes(spec, mem), 0, "B", "unchecked", "simulated devices")
        )
    else:
        used = host_memory_bytes(spec, mem)
        out.append(
            _capacity("host_memory", used, model.host_memory_bytes, f"{c.devices_per_host} devices a host")
        )
    step = max(st.step_s, 1e-12)
    host = host_bytes_per_s(c, model)
    out.append(_link("host_link", w.host_bytes / step, host, st.exposed_offload_s, step))
    bw = float(model.ici_bytes_per_s) or 1e11
    ici = w.attention_ring_bytes + w.attention_blocking_bytes + w.fsdp_bytes + w.tensor_bytes
    links = cluster_model.collective_links(c, model, w.fsdp_group)
    exposed = st.exposed_ring_s + st.collectives_s + st.exposed_fsdp_s + st.tensor_s
    out.append(_link("ici", ici / step, bw * links, exposed, step, f"{links:g} links of {bw / 1e9:g} GB/s"))
    if w.dcn_slices > 1 and w.dcn_axis:
        crossing = w.dcn_blocking_bytes + w.dcn_ring_bytes + w.dcn_fsdp_bytes
        out.append(_link("dcn", crossing / step, dcn_bytes_per_s(c, model), st.dcn_exposed_s, step))
    return tuple(out)


def _capacity(name: str, used: float, capacity: float, note: str = "") -> Resource:
    if not capacity:
        return Resource(name, used, 0, "B", "unchecked", note)
    return Resource(name, used, float(capacity), "B", "over" if used > capacity else "fits", note)


def _link(name: str, rate: float, capacity: float, exposed_s: float, step: float, note: str = "") -> Resource:
    if rate <= 0 or (capacity and rate < IDLE * capacity):
        return Resource(name, rate, capacity, "B/s", "idle", note)
    verdict = "limits" if exposed_s > LIMITS * step else "busy"
    waits = f"the step waits {exposed_s / step:.0%} of its time on it" if verdict == "limits" else ""
    return Resource(name, rate, capacity, "B/s", verdict, "; ".join(x for x in (note, waits) if x))


def overflowing(found: tuple[Resource, ...]) -> list[Resource]:
    return [r for r in found if r.verdict == "over"]
