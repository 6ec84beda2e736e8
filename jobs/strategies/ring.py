"""Ring CP: K/V blocks travel around the context axis while each device merges partial attention; zigzag
order balances the causal work. O(L/P) memory; each hop's transfer hides behind the previous hop's compute."""

from __future__ import annotations

from jobs.strategies.base import BF16, FP32, Local, Strategy, kernel_bytes


def travelling_kv_bytes(x: Local, tokens: int, hkv: int) -> int:
    """Two K/V blocks in flight (current and next); in backward K,V (bf16) travel with dK,dV (fp32)."""
    return 2 * x.B * tokens * hkv * x.D * (2 * BF16 + 2 * FP32)


class Ring(Strategy):
    name = "ring"
    default_layout = "zigzag"
    collectives = ("collective-permute",)
    summary = "K/V rotate around one ring, transfers hidden behind attention: O(L/P) memory at any head count"

    def attention_bytes(self, x: Local, block_q: int, block_kv: int) -> int:
        return travelling_kv_bytes(x, x.Ll, x.hkv) + kernel_bytes(
            x, x.Ll, x.Ll, x.hq, x.hkv, block_q, block_kv
        )

    def comm_bytes(self, x: Local) -> tuple[int, int]:
        return 0, int(2 * (x.P - 1) / x.P * x.L * x.kv_token * BF16)

    def hop_tokens(self, x: Local) -> int:
        return x.Ll


STRATEGY = Ring()
