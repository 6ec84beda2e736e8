"""Packing documents into rows of exactly context_length tokens: first-fit (grain) or concatenate-then-split.

A row is {tokens, segment_ids, positions}, each [L]: segment ids count the documents of the row from 1
(padding 0), positions restart at 0 in each document. `finish_rows` adds the next-token targets and the loss
mask, neither of which crosses a document boundary. Under concat a document cut at a row's end continues in
the next row as a new document (positions from 0): attention cannot see across rows, so the model is
trained exactly as it sees the piece.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np
from grain.experimental import FirstFitPackIterDataset

from jobs.spec import LONG_DOCS, PACKS


class _Cursor(grain.DatasetIterator):
    """An iterator partway through its parent's current document. State: the parent's state before that
    document and how far into it (under the key `_AT`), so a restore re-reads just that one document."""

    _AT: str

    def __init__(self, parent: grain.DatasetIterator):
        super().__init__(parent)
        self._before: Any = self._parent.get_state()
        self._doc: np.ndarray | None = None
        self._at = 0

    def _next_doc(self) -> None:
        self._before = self._parent.get_state()
        self._doc, self._at = next(self._parent), 0

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._before, self._AT: self._at if self._doc is not None else 0}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._before, self._doc, self._at = state["parent"], None, 0
        if state[self._AT]:
            self._doc, self._at = next(self._parent), state[self._AT]


class _PiecesIterator(_Cursor):
    """Each document as pieces of at most `length` tokens (split) or its first piece (truncate); empty
    documents are skipped. Where it is: the next piece of the current document."""

    _AT = "piece"

    def __init__(self, parent: grain.DatasetIterator, length: int, split: bool):
        super().__init__(parent)
        self._length, self._split = length, split

    def __next__(self) -> np.ndarray:
        L = self._length
        while self._doc is None or self._at * L >= len(self._doc) or (not self._split and self._at):
            self._next_doc()
        out = self._doc[self._at * L : (self._at + 1) * L]
        self._at += 1
        return out


class Pieces(grain.IterDataset):
    """Documents (int32 arrays) -> pieces no longer than a row (see `_PiecesIterator`)."""

    def __init__(self, parent: grain.IterDataset, length: int, long_docs: str):
        super().__init__(parent)
        self._length, self._split = length, long_docs == "split"

    def __iter__(self) -> _PiecesIterator:
        return _PiecesIterator(self._parent.__iter__(), self._length, self._split)


class _ConcatIterator(_Cursor):
    """Rows cut from the concatenation of the pieces. Where it is: the piece that starts the next row (its
    document, if already read) and how many of its tokens earlier rows took."""

    _AT = "offset"

    def __init__(self, parent: grain.DatasetIterator, length: int):
        super().__init__(parent)
        self._length = length

    def __next__(self) -> dict[str, np.ndarray]:
        L = self._length
        tokens, seg, pos = (np.zeros(L, np.int32) for _ in range(3))
        n, k = 0, 0
        while n < L:
            if self._doc is None or self._at >= len(self._doc):
                try:
                    self._next_doc()
                except StopIteration:
                    self._doc = None
                    if n == 0:
                        raise
                    break  # a finite input's last row, padded
            take = self._doc[self._at : self._at + L - n]
            k += 1
            tokens[n : n + len(take)], seg[n : n + len(take)] = take, k
            pos[n : n + len(take)] = np.arange(len(take))
            n += len(take)
            self._at += len(take)
        return {"tokens": tokens, "segment_ids": seg, "positions": pos}


class Concat(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, length: int):
        super().__init__(parent)
        self._length = length

    def __iter__(self) -> _ConcatIterator:
        return _ConcatIterator(self._parent.__iter__(), self._length)


def first_fit(pieces: grain.IterDataset, length: int, bins: int) -> grain.IterDataset:
    """grain's first-fit packer over `bins` open rows (in order, no bin shuffle), renamed to our keys."""
    packed = FirstFitPackIterDataset(
        pieces.map(lambda t: {"tokens": t}),
        length_struct={"tokens": length},
        num_packing_bins=bins,
        shuffle_bins=False,
    )

    def rename(r: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            "tokens": r["tokens"].astype(np.int32),
            "segment_ids": r["tokens_segment_ids"].astype(np.int32),
            "positions": r["tokens_positions"].astype(np.int32),
        }

    # a finite input's last round may hold empty rows; an infinite one never does
    return packed.map(rename).filter(lambda r: bool(r["segment_ids"][0]))


def pack(docs: grain.IterDataset, length: int, pack: str, long_docs: str, bins: int = 8) -> grain.IterDataset:
    """Documents (int32 token arrays) -> rows {tokens, segment_ids, positions}, each [length]."""
    if pack not in PACKS:
        raise ValueError(f"train.data.pack={pack!r}; use one of {', '.join(PACKS)}")
    if long_docs not in LONG_DOCS:
        raise ValueError(f"train.data.long_docs={long_docs!r}; use one of {', '.join(LONG_DOCS)}")
    pieces = Pieces(docs, length, long_docs)
    return Concat(pieces, length) if pack == "concat" else first_fit(pieces, length, bins)


def finish_rows(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add targets (the next token of the same document, else 0) and the float32 loss mask (0 on each
    document's last token and on padding) to rows of any leading shape [..., L]."""
    tok, seg = rows["tokens"], rows["segment_ids"]
    same = (seg[..., 1:] == seg[..., :-1]) & (seg[..., :-1] != 0)
    targets = np.zeros_like(tok)
    targets[..., :-1] = np.where(same, tok[..., 1:], 0)
    mask = np.zeros(tok.shape, np.float32)
    mask[..., :-1] = same
    return {**rows, "targets": targets, "mask": mask}
