"""Ring CP: K/V blocks travel around the context axis while each device merges partial attention; zigzag
order balances the causal work. O(L/P) memory; each hop's transfer hides behind the previous hop's compute."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.strategies.base import (
    BF16,
    GLOBAL_REACH,
    Local,
    Reach,
    Schedule,
    Strategy,
    kernel_bytes,
    ring_hops,
    ring_steps,
    travelling_kv_bytes,
)


class Ring(Strategy):
    name = "ring"
    default_layout = "zigzag"
    collectives = ("collective-permute",)
    summary = "K/V rotate around one ring, transfers hidden behind attention: O(L/P) memory at any head count"
    # The ring may span slices: each hop's transfer hides behind that hop's attention.
    dcn_axes = ("context", "data", "fsdp")
    # A window or chunk in the contiguous layout stops the rotation at the last shard it reaches (ring_steps).
    truncates = True

    def attention_bytes(self, x: Local, block_q: int, block_kv: int, reach=GLOBAL_REACH, layout="") -> int:
        return travelling_kv_bytes(x, x.Ll, x.hkv) + kernel_bytes(
            x, x.Ll, x.Ll, x.hq, x.hkv, block_q, block_kv
        )

    def comm_bytes(self, x: Local, reach=GLOBAL_REACH, layout="", block_kv=0) -> tuple[int, int]:
        # a window sends the blocks of the steps the ring still runs (ring_steps), each skipped kernel or not
        steps = ring_steps(x.P, x.Ll, layout, reach.lookback) if self.truncates else x.P
        return 0, int(2 * (steps - 1) / x.P * x.L * x.kv_token * BF16)

    def hop_tokens(self, x: Local) -> int:
        return x.Ll

    def schedule(
        self, x: Local, layout: str, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH
    ) -> Schedule:
        block = 2 * x.Ll * x.kv_token * BF16  # the K,V shard each hop passes on
        hops = ring_hops(x, x.P, x.Ll, layout, block_q, block_kv, block, reach, self.truncates)
        return Schedule(hops, x.hq, block_q, block_kv, ring_group=x.P)

    def dcn_bytes(self, x: Local, mesh: Mapping[str, int], axis: str, slices: int) -> tuple[int, int]:
        # A ring laid across slices has slice-crossing transfers at every hop (a hop waits for its slowest).
        return (0, self.comm_bytes(x)[1]) if axis == "context" else (0, 0)

    def dcn_words(self, mesh: Mapping[str, int], axis: str) -> str:
        if axis == "context":
            return "every hop crosses DCN, each hidden only behind that hop's attention"
        return super().dcn_words(mesh, axis)


STRATEGY = Ring()
