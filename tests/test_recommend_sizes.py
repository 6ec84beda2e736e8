"""The recommender's wider search: each strategy's layouts, and batch / grad_accum where the user allows them."""

import json
import shlex
from dataclasses import replace

import pytest
from drivers import run_cli

from orchestrator.config.grid import expand
from orchestrator.config.load import load
from orchestrator.plan import memory, steptime, work
from orchestrator.plan.search import search, sizes

L1M = 1_048_576
POINT = ["model=llama3_1_8b_long", "cluster=tpu7x_128", f"context_length={L1M}"]


def point(words):
    return expand(load(words))[0]


def per_token(c):
    return c.row.predicted_step_s / c.spec.train.batch


@pytest.fixture(scope="module")
def sized():
    s = point(POINT)
    return search(s.model, s.cluster, s.context_length, s.train, top=5, tail=POINT, batch=(1, 2, 4))


def test_sizes_smallest_microbatch_first_and_divisible():
    t = point(POINT).train
    assert sizes(t) == [(1, 1)]
    assert sizes(t, (1, 2, 4), (1, 2)) == [(1, 1), (2, 2), (2, 1), (4, 2), (4, 1)]  # (1, 2) does not divide


def test_a_larger_batch_wins_only_on_throughput(sized):
    s = point(POINT)
    plain = search(s.model, s.cluster, s.context_length, s.train, top=1)
    win = sized.top[0]
    # widening the search can only find something at least as fast per token as the point's own batch
    assert per_token(win) <= per_token(plain.top[0]) * 1.0001
    assert per_token(win) <= min(per_token(c) for c in sized.top) * 1.006  # ranked by per-token time (TIE)
    assert win.spec.train.batch > 1  # at 1M on tpu7x_128 a batch of 2 is predicted faster per token
    assert win.row.predicted_mfu > plain.top[0].row.predicted_mfu


def test_sized_command_lines_set_batch_and_reproduce_the_spec(sized):
    for c in sized.top[:2]:
        assert f"train.batch={c.spec.train.batch}" in c.command and "train.grad_accum=" in c.command
        assert point(shlex.split(c.command)[3:]).trial_id == c.spec.trial_id


def test_unsized_command_lines_leave_the_batch_alone():
    s = point(POINT)
    a = search(s.model, s.cluster, s.context_length, s.train, top=1, tail=POINT)
    assert "train.batch" not in a.top[0].command and a.top[0].spec.train.batch == 1


def test_layouts_are_searched():
    s = point(POINT)
    a = search(s.model, s.cluster, s.context_length, s.train, top=40)
    # all_gather's default is contiguous; zigzag balances its causal work, so its best layout is zigzag
    ag = [c for c in a.top if c.spec.strategy.name == "all_gather"] or None
    line = next(x for x in a.losers if x.startswith("all_gather"))
    assert (ag and ag[0].spec.strategy.layout == "zigzag") or "layout zigzag" in line, line


def test_grad_accum_is_priced(sized):
    s = point(POINT)
    one = replace(s, train=replace(s.train, batch=2, grad_accum=1))
    two = replace(one, train=replace(one.train, grad_accum=2))
    m1, m2 = memory.breakdown(one), memory.breakdown(two)
    assert m2["saved_activations"] * 2 == m1["saved_activations"]  # half the tokens per pass
    assert m2["batch"] == m1["batch"] and m2["grad_accumulator"] == m2["params"] > 0 == m1["grad_accumulator"]
    w1, w2 = work.step_work(one), work.step_work(two)
    assert w2.attention_ring_bytes == pytest.approx(w1.attention_ring_bytes)  # same tokens moved in total
    fsdp = replace(one, mesh=replace(one.mesh, fsdp=2, context=one.mesh.context // 2))
    f1, f2 = work.step_work(fsdp), work.step_work(replace(fsdp, train=two.train))
    assert f1.fsdp_bytes > 0 and f2.fsdp_bytes == pytest.approx(
        2 * f1.fsdp_bytes
    )  # gathers once per microbatch
    assert steptime.step_time(replace(fsdp, train=two.train)).step_s >= steptime.step_time(fsdp).step_s


def test_cli_search_json_and_bad_lists(tmp_path, no_ray_no_mlflow):
    args = ["recommend=true", *POINT, "train.batch=1", "search.batch=[1,2]", "top=2", "output=json"]
    res = run_cli(args, cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
    assert res.returncode == 0, res.stderr
    top = json.loads(res.stdout)["top"]
    assert top[0]["batch"] == 2 and top[0]["layout"] and top[0]["grad_accum"] == 1
    assert top[0]["command"].count("train.batch=") == 1  # the user's own train.batch=1 left out of the tail
    for bad in ("search.batch=[0,2]", "search.grad_accum=[2,2]", "search.batch=four"):
        res = run_cli(["recommend=true", *POINT, bad], cwd=tmp_path, timeout=120, env=no_ray_no_mlflow)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and bad.split("=")[0] in lines[0], res.stderr
