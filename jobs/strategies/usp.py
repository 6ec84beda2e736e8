"""USP: Ulysses over `context_ulysses` (inner) inside a ring over `context` (outer); zigzag by ring size."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.strategies.base import AUTO, Local, divisors, usp_like_splits
from jobs.strategies.ulysses import Ulysses


class USP(Ulysses):
    name = "usp"
    axes = ("context", "context_ulysses")  # ring (outer, major) x Ulysses (inner, minor)
    ulysses_axis = "context_ulysses"
    default_layout = "zigzag"
    collectives = ("collective-permute", "all-to-all")
    summary = (
        "Ulysses inside groups, a ring across them: fewer ring hops than ring, any degree beyond the heads"
    )
    dcn_axes = ("context", "data", "fsdp")  # the ring may cross slices; the all-to-all (context_ulysses) not

    def degrees(self, mesh: Mapping[str, int]) -> tuple[int, int]:
        return int(mesh.get("context_ulysses", 1)), int(mesh.get("context", 1))

    def resolve_mesh(self, free, context, inner, hq, hkv):
        """The largest Ulysses degree the KV heads allow, keeping a ring of at least 2."""
        if inner == AUTO:
            base = free // int(context) if context != AUTO else free
            fits = [d for d in divisors(base) if hq % d == 0 and d <= hkv]
            inner = max([d for d in fits if base // d >= 2] or fits or [1])
        inner = int(inner)
        return (max(free // inner, 1) if context == AUTO else int(context)), inner

    def mesh_splits(self, cp: int) -> list[tuple[int, int]]:
        return usp_like_splits(cp)

    def hop_tokens(self, x: Local) -> int:
        return x.L // x.R if x.R > 1 else x.L

    def dcn_bytes(self, x: Local, mesh: Mapping[str, int], axis: str, slices: int) -> tuple[int, int]:
        return (0, self.comm_bytes(x)[1]) if axis == "context" else (0, 0)  # every ring hop crosses

    def dcn_words(self, mesh: Mapping[str, int], axis: str) -> str:
        if axis == "context":
            return "every ring hop crosses DCN (hidden behind that hop's attention); the all-to-alls stay in a slice"
        return super().dcn_words(mesh, axis)


STRATEGY = USP()
