"""Markdown tables for the pages the project writes (docs/results/, generated references): one format, GitHub's,
from tabulate."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate


def table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table, its columns padded to line up. Each cell is str() of what is given
    (formatted already): no number parsing, so `0.500` stays `0.500` and every column is left-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    return tabulate(cells, headers=[str(h) for h in head], tablefmt="github", disable_numparse=True)
