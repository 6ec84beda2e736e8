"""All-gather CP: every device gathers the whole sequence's K/V and attends its own queries."""

from __future__ import annotations

from jobs.strategies.base import BF16, Local, Strategy, kernel_bytes


class AllGather(Strategy):
    name = "all_gather"
    collectives = ("all-gather",)
    summary = "gathers K/V of the whole sequence per layer: simplest, memory grows with L, not L/P"

    def attention_bytes(self, x: Local, block_q: int, block_kv: int) -> int:
        # Every device holds the whole sequence's K,V (bf16), and in backward their full fp32 gradients.
        return 2 * x.L * x.kv_token * BF16 + kernel_bytes(x, x.Ll, x.L, x.hq, x.hkv, block_q, block_kv)

    def comm_bytes(self, x: Local) -> tuple[int, int]:
        return int(2 * (x.P - 1) / x.P * x.L * x.kv_token * BF16), 0

    def overflow_hint(self, x: Local) -> str:
        kv = 2 * x.L * x.kv_token * BF16
        return f"all_gather holds the full K,V of {x.L:,} tokens: {kv / 2**30:,.1f} GiB/layer"


STRATEGY = AllGather()
