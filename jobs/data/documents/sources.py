"""Document sources: ArrayRecord or Parquet shards of pre-tokenized documents, local or gs://, random access.

Record schema, one document per record:
- ArrayRecord: each record is the 4-byte magic ``b"TOK1"`` followed by the document's token ids as
  little-endian uint32 (``encode_record`` / ``decode_record``). The magic makes a wrong record (text, a
  tf.train.Example) fail on the first peek instead of training on garbage.
- Parquet: a column ``tokens`` of type list<int32 | uint32 | int64>; other columns are ignored.

A source is a shard file or a directory / gs:// prefix of shards (``*.arrayrecord``, ``*.array_record``,
``*.parquet``, sorted by name). gs:// shards are fetched whole to a local cache (jobs/storage.py) once per host.
Parquet shards are read into memory whole (4 bytes a token) on first use, because a global shuffle would decode
one row group per document; ArrayRecord is the format for corpora larger than host memory.
"""

from __future__ import annotations

import bisect
import os
import threading

import numpy as np

from jobs import storage

MAGIC = b"TOK1"
ARRAY_RECORD_EXTS = (".arrayrecord", ".array_record")
PARQUET_EXTS = (".parquet",)


def encode_record(tokens: np.ndarray) -> bytes:
    """One ArrayRecord record: MAGIC + little-endian uint32 token ids."""
    t = np.asarray(tokens)
    if t.size and (t.min() < 0 or t.max() >= 2**32):
        raise ValueError("token ids must fit uint32")
    return MAGIC + t.astype("<u4").tobytes()


def decode_record(raw: bytes, where: str = "record") -> np.ndarray:
    """The token ids of one ArrayRecord record as int32; ValueError naming `where` if it is not one."""
    if not raw.startswith(MAGIC) or (len(raw) - len(MAGIC)) % 4:
        raise ValueError(
            f"{where} is not a token record (want {MAGIC!r} + little-endian uint32 ids, "
            f"see jobs/data/documents/sources.py); got {raw[:8]!r}..."
        )
    return np.frombuffer(raw, dtype="<u4", offset=len(MAGIC)).astype(np.int32)


def _format(name: str) -> str | None:
    if name.endswith(ARRAY_RECORD_EXTS):
        return "arrayrecord"
    if name.endswith(PARQUET_EXTS):
        return "parquet"
    return None


def shards(source: str) -> tuple[str, list[str]]:
    """(format, sorted shard uris) of a source: one shard file, or a directory / gs:// prefix of them."""
    if _format(source):
        if not storage.exists(source):
            raise ValueError(f"document source {source} does not exist; check train.data.sources")
        return _format(source), [source]
    names = storage.list_names(source)
    found = {f for f in map(_format, names) if f}
    if not found:
        what = "has no *.arrayrecord or *.parquet shards" if names else "does not exist or is empty"
        raise ValueError(f"document source {source} {what}; check train.data.sources")
    if len(found) > 1:
        raise ValueError(f"document source {source} mixes ArrayRecord and Parquet shards; give one format")
    fmt = found.pop()
    return fmt, [storage.join(source, n) for n in names if _format(n) == fmt]


def local(uri: str, cache_dir: str) -> str:
    """A local path for a shard (gs:// objects fetched to the cache once)."""
    try:
        return storage.fetch(uri, cache_dir)
    except FileNotFoundError as e:
        raise ValueError(f"document shard {uri} is missing or unreadable: {e}") from None


class _ParquetShard:
    """One Parquet shard's `tokens` column as (offsets, flat int32 values)."""

    def __init__(self, path: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"{path} is not a readable Parquet file: {e}") from None
        if "tokens" not in schema.names:
            raise ValueError(f"{path} has no `tokens` column (columns: {', '.join(schema.names)})")
        kind = schema.field("tokens").type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
            kind.value_type
        ):
            raise ValueError(f"{path}: column `tokens` must be a list of integers, got {kind}")
        self.path = path
        self.rows = pq.ParquetFile(path).metadata.num_rows
        self._loaded: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()

    def first(self) -> np.ndarray:
        """Record 0 without reading the whole shard (one row group)."""
        import pyarrow.parquet as pq

        col = pq.ParquetFile(self.path).read_row_group(0, columns=["tokens"]).column("tokens")
        return np.asarray(col[0].values.to_numpy(zero_copy_only=False)).astype(np.int64)

    def __getitem__(self, i: int) -> np.ndarray:
        with self._lock:
            if self._loaded is None:
                import pyarrow.parquet as pq

                col = pq.read_table(self.path, columns=["tokens"]).column("tokens").combine_chunks()
                offsets = np.asarray(col.offsets.to_numpy(), np.int64)
                values = np.asarray(col.values.to_numpy(zero_copy_only=False)).astype(np.int64)
                self._loaded = (offsets, values)
        offsets, values = self._loaded
        return values[offsets[i] : offsets[i + 1]]


class TokenSource:
    """Random-access documents of one source (grain's RandomAccessDataSource protocol): int32 token ids,
    each checked against the model's vocab as it is read."""

    def __init__(self, source: str, vocab: int, cache_dir: str, first_shard_only: bool = False):
        self.source, self.vocab = source, vocab
        self.format, uris = shards(source)
        # the driver's peek fetches one shard, not the corpus
        self.paths = [local(u, cache_dir) for u in (uris[:1] if first_shard_only else uris)]
        self.shards = len(uris)
        if self.format == "arrayrecord":
            from grain.python import ArrayRecordDataSource

            try:
                self._ar = ArrayRecordDataSource(self.paths)
            except Exception as e:  # array_record raises bare RuntimeErrors on a corrupt file
                raise ValueError(f"document source {source} is not readable ArrayRecord: {e}") from None
            self._len = len(self._ar)
        else:
            self._pq = [_ParquetShard(p) for p in self.paths]
            self._starts = list(np.cumsum([0] + [s.rows for s in self._pq]))
            self._len = int(self._starts[-1])
        if self._len == 0:
            raise ValueError(f"document source {source} has no documents")

    def __len__(self) -> int:
        return self._len

    def _raw(self, i: int) -> np.ndarray:
        if self.format == "arrayrecord":
            return decode_record(self._ar[i], f"record {i} of {self.source}")
        s = bisect.bisect_right(self._starts, i) - 1
        return self._pq[s][i - self._starts[s]]

    def __getitem__(self, i: int) -> np.ndarray:
        return self._checked(self._raw(int(i)), i)

    def first(self) -> np.ndarray:
        """Record 0, read without loading a whole Parquet shard: the driver's peek."""
        if self.format == "arrayrecord":
            return self[0]
        return self._checked(self._pq[0].first(), 0)

    def _checked(self, t: np.ndarray, i: int) -> np.ndarray:
        if t.size and (t.max() >= self.vocab or t.min() < 0):
            bad = int(t.max()) if t.max() >= self.vocab else int(t.min())
            raise ValueError(
                f"record {i} of {self.source} has token id {bad} outside the model's vocab [0, {self.vocab}); "
                "use the tokenizer the corpus was built with and a model.vocab at least its size"
            )
        return t.astype(np.int32)

    def __repr__(self) -> str:  # grain names sources in its logs
        return f"TokenSource({os.path.basename(self.source.rstrip('/'))}, {self._len} documents)"
