"""Tier 1: the TPU clusters of conf/cluster/ as libtpu and the planner see them (topology names, host bounds,
the chip's peak), and a cluster file that is not conf/'s priced by its own constants (no Ray, no MLflow)."""

from dataclasses import replace

import pytest

from jobs import flops
from orchestrator.config.grid import expand
from orchestrator.config.load import CONF_DIR, group_option, load
from orchestrator.plan import cluster_model
from orchestrator.plan.aot import target

TPU = sorted(
    p.stem
    for p in (CONF_DIR / "cluster").glob("*.yaml")
    if group_option("cluster", p.stem)["platform"] == "tpu"
)


def test_the_tpu_clusters_include_v5e_and_v6e():
    assert {"v5e_1", "v5e_256", "v6e_256", "v5p_128", "tpu7x_128"} <= set(TPU)


@pytest.mark.parametrize("name", TPU)
def test_every_tpu_clusters_chip_is_known(name):
    """Its accelerator has libtpu's topology name (AOT), JAX devices per chip (cost, links) and a spec-sheet
    peak (MFU); its slice holds hosts x devices per host JAX devices, chips x devices per chip."""
    spec, _ = cluster_model.load(name)
    prefix, _, per_chip = cluster_model.CHIPS[spec.accelerator]
    assert flops.PEAK_TFLOPS_PER_DEVICE[spec.accelerator] > 0
    chips = 1
    for d in spec.topology.split("x"):
        chips *= int(d)
    assert chips * per_chip == spec.hosts * spec.devices_per_host, name


def _point(cluster: str, *words: str):
    (spec,) = expand(load([f"cluster={cluster}", "context_length=4096", *words]))
    return spec


def test_host_bounds_divide_the_topology():
    """libtpu rejects chips_per_host_bounds that do not divide the topology: a one-chip VM is (1, 1, 1), a
    4-chip host (2, 2, 1), and a topology smaller than one host (aot_topology) is cut to it."""
    assert target.host_bounds(_point("v5e_1"), [1, 1, 1]) == (1, 1, 1)
    assert target.host_bounds(_point("v5e_256"), [16, 16, 1]) == (2, 2, 1)
    assert target.host_bounds(_point("tpu7x_128"), [4, 4, 4]) == (2, 2, 1)  # 8 devices, 4 chips a host
    assert target.host_bounds(_point("v6e_256"), [1, 1, 1]) == (1, 1, 1)
    eight = _point("v5e_256")
    eight = replace(eight, cluster=replace(eight.cluster, devices_per_host=8))  # ct5lp-hightpu-8t
    assert target.host_bounds(eight, [2, 4, 1]) == (2, 4, 1)


@pytest.mark.parametrize("name", TPU)
def test_libtpu_builds_every_tpu_clusters_slice(name):
    """The virtual slice an AOT compile targets (no TPU here): libtpu 0.0.42 names v5e `v5e:16x16` and v6e
    `v6e:16x16` (chip config `default`), three axes with 2D ones padded, and gives every device of the slice."""
    pytest.importorskip("libtpu")
    spec = _point(name)
    assert (
        target.topology_name(spec)
        == f"{cluster_model.CHIPS[spec.cluster.accelerator][0]}:{spec.cluster.topology}"
    )
    assert len(target.devices(spec)) == spec.cluster.devices


def test_one_v5e_chip_compiles():
    """aot=true on v5e_1: the tiny model's step compiles for libtpu's 1x1 v5e and fits its HBM."""
    pytest.importorskip("libtpu")
    spec = _point("v5e_1", "strategy=ring")
    assert target.topology_name(spec) == "v5e:1x1"
    compiled = target.lowered(spec)[0].compile().memory_analysis()
    used = compiled.argument_size_in_bytes + compiled.temp_size_in_bytes
    assert 0 < used < cluster_model.load("v5e_1")[1].hbm_bytes_per_device


def test_a_cluster_section_not_in_conf_is_priced_by_its_own_constants():
    """model_of: a conf/ cluster by its file; one composed from elsewhere (a user's --config-dir) by the section
    this process split; a spec nobody composed by the defaults (the roofline)."""
    section = group_option("cluster", "v5e_256") | {"name": "mine_elsewhere", "hbm_bytes_per_device": 2**30}
    spec, model = cluster_model.split(section)
    assert cluster_model.model_of(spec) == model and model.hbm_bytes_per_device == 2**30
    assert cluster_model.model_of(replace(spec, hosts=2)) == cluster_model.ClusterModel()
    v5e, _ = cluster_model.split(group_option("cluster", "v5e_256") | {"hbm_bytes_per_device": 2**30})
    assert cluster_model.model_of(v5e) == cluster_model.load("v5e_256")[1]  # conf/cluster/v5e_256.yaml's own
