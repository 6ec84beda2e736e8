"""Double ring (LoongTrain): a ring of rings. K/V go around an inner ring of `context_ulysses` devices, and
once per inner round one block per device crosses to the next group over `context`, so only 1 transfer in
`context_ulysses` uses the slower outer links (and it hides behind a whole inner round of attention)."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.strategies.base import AUTO, BF16, GLOBAL_REACH, Local, divisors, usp_like_splits
from jobs.strategies.ring import Ring


class DoubleRing(Ring):
    name = "double_ring"
    axes = ("context", "context_ulysses")  # outer ring (groups, major) x inner ring (minor)
    summary = (
        "ring of rings: inner rings within groups, one outer transfer per inner round: for slow outer links"
    )
    dcn_axes = ("context", "data", "fsdp")  # the outer ring crosses slices, once per inner round
    truncates = False  # its rounds visit every source (the inner ring's order), window or not

    def ring_size(self, mesh: Mapping[str, int]) -> int:
        return int(mesh.get("context", 1)) * int(mesh.get("context_ulysses", 1))  # zigzag over all P

    def degrees(self, mesh: Mapping[str, int]) -> tuple[int, int]:
        return 1, self.ring_size(mesh)

    def resolve_mesh(self, free, context, inner, hq, hkv):
        """Inner ring: the largest divisor of the context devices not above their square root."""
        if inner == AUTO:
            base = free // int(context) if context != AUTO else free
            inner = max(d for d in divisors(base) if d * d <= base)
        inner = int(inner)
        return (max(free // inner, 1) if context == AUTO else int(context)), inner

    def mesh_splits(self, cp: int) -> list[tuple[int, int]]:
        return usp_like_splits(cp)

    def dcn_axis_reason(self, axis: str) -> str:
        return (
            "the inner ring (context_ulysses) would cross DCN at every hop; lay the slices over the outer ring, "
            "which crosses once per inner round"
        )

    def dcn_bytes(self, x: Local, mesh: Mapping[str, int], axis: str, slices: int) -> tuple[int, int]:
        # Only the outer hops (G-1 of the R-1 transfers per pass) cross; the inner rings stay in a slice.
        if axis != "context" or x.R <= 1:
            return 0, 0
        outer = int(mesh.get("context", 1))
        return 0, self.comm_bytes(x)[1] * (outer - 1) // (x.R - 1)

    def dcn_words(self, mesh: Mapping[str, int], axis: str) -> str:
        if axis == "context":
            inner = int(mesh.get("context_ulysses", 1))
            return f"one outer hop per inner round crosses DCN, hidden behind {inner} hops of attention"
        return super().dcn_words(mesh, axis)

    def attention_bytes(self, x: Local, block_q: int, block_kv: int, reach=GLOBAL_REACH, layout="") -> int:
        # ring's two blocks in flight, plus the round's base block and the next group's (K and V, bf16)
        return super().attention_bytes(x, block_q, block_kv) + 2 * x.Ll * x.kv_token * 2 * BF16


STRATEGY = DoubleRing()
