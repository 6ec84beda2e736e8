"""Tier 1: the config schema (its declarations, orchestrator/config/keys.py, orchestrator/config/data.py)
in-process: no Ray, no MLflow.

The CLI's side (exit 2, one `error:` line, nothing started) is tests/test_cli.py::test_bad_input_exits_2_before_launch.
"""

import shutil
from pathlib import Path

import pytest

from orchestrator.config import data, keys, schema
from orchestrator.config.grid import expand
from orchestrator.config.load import CONF_DIR, ConfigError, load
from orchestrator.plan import validity

OPTIONS = {
    g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in ("model", "strategy", "mesh", "cluster")
}
SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


def square_sweep(model: str, cluster: str) -> str:
    """The sweep a (model, cluster) pair is loaded under: a Latin square over the three."""
    return SWEEPS[(OPTIONS["model"].index(model) + OPTIONS["cluster"].index(cluster)) % len(SWEEPS)]


@pytest.mark.parametrize("cluster", OPTIONS["cluster"])
@pytest.mark.parametrize("model", OPTIONS["model"])
def test_every_shipped_sweep_passes_on_every_cluster_and_model(cluster, model):
    """Every (model, cluster) pair under one sweep, the sweep turning with the pair (a Latin square): each sweep
    also meets every model and every cluster, so all pairs of the three are covered in one load per pair."""
    sweep = square_sweep(model, cluster)
    # the corpus of the quickstart and families sweeps (data/stdlib) is built on first use, not here: their grids
    # on the recall task
    data = ["~sweep.set", "+sweep.set={model.vocab:4096}"] if sweep in ("quickstart", "families") else []
    assert expand(load([f"+sweep={sweep}", f"cluster={cluster}", f"model={model}", *data]))


def test_the_sweep_square_covers_every_pair():
    """The square above: every sweep meets every model and every cluster."""
    pairs = [(m, c, square_sweep(m, c)) for m in OPTIONS["model"] for c in OPTIONS["cluster"]]
    assert {(m, s) for m, _, s in pairs} == {(m, s) for m in OPTIONS["model"] for s in SWEEPS}
    assert {(c, s) for _, c, s in pairs} == {(c, s) for c in OPTIONS["cluster"] for s in SWEEPS}


@pytest.mark.parametrize("cluster", OPTIONS["cluster"])
def test_every_strategy_and_mesh_passes(cluster):
    for strategy in OPTIONS["strategy"]:
        for mesh in OPTIONS["mesh"]:
            (spec,) = expand(load([f"strategy={strategy}", f"mesh={mesh}", f"cluster={cluster}"]))
            assert spec.strategy.name == strategy


def test_tracking_server_and_driver_options_pass():
    opts = keys.check_options(
        {"tracking": {"uri": "http://mlflow:5000", "experiment": "x"}, "progress": "plain", "output": "json"}
    )
    assert opts.progress == "plain" and opts.retries == schema.Retries() and opts.sweep is None
    load(
        [
            "tracking=server",
            "dry_run=true",
            "output=json",
            "aot=true",
            "aot_topology=2x2x1",
            "skip_invalid=true",
            "gate.enabled=false",
            "gate.max_drop=0",
            "retries.preemption=0",
            "+sweep=smoke",
            "sweep.id=s1",
        ]
    )


def test_kernel_names_have_one_owner():
    """jobs.spec owns the kernel names (pure Python: the driver checks them before launch, without jax); the
    kernel registry must implement each, and the planner's platform rule is the spec's."""
    from jobs import spec
    from jobs.attention.kernels import KERNELS
    from orchestrator.plan.validity import KERNEL_PLATFORM

    assert spec.KERNELS == tuple(KERNELS) == tuple(KERNEL_PLATFORM)
    assert all(k.name == name for name, k in KERNELS.items())
    # auto resolves per platform at trace time, so it (and xla) pass on every cluster; the others need theirs
    assert KERNEL_PLATFORM == spec.KERNEL_PLATFORM
    assert spec.KERNEL_PLATFORM == {"auto": None, "xla": None, "splash": "tpu", "flash": "gpu"}


def test_data_kind_and_path(tmp_path):
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(b"\0" * 64)
    (spec,) = expand(load(["train.data.kind=tokens", f"train.data.path={tokens}"]))
    assert spec.train.data.path == str(tokens)
    expand(
        load(["train.data.kind=tokens", "train.data.path=gs://bucket/data/tokens.bin"])
    )  # the job checks it
    with pytest.raises(ConfigError, match="is not a file"):
        expand(load(["train.data.kind=tokens", f"train.data.path={tmp_path}"]))
    # kind against path is a rule across keys: the planner's (invalid verdict), not the schema's
    (recall,) = expand(load([f"train.data.path={tokens}"]))
    (empty,) = expand(load(["train.data.kind=tokens", "train.data.path=''"]))
    ((rule, msg),) = [(p.rule, p.message) for p in validity.problems(recall)]
    assert rule == "data kind vs path" and "is ignored by train.data.kind=recall" in msg
    assert [p.message for p in validity.problems(empty)] == [
        "train.data.path='' is empty but train.data.kind=tokens reads a token file; allowed: a local file or "
        "gs://bucket/object — set train.data.path=..., or train.data.kind=recall for the synthetic task"
    ]


def test_per_point_message_names_the_first_bad_point_and_counts_the_rest():
    with pytest.raises(ConfigError) as e:
        expand(load(["+sweep=smoke", "+sweep.axes.train.lr=[0.1,-1]"]))
    msg = str(e.value)
    assert (
        "(grid point strategy=all_gather context_length=512 train.lr=-1; 3 more of 8 grid points fail too)"
        in msg
    )
    assert msg.endswith("e.g. train.lr=0.003")


def test_unknown_cluster_key_in_a_cluster_file_is_rejected_not_dropped(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    text = (conf / "cluster" / "local.yaml").read_text()
    Path(conf / "cluster" / "local_gpu.yaml").write_text(text + "gpus_per_host: 8\n")
    cfg = load(["+sweep=smoke", "+sweep.axes.cluster=[local,local_gpu]"], conf_dir=conf)
    with pytest.raises(
        ConfigError, match=r"cluster.gpus_per_host is not a cluster key \(grid point .*cluster=local_gpu"
    ):
        expand(cfg, conf_dir=conf)


def test_gcs_data_path_is_looked_up_when_credentials_allow(monkeypatch):
    """Against a GCS emulator (the real gcsfs client): a missing object is bad input before launch,
    an existing one passes; without credentials the lookup is left to the job."""
    from servers import start_gcs_emulator

    from jobs import storage

    url, stop = start_gcs_emulator(bucket="cp-schema")
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        data.path_problem.cache_clear()
        storage.write_bytes("gs://cp-schema/data/tokens.bin", b"\0" * 64)
        expand(load(["train.data.kind=tokens", "train.data.path=gs://cp-schema/data/tokens.bin"]))
        with pytest.raises(ConfigError, match="does not exist in the bucket"):
            expand(load(["train.data.kind=tokens", "train.data.path=gs://cp-schema/data/missing.bin"]))
    finally:
        stop()
        data.path_problem.cache_clear()
