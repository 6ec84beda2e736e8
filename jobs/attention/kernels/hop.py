"""The static shape of a kernel call's mask, for kernels whose masks must be known at trace time (splash)."""

from __future__ import annotations

from typing import NamedTuple


class Order(NamedTuple):
    """How the key positions of a call are laid out (the xla kernel ignores this: it masks by positions).

    layout/ring: keys are the whole sequence in `layout` order for ring size `ring` (global_positions), and
    the queries are either that same sequence or one device's block of it. The default (contiguous, 1) also
    covers every ring hop: a ring block's positions increase with the index (zigzag too: chunk r precedes
    chunk 2R-1-r), so a causal hop is the plain causal mask and any other hop is unmasked. layout="balanced"
    (packed documents, a data-dependent permutation): no static mask fits; only position-masking kernels run.
    whole: the queries and the keys are the same whole sequence (ulysses, none), so a sliding window or chunk is
    one static mask too.
    """

    layout: str = "contiguous"
    ring: int = 1
    whole: bool = False

    @property
    def permuted(self) -> bool:
        return self.layout == "zigzag" and self.ring > 1


MONOTONIC = Order()
