"""Tier 1: config composition, grid expansion and trial identity (no Ray, no JAX)."""

import json

from jobs import strategies
from jobs.spec import TrialSpec
from orchestrator.config.grid import expand, points
from orchestrator.config.load import load


def test_defaults_compose():
    cfg = load([])
    assert cfg.model.name == "tiny" and cfg.strategy.name == "ring"
    assert cfg.cluster.name == "local" and cfg.tracking.uri == "sqlite:///mlflow.db"
    assert "sweep" not in cfg


def test_grid_is_deterministic_and_ids_stable():
    a = expand(load(["+sweep=cp_scaling"]))
    b = expand(load(["+sweep=cp_scaling"]))
    assert [s.trial_id for s in a] == [s.trial_id for s in b]
    assert len(a) == len(strategies.CP_NAMES) * 15 and len({s.trial_id for s in a}) == len(a)
    assert {s.strategy.name for s in a} == {"all_gather", "ulysses", "ring", "usp", "double_ring"}
    assert max(s.context_length for s in a) == 14 * 2**20
    # crossed axes, strategy major
    assert [s.context_length for s in a[:3]] == [1024, 2048, 4096]


def test_trial_id_ignores_cluster_and_paths():
    base = expand(load(["context_length=4096"]))[0]
    moved = expand(
        load(["context_length=4096", "cluster.name=elsewhere", "run.checkpoint_dir=/x", "cluster.hosts=1"])
    )[0]
    assert base.trial_id == moved.trial_id
    changed = expand(load(["context_length=4096", "train.seed=1"]))[0]
    assert changed.trial_id != base.trial_id


def test_spec_json_round_trip():
    s = expand(load(["+sweep=smoke"]))[0]
    back = TrialSpec.from_json(s.to_json())
    assert back == s and back.trial_id == s.trial_id
    assert json.loads(s.to_json())["context_length"] == s.context_length


def test_mesh_auto_resolution():
    specs = {s.strategy.name: s for s in expand(load(["+sweep=cp_scaling"]))}
    assert specs["ring"].mesh.context == 8 and specs["ring"].mesh.context_ulysses == 1
    usp = specs["usp"].mesh
    assert usp.context_ulysses * usp.context == 8 and usp.context >= 2 and usp.context_ulysses > 1
    big = {
        s.strategy.name: s
        for s in expand(load(["+sweep=cp_scaling", "cluster=v5p_128", "model=llama3_1_8b"]))
    }
    assert big["ring"].mesh.cp == 64 and big["usp"].mesh.context_ulysses == 8


def test_zip_axes():
    pts = points({"axes": {"a": [1, 2], "b": [3, 4], "c": [5, 6]}, "zip": [["a", "b"]]})
    assert pts == [
        (("a", 1), ("b", 3), ("c", 5)),
        (("a", 1), ("b", 3), ("c", 6)),
        (("a", 2), ("b", 4), ("c", 5)),
        (("a", 2), ("b", 4), ("c", 6)),
    ]
