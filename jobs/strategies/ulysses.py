"""Ulysses CP: an all-to-all trades sequence shards for head shards, attention runs over the whole
sequence for H/U heads, and a second all-to-all trades back; the KV heads bound the degree."""

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


class Ulysses(Strategy):
    name = "ulysses"
    ulysses_axis = "context"
    collectives = ("all-to-all",)
    summary = "two all-to-alls per layer, whole-sequence attention on H/P heads: degree bounded by the heads"

    def degrees(self, mesh: Mapping[str, int]) -> tuple[int, int]:
        return int(mesh.get("context", 1)), 1

    def attention_bytes(self, x: Local, block_q: int, block_kv: int, reach=GLOBAL_REACH, layout="") -> int:
        hq_u = max(x.hq // x.U, 1)
        hkv_u = max(x.hkv // x.U, 1)  # fewer kv heads than U: each device gets one replicated head
        tr = x.L // x.R  # tokens per device after the all-to-all (the whole sequence without a ring)
        # q, k, v, out in the head layout, plus the all-to-all's send buffers of the same size.
        a2a = 2 * x.B * tr * (2 * hq_u + 2 * hkv_u) * x.D * BF16
        # Under a ring (usp): two K/V blocks in flight, with dK/dV (fp32) travelling in backward.
        ring = travelling_kv_bytes(x, tr, hkv_u) if x.R > 1 else 0
        return a2a + ring + kernel_bytes(x, tr, tr, hq_u, hkv_u, block_q, block_kv)

    def comm_bytes(self, x: Local, reach=GLOBAL_REACH, layout="", block_kv=0) -> tuple[int, int]:
        U, R = x.U, x.R
        hkv = max(x.hkv, U)  # kv heads replicated up to U before the all-to-all when Hkv < U
        a2a = int((U - 1) / U**2 * (x.L / R) * x.D * (2 * x.hq + 2 * hkv) * x.B * BF16)
        steps = ring_steps(R, x.L // R, layout, reach.lookback)  # usp's ring stops where a window ends
        ring = int(2 * (steps - 1) / R * x.L * max(x.hkv // U, 1) * x.D * x.B * BF16) if R > 1 else 0
        return a2a, ring

    def schedule(
        self, x: Local, layout: str, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH
    ) -> Schedule:
        """The all-to-alls, then H/U heads over the whole sequence, or (usp) over a ring of R shards of L/R."""
        U, R = x.U, x.R
        shard = x.L // R
        block = 2 * x.B * shard * max(x.hkv // U, 1) * x.D * BF16
        hops = ring_hops(x, R, shard, layout, block_q, block_kv, block, reach)
        a2a = self.comm_bytes(x)[0]
        return Schedule(hops, max(x.hq // U, 1), block_q, block_kv, a2a_bytes=a2a, a2a_group=U, ring_group=R)


STRATEGY = Ulysses()
