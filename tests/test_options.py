"""Tier 1: the driver's typed options (orchestrator.config.load.Loaded), their defaults (their declarations, composed in), one
owner per check, and no import cycle between the config loader and the schema checks (no Ray cluster, no MLflow
store)."""

import dataclasses
import subprocess
import sys

import yaml
from drivers import ROOT
from omegaconf import OmegaConf

from jobs.spec import MemorySpec, RunSpec, TrainSpec
from orchestrator import driver
from orchestrator.cli.args import compose, parse_args
from orchestrator.config import schema
from orchestrator.config.grid import expand
from orchestrator.config.load import (
    ConfigError,
    group_option,
    load,
    load_typed,
    section_defaults,
    switch_defaults,
)
from orchestrator.config.schema import sweep_identity
from orchestrator.plan import validity


def test_the_switches_compose_at_their_declared_defaults():
    """conf/config.yaml names no switch's value: each comes from its declaration, and overrides as a YAML key."""
    tree = OmegaConf.to_container(load(["gate.window=3", "search.batch=[1,2]"]))
    switches = switch_defaults()
    assert not set(switches) & set(yaml.safe_load((ROOT / "conf" / "config.yaml").read_text()))
    assert switches["gate"] == {"enabled": True, "max_drop": 0.10, "window": 5, "noise_k": 1.5}
    assert switches["search"] == {"batch": [], "grad_accum": []} and switches["dry_run"] is False
    want = switches | {
        "gate": switches["gate"] | {"window": 3},
        "search": {"batch": [1, 2], "grad_accum": []},
    }
    assert {k: tree[k] for k in switches} == want
    # a switch deleted on the command line falls back to its declaration, as one never composed would
    assert load_typed(["~gate.window"]).options.gate == schema.Gate()


def test_the_train_and_run_keys_compose_at_their_declared_defaults():
    """conf/config.yaml restates no declared default (its one value, context_length, has none): train and run come
    in at their declarations (jobs/spec.py), so the two cannot drift, and a key overrides as a YAML key."""
    assert set(yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())) == {"defaults", "context_length"}
    tree = OmegaConf.to_container(load(["train.steps=3", "train.data.pack=concat", "run.profile_steps=[2]"]))
    train = section_defaults(TrainSpec)
    assert tree["train"] == train | {"steps": 3, "data": train["data"] | {"pack": "concat"}}
    assert tree["run"] == section_defaults(RunSpec) | {"profile_steps": [2]}
    assert train["lr"] == 3e-3 and train["memory"] == {"save": [], "offload": [], "host": []}
    (spec,) = expand(load([]))
    assert (spec.train, spec.run) == (TrainSpec(), RunSpec())


def test_load_returns_the_typed_options():
    loaded = load_typed(["dry_run=true", "gate.max_drop=0.2", "retries.preemption=0", "tracking=server"])
    o = loaded.options
    assert isinstance(o, schema.Options) and o.dry_run and o.output == "table" and o.progress == "auto"
    assert o.gate == schema.Gate(enabled=True, max_drop=0.2) and o.retries == schema.Retries(0, 1)
    assert o.tracking.uri.startswith("http") and o.sweep is None
    assert loaded.tree["model"]["name"] == "tiny" and expand(load([])) == expand(loaded.tree)


def test_a_command_line_sweep_is_typed_too():
    o = compose(parse_args(["-m", "train.seed=0,1"])).options
    assert o.sweep.name == "cli" and o.sweep.axes == {"train.seed": [0, 1]}
    assert sweep_identity(o)[0] == "cli"
    assert sweep_identity(load_typed(["+sweep=smoke", "sweep.id=s1"]).options) == ("smoke", "s1")
    name, sid = sweep_identity(load_typed([]).options)
    assert name == "single" and sid.startswith("single-")


def test_the_gate_is_on_as_the_schema_says(monkeypatch):
    """The driver's gate gets the schema's defaults (max_drop 0.10, window 5, noise_k 1.5) and says 1 when the
    store cannot answer; the store here is a stand-in that hands the gate's arguments back."""
    asked = []

    class Store:
        client, started = "client", {}

        def experiment_id(self):
            return "1"

        def call(self, fn, *args):
            asked.append((fn, args))
            if len(asked) > 1:
                raise ConnectionError("the store is away")
            return "verdict"

        def set_tags(self, key, tags):
            asked.append(("tags", key, tags))

    monkeypatch.setattr(driver.gate, "tags", lambda result: {"regression": "true"})
    monkeypatch.setattr(driver.gate, "exit_code", lambda result: 3)
    on = load_typed([]).options
    assert driver._gate(on, Store(), "s", []) == ("verdict", 3)
    assert asked[0] == (driver.gate.compare, ("client", "1", "s", 0.10, 5, 1.5, []))
    assert asked[1] == ("tags", "sweep", {"regression": "true"})
    assert load_typed(["gate.window=3", "gate.noise_k=2"]).options.gate == schema.Gate(window=3, noise_k=2.0)
    assert driver._gate(on, Store(), "s", []) == (None, 1)  # the second store call fails: no verdict
    assert not load_typed(["gate.enabled=false"]).options.gate.enabled  # the driver then never calls _gate


def test_config_error_has_its_own_module_and_no_cycle():
    assert ConfigError is schema.ConfigError
    code = "import sys, orchestrator.config.keys; print('orchestrator.config.load' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_rules_across_keys_are_the_planners():
    """train.memory against train.remat: a grid point the planner marks invalid, with the schema's words."""
    (spec,) = expand(load(["train.remat=save_attn", "train.memory.offload=[attn_out]"]))
    (p,) = validity.problems(spec)
    assert p.rule == "memory policy" and p.message == (
        "train.memory.offload=['attn_out'] names attn_out, but train.remat=save_attn already saves it in HBM; "
        "allowed: each residual saved or offloaded, not both — drop it, or use train.remat=full"
    )
    both = dataclasses.replace(
        spec.train, remat="full", memory=MemorySpec(save=("attn_out",), offload=("attn_out",))
    )
    none = dataclasses.replace(spec.train, remat="none", memory=MemorySpec(save=("mlp_act",)))
    msgs = [validity.problems(dataclasses.replace(spec, train=t))[0].message for t in (both, none)]
    assert (
        "train.memory.offload also names it" in msgs[0]
        and "drop attn_out from one of the two lists" in msgs[0]
    )
    assert msgs[1].startswith("train.memory.save=['mlp_act'] needs a remat policy, but train.remat=none")
    (fine,) = expand(load(["train.remat=offload", "train.memory.save=[attn_out]"]))
    assert validity.problems(fine) == []


def test_one_reader_of_a_group_option():
    """grid, the published rows, tests and benchmarks read conf/<group>/<name>.yaml through one function."""
    from orchestrator.calibrate import published_tpu

    assert published_tpu._load("cluster", "v5p_128") == group_option("cluster", "v5p_128")
    for path in (
        "orchestrator/calibrate/published_tpu.py",
        "benchmarks/aot.py",
        "tests/test_plan.py",
        "tests/test_aot.py",
        "tests/test_kernels_aot.py",
    ):
        assert "OmegaConf.load" not in (ROOT / path).read_text(), path
