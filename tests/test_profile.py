"""Profiles (run.profile_steps): a real jax.profiler trace on 8 simulated CPU devices read into a step breakdown,
a profiled trial's trace record, and the files and metrics it leaves on the trial's MLflow run."""

import dataclasses
import gzip
import json
import os
import tempfile
import time
import typing

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.profile import breakdown
from jobs.profile.trace import PERFETTO
from jobs.records import ProfileRecord, parse
from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.config.schema import ConfigError
from orchestrator.plan.steptime import StepTime
from orchestrator.tracking import mlflow_names

# tiny model, K,V gathered over 8 devices (all_gather compiles in half ring's time); a pinned peak spares
# each attempt the CPU matmul probe
TRIAL = [
    "strategy=all_gather",
    "context_length=256",
    "train.steps=4",
    "cluster.peak_tflops_per_device=0.01",
    "run.profile_steps=[2]",
]


def _traced(f, *args):
    """(trace, the compiled program's text, wall time of the traced call) of one warm call of `f`."""
    compiled = jax.jit(f).lower(*args).compile()
    jax.block_until_ready(compiled(*args))  # warm: the trace holds one plain execution
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        wall = time.perf_counter() - t0
        jax.profiler.stop_trace()
        (path,) = [os.path.join(r, PERFETTO) for r, _, names in os.walk(d) if PERFETTO in names]
        return breakdown.load(path), compiled.as_text(), wall


def test_a_real_trace_of_a_gather_a_matmul_and_attention_adds_up_to_its_wall_time():
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.device_put(np.ones((8 * 128, 128), np.float32), NamedSharding(mesh, P("d")))

    def step(x):
        full = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))  # an all-gather over 8 devices
        y = x @ full.T[:, :128]
        with jax.named_scope(breakdown.ATTENTION_SCOPE):  # as jobs/attention/api.py marks its kernels
            y = jax.nn.softmax(y @ y.T, axis=-1) @ y
        return y

    trace, hlo, wall = _traced(step, x)
    module, cats = breakdown.hlo_categories(hlo)
    assert module == "jit_step" and "all_gather" in cats.values() and "attention" in cats.values()
    b = breakdown.breakdown(trace, hlo)
    print({k: f"{v * 1e3:.3f} ms" for k, v in b.seconds.items()}, f"step {b.step_s * 1e3:.3f} ms")
    assert b.devices == 8 and b.steps == 1 and set(b.seconds) == set(breakdown.CATEGORIES)
    assert b.seconds["all_gather"] > 0 and b.seconds["matmul"] > 0 and b.seconds["attention"] > 0
    assert abs(sum(b.seconds.values()) - b.step_s) <= 1e-9 + 1e-6 * b.step_s  # idle closes the sum
    assert 0 < b.step_s <= wall  # the device ops of one call fit inside the host's wall time of it
    collectives = sum(b.seconds[c] for c in breakdown.COLLECTIVES)
    assert 0 < collectives <= b.collective_exposed_s + b.collective_overlapped_s + 1e-9
    assert b.limiter().endswith("of the step")
    by_name = breakdown.breakdown(trace)  # without the module's text: the op names alone
    assert by_name.seconds["all_gather"] == pytest.approx(b.seconds["all_gather"])
    assert by_name.seconds["attention"] == 0  # the named scope lives only in the module's metadata


def test_exposed_and_overlapped_collective_time_on_one_device():
    """µs: an all-gather 0-10 with a dot 5-8 beside it, then a while loop 10-20 whose body runs a fusion 12-14."""
    ops = [("all-gather.1", 0, 10), ("dot.2", 5, 3), ("while.3", 10, 10), ("fusion.4", 12, 2)]
    events = [
        {
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
            "name": n,
            "args": {"hlo_op": n, "device_ordinal": "0"},
        }
        for n, ts, dur in ops
    ]
    b = breakdown.breakdown({"traceEvents": events})
    s = {k: v * 1e6 for k, v in b.seconds.items() if v * 1e6 > 1e-6}  # µs, the categories that got any
    assert s == pytest.approx({"all_gather": 5 + 1.5 + 2, "matmul": 1.5, "other_compute": 2 + 2 + 6})
    assert b.collective_exposed_s * 1e6 == pytest.approx(
        7
    ) and b.collective_overlapped_s * 1e6 == pytest.approx(3)
    assert b.step_s * 1e6 == pytest.approx(20) and b.limiter() == "other compute 50% of the step"


def test_profile_keys_are_checked_and_stay_out_of_the_trial_id():
    plain, traced = (expand(load([*TRIAL[:4], *more]))[0] for more in ([], ["run.profile_steps=[1,2]"]))
    assert traced.run.profile_steps == (1, 2) and traced.trial_id == plain.trial_id
    with pytest.raises(ConfigError, match=r"run.profile_steps=\[0, 2\] names step 0, the warm-up"):
        expand(load([*TRIAL[:4], "run.profile_steps=[0,2]"]))
    with pytest.raises(ConfigError, match=r"names a step past the last .* steps 1 to train.steps - 1 = 3"):
        expand(load([*TRIAL[:4], "run.profile_steps=[4]"]))
    with pytest.raises(ConfigError, match="allowed: first, all"):
        expand(load(["run.profile_hosts=some"]))


def test_every_category_and_planner_term_has_its_metric_name():
    assert set(breakdown.CATEGORIES) <= set(mlflow_names.MEASURED)
    assert all(
        name == f"measured/{k}" + ("" if k.endswith("_s") else "_s")
        for k, name in mlflow_names.MEASURED.items()
    )
    fields = {
        f.name for f in dataclasses.fields(StepTime) if typing.get_type_hints(StepTime)[f.name] is float
    }
    assert set(mlflow_names.PREDICTED) <= fields and all(
        v == f"predicted/{k}" for k, v in mlflow_names.PREDICTED.items()
    )


def test_a_profiled_trial_traces_its_step_and_resumes_without_the_trace(tmp_path):
    run = [
        "run.checkpoint_every=3",
        f"run.checkpoint_dir={tmp_path / 'ckpt'}",
    ]  # a save right after the trace
    spec = expand(load([*TRIAL, *run]))[0]
    recs = [r.to_dict() for r in train(spec)]  # the form a Ray batch carries
    kinds = [(r["kind"], r.get("step", r.get("first_step"))) for r in recs]
    assert kinds[1:6] == [("step", 0), ("step", 1), ("step", 2), ("profile", 2), ("step", 3)], kinds
    steps = {r["step"]: r for r in recs if r["kind"] == "step"}
    assert [s.get("profiled") for s in steps.values()] == [None, None, True, None]  # left out unless traced
    assert all("bytes_in_use" not in s for s in steps.values())  # CPU keeps no memory counters
    summary = recs[-1]
    assert summary["step_time_median_s"] == pytest.approx(
        np.median([steps[1]["step_time_s"], steps[3]["step_time_s"]])
    )

    p = parse(next(r for r in recs if r["kind"] == "profile"))
    assert isinstance(p, ProfileRecord) and (p.first_step, p.last_step, p.process, p.devices) == (2, 2, 0, 8)
    files = p.file_bytes()
    assert json.loads(gzip.decompress(files[PERFETTO]))["traceEvents"]
    assert any(n.endswith(".xplane.pb") and len(b) > 1000 for n, b in files.items()), list(files)
    assert p.note == "" and abs(sum(p.seconds.values()) - p.step_s) < 1e-6
    assert p.seconds["all_gather"] > 0 and p.seconds["attention"] > 0 and p.seconds["matmul"] > 0
    # the host's step ends when the loss is ready on one device, the trace's when the last device is done
    assert 0 < p.step_s <= 1.1 * steps[2]["step_time_s"]

    # resumes after the save at step 2: its history carries no trace
    again = [r.to_dict() for r in train(spec)]
    print(f"compile {recs[0]['compile_s']:.1f} s, resumed {again[0]['compile_s']:.1f} s")
    assert [r["kind"] for r in again] == ["start", "step", "step", "step", "step", "summary"]
    assert again[0]["resumed_from_step"] == 3 and again[3].get("profiled") is True


@pytest.mark.slow
def test_a_profiled_cli_trial_puts_its_trace_and_breakdown_on_its_run(tmp_path, local_ray, store, cli):
    import mlflow_lookup

    res = cli([*TRIAL, "progress=plain", "gate.enabled=false"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = mlflow_lookup.client(tmp_path)
    run = mlflow_lookup.trial(client)
    rid, metrics, tags = run.info.run_id, run.data.metrics, run.data.tags
    folder = "profile/plugins/profile/steps_2-2.process_0"
    names = {os.path.basename(a.path) for a in client.list_artifacts(rid, folder)}
    assert PERFETTO in names and any(n.endswith(".xplane.pb") for n in names), names
    assert {"measured/step_s", "measured/all_gather_s", "measured/idle_s"} <= set(metrics)
    assert mlflow_lookup.steps(client, rid, "measured/step_s") == [2]
    assert metrics["measured/all_gather_s"] > 0 and metrics["measured/attention_s"] > 0
    assert sum(metrics[mlflow_names.MEASURED[c]] for c in breakdown.CATEGORIES) == pytest.approx(
        metrics["measured/step_s"]
    )
    assert metrics["predicted/step_s"] == pytest.approx(metrics["predicted_step_time_s"])
    assert set(mlflow_names.PREDICTED.values()) <= set(metrics)
    assert tags["measured_limiter"].endswith("of the step") and "of the step" in tags["predicted_limiter"]
    log = mlflow_lookup.artifact_text(client, run, "trial_log.txt", tmp_path)
    # the breakdown joins the trial's records (the end-of-sweep plot reads it); its files went to artifacts only
    (prof,) = [json.loads(ln) for ln in log.splitlines() if ln.startswith('{"kind": "profile"')]
    assert prof["files"] == {} and prof["seconds"]["all_gather"] == pytest.approx(
        metrics["measured/all_gather_s"]
    )
    losses = client.get_metric_history(rid, "loss")
    assert len(losses) == 4 and "final_step_time_median_s" in metrics
