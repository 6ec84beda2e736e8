"""The strategy registry: every entry is complete, pure Python, and wired to its body and config."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import strategies
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrialSpec
from jobs.strategies.base import MESH_AXES
from orchestrator.config.grid import expand, resolve_mesh
from orchestrator.config.load import load
from orchestrator.plan import memory, plan

ROOT = Path(__file__).resolve().parent.parent
LONG = ModelSpec("long", 128256, 4096, 32, 16, 4, 256, 14336)
DOC_HOLDERS = (ast.Module, ast.FunctionDef, ast.ClassDef)


def test_registry_imports_no_jax():
    code = "import sys, jobs.strategies as s; [s.get(n) for n in s.NAMES]; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", strategies.NAMES)
def test_entry_is_wired(name):
    s = strategies.get(name)
    assert s.name == name and (ROOT / "conf" / "strategy" / f"{name}.yaml").exists()
    assert (ROOT / "jobs" / "attention" / "cp" / f"{name}.py").exists()
    assert s.default_layout in s.layouts
    if name != "none":
        assert s.axes and s.collectives and s.summary


@pytest.mark.parametrize("name", strategies.CP_NAMES)
def test_auto_mesh_uses_every_device_and_plans(name):
    """mesh=auto puts all 128 devices on the strategy's axes, and the planner has a positive term for it."""
    mesh = resolve_mesh({"data": 1, "fsdp": 1, "tensor": 1}, name, {"q_heads": 16, "kv_heads": 4}, 128)
    assert mesh.size == 128
    spec = TrialSpec(LONG, mesh, StrategySpec(name=name), 1 << 20, cluster=ClusterSpec(devices_per_host=128))
    assert memory.attention_bytes(spec) > 0
    for c, u in strategies.get(name).mesh_splits(64):
        assert c * u == 64


def test_unknown_strategy_is_one_line():
    with pytest.raises(ValueError, match="unknown attention strategy 'warp'; use one of none, all_gather"):
        strategies.get("warp")


def test_cp_scaling_sweep_takes_every_registered_strategy():
    specs = expand(load(["+sweep=cp_scaling", "cluster=tpu7x_128", "model=llama3_1_8b_long"]))
    assert {s.strategy.name for s in specs} == set(strategies.CP_NAMES)
    rows = plan([s for s in specs if s.context_length == 14_680_064])
    assert {r.strategy for r in rows} == set(strategies.CP_NAMES)


def test_double_ring_is_a_ring_over_both_context_axes():
    s = strategies.get("double_ring")
    assert s.ring_size({"context": 4, "context_ulysses": 2}) == 8
    assert s.axes == ("context", "context_ulysses")
    assert resolve_mesh(
        {"data": 1, "fsdp": 1, "tensor": 1}, "double_ring", {"q_heads": 8, "kv_heads": 8}, 8
    ) == (MeshSpec(context=4, context_ulysses=2))


@pytest.mark.parametrize("name", strategies.NAMES)
def test_body_takes_its_mesh_axes_from_the_registry(name):
    """jobs/attention/<name>.py spells no mesh axis name (docstrings aside): the registry's `axes` own them."""
    tree = ast.parse((ROOT / "jobs" / "attention" / "cp" / f"{name}.py").read_text())
    docs = {
        id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOC_HOLDERS) and ast.get_docstring(n)
    }
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs}
    assert not names & set(MESH_AXES)
