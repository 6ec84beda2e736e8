"""Tier 3: the real CLI in a subprocess — local Ray, JAX on 8 simulated devices, a fresh sqlite MLflow store."""

import json
import math
import subprocess
import sys
import time

import pytest
from drivers import driver_env, run_cli, run_cli_each
from mlflow import MlflowClient

from jobs.spec import TrialSpec


@pytest.mark.slow
@pytest.mark.ray  # the CLI subprocess starts a local Ray of its own
def test_smoke_sweep_end_to_end(tmp_path):
    t0 = time.monotonic()
    res = run_cli(["+sweep=smoke", "progress=plain"], cwd=tmp_path)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in res.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("cp_scaling")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4  # smoke: 2 strategies x 2 lengths
    ids = {r.data.tags["trial_id"] for r in children}
    assert len(ids) == 4
    for r in children:
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["status"] == "finished" and r.info.status == "FINISHED"
        assert {"strategy", "context_length", "mesh", "model"} <= set(r.data.params)
        losses = [m.value for m in client.get_metric_history(r.info.run_id, "loss")]
        assert len(losses) == int(r.data.params["steps"]) and all(math.isfinite(x) for x in losses)
        assert r.data.metrics["final_mfu"] > 0
        assert r.data.metrics["compiled_bytes_per_device"] > 0
        assert "trial_spec.json" in [a.path for a in client.list_artifacts(r.info.run_id)]
    # the parent charts MFU against context length per strategy
    hist = client.get_metric_history(parents[0].info.run_id, "mfu/ring")
    assert sorted(m.step for m in hist) == [512, 1024]
    print(f"smoke sweep wall time: {wall:.1f} s")


BAD_INPUT = [
    # what the CLI caught before the schema
    (["+sweep=smoke", "model=nope"], "choose model from"),
    (["+sweep=smoke", "trian.steps=3"], "Could not override 'trian.steps'"),
    (["+sweep=smoke", "sweep.axes.context_length=[]"], "grid is empty"),
    (["foo=1"], "Could not override 'foo'"),
    (["+sweep=nope"], "choose sweep from"),
    (["+sweep=smoke", "sweep.axes.strategy=[]"], "grid is empty"),
    (["+sweep=smoke", "+sweep.axes.train.nope=[1]"], "not a config key"),
    (["+sweep=smoke", "sweep.axes.strategy=[ring,warp]"], "unknown strategy 'warp'"),
    (["+sweep=smoke", "sweep.axes.context_length=[1000]"], "1000 % 16 = 8"),
    # the command line's own flags and sweep syntax (orchestrator/cli/args.py)
    (
        ["strategy=ring,usp"],
        "write strategy=[ring,usp] for a list, strategy='ring,usp' for a string, or add -m "
        "(or --multirun) to sweep over it",
    ),
    (
        ["context_length=range(1,3)"],
        "'context_length=range(1,3)': add -m (or --multirun) to sweep over it",
    ),
    (
        ["--foo"],
        "unknown flag '--foo'; allowed: -h/--help, -m/--multirun, -c/--cfg job|hydra|all, --resolve",
    ),
    (["--cfg"], "--cfg needs a value"),
    (["--cfg", "jobs"], "--cfg takes one of job, hydra, all, got 'jobs'"),
    (["--info=tree"], "--info takes one of all, config, defaults, defaults-tree, searchpath, plugins"),
    (["-m=1"], "-m takes no value"),
    (["-m", "strategy=ring,nope"], "unknown strategy 'nope' in the sweep grid — choose from: all_gather"),
    (["-m", "tracking=local,server"], "sweep axis 'tracking' is a driver option"),
    (["-m", "+sweep=smoke,cp_scaling"], "one sweep file per run"),
    (["-m", "train.lr=interval(0,1)"], "is a continuous interval"),
    (["-m", "context_length=glob(*)"], "glob() picks options of a config group"),
    (["-m", "strategy=ring,usp", "model=nope"], "choose model from"),
    (["--cfg", "job", "-p", "nope"], "package 'nope' not found in the config"),
    (["--config-dir", "/nonexistent/conf"], "--config-dir '/nonexistent/conf': no such directory"),
    (["-cd"], "-cd needs a value"),
    (["-cd", ".", "cluster=mine"], "Could not find 'cluster/mine'"),
    # issue 17: each of these used to start Ray and write a tracking store
    (["train.steps=0"], "train.steps=0 is out of range (the single trial); allowed: an integer >= 1"),
    (["train.steps=-3"], "train.steps=-3 is out of range"),
    (["train.lr=-1"], "train.lr=-1 is out of range"),
    (["train.grad_accum=0"], "train.grad_accum=0 is out of range"),
    (["model.head_dim=0"], "model.head_dim=0 is out of range"),
    (["train.data.kind=tokens"], "train.data.kind=tokens reads a token file"),
    (["train.data.path=/nonexistent/tokens.bin"], "'/nonexistent/tokens.bin' does not exist"),
    (["train.data.kind=parquet"], "train.data.kind='parquet' is not an allowed value"),
    (["progress=fancy"], "allowed: auto, rich, plain"),
    (["output=xml", "dry_run=true"], "allowed: table, json"),
    (["gate.max_drop=-0.5"], "allowed: a number >= 0 and <= 1"),
    (["retries.failure=-1"], "retries.failure=-1 is out of range"),
    (["run.checkpoint_every=-1"], "run.checkpoint_every=-1 is out of range"),
    # the schema's checks of single keys (conf/ and jobs/spec.py declare them)
    (["train.seed=-1"], "train.seed=-1 is out of range"),
    (["train.grad_clip=0"], "allowed: a number > 0"),
    (["train.lr=nan"], "train.lr=nan has the wrong type"),
    (["train.steps=2.5"], "allowed: an integer >= 1"),
    (["train.dtype=fp8"], "allowed: bfloat16, float32"),
    (["train.remat=some"], "allowed: none, full, save_attn, offload"),
    (["strategy.layout=striped"], "allowed: contiguous, zigzag"),
    (["train.data.dtype=int8"], "allowed: uint16, uint32"),
    (["mesh.context=0"], 'allowed: an integer >= 1 or "auto"'),
    (["mesh.data=0"], "mesh.data=0 is out of range"),
    (["~model.vocab"], "model.vocab is missing"),
    (["+model.moe=true"], "model.moe is not a model key"),
    (["cluster.kind=k8s"], "allowed: local, local_multihost, fake_tpu, tpu, address"),
    (["cluster.platform=npu"], "allowed: cpu, gpu, tpu"),
    (["train.data.path=s3://b/tokens.bin", "train.data.kind=tokens"], "neither a local file nor a gs://"),
    (["train.data.path=gs://bucket-only", "train.data.kind=tokens"], "is not a gs://bucket/object"),
    (["tracking.experiment=''"], "tracking.experiment='' is empty"),
    (["dry_run=maybe"], "allowed: true or false"),
    (["gate.max_drop=1.5"], "<= 1"),
    (["+sweep=smoke", "+sweep.axes.progress=[plain,rich]"], "sweep axis 'progress' is a driver option"),
    # the same kinds of check elsewhere
    (["+sweep=smoke", "train.lr=-1"], "(grid point strategy=all_gather context_length=512; 3 more of 4"),
    (["+sweep=smoke", "+sweep.axes.train.steps=[4,0]"], "train.steps=0 is out of range (grid point"),
    (["+cluster.gpus=8"], "cluster.gpus is not a cluster key"),
    (["+foo=1"], "foo is not a config key"),
    (["train.steps=abc"], "has the wrong type"),
    (["strategy.kernel=cudnn"], "allowed: auto, xla, splash, flash"),
    (["+sweep=smoke", "+sweep.set.progress=plain"], "is a driver option, not a trial key"),
    # train.memory (tests/test_memory_policy.py has the rest of memory policies)
    (
        ["train.memory.save=[attn,mlp_act]"],
        "train.memory.save=['attn', 'mlp_act'] names 'attn', not an allowed "
        "value (the single trial); allowed: a list of layer_input, attn_out, mlp_act (each at most once) — e.g. "
        "train.memory.save=[mlp_act]",
    ),
    (["train.memory.host=[grads]"], "allowed: a list of optimizer, params"),
    (["train.memory.offload=attn_out"], "is not a list of names"),
    (["train.remat=none", "train.memory.save=[attn_out]"], "needs a remat policy, but train.remat=none"),
    (
        ["train.memory.save=[attn_out]", "train.memory.offload=[attn_out]"],
        "train.memory.offload also names it",
    ),
    (["train.remat=save_attn", "train.memory.offload=[attn_out]"], "train.remat=save_attn already saves it"),
    (["train.remat=auto", "train.memory.save=[attn_out]"], "is set with train.remat=auto, which chooses"),
    (["train.remat=fastest"], "allowed: none, full, save_attn, offload or auto"),
    (["budget.chip_hours=-1"], "budget.chip_hours=-1 is out of range"),
]


def _rejected(res, words: str) -> None:
    """Exit 2 with one line, `error: ...` saying `words`, on stderr and nothing else on either stream."""
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], res.stderr


@pytest.mark.parametrize("args, words", BAD_INPUT, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_bad_input_exits_2_before_launch(tmp_path, cli, args, words):
    _rejected(cli(args, cwd=tmp_path), words)
    assert list(tmp_path.iterdir()) == []  # nothing half-launched, not even a tracking store


def test_bad_input_is_rejected_before_ray_or_mlflow_loads(tmp_path, no_ray_no_mlflow):
    """Every BAD_INPUT case through `python -m orchestrator`'s main in one fresh interpreter whose ray and mlflow
    fail on import: each is rejected as in-process, so none got as far as importing either."""
    results = run_cli_each([args for args, _ in BAD_INPUT], tmp_path, env=no_ray_no_mlflow)
    for (_, words), res in zip(BAD_INPUT, results, strict=True):
        _rejected(res, words)
    assert list(tmp_path.iterdir()) == []


def test_specs_writes_each_runnable_point_as_jobs_train_reads_it(tmp_path, no_ray_no_mlflow):
    """specs=DIR, through `python -m orchestrator` with ray and mlflow failing on import: a file per runnable
    point, named by its trial id, its policy resolved (train.remat=auto is never in a file), a line for each
    file and for the point the planner rejects; then `python -m jobs.train FILE` runs one on CPU."""
    out = tmp_path / "specs"
    argv = ["-m", "context_length=256,512,1048576", "train.steps=2", "train.remat=auto", f"specs={out}"]
    res = run_cli(argv, cwd=tmp_path, timeout=300, env=no_ray_no_mlflow)
    assert res.returncode == 0, res.stderr
    files = sorted(out.glob("*.json"))
    specs = [TrialSpec.from_json(f.read_text()) for f in files]
    assert sorted(s.context_length for s in specs) == [256, 512]
    assert all(f.stem == s.trial_id and s.train.remat != "auto" for f, s in zip(files, specs, strict=True))
    lines = res.stdout.splitlines()
    assert sorted(ln.split(":")[0] for ln in lines if ln.startswith(str(out))) == [str(f) for f in files]
    (skipped,) = [ln for ln in lines if ln.startswith("skipped ")]
    assert "context_length=1048576" in skipped and "infeasible: predicted step" in skipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"]  # no tracking store, nothing else
    small = next(f for f, s in zip(files, specs, strict=True) if s.context_length == 256)
    run = subprocess.run(
        [sys.executable, "-m", "jobs.train", str(small)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=driver_env(),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    records = [json.loads(ln) for ln in run.stdout.splitlines() if ln.startswith("{")]
    assert [r["kind"] for r in records] == ["start", "step", "step", "summary"]
    assert records[0]["trial_id"] == small.stem and math.isfinite(records[-1]["final_loss"])
