"""The regression gate on runs written straight into a store, plus one CLI check once train.py has the knob."""

import time

import mlflow_lookup
import pytest
from mlflow import MlflowClient
from rich.console import Console

from orchestrator.results import gate

POINTS = [("all_gather", 512, "t-ag-512"), ("ring", 512, "t-ring-512"), ("ring", 1024, "t-ring-1024")]


def log_sweep(
    client: MlflowClient,
    sweep_id: str,
    scale: dict[str, float] | float = 1.0,
    status="finished",
    peak: float | None = None,
    mfu: float = 1.0,
    **tags: str,
):
    """A parent run and finished child runs as the Tracker writes them; `scale` slows chosen trials down (a
    float: all of them), `tags` go on each child (planned="true")."""
    exp = client.get_experiment_by_name(mlflow_lookup.EXPERIMENT)
    eid = exp.experiment_id if exp else client.create_experiment(mlflow_lookup.EXPERIMENT)
    parent = client.create_run(eid, tags={"kind": "sweep", "sweep_id": sweep_id}, run_name=sweep_id)
    for strategy, length, tid in POINTS:
        s = scale if isinstance(scale, float) else scale.get(tid, 1.0)
        child = {
            "kind": "trial",
            "trial_id": tid,
            "sweep_id": sweep_id,
            "status": status,
            "mlflow.parentRunId": parent.info.run_id,
            **tags,
        }
        run = client.create_run(eid, tags=child)
        rid = run.info.run_id
        for k, v in {"strategy": strategy, "context_length": length, "mesh": "context8"}.items():
            client.log_param(rid, k, v)
        client.log_metric(rid, "final_mfu", 0.2 * s * mfu)
        if peak is not None:  # what the trial divided its MFU by
            client.log_metric(rid, "peak_tflops_per_device", peak)
        client.log_metric(rid, "final_tokens_per_s", 1000.0 * length / 512 * s)
        client.log_metric(rid, "final_step_time_median_s", 0.5 / s)
        client.log_metric(rid, "memory_bytes_per_device", 2**28)
        client.set_terminated(rid)
        time.sleep(0.01)  # distinct start times: "previous" is by start time
    return parent.info.run_id


@pytest.fixture
def client(store):
    return mlflow_lookup.client(store)


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=200)  # noqa: SIM115


def test_first_sweep_has_no_baseline(client, store):
    log_sweep(client, "s1")
    res = gate.compare(client, mlflow_lookup.experiment_id(client), "s1")
    assert res.changes == [] and len(res.new) == 3 and not res.regressions
    assert gate.gate(store, mlflow_lookup.EXPERIMENT, "s1", console=quiet()) == 0


def gate_text(result: gate.GateResult) -> str:
    console = Console(record=True, width=220, file=open("/dev/null", "w"))  # noqa: SIM115
    gate.render(result, console)
    return console.export_text()


def test_all_new_sweep_prints_one_line():
    result = gate.GateResult("s1", 0.10, [], new=[f"ring L={512 * 2**i} context8" for i in range(20)])
    text = gate_text(result)
    assert text.strip().splitlines() == [
        "regression gate: no earlier run of any of the 20 trials to compare with; this sweep is the baseline"
    ]
    assert "baseline sweep" not in text and "ring L=512" not in text  # no empty table, no list of names


def test_new_trials_are_counted_under_the_table():
    ok = gate.Change("t1", "ring L=512 context8", "s1", {"final_mfu": (0.2, 0.21)})
    result = gate.GateResult("s2", 0.10, [ok], new=["ring L=1024 context8", "ring L=2048 context8"])
    text = gate_text(result)
    assert "ring L=512 context8" in text and "ok" in text  # the compared trial keeps its table row
    assert "2 new trials not compared" in text and "L=1024" not in text and "L=2048" not in text


def test_trials_with_other_baseline_runs_name_them_in_their_row():
    one = gate.Change("t1", "ring L=512 context8", "s1", {"final_mfu": (0.2, 0.21)})
    two = gate.Change(
        "t2", "ring L=1024 context8", "s2", {"final_mfu": (0.2, 0.2)}, baseline_sweeps=("s2", "s1")
    )
    result = gate.GateResult("s3", 0.10, [one, two])
    text = gate_text(result)
    assert "1: s1" in text and "2: s2, s1" in text and "newest first" not in text
    assert result.summary(detail=False).endswith(
        "1 trial vs the 1 run (sweep s1, band max_drop); 1 trial vs the median of 2 runs (sweeps s2, s1); "
        "band = max(10%, 1.5 × ± spread)"
    )


def test_the_drivers_trials_are_compared_and_only_their_baselines_read(client, monkeypatch):
    """The driver passes the trials it holds: the store is asked for their baseline runs, never for them."""
    log_sweep(client, "s1")
    eid = mlflow_lookup.experiment_id(client)
    now = int(time.time() * 1000) + 1
    measured = [
        gate.Measured(
            tid,
            "s2",
            strategy,
            length,
            "context8",
            "",
            now,
            {"final_mfu": 0.2 * s, "final_tokens_per_s": 1000.0 * length / 512 * s},
        )
        for (strategy, length, tid), s in zip(POINTS, (1.0, 1.0, 0.7), strict=True)
    ]
    filters = []
    search = client.search_runs
    monkeypatch.setattr(client, "search_runs", lambda ids, f, **kw: filters.append(f) or search(ids, f, **kw))
    res = gate.compare(client, eid, "s2", 0.10, measured=measured)  # no run of sweep s2 in the store
    assert [c.label for c in res.regressions] == ["ring L=1024 context8"]
    assert [c.baseline_sweep for c in res.changes] == ["s1"] * 3
    assert len(filters) == 3 and all("tags.sweep_id != 's2'" in f for f in filters)


def test_unchanged_sweep_passes_and_is_tagged(client, store):
    log_sweep(client, "s1")
    parent = log_sweep(client, "s2", {"t-ring-512": 0.95})  # a 5% wobble is under the 10% threshold
    assert gate.gate(store, mlflow_lookup.EXPERIMENT, "s2", max_drop=0.10, console=quiet()) == 0
    tags = client.get_run(parent).data.tags
    assert tags["regression"] == "false" and "no drop beyond 10%" in tags["regression_summary"]


def test_slowdown_trips_gate_and_tags_parent(client, store):
    log_sweep(client, "s1")
    parent = log_sweep(client, "s2", {"t-ring-1024": 0.7})
    res = gate.compare(client, mlflow_lookup.experiment_id(client), "s2", 0.10)
    [bad] = res.regressions
    assert bad.trial_id == "t-ring-1024" and bad.baseline_sweep == "s1"
    assert set(bad.dropped) == {"final_mfu", "final_tokens_per_s"}
    assert bad.delta("final_mfu") == pytest.approx(-0.3)
    assert (
        gate.gate(store, mlflow_lookup.EXPERIMENT, "s2", 0.10, console=quiet()) == gate.EXIT_REGRESSION == 3
    )
    tags = client.get_run(parent).data.tags
    assert tags["regression"] == "true" and "ring L=1024" in tags["regression_summary"]
    assert (
        gate.gate(store, mlflow_lookup.EXPERIMENT, "s2", max_drop=0.5, console=quiet()) == 0
    )  # the threshold is configurable


def test_baseline_is_the_median_of_the_window(client):
    for i, s in enumerate([1.0, 0.9, 1.1, 0.95, 1.05, 0.5], 1):  # s1 falls out of the window of 5
        log_sweep(client, f"s{i}", {"t-ring-512": s})
    log_sweep(client, "s7", {"t-ring-512": 0.97})
    eid = mlflow_lookup.experiment_id(client)
    res = gate.compare(client, eid, "s7", 0.10, window=5)
    ring = next(c for c in res.changes if c.trial_id == "t-ring-512")
    assert ring.baseline_sweeps == ("s6", "s5", "s4", "s3", "s2") and ring.baseline_sweep == "s6"
    assert ring.values["final_tokens_per_s"] == (pytest.approx(950.0), pytest.approx(970.0))  # median of 5
    assert ring.values["final_mfu"][0] == pytest.approx(0.19)
    assert ring.noise["final_tokens_per_s"] == pytest.approx((1100 - 500) / (2 * 950))  # s6's 0.5 is in it
    assert res.regressions == []


def test_window_takes_the_last_n_measured_runs_one_per_sweep(client):
    log_sweep(client, "s1", 0.5)
    log_sweep(client, "s2")
    log_sweep(client, "s3", 0.1, status="failed")  # not finished: never a baseline
    log_sweep(client, "s4")
    log_sweep(client, "s4", 0.2)  # a retried sweep's second finished run: its newest speaks for it
    log_sweep(client, "s4-plan", 0.1, planned="true")  # a prediction, never a measurement
    log_sweep(client, "s5", 0.6)
    eid = mlflow_lookup.experiment_id(client)
    two = gate.compare(client, eid, "s5", 0.10, window=2)
    assert {c.baseline_sweeps for c in two.changes} == {("s4", "s2")}
    assert two.changes[0].values["final_mfu"][0] == pytest.approx((0.2 * 0.2 + 0.2) / 2)
    assert {c.baseline_sweeps for c in gate.compare(client, eid, "s5", 0.10).changes} == {("s4", "s2", "s1")}
    # an older sweep compares with what came before it, not after
    assert {c.baseline_sweeps for c in gate.compare(client, eid, "s2", 0.10).changes} == {("s1",)}


NOISY = [1.15, 0.85, 1.0, 1.075, 0.925]  # five quiet reruns spread ±15 % about their median


def test_noise_widens_the_band_a_dip_inside_it_passes_a_real_drop_trips(client, store):
    for i, s in enumerate(NOISY, 1):
        log_sweep(client, f"s{i}", s)
    parent = log_sweep(client, "s6", {"t-ring-512": 0.88, "t-ring-1024": 0.70})  # a 12 % dip, a 30 % drop
    eid = mlflow_lookup.experiment_id(client)
    res = gate.compare(client, eid, "s6", 0.10, window=5, noise_k=1.5)
    dip, drop = (next(c for c in res.changes if c.trial_id == t) for t in ("t-ring-512", "t-ring-1024"))
    assert dip.noise["final_tokens_per_s"] == pytest.approx(0.15)
    assert dip.bands == {"final_mfu": pytest.approx(0.225), "final_tokens_per_s": pytest.approx(0.225)}
    assert dip.delta("final_tokens_per_s") == pytest.approx(-0.12) and not dip.dropped
    assert [c.trial_id for c in res.regressions] == ["t-ring-1024"]
    assert set(drop.dropped) == set(gate.GATED) and drop.delta("final_mfu") == pytest.approx(-0.30)
    # the old gate, max_drop alone, cries wolf at the dip
    assert len(gate.compare(client, eid, "s6", 0.10, noise_k=0).regressions) == 2
    # a quieter history keeps the band at max_drop: the same dip trips
    assert gate.band([1.0, 1.02, 0.98], 0.10, 1.5) == (pytest.approx(0.02), 0.10)
    assert gate.gate(store, mlflow_lookup.EXPERIMENT, "s6", console=quiet()) == gate.EXIT_REGRESSION
    summary = client.get_run(parent).data.tags["regression_summary"]
    assert summary.startswith("1 of 3 trials dropped beyond 22%: ring L=1024 context8: MFU -30% (band 22%)")
    assert "each vs the median of 5 runs (sweeps s5, s4, s3, s2, s1)" in summary
    assert "ring L=512 context8 1000 22.5%" in summary  # each trial's median and band


def test_a_single_earlier_run_uses_max_drop_and_says_so(client, store):
    log_sweep(client, "s1")
    log_sweep(client, "s2", {"t-ring-512": 0.88})
    res = gate.compare(client, mlflow_lookup.experiment_id(client), "s2", 0.10)
    [bad] = res.regressions
    assert bad.trial_id == "t-ring-512" and bad.bands == {m: 0.10 for m in gate.GATED}
    assert bad.baseline() == "1 run (sweep s1, band max_drop)"
    text = gate_text(res)
    assert "baseline runs, newest first: s1" in text and "10.0% (1 run)" in text
    assert "each vs the 1 run (sweep s1, band max_drop)" in text


def test_the_verdict_names_the_compared_sweeps(client, store):
    for i, s in enumerate([1.0, 1.1, 0.9], 1):
        log_sweep(client, f"s{i}", s)
    parent = log_sweep(client, "s4")
    console = Console(record=True, width=250, file=open("/dev/null", "w"))  # noqa: SIM115
    assert gate.gate(store, mlflow_lookup.EXPERIMENT, "s4", console=console) == 0
    text = console.export_text()
    assert "baseline runs, newest first: s3, s2, s1" in text and text.count("15.0% (±10.0%)") == 3
    assert "1000 → 1000 (+0.0%)" in text  # the median of 1000, 1100 and 900
    tags = client.get_run(parent).data.tags
    assert tags["regression"] == "false"
    assert tags["regression_summary"].startswith(
        "no drop beyond 15% in 3 compared trials; each vs the median of 3 runs (sweeps s3, s2, s1); "
        "band = max(10%, 1.5 × ± spread)"
    )


def test_table_shows_changes(client, store):
    log_sweep(client, "s1")
    log_sweep(client, "s2", {"t-ag-512": 0.5})
    console = Console(record=True, width=220)
    gate.gate(store, mlflow_lookup.EXPERIMENT, "s2", console=console, tag=False)
    text = console.export_text()
    assert "REGRESSED" in text and "all_gather L=512" in text and "-50.0%" in text


def test_standalone_cli(client, store, capsys):
    log_sweep(client, "s1")
    log_sweep(client, "s2", {"t-ring-512": 0.8})
    assert gate.main(["s2", "--uri", store, "--no-tag"]) == 3
    assert "REGRESSED" in capsys.readouterr().out
    assert gate.main(["s2", "--uri", store, "--max-drop", "0.3"]) == 0
    log_sweep(client, "s3", {"t-ring-512": 0.76})  # vs s1 (1.0) and s2 (0.8): median 0.9, ±11 %
    assert gate.main(["s3", "--uri", store, "--no-tag"]) == 0  # a 15.6 % drop, band 1.5 × 11 % = 16.7 %
    assert gate.main(["s3", "--uri", store, "--no-tag", "--noise-k", "1"]) == 3  # band 11 %
    assert (
        gate.main(["s3", "--uri", store, "--no-tag", "--noise-k", "1", "--window", "1"]) == 0
    )  # vs s2: -5 %


ONE_TRIAL = [
    "+sweep=smoke",
    "progress=plain",
    "sweep.axes.strategy=[all_gather]",
    "sweep.axes.context_length=[512]",
]


@pytest.mark.slow
def test_cli_gate_exit_code(tmp_path, local_ray, store, cli):
    """A baseline and a slowed-down sweep of one trial through the real CLI (an unchanged sweep passing is
    test_unchanged_sweep_passes_and_is_tagged, in-process)."""
    base = cli(ONE_TRIAL + ["sweep.id=base"], cwd=tmp_path)
    assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-3000:]
    slow = cli(ONE_TRIAL + ["sweep.id=slow"], cwd=tmp_path, env={"CP_ORCH_INJECT_SLEEP_S": "2"})
    assert slow.returncode == 3, slow.stdout[-3000:] + slow.stderr[-3000:]
    assert "REGRESSED" in slow.stdout
    [parent] = mlflow_lookup.runs(mlflow_lookup.client(tmp_path), "slow", "sweep")
    assert parent.data.tags["regression"] == "true"


def test_mfu_over_a_peak_each_run_measured_is_shown_not_gated(client):
    eid = lambda: mlflow_lookup.experiment_id(client)  # noqa: E731
    log_sweep(client, "s1", peak=0.10)
    log_sweep(client, "s2", peak=0.05, mfu=0.5)  # the CPU probe ran on a busy host: MFU halves, tokens/s not
    res = gate.compare(client, eid(), "s2")
    assert not res.regressions and all(c.unpegged for c in res.changes)
    assert all(
        "final_mfu" not in c.bands and c.delta("final_mfu") == pytest.approx(-0.5) for c in res.changes
    )
    assert "MFU not gated for 3 trials" in gate_text(res)
    log_sweep(client, "s3", peak=0.05, scale=0.6)  # a real slowdown still trips on tokens/s
    assert {tuple(c.dropped) for c in gate.compare(client, eid(), "s3", window=1).regressions} == {
        ("final_tokens_per_s",)
    }
    log_sweep(client, "s4", peak=459.0)  # a chip's spec-sheet peak, the same every run: MFU is gated
    log_sweep(client, "s5", peak=459.0, mfu=0.5)
    res = gate.compare(client, eid(), "s5", window=1)
    assert [c.dropped for c in res.regressions] == [["final_mfu"]] * 3 and not any(
        c.unpegged for c in res.changes
    )
