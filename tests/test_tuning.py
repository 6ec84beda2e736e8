"""jobs/tuning.py: `auto` block sizes resolve to what the chip measured fastest, and splash's fused backward only
where its partial dq stays small; trial ids of points without a measured row do not move."""

from __future__ import annotations

import dataclasses

from jobs import tuning
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrialSpec
from orchestrator.plan import cluster_model

QWEN = ModelSpec("q", vocab=151936, embed=1024, layers=28, q_heads=16, kv_heads=8, head_dim=128, mlp=3072)


def point(cluster: ClusterSpec, length: int = 8192, **strategy) -> TrialSpec:
    return TrialSpec(QWEN, MeshSpec(), StrategySpec(name="none", **strategy), length, cluster=cluster)


def test_auto_blocks_are_the_chips_measured_best_and_512_elsewhere():
    v5e = cluster_model.load("v5e_1")[0]
    assert v5e.accelerator == "v5litepod"
    s = point(v5e)
    assert (s.strategy.block_q, s.strategy.block_kv) == (1024, 1024)  # docs/results/v5e.md's sweep
    assert point(v5e, 131_072).strategy.block_q == 1024  # the nearest measured length's
    assert point(ClusterSpec()).strategy.block_q == 512  # CPU: no row
    assert point(cluster_model.load("v5p_128")[0]).strategy.block_q == 512  # a chip never swept
    assert point(v5e, kernel="xla").strategy.block_q == 512  # the xla kernel has no row
    assert point(v5e, block_q=256).strategy == dataclasses.replace(s.strategy, block_q=256)  # given: kept


def test_a_resolved_auto_block_has_the_id_of_the_same_integer():
    """What the id hashes is the integer: `auto` on CPU is the 512 of every earlier run."""
    cpu = ClusterSpec()
    assert point(cpu).trial_id == point(cpu, block_q=512, block_kv=512).trial_id
    assert point(cpu).to_json() == point(cpu, block_q=512, block_kv=512).to_json()


def test_fused_backward_only_where_its_partial_dq_fits():
    # Qwen3 0.6B on one chip: 8K and 32K tokens with 1024-blocks fuse (0.25 and 4.0 GiB of partials) ...
    assert tuning.fused_dq_bytes(1, 16, 8192, 8192, 1024, 128) == 2**28
    assert tuning.fused_backward(1, 16, 32768, 32768, 1024, 128)
    # ... 64K does not (16 GiB), nor does a 16-wide head at 128K (padded to 128 lanes: 32 GiB)
    assert not tuning.fused_backward(1, 16, 65536, 65536, 1024, 128)
    assert tuning.fused_dq_bytes(1, 8, 131072, 131072, 512, 16) == 256 * 8 * 131072 * 128 * 2
