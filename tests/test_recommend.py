"""`recommend=true`: the fastest strategy x mesh x memory policy for one point, its command line, the losers."""

import json
import shlex
import time

import pytest
from drivers import run_cli

from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.plan import auto, policies
from orchestrator.plan.search import search

L14M = 14_680_064
POINT = ["model=llama3_1_8b_long", "cluster=tpu7x_128", f"context_length={L14M}"]


def point(words):
    return expand(load(words))[0]


@pytest.fixture(scope="module")
def tpu7x():
    s = point(POINT)
    return search(s.model, s.cluster, s.context_length, s.train, tail=POINT)


def test_tpu7x_14m_winner_offloads(tpu7x):
    win = tpu7x.top[0]
    assert win.row.predicted_mfu >= 0.45 and win.row.verdict == "run"
    assert win.policy.memory.offload and "train.remat=full" in win.command
    assert len(tpu7x.top) == 5
    steps = [c.row.predicted_step_s for c in tpu7x.top]
    assert all(
        a <= b * (1 + auto.TIE) for a, b in zip(steps[:-1], steps[1:], strict=True)
    )  # a tie: simpler first


def test_command_line_reproduces_the_winner(tpu7x):
    for c in tpu7x.top[:2]:
        words = shlex.split(c.command)[3:]  # past `python -m orchestrator`
        assert point(words).trial_id == c.spec.trial_id == c.row.trial_id


def test_losing_families_are_named(tpu7x):
    lines = "\n".join(tpu7x.losers)
    # all_gather's best is a zigzag layout (not its default), within the model's precision of the winner
    assert any(x.startswith("all_gather: a tie") and "layout zigzag" in x for x in tpu7x.losers), lines
    assert any(x.startswith("ulysses: invalid: heads per strategy") for x in tpu7x.losers), lines
    assert "policy no remat: does not fit" in lines and "policy recompute: slower by 1.8" in lines
    assert "beyond the bands" in lines


def test_policies_are_distinct_and_host_state_only_on_tpu():
    tpu, gpu = policies.candidates("tpu"), policies.candidates("gpu")
    assert len({p.key for p in tpu}) == len(tpu) and not any(p.memory.host for p in gpu)
    assert tpu[0].words() == ["train.remat=full"]
    assert any(p.words() == ["train.remat=offload"] for p in tpu)  # a preset, not its spelled-out twin


def test_one_14m_point_plans_fast():
    s = point(POINT)
    t = time.perf_counter()
    a = search(s.model, s.cluster, s.context_length, s.train)
    took = time.perf_counter() - t
    assert a.searched > 2000 and took < 5, took  # about 0.25 s on an idle CPU


def test_cli_json(tmp_path, no_ray_no_mlflow):
    res = run_cli(
        ["recommend=true", *POINT, "top=3", "output=json"], cwd=tmp_path, timeout=120, env=no_ray_no_mlflow
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["top"]) == 3 and out["top"][0]["predicted_mfu"] >= 0.45 and out["losers"]


def test_cli_table_fits_100_columns(tmp_path, no_ray_no_mlflow):
    """The answer in a 100-column terminal: each configuration's figures, policy, limiter, resources and its
    command line (continued with backslashes) on lines of their own, none wider than the terminal."""
    res = run_cli(
        ["recommend=true", *POINT], cwd=tmp_path, timeout=120, env={**no_ray_no_mlflow, "COLUMNS": "100"}
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "   python -m orchestrator strategy=" in out and "why the others lose" in out
    assert "uses: HBM" in out and "host RAM" in out and "MFU 0." in out
    assert max(len(line) for line in out.splitlines()) <= 100
    joined = out.replace(" \\\n", " ").replace("\\\n", "")
    assert "train.memory.offload=[layer_input,attn_out]' model=llama3_1_8b_long" in " ".join(joined.split())


@pytest.mark.parametrize(
    "args, words",
    [
        (["model=llama3_1_70b", "cluster=v5p_128", "context_length=29360128"], "nothing fits llama3_1_70b"),
        (["-m", "context_length=1024,2048"], "answers for one point"),
    ],
)
def test_cli_errors_exit_2(tmp_path, no_ray_no_mlflow, args, words):
    res = run_cli(["recommend=true", *args], cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.stderr


@pytest.mark.slow
def test_recommend_aot_compiles_the_listed_answers(tmp_path, local_ray, cli):
    """recommend=true aot=true: the top answers compiled for the TPU topology on the Ray pool (the session's
    local Ray, which the pool joins), in the JSON."""
    pytest.importorskip("libtpu")
    small = [
        "model=tiny",
        "cluster=tpu7x_128",
        "cluster.topology=2x2x1",
        "cluster.hosts=1",
        "cluster.address=",
        "context_length=4096",
    ]
    args = ["recommend=true", *small, "top=2", "aot=true", "aot_workers=2", "output=json", "progress=plain"]
    res = cli(args, cwd=tmp_path, env={"CP_AOT_CACHE": str(tmp_path / "aot")})
    assert res.returncode == 0, res.stderr[-3000:]
    top = json.loads(res.stdout)["top"]
    assert len(top) == 2 and all(
        t["aot"]["status"] == "compiled" and t["aot"]["verdict"] == "run" for t in top
    )
    assert all(t["aot"]["compiled_bytes"] > 0 for t in top)
    assert len(list((tmp_path / "aot").glob("*.json"))) == 2  # cached by program, for the next user
