"""All-gather CP: every device gathers the whole sequence's K/V and attends its own queries."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.strategies.base import (
    BF16,
    GLOBAL_REACH,
    TILE_BYTES,
    Hop,
    Local,
    Reach,
    Schedule,
    Strategy,
    gathered_scores,
    kernel_bytes,
)


def halo_tokens(lookback: int | None, layout: str, P: int, Ll: int, block_kv: int) -> int:
    """Keys a device fetches before its shard for a window or chunk that sees `lookback` keys back (0: gather
    everything instead): contiguous layout only (a zigzag or balanced shard's halo is not one static slice).
    Rounded up to the kernel's key block on the shard (the largest divisor of Ll not above block_kv), so the
    keys' length keeps a large block dividing it; a halo reaching P-1 shards is a full gather."""
    if lookback is None or layout != "contiguous" or P == 1:
        return 0
    block = max(d for d in range(1, min(block_kv, Ll) + 1) if Ll % d == 0)
    h = -(-lookback // block) * block
    return h if -(-h // Ll) < P - 1 else 0


class AllGather(Strategy):
    name = "all_gather"
    collectives = ("all-gather",)
    summary = "gathers K/V of the whole sequence per layer: simplest, memory grows with L, not L/P"
    # Allowed across slices and priced, not hidden: one gather per layer brings each device the other slices'
    # shards once (a DCN phase between slice peers, then ICI inside the slice, as the TPU compiler splits the
    # FSDP gathers of a multislice mesh). Its memory, the whole K,V per device, rules it out at long context
    # long before the DCN time does; rejecting it would hide a valid, merely slow, layout at short context.
    dcn_axes = ("context", "data", "fsdp")

    def attention_bytes(
        self, x: Local, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH, layout: str = "contiguous"
    ) -> int:
        # Every device holds the whole sequence's K,V (bf16) and, in backward, one of them copied into the dK/dV
        # kernel's layout and their gradients for the whole sequence as the kernel returns them, in K,V's dtype,
        # before their reduce-scatter (splash accumulates each key block in VMEM): five bf16[1048576, 4, 256] at
        # the peak of the tpu7x_128 compile at 1,048,576 tokens, no fp32 ones; beside them the local queries'
        # accumulators and a score tile.
        # A halo (window or chunk, contiguous) holds the shard and the keys before it, not the whole sequence.
        h = halo_tokens(reach.lookback, layout, x.P, x.Ll, block_kv)
        keys = h + x.Ll if h else x.L
        kv = 2 * keys * x.kv_token * BF16
        q_side = kernel_bytes(x, x.Ll, 0, x.hq, x.hkv, block_q, block_kv)
        tile = x.B * x.hq * min(block_q, x.Ll) * min(block_kv, keys) * TILE_BYTES
        return kv + kv // 2 + kv + q_side + tile

    def comm_bytes(
        self, x: Local, reach: Reach = GLOBAL_REACH, layout: str = "contiguous", block_kv: int = 0
    ) -> tuple[int, int]:
        if h := halo_tokens(reach.lookback, layout, x.P, x.Ll, block_kv or x.Ll):
            return 2 * h * x.kv_token * BF16, 0  # the halo's K,V from the neighbour(s) before the shard
        return int(2 * (x.P - 1) / x.P * x.L * x.kv_token * BF16), 0

    def schedule(
        self, x: Local, layout: str, block_q: int, block_kv: int, reach: Reach = GLOBAL_REACH
    ) -> Schedule:
        h = halo_tokens(reach.lookback, layout, x.P, x.Ll, block_kv)
        busiest, mean, calls = gathered_scores(x.P, x.Ll, x.L, layout, block_q, block_kv, reach, h)
        fetched = self.comm_bytes(x, reach, layout, block_kv)[0]
        # the halo comes by collective-permute from ceil(h / Ll) neighbours, not a gather over the whole group
        group = -(-h // x.Ll) + 1 if h else x.P
        return Schedule((Hop(busiest, mean, calls, 0),), x.hq, block_q, block_kv, fetched, group)

    def dcn_bytes(self, x: Local, mesh: Mapping[str, int], axis: str, slices: int) -> tuple[int, int]:
        return ((slices - 1) * 2 * x.Ll * x.kv_token * BF16, 0) if axis == "context" else (0, 0)

    def dcn_words(self, mesh: Mapping[str, int], axis: str) -> str:
        if axis == "context":
            return "each layer's K,V gather brings the other slices' shards over DCN, not overlapped"
        return super().dcn_words(mesh, axis)

    def overflow_hint(self, x: Local) -> str:
        kv = 2 * x.L * x.kv_token * BF16
        return f"all_gather holds the full K,V of {x.L:,} tokens: {kv / 2**30:,.1f} GiB/layer"


STRATEGY = AllGather()
