"""A Gemma 3-style train step (sliding-window local layers, a global layer, attention sinks) compiles for tpu7x
2x2x1 with libtpu on a CPU host (no TPU): the strategy's collectives are in the compiled HLO, and the compiler's
own peak HBM per device stands against the planner's prediction."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from jobs.hardware import compiled_bytes
from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config.load import group_option
from orchestrator.plan import aot, cluster_model, memory

MIB = 2**20


def gemma_spec(strategy: str, mesh: MeshSpec) -> TrialSpec:
    """tiny_gemma cut to one local and one global layer (compile time grows with the pattern's length), with
    sinks; 2,048 tokens over 8 devices is 256 a shard, so the 32-token window reaches only the own hop and the
    previous shard's and the ring skips the rest (jobs.attention.cp.span_hop). kernel=auto, the default: on TPU
    the local layer runs the xla kernel under ring and usp (a hop's window mask moves with the hop), the global
    one splash."""
    model = replace(
        ModelSpec(**group_option("model", "tiny_gemma")),
        layers=2,
        attention_pattern=("local", "global"),
        sinks=True,
    )
    return TrialSpec(
        model=model,
        mesh=mesh,
        strategy=replace(StrategySpec(**group_option("strategy", strategy)), block_q=256, block_kv=256),
        context_length=2048,
        train=TrainSpec(remat="full"),
        cluster=replace(cluster_model.load("tpu7x_128")[0], topology="2x2x1"),
    )


# (strategy, mesh, its collectives in the compiled HLO, planner / compiler's peak bounds). The ring measured
# 1.01 (9.7 vs 9.6 MiB). usp measured 0.38 (4.2 vs 11.0 MiB): at these shapes its all-to-all staging, which
# the planner's attention term leaves out, outweighs the rest; at 1,048,576 tokens on tpu7x_128 (gemma3_27b,
# context4xcontext_ulysses32, save_attn) it is 0.97 (30.3 vs 31.2 GiB), so only a range is held here.
CASES = [
    pytest.param("ring", MeshSpec(context=8), ("collective-permute",), (0.9, 1.15), id="ring"),
    pytest.param(
        "usp",
        MeshSpec(context=2, context_ulysses=4),
        ("all-to-all", "collective-permute"),
        (0.25, 1.15),
        marks=pytest.mark.slow,
        id="usp",
    ),
]


@pytest.mark.parametrize("strategy,mesh,collectives,band", CASES)
def test_gemma_style_step_compiles_for_tpu7x(strategy, mesh, collectives, band):
    pytest.importorskip("libtpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    spec = gemma_spec(strategy, mesh)
    assert spec.model.window < spec.context_length // mesh.size  # the window is shorter than a shard
    low, _ = aot.lowered(spec)  # the program aot=true compiles, on tpu7x 2x2x1's 8 virtual devices
    compiled = low.compile()
    text = compiled.as_text()
    for op in collectives:
        assert op in text, f"{strategy}: no {op} in the compiled HLO"
    # the global layer's splash kernel (Mosaic), beside the local layer's xla
    assert "tpu_custom_call" in text
    ma = compiled.memory_analysis()
    peak = int(ma.peak_memory_in_bytes)
    # above the step's own arguments (params, AdamW state, batch), never above memory_analysis's sum, and a
    # tiny model's few MiB
    assert ma.argument_size_in_bytes < peak <= compiled_bytes(ma) and peak < 64 * MIB, ma
    ratio = memory.total(spec) / peak
    assert band[0] <= ratio <= band[1], f"{strategy}: planner / compiler's peak {ratio:.2f}"
