"""Count the ring hops that run a kernel (a debug probe for tests and benchmarks; off by default, no cost).

While `counting()` is active at trace time, every ring hop (ring, usp, double_ring; forward and backward)
traced with segment ids reports each kernel call it runs, per device, through jax.debug.callback: a hop
skipped by its segment summary reports nothing. With a sliding window or chunk (and no segment ids) the unit
is a (query chunk, key chunk) pair of a hop (one per hop contiguous, four zigzag), and both outcomes report:
"fwd" / "bwd" for a pair whose kernel ran, "fwd skipped" / "bwd skipped" for one the span cannot reach.
Functions traced outside the block carry no callback.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import jax

_active: list[Counter] = []
SKIPPED = " skipped"  # suffix of the phase a skipped pair reports


@contextmanager
def counting() -> Iterator[Counter]:
    """Counter of kernel-running hops by phase ("fwd", "bwd"), filled when the traced function runs."""
    counter: Counter = Counter()
    _active.append(counter)
    try:
        yield counter
    finally:
        _active.remove(counter)


def note(phase: str) -> None:
    """Called inside a hop's compute branch (or, phase + SKIPPED, a skip branch) while tracing."""
    for counter in list(_active):
        jax.debug.callback(lambda c=counter: c.update([phase]))
