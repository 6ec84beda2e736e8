"""train.memory: residuals saved or offloaded on top of train.remat, train state in pinned host memory.

Trial ids of existing trials are unchanged; on CPU every combination trains with the losses of plain
remat=full; for a TPU topology the offloads and the host-held state compile into host memory space."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
from drivers import ROOT

from jobs.spec import MemorySpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config.grid import expand
from orchestrator.config.load import load

MODEL = ModelSpec(name="tiny", vocab=256, embed=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, mlp=128)


def spec_of(*overrides: str) -> TrialSpec:
    return expand(load(list(overrides)))[0]


def test_default_memory_leaves_trial_ids_unchanged():
    """Ids measured before train.memory existed; earlier runs and cached AOT compiles keep theirs."""
    base = TrialSpec(model=MODEL, mesh=MeshSpec(context=8), strategy=StrategySpec(), context_length=2048)
    assert base.trial_id == "02355795f328b321"
    offload = replace(base, train=TrainSpec(remat="offload", dtype="float32", steps=3))
    assert offload.trial_id == "0289f2d9f1f13337"
    added = replace(base, train=TrainSpec(memory=MemorySpec(save=("attn_out",))))
    assert added.trial_id != base.trial_id
    assert TrialSpec.from_json(added.to_json()) == added
    assert TrialSpec.from_dict({**dataclasses.asdict(added), "axes": []}).train.memory.save == ("attn_out",)


# The last revision before train.memory and mesh.dcn existed (an ancestor of every later commit).
BEFORE = "2618124"


def test_ids_match_the_committed_code(monkeypatch):
    """Default specs from the shipped config hash the same under the jobs/spec.py of BEFORE."""
    try:
        text = subprocess.run(
            ["git", "show", f"{BEFORE}:jobs/spec.py"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout")
    mod = types.ModuleType("head_spec")
    monkeypatch.setitem(sys.modules, "head_spec", mod)  # dataclasses look their module up
    exec(compile(text, f"{BEFORE}:jobs/spec.py", "exec"), mod.__dict__)
    old = {
        "model": mod.ModelSpec,
        "train": mod.TrainSpec,
        "mesh": mod.MeshSpec,
        "cluster": mod.ClusterSpec,
        "run": mod.RunSpec,
        "strategy": mod.StrategySpec,
    }
    for overrides in ([], ["train.remat=save_attn"], ["strategy=usp", "train.dtype=float32"]):
        spec = spec_of(*overrides)
        d = dataclasses.asdict(spec)
        for section, cls in old.items():  # keys added since BEFORE, at their defaults
            known = {f.name for f in dataclasses.fields(cls)}
            d[section] = {k: v for k, v in d[section].items() if k in known}
        old_data = {f.name for f in dataclasses.fields(mod.DataSpec)}
        d["train"]["data"] = {k: v for k, v in d["train"]["data"].items() if k in old_data}
        assert mod.TrialSpec.from_dict(d).trial_id == spec.trial_id, overrides


def test_policy_is_the_preset_unless_memory_adds_to_it():
    from jobs.model import REMAT_POLICIES, remat_policy

    for remat, policy in REMAT_POLICIES.items():
        assert remat_policy(remat, MemorySpec(host=("params",))) is policy  # same program as before
    assert remat_policy("full", MemorySpec(save=("mlp_act",))) is not REMAT_POLICIES["full"]
    with pytest.raises(ValueError, match="train.remat=none"):
        remat_policy("none", MemorySpec(offload=("layer_input",)))
    with pytest.raises(ValueError, match="both saved and offloaded"):
        remat_policy("save_attn", MemorySpec(offload=("attn_out",)))


def test_host_state_lives_in_pinned_host_memory_on_cpu():
    import jax

    from jobs.mesh import make_mesh
    from jobs.step import make_train_step

    spec = spec_of("context_length=128", "train.memory.host=[optimizer]")
    init_fn, _ = make_train_step(spec, make_mesh(spec.mesh, jax.devices()))
    params, opt_state = init_fn(jax.random.key(0))
    assert {x.sharding.memory_kind for x in jax.tree.leaves(params)} == {"device"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(opt_state)} == {"pinned_host"}


RUN = ["strategy=ring", "context_length=128", "train.steps=3", "train.dtype=float32", "train.remat=full"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "memory",
    [
        ["train.memory.save=[attn_out,mlp_act]"],
        ["train.memory.offload=[layer_input,attn_out]"],  # CPU has a pinned_host memory space: it runs
        ["train.memory.host=[optimizer,params]"],
    ],
    ids=lambda m: " ".join(m),
)
def test_cpu_losses_equal_plain_full_remat(memory):
    ref, got = spec_of(*RUN), spec_of(*RUN, *memory)
    assert ref.mesh.cp == 8 and got.trial_id != ref.trial_id
    np.testing.assert_allclose(losses(got), losses(ref), rtol=0, atol=1e-6)


@functools.cache
def losses(spec: TrialSpec) -> tuple[float, ...]:
    from jobs.train import train

    return tuple(r.loss for r in train(spec) if r.kind == "step")


def test_offload_and_host_state_compile_to_tpu_host_memory():
    """tpu7x 2x2x1 (8 devices), compiled here with libtpu: the state is a host argument and output, the
    offloaded residuals (stacked over layers) sit in host memory space S(5)."""
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from test_aot import tiny_spec

    from jobs.mesh import make_mesh
    from jobs.step import lower_train_step
    from orchestrator.plan import aot

    spec = tiny_spec()
    memory = MemorySpec(offload=("layer_input", "attn_out"), host=("optimizer", "params"))
    spec = replace(spec, train=replace(spec.train, memory=memory))
    compiled = lower_train_step(spec, make_mesh(spec.mesh, aot.devices(spec))).compile()
    ma = compiled.memory_analysis()
    state = 3 * spec.model.n_params() * 4 // spec.mesh.size  # fp32 params, mu, nu per device, unpadded
    assert ma.host_argument_size_in_bytes >= state and ma.host_output_size_in_bytes >= state
    assert ma.argument_size_in_bytes < ma.host_argument_size_in_bytes  # only the batch stays on device
    assert ma.host_temp_size_in_bytes > 0
    m, Ll = spec.model, spec.context_length // spec.mesh.cp
    text = compiled.as_text()
    for name, dims in (("layer_input", [m.embed]), ("attn_out", [m.q_heads, m.head_dim])):
        shape = ",".join(map(str, [m.layers, spec.train.batch, Ll, *dims]))
        assert re.search(rf"bf16\[{shape}\]\{{[^}}]*S\(5\)\}}", text), f"{name} not in host memory"
