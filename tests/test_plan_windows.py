"""The planner prices each layer type apart: a window's or chunk's tiles, ring steps and halo, as the job runs them."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from jobs import strategies
from jobs.strategies.all_gather import halo_tokens
from jobs.strategies.base import BF16, GLOBAL_REACH, Reach, causal_scores, reach_hops, ring_steps, shard_runs
from orchestrator.config import grid
from orchestrator.config.load import load
from orchestrator.plan import memory, plan, plan_one, work

pytestmark = pytest.mark.usefixtures("pinned_cpu_peak")


def specs(*overrides: str):
    return grid.expand(load(["dry_run=true", *overrides]))


def dense_live(qpos: np.ndarray, kpos: np.ndarray, bq: int, bk: int, reach: Reach) -> int:
    """Score entries of every (bq x bk) tile, aligned to the ranges' starts, with a visible score: by brute force."""
    lo = np.array([reach.lo(int(q)) for q in qpos])
    see = (qpos[:, None] >= kpos[None, :]) & (kpos[None, :] >= lo[:, None])
    total = 0
    for i in range(0, len(qpos), bq):
        for j in range(0, len(kpos), bk):
            tile = see[i : i + bq, j : j + bk]
            total += tile.size if tile.any() else 0
    return total


def test_reach_is_the_data_planes_span_on_ints():
    from jobs.attention.span import Span

    for window, chunk in ((5, 0), (1, 0), (0, 7), (0, 1)):
        span, reach = Span(window or None, chunk or None), Reach(window, chunk)
        assert reach.lookback == span.lookback
        for q in range(40):
            assert reach.lo(q) == int(span.lo(np.int32(q)))
    assert Reach.of(4096, 0, 4096) == GLOBAL_REACH == Reach.of(0, 8192, 1024)
    assert Reach.of(1024, 0, 4096) == Reach(1024, 0)


def test_tile_counts_match_a_dense_mask():
    rng = random.Random(0)
    for _ in range(300):
        reach = rng.choice([GLOBAL_REACH, Reach(rng.randint(1, 40), 0), Reach(0, rng.randint(1, 40))])
        q0, k0 = rng.randint(0, 60), rng.randint(0, 60)
        nq, nk = rng.randint(1, 33), rng.randint(1, 33)
        bq, bk = rng.randint(1, 9), rng.randint(1, 9)
        want = dense_live(np.arange(q0, q0 + nq), np.arange(k0, k0 + nk), bq, bk, reach)
        assert causal_scores(q0, nq, k0, nk, bq, bk, reach) == want, (q0, nq, k0, nk, bq, bk, reach)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("reach", [Reach(5, 0), Reach(20, 0), Reach(0, 12)])
def test_ring_steps_are_the_busiest_devices_live_tiles(layout, reach):
    """Step s: device r attends the keys of device r - s; the step's cost is its busiest device's tiles, its
    calls the (query run, key run) pairs that run; every step but the last passes its block on."""
    P, Ll, bq, bk = 8, 8, 4, 4
    hops = reach_hops(P, Ll, layout, bq, bk, 100, reach)
    steps = [h for h in hops for _ in range(h.count)]
    n = ring_steps(P, Ll, layout, reach.lookback)  # contiguous: the ring stops at the last shard reached
    assert len(steps) == n == (P if layout == "zigzag" else {4: 2, 19: 4, 11: 3}[reach.lookback])
    for s, h in enumerate(steps):
        per = []
        for r in range(P):
            j = (r - s) % P
            pairs = [
                dense_live(np.arange(q0, q0 + nq), np.arange(k0, k0 + nk), bq, bk, reach)
                for (q0, nq), (k0, nk) in itertools.product(
                    shard_runs(r, P, Ll, layout), shard_runs(j, P, Ll, layout)
                )
            ]
            per.append((sum(pairs), sum(p > 0 for p in pairs)))
        assert h.scores == max(per)[0] and h.calls == max(c for _, c in per)
        assert h.mean_scores == pytest.approx(sum(t for t, _ in per) / P)
        assert h.send_bytes == (100 if s < n - 1 else 0)
    # the steps the ring does not run hold no visible score on any device
    for s in range(n, P):
        for r in range(P):
            for (q0, nq), (k0, nk) in itertools.product(
                shard_runs(r, P, Ll, layout), shard_runs((r - s) % P, P, Ll, layout)
            ):
                assert dense_live(np.arange(q0, q0 + nq), np.arange(k0, k0 + nk), bq, bk, reach) == 0


def test_a_short_window_runs_the_kernels_of_the_steps_it_reaches():
    x = memory.Local(B=1, Ll=1024, L=8192, P=8, U=1, R=8, T=1, S=8, hq=8, hkv=2, M=64, V=64, D=64)
    ring = strategies.get("ring")
    # contiguous: the own shard and the one before; zigzag: the own step and both neighbours' (steps 1 and P-1)
    sched = ring.schedule(x, "contiguous", 512, 512, Reach(300, 0))
    assert [h.count for h in sched.hops if h.scores] == [1, 1] and sched.steps == 2  # then it stops rotating
    assert ring.comm_bytes(x, Reach(300, 0), "contiguous")[1] == ring.comm_bytes(x)[1] // 7  # 1 send of 7
    assert strategies.get("double_ring").schedule(x, "contiguous", 512, 512, Reach(300, 0)).steps == 8
    zig = ring.schedule(x, "zigzag", 512, 512, Reach(300, 0))
    assert sum(h.count for h in zig.hops if h.scores) == 3 and zig.hops[-1].scores > 0
    glob = ring.schedule(x, "zigzag", 512, 512)
    assert zig.scores() < glob.scores() / 3  # whole 512-key tiles: a 300-token window costs up to 2 per row


def test_all_gather_fetches_a_windows_halo_only_in_the_contiguous_layout():
    x = memory.Local(B=1, Ll=1024, L=8192, P=8, U=1, R=8, T=1, S=8, hq=8, hkv=2, M=64, V=64, D=64)
    ag, reach = strategies.get("all_gather"), Reach(300, 0)
    h = halo_tokens(reach.lookback, "contiguous", 8, 1024, 512)
    assert h == 512  # 299 keys back, rounded up to the shard's 512-key block
    assert ag.comm_bytes(x, reach, "contiguous", 512) == (2 * h * x.kv_token * BF16, 0)
    assert ag.comm_bytes(x, reach, "zigzag", 512) == ag.comm_bytes(x)  # the whole gather
    assert ag.schedule(x, "contiguous", 512, 512, reach).gather_group == 2  # one neighbour, not the group
    halo, whole = (ag.attention_bytes(x, 512, 512, reach, lay) for lay in ("contiguous", "zigzag"))
    assert halo < whole == ag.attention_bytes(x, 512, 512)
    assert halo_tokens(reach.lookback, "contiguous", 2, 1024, 512) == 0  # a halo of P-1 shards: gather


def test_gemma_prices_its_local_layers_apart_and_says_so():
    (spec,) = specs("model=gemma3_27b", "cluster=tpu7x_128", "context_length=1048576", "strategy=usp")
    w = work.step_work(spec)
    kinds = {k: (sched, n) for k, sched, n in w.attention_layers()}
    assert set(kinds) == {"local", "global"} and kinds["local"][1] == 52 and kinds["global"][1] == 10
    assert kinds["local"][0].scores() < kinds["global"][0].scores() / 100  # window 1,024 of 1M tokens
    row = plan_one(spec)
    assert "52 local layers (window 1,024)" in row.reason and "10 global layers" in row.reason
    # the same model with every layer global is priced as a global model: several times slower
    (glob,) = specs(
        "model=gemma3_27b",
        "cluster=tpu7x_128",
        "context_length=1048576",
        "strategy=usp",
        "model.attention_pattern=[global]",
    )
    assert plan_one(glob).predicted_step_s > 3 * row.predicted_step_s


def test_a_window_at_least_the_context_is_global_and_the_plan_says_so():
    (wide,) = specs("model=tiny_gemma", "context_length=512", "model.window=512", "strategy=ring")
    (glob,) = specs(
        "model=tiny_gemma", "context_length=512", "model.attention_pattern=[global]", "strategy=ring"
    )
    a, b = plan_one(wide), plan_one(glob)
    assert "model.window=512 >= context length 512: its local layers attend globally" in a.reason
    assert (
        a.predicted_step_s == b.predicted_step_s
        and a.predicted_hbm_bytes_per_device == b.predicted_hbm_bytes_per_device
    )


@pytest.mark.parametrize("model", ["gemma3_27b", "qwen3_32b"])
@pytest.mark.parametrize("cluster", ["v5p_128", "tpu7x_128"])
def test_roofline_bounds_prediction_for_the_new_families(model, cluster):
    rows = plan(specs("+sweep=cp_scaling", f"cluster={cluster}", f"model={model}"))
    valid = [r for r in rows if r.verdict != "invalid"]
    assert len(valid) >= 20
    assert all(r.roofline_mfu >= r.predicted_mfu * (1 - 1e-12) for r in valid)


# --- a strategy per layer type (strategy.local) ------------------------------------------------------------
GEMMA_1M = (
    "model=gemma3_27b",
    "cluster=tpu7x_128",
    "context_length=1048576",
    "mesh.context=16",
    "mesh.data=8",
)
MIX = (*GEMMA_1M, "train.batch=8", "strategy.layout=contiguous")


def test_each_layer_type_is_priced_under_its_own_strategy():
    """ulysses for the global layers and all_gather for the local ones: each type's schedule and transfers are
    those of a trial that runs its strategy on every layer."""
    (mixed,) = specs(*MIX, "strategy=ulysses", "strategy.local=all_gather")
    (uly,) = specs(*MIX, "strategy=ulysses")
    (ag,) = specs(*MIX, "strategy=all_gather")
    types = {
        s.trial_id: {k: sched for k, sched, _ in work.step_work(s).attention_layers()} for s in (uly, ag)
    }
    got = {k: sched for k, sched, _ in work.step_work(mixed).attention_layers()}
    assert got == {"local": types[ag.trial_id]["local"], "global": types[uly.trial_id]["global"]}
    # memory: the largest type under its own strategy; here ulysses' global layer, not all_gather's full gather
    assert memory.attention_bytes(mixed) == memory.attention_bytes(uly) < memory.attention_bytes(ag)
    row = plan_one(mixed)
    assert (
        "52 local layers (window 1,024) under all_gather" in row.reason
        and "global layers under ulysses" in row.reason
    )
    # its halo instead of two all-to-alls per local layer: faster than ulysses everywhere, by the local layers
    assert row.predicted_step_s < plan_one(uly).predicted_step_s
    assert (
        mixed.trial_id != uly.trial_id
        and specs(*MIX, "strategy=ulysses", "strategy.local=")[0].trial_id == uly.trial_id
    )


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ("model=tiny", "strategy=ring", "strategy.local=all_gather"),
            "strategy.local=all_gather names the strategy of local and chunked layers, but model tiny has only global",
        ),
        (
            (
                "model=tiny_gemma",
                "strategy=usp",
                "mesh.context=2",
                "mesh.context_ulysses=4",
                "strategy.local=ring",
            ),
            "strategy.local=ring shards the sequence over context but strategy usp over context x context_ulysses".replace(
                " x ", "x"
            ),
        ),
        (
            (
                "model=tiny_gemma",
                "strategy=usp",
                "mesh.context=2",
                "mesh.context_ulysses=4",
                "strategy.local=double_ring",
            ),
            "strategy.local=double_ring cuts layout=zigzag for 8 ring positions but usp for 2",
        ),
        (
            ("model=tiny_gemma", "strategy=ring", "strategy.local=ulysses", "model.q_heads=4"),
            "ulysses splits q heads",
        ),
    ],
)
def test_a_strategy_per_layer_type_that_cannot_run_is_invalid_before_launch(overrides, words):
    (spec,) = specs(*overrides)
    row = plan_one(spec)
    assert row.verdict == "invalid" and words in row.reason, row.reason


def test_the_recommender_prices_mixes_only_for_windowed_models_and_says_whether_one_pays():
    from orchestrator.plan.search import search

    def answer(model: str):
        (spec,) = specs(f"model={model}", "cluster=tpu7x_128", "context_length=131072")
        return search(spec.model, spec.cluster, spec.context_length, spec.train, top=3)

    llama, gemma = answer("llama3_1_8b"), answer("gemma3_27b")
    assert not any("per layer type" in line or "every layer" in line for line in llama.losers)
    assert (
        gemma.searched > llama.searched
    )  # each windowed candidate also under each strategy that mixes with it
    (line,) = [
        x
        for x in gemma.losers
        if x.startswith(("a strategy per layer type:", "one strategy for every layer:"))
    ]
    assert "(local layers: " in line and "s/step" in line
    mixed = next((c for c in gemma.top if c.spec.strategy.local), None)
    if mixed is not None:  # its command line selects the mix
        assert f"strategy.local={mixed.spec.strategy.local}" in mixed.command


def test_splash_with_a_window_is_planned_only_where_a_call_holds_the_whole_sequence():
    tpu = ("model=tiny_gemma", "cluster=tpu7x_128", "mesh.context=8", "mesh.data=16", "train.batch=16")
    ring = plan_one(specs(*tpu, "strategy=ring", "strategy.kernel=splash")[0])
    assert (
        ring.verdict == "invalid" and "kernel=splash runs a sliding window or chunk only under" in ring.reason
    )
    assert plan_one(specs(*tpu, "strategy=ulysses", "strategy.kernel=splash")[0]).verdict == "run"
    # the windowed layers under ulysses (strategy.local), the global ones under ring: splash runs both
    mixed = specs(
        *tpu,
        "strategy=ring",
        "strategy.local=ulysses",
        "strategy.layout=contiguous",
        "strategy.kernel=splash",
    )
    assert plan_one(mixed[0]).verdict == "run"
    # a window that covers the row is global: splash runs it under any strategy
    assert (
        plan_one(specs(*tpu, "strategy=ring", "strategy.kernel=splash", "context_length=32")[0]).verdict
        == "run"
    )
