"""The regression gate on runs written straight into a store, plus one CLI check once train.py has the knob."""

import time

import pytest
from conftest import run_cli
from mlflow import MlflowClient
from rich.console import Console

from orchestrator import regress

EXP = "cp_scaling"
POINTS = [("all_gather", 512, "t-ag-512"), ("ring", 512, "t-ring-512"), ("ring", 1024, "t-ring-1024")]


def log_sweep(client: MlflowClient, sweep_id: str, scale: dict[str, float] | None = None, status="finished"):
    """A parent run and finished child runs as the Tracker writes them; `scale` slows chosen trials down."""
    exp = client.get_experiment_by_name(EXP)
    eid = exp.experiment_id if exp else client.create_experiment(EXP)
    parent = client.create_run(eid, tags={"kind": "sweep", "sweep_id": sweep_id}, run_name=sweep_id)
    for strategy, length, tid in POINTS:
        s = (scale or {}).get(tid, 1.0)
        tags = {"kind": "trial", "trial_id": tid, "sweep_id": sweep_id, "status": status,
                "mlflow.parentRunId": parent.info.run_id}  # fmt: skip
        run = client.create_run(eid, tags=tags)
        rid = run.info.run_id
        for k, v in {"strategy": strategy, "context_length": length, "mesh": "context8"}.items():
            client.log_param(rid, k, v)
        client.log_metric(rid, "final_mfu", 0.2 * s)
        client.log_metric(rid, "final_tokens_per_s", 1000.0 * length / 512 * s)
        client.log_metric(rid, "final_step_time_median_s", 0.5 / s)
        client.log_metric(rid, "memory_bytes_per_device", 2**28)
        client.set_terminated(rid)
        time.sleep(0.01)  # distinct start times: "previous" is by start time
    return parent.info.run_id


@pytest.fixture
def client(store):
    return MlflowClient(store)


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=200)  # noqa: SIM115


def test_first_sweep_has_no_baseline(client, store):
    log_sweep(client, "s1")
    res = regress.compare(client, client.get_experiment_by_name(EXP).experiment_id, "s1")
    assert res.changes == [] and len(res.new) == 3 and not res.regressions
    assert regress.gate(store, EXP, "s1", console=quiet()) == 0


def gate_text(result: regress.GateResult) -> str:
    console = Console(record=True, width=220, file=open("/dev/null", "w"))  # noqa: SIM115
    regress.render(result, console)
    return console.export_text()


def test_all_new_sweep_prints_one_line():
    result = regress.GateResult("s1", 0.10, [], new=[f"ring L={512 * 2**i} context8" for i in range(20)])
    text = gate_text(result)
    assert text.strip().splitlines() == [
        "regression gate: no earlier run of any of the 20 trials to compare with; this sweep is the baseline"
    ]
    assert "baseline sweep" not in text and "ring L=512" not in text  # no empty table, no list of names


def test_new_trials_are_counted_under_the_table():
    ok = regress.Change("t1", "ring L=512 context8", "s1", {"final_mfu": (0.2, 0.21)})
    result = regress.GateResult("s2", 0.10, [ok], new=["ring L=1024 context8", "ring L=2048 context8"])
    text = gate_text(result)
    assert "ring L=512 context8" in text and "ok" in text  # the compared trial keeps its table row
    assert "2 new trials not compared" in text and "L=1024" not in text and "L=2048" not in text


def test_unchanged_sweep_passes_and_is_tagged(client, store):
    log_sweep(client, "s1")
    parent = log_sweep(client, "s2", {"t-ring-512": 0.95})  # a 5% wobble is under the 10% threshold
    assert regress.gate(store, EXP, "s2", max_drop=0.10, console=quiet()) == 0
    tags = client.get_run(parent).data.tags
    assert tags["regression"] == "false" and "no drop beyond 10%" in tags["regression_summary"]


def test_slowdown_trips_gate_and_tags_parent(client, store):
    log_sweep(client, "s1")
    parent = log_sweep(client, "s2", {"t-ring-1024": 0.7})
    res = regress.compare(client, client.get_experiment_by_name(EXP).experiment_id, "s2", 0.10)
    [bad] = res.regressions
    assert bad.trial_id == "t-ring-1024" and bad.baseline_sweep == "s1"
    assert set(bad.dropped) == {"final_mfu", "final_tokens_per_s"}
    assert bad.delta("final_mfu") == pytest.approx(-0.3)
    assert regress.gate(store, EXP, "s2", 0.10, console=quiet()) == regress.EXIT_REGRESSION == 3
    tags = client.get_run(parent).data.tags
    assert tags["regression"] == "true" and "ring L=1024" in tags["regression_summary"]
    assert regress.gate(store, EXP, "s2", max_drop=0.5, console=quiet()) == 0  # the threshold is configurable


def test_baseline_is_the_latest_earlier_finished_run(client, store):
    log_sweep(client, "s1", {"t-ring-512": 0.5})
    log_sweep(client, "s2")
    log_sweep(client, "s3", {"t-ring-512": 0.1}, status="failed")  # not finished: never a baseline
    log_sweep(client, "s4", {"t-ring-512": 0.6})
    eid = client.get_experiment_by_name(EXP).experiment_id
    res = regress.compare(client, eid, "s4", 0.10)
    assert {c.baseline_sweep for c in res.changes} == {"s2"}
    assert [c.trial_id for c in res.regressions] == ["t-ring-512"]
    # an older sweep compares with what came before it, not after
    assert regress.compare(client, eid, "s2", 0.10).regressions == []


def test_table_shows_changes(client, store):
    log_sweep(client, "s1")
    log_sweep(client, "s2", {"t-ag-512": 0.5})
    console = Console(record=True, width=220)
    regress.gate(store, EXP, "s2", console=console, tag=False)
    text = console.export_text()
    assert "REGRESSED" in text and "all_gather L=512" in text and "-50.0%" in text


def test_standalone_cli(client, store, capsys):
    log_sweep(client, "s1")
    log_sweep(client, "s2", {"t-ring-512": 0.8})
    assert regress.main(["s2", "--uri", store, "--no-tag"]) == 3
    assert "REGRESSED" in capsys.readouterr().out
    assert regress.main(["s2", "--uri", store, "--max-drop", "0.3"]) == 0


ONE_TRIAL = [
    "+sweep=smoke",
    "progress=plain",
    "sweep.axes.strategy=[all_gather]",
    "sweep.axes.context_length=[512]",
]


@pytest.mark.slow
def test_cli_gate_exit_code(tmp_path):
    """A baseline and a slowed-down sweep of one trial through the real CLI (an unchanged sweep passing is
    test_unchanged_sweep_passes_and_is_tagged, in-process)."""
    base = run_cli(ONE_TRIAL + ["sweep.id=base"], cwd=tmp_path)
    assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-3000:]
    slow = run_cli(ONE_TRIAL + ["sweep.id=slow"], cwd=tmp_path, env={"CP_ORCH_INJECT_SLEEP_S": "2"})
    assert slow.returncode == 3, slow.stdout[-3000:] + slow.stderr[-3000:]
    assert "REGRESSED" in slow.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    eid = client.get_experiment_by_name(EXP).experiment_id
    [parent] = client.search_runs([eid], "tags.sweep_id = 'slow' and tags.kind = 'sweep'")
    assert parent.data.tags["regression"] == "true"
