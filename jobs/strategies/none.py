"""No CP: the sequence whole on every device (batch and heads still sharded); the baseline of every sweep."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.strategies.base import Strategy


class NoCP(Strategy):
    name = "none"
    axes = ()
    summary = "no context parallelism: every device holds the whole sequence"

    def resolve_mesh(self, free, context, inner, hq, hkv):
        return (1 if context == "auto" else int(context)), (1 if inner == "auto" else int(inner))

    def degrees(self, mesh: Mapping[str, int]) -> tuple[int, int]:
        return 1, 1


STRATEGY = NoCP()
