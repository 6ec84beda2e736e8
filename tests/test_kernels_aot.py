"""kernel=splash compiles for real TPU topologies (libtpu on a CPU host, no TPU): ring and usp train steps
lower to the Mosaic kernel (`tpu_custom_call` in the compiled HLO), not the interpreted or xla fallback."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec

ROOT = Path(__file__).resolve().parent.parent


def conf(group: str, name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"), resolve=True)


# (strategy, cluster, mesh, kernel): tpu7x 2x2x1 is 4 chips = 8 devices, v5p 2x2x1 is 4 megacore devices.
# kernel=auto (the default) must pick the Mosaic kernel when lowered for TPU from this CPU host.
CASES = [
    ("ring", "tpu7x_128", MeshSpec(context=8), "auto"),
    ("usp", "tpu7x_128", MeshSpec(context=4, context_ulysses=2), "splash"),
    pytest.param("ring", "v5p_128", MeshSpec(context=4), "splash", marks=pytest.mark.slow),
    pytest.param("usp", "v5p_128", MeshSpec(context=2, context_ulysses=2), "auto", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
    "strategy,cluster,mesh,kernel", CASES, ids=lambda x: x.label() if isinstance(x, MeshSpec) else None
)
def test_splash_compiles_to_mosaic(strategy, cluster, mesh, kernel):
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jobs.mesh import make_mesh
    from jobs.step import lower_train_step
    from orchestrator.plan import aot

    c = replace(ClusterSpec(**conf("cluster", cluster)), topology="2x2x1")
    s = replace(StrategySpec(**conf("strategy", strategy)), kernel=kernel, block_q=256, block_kv=256)
    spec = TrialSpec(
        model=ModelSpec(**conf("model", "tiny")), mesh=mesh, strategy=s, context_length=4096,
        train=TrainSpec(remat="full"), cluster=c,
    )  # fmt: skip
    devices = aot._devices(spec, None)
    assert len(devices) == mesh.size
    text = lower_train_step(spec, make_mesh(spec.mesh, devices)).compile().as_text()
    assert "tpu_custom_call" in text, f"{strategy} kernel={kernel}: no Mosaic kernel in the compiled HLO"
    assert "collective-permute" in text  # the ring is still there
