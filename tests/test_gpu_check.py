"""The prepared GPU check (benchmarks/gpu_check.py) on this CPU host: its dry run exercises every section's
plumbing (flash falls back to xla and says why), a spent budget skips instead of failing, and --compare puts
the planner beside each trial."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import gpu_check, gpu_check_common
from benchmarks.gpu_check_packed import documents, stats_readings
from benchmarks.gpu_check_parity import ring_hops
from jobs.spec import ModelSpec, TrialSpec

ROOT = Path(__file__).resolve().parent.parent
CPU_REFUSAL = "cuDNN refuses it: "  # flash.refusal on a host without cuDNN


def test_constants_match_their_sources():
    """The script restates two values it cannot import on the GPU machine: they must not drift."""
    from tests.test_attention import BF16_TOL

    assert gpu_check_common.BF16_TOL == BF16_TOL
    tiny = yaml.safe_load((ROOT / "conf/model/tiny.yaml").read_text())
    assert gpu_check_common.TINY == ModelSpec(**tiny)
    assert 1.0e9 < gpu_check_common.ONE_B.n_params() < 1.3e9  # the "~1B" model


def test_packed_probe_reads_cudnn_statistics_under_both_layouts():
    """The probe's two readings of cuDNN's packed statistics [M, N, T] each recover the per-token lse."""
    seg, offsets, lengths = documents(64, 3)
    assert seg.shape == (1, 64) and offsets[0, 0] == 0 and offsets[0, -1] == 64 and lengths.sum() == 64
    assert list(np.unique(seg)) == [1, 2, 3] and (lengths > 0).all()
    lse = np.random.default_rng(0).normal(size=(1, 64, 2))  # [B, L, N]
    by_row, by_seg = np.zeros((3, 2, 64)), np.zeros((3, 2, 64))
    for m in range(3):
        for t in range(offsets[0, m], offsets[0, m + 1]):
            by_row[m, :, t], by_seg[m, :, t - offsets[0, m]] = lse[0, t], lse[0, t]
    assert np.allclose(stats_readings(by_row, offsets, lengths)["row_index"], lse)
    assert np.allclose(stats_readings(by_seg, offsets, lengths)["segment_index"], lse)
    assert not np.allclose(stats_readings(by_seg, offsets, lengths)["row_index"], lse)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_hops_cover_the_causal_triangle_once(n, zigzag):
    """Every (query chunk, key chunk) pair at or below the diagonal exactly once, none above it; the diagonal
    chunks only in causal hops."""
    chunks, hops = ring_hops(n, zigzag)
    assert chunks == (2 * n if zigzag else n)
    seen = [(i, j, causal) for qi, ki, causal in hops for i in qi for j in ki]
    visible = [(i, j) for i, j, causal in seen if not causal or j <= i]
    assert sorted(visible) == [(i, j) for i in range(chunks) for j in range(i + 1)]
    assert all(causal for i, j, causal in seen if i == j)


def test_a_spent_budget_skips_and_keeps_every_section(tmp_path, capsys):
    """--budget-s 0: the kernels process is killed, every trial is "skipped: time", the JSON has it all."""
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(gpu_check_common.SECTIONS) <= set(data)
    assert str(data["meta"]["kernels_process"]).startswith("killed")
    for sec in ("env", "parity", "speed"):
        assert "error" in data[sec] or data[sec]["items"]
    for sec in ("trials", "host_memory"):
        assert data[sec]["items"] and all(it["skipped"] == "time" for it in data[sec]["items"].values())
    assert "skipped: time" in capsys.readouterr().out


# A stand-in for benchmarks/gpu_check_kernels.py whose process dies in its second item the first time.
DYING_CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from benchmarks.gpu_check_common import Recorder
out = sys.argv[sys.argv.index("--out") + 1]
rec = Recorder(out, time.time(), 1e9)
rec.run("env", "env", lambda: {{"private_api": {{"ok": True}}}})
def dies_once():
    if not os.path.exists(out + ".died"):
        open(out + ".died", "w").close()
        os._exit(139)
    return {{}}
rec.run("parity", "dies", dies_once)
rec.run("parity", "after", lambda: {{"max_error": 0.0}})
rec.run("speed", "last", lambda: {{"tflops": 1.0}})
"""


def test_a_dying_kernels_process_costs_only_its_item(tmp_path, monkeypatch):
    """The item a crashed child was running is recorded as lost; a second child goes on after it."""
    fake = tmp_path / "child.py"
    fake.write_text(DYING_CHILD.format(root=str(ROOT)))
    monkeypatch.setattr(gpu_check, "KERNELS", fake)
    rec = gpu_check_common.Recorder(tmp_path / "gpu_check.json", time.time(), 1e9)
    rec.data["meta"] = {}
    gpu_check.run_kernels(rec, dry_run=True)
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["meta"]["kernels_process"] == [139, 0] and "running" not in data
    assert data["parity"]["items"]["dies"]["error"] == "the kernels process ended during this item (139)"
    assert (
        data["parity"]["items"]["after"]["max_error"] == 0.0
        and data["speed"]["items"]["last"]["tflops"] == 1.0
    )
    assert list(data["env"]["items"]) == ["env"]


@pytest.mark.slow
def test_dry_run_then_compare(tmp_path, capsys):
    """Every section's figures on CPU, within the bf16 tolerance, fallbacks named; then the planner."""
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "100000"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["meta"]["dry_run"] and data["meta"]["kernels_process"] == 0
    env = data["env"]["items"]["env"]
    assert env["backend"] == "cpu" and env["private_api"] == {"ok": True, "failed": {}}
    parity = data["parity"]["items"]
    assert {
        "merge_contiguous",
        "merge_zigzag",
        "merge_contiguous_d256",
        "ring_zigzag",
        "usp_contiguous",
    } <= set(parity)
    # no cuDNN on a CPU: the packed-layout probe records why, and the rest goes on
    assert "cuDNN is not detected" in parity.pop("packed_layout_probe")["error"]
    for key, it in parity.items():
        assert it["within_tol"] and it["max_error"] < gpu_check_common.BF16_TOL, (key, it)
        assert not it["flash_ran"] and it["fallbacks"][0].startswith(CPU_REFUSAL), (key, it)
    speed = data["speed"]["items"]
    assert len(speed) == 2 * (len(gpu_check_common.DRY.speed_L) + 1)
    for key, it in speed.items():
        assert it["tflops"] > 0 and len(it["times_s"]) == 5, (key, it)
        assert bool(it["fallbacks"]) == (it["kernel"] == "flash"), (key, it)
    trials = {**data["trials"]["items"], **data["host_memory"]["items"]}
    assert list(trials) == ["tiny", "big", "host_state", "offload_layer_input"]
    for key, it in trials.items():
        assert "error" not in it, (key, it.get("error"))
        assert it["steps_run"] == gpu_check_common.DRY.steps and it["step_time_median_s"] > 0, key
        assert it["compiled_bytes_per_device"] > 0 and it["planner_bytes"] > 0, key
        assert it["kernel_fallbacks"] and it["kernel_fallbacks"][0].startswith(CPU_REFUSAL), key
        spec = TrialSpec.from_json(it["spec"])
        assert spec.cluster.name == "h200_1" and spec.strategy.kernel == "flash"
    assert TrialSpec.from_json(trials["host_state"]["spec"]).train.memory.host == ("optimizer", "params")
    assert trials["host_state"]["vs_big"]["compiled_bytes_per_device"] > 0
    table = capsys.readouterr().out
    assert "merge_zigzag" in table and "offload_layer_input" in table

    assert gpu_check.main(["--compare", str(tmp_path / "gpu_check.json"), "--out", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in ("trials/tiny", "trials/big", "host_memory/host_state", "host_memory/offload_layer_input"):
        (row,) = [line for line in lines if line.startswith(name + " ")]
        assert row.rstrip().endswith(("MiB", "GiB")), row  # the planner's bytes, last column
    compared = json.loads((tmp_path / "c" / "gpu_check_compare.json").read_text())
    assert compared["trials"]["items"]["big"]["planner_step_s"] > 0
