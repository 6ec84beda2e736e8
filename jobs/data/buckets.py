"""Loss-by-position buckets: log-spaced position ranges a step reports its loss over (jobs/model.loss_fn)."""

from __future__ import annotations


def position_buckets(length: int) -> tuple[int, ...]:
    """Lower edges of the loss-by-position buckets: 0, 256, 1K, 4K, ... (x4) below `length`; the last bucket
    ends at it. Positions within the document for packed data, within the row otherwise."""
    edges = [0]
    while (nxt := edges[-1] * 4 or 256) < length:
        edges.append(nxt)
    return tuple(edges)


def bucket_labels(length: int) -> tuple[str, ...]:
    """'0-256', '256-1K', ..., '4M-14M' (binary K and M, as context lengths are)."""

    def short(n: int) -> str:
        for unit, size in (("M", 2**20), ("K", 2**10)):
            if n >= size:
                return f"{n / size:.3g}{unit}"
        return str(n)

    edges = (*position_buckets(length), length)
    return tuple(f"{short(a)}-{short(b)}" for a, b in zip(edges[:-1], edges[1:], strict=False))
