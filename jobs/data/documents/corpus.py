"""Build a tokenized document corpus from text files: a byte-level BPE, ArrayRecord and/or Parquet shards.

    python -m jobs.data.documents.corpus --out data/stdlib --vocab 4096 [--src DIR ...] [--format arrayrecord]

Default source: the Python standard library's own *.py / *.txt / *.rst files (thousands of real documents
with a long-tailed length distribution, on every machine with Python, nothing downloaded). Deterministic:
files are taken in sorted order and the tokenizer is trained on a fixed subset. OUT receives tokenizer.json,
meta.json (vocab size, documents, tokens, length quantiles), lengths.npy (int64 tokens per document, in
dataset order) and documents-XXXXX-of-YYYYY.{arrayrecord,parquet} (record schema: jobs/data/documents/sources.py).
OUT may be gs://: the corpus is built in a temporary directory and uploaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from jobs import storage
from jobs.data.documents.sources import encode_record

SUFFIXES = (".py", ".txt", ".rst")
# Corpora this module knows how to build, by the source path a config names them with: a sweep that names a
# missing one gets it built (and kept) on first use; any other missing source is the user's error.
KNOWN = {"data/stdlib": {"vocab": 4096}}  # the standard library's own files, a 4096-entry BPE
Progress = Callable[[str, int, int], None]  # (stage, done, total)
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}  # installed packages are not the stdlib
BATCH = 512  # documents per tokenizer call (a progress tick)
PAD = "<pad>"  # id 0: the packers pad with 0, so no real token is ever padding
FORMATS = ("arrayrecord", "parquet", "both")


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def collect(srcs: Sequence[str], max_docs: int = 0) -> list[str]:
    """Texts of the text files under `srcs`, in sorted order (per source, by relative path); empty files
    skipped. max_docs > 0 keeps that many, evenly spaced over the sorted list (a spread, not one package)."""
    files: list[Path] = []
    for src in srcs:
        root = Path(src)
        if not root.is_dir():
            raise ValueError(f"--src {src} is not a directory")
        found = [p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
        found = [p for p in found if not SKIP_DIRS & set(p.relative_to(root).parts)]
        files += sorted(found, key=lambda p: p.relative_to(root).as_posix())
    texts = [t for t in (p.read_text(encoding="utf-8", errors="replace") for p in files) if t.strip()]
    if max_docs and max_docs < len(texts):
        texts = [texts[(k * len(texts)) // max_docs] for k in range(max_docs)]
    if not texts:
        raise ValueError(f"no {'/'.join(SUFFIXES)} text files under {', '.join(srcs)}")
    return texts


def train_tokenizer(texts: Sequence[str], vocab: int, train_bytes: int):
    """A byte-level BPE of `vocab` entries (id 0 = PAD), trained on an evenly spaced subset of about
    `train_bytes` of the texts (the whole stdlib would cost minutes and buys little at 4K entries)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    total = sum(len(t) for t in texts)
    every = max(1, math.ceil(total / train_bytes)) if train_bytes > 0 else 1
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts[::every], trainer=trainer)
    return tok


def write_shards(docs: Sequence[np.ndarray], out: Path, fmt: str, shard_docs: int) -> list[str]:
    """Documents in order into ceil(n / shard_docs) shards per format; returns the shard names."""
    n = max(1, math.ceil(len(docs) / shard_docs))
    names = []
    for i in range(n):
        part = docs[i * shard_docs : (i + 1) * shard_docs]
        stem = f"documents-{i:05d}-of-{n:05d}"
        if fmt in ("arrayrecord", "both"):
            from array_record.python.array_record_module import ArrayRecordWriter

            w = ArrayRecordWriter(str(out / f"{stem}.arrayrecord"), "group_size:1")  # random access
            for t in part:
                w.write(encode_record(t))
            w.close()
            names.append(f"{stem}.arrayrecord")
        if fmt in ("parquet", "both"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            col = pa.array([t.astype(np.uint32) for t in part], type=pa.list_(pa.uint32()))
            pq.write_table(pa.table({"tokens": col}), out / f"{stem}.parquet", row_group_size=256)
            names.append(f"{stem}.parquet")
    return names


def quantiles(lengths: np.ndarray) -> dict[str, float]:
    qs = {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 50, 90, 99)}
    return {"min": int(lengths.min()), **qs, "max": int(lengths.max()), "mean": float(lengths.mean())}


def build(
    out: str,
    srcs: Sequence[str] = (),
    vocab: int = 4096,
    fmt: str = "arrayrecord",
    max_docs: int = 0,
    shard_docs: int = 512,
    train_bytes: int = 8 << 20,
    progress: Progress | None = None,
) -> dict:
    """Build the corpus in `out` (a directory or gs:// prefix); returns meta.json's content. `progress` is told
    each stage's (done, total): reading, training the tokenizer, tokenizing, writing."""
    say = progress or (lambda stage, done, total: None)
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}; use one of {', '.join(FORMATS)}")
    if vocab < 257:
        raise ValueError(f"--vocab {vocab}: a byte-level BPE needs at least 257 entries (256 bytes + pad)")
    say("reading text files", 0, 1)
    texts = collect(list(srcs) or [stdlib_dir()], max_docs)
    say("training the tokenizer", 0, 1)
    tok = train_tokenizer(texts, vocab, train_bytes)
    docs: list[np.ndarray] = []
    for start in range(0, len(texts), BATCH):
        say("tokenizing documents", start, len(texts))
        batch = tok.encode_batch(texts[start : start + BATCH], add_special_tokens=False)
        docs += [np.asarray(e.ids, np.uint32) for e in batch]
    say("tokenizing documents", len(texts), len(texts))
    lengths = np.array([len(d) for d in docs], np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp if storage.is_gcs(out) else out)
        local.mkdir(parents=True, exist_ok=True)
        say("writing shards", 0, 1)
        names = write_shards(docs, local, fmt, shard_docs)
        tok.save(str(local / "tokenizer.json"))
        np.save(local / "lengths.npy", lengths)
        meta = {
            "vocab_size": tok.get_vocab_size(),
            "pad_id": tok.token_to_id(PAD),
            "documents": len(docs),
            "tokens": int(lengths.sum()),
            "length_quantiles": quantiles(lengths),
            "sources": list(srcs) or ["python-stdlib"],
            "format": fmt,
            "shards": names,
            "record_encoding": "ArrayRecord: b'TOK1' + little-endian uint32 ids; Parquet: column tokens",
        }
        (local / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if storage.is_gcs(out):
            storage.upload_dir(tmp, out)
    say("done", 1, 1)
    return meta


def known(source: str) -> dict | None:
    """How to build `source` when it is a corpus this module knows (its build arguments), else None."""
    return KNOWN.get(source.rstrip("/"))


def built(source: str) -> bool:
    return storage.exists(storage.join(source.rstrip("/"), "meta.json"))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m jobs.data.documents.corpus", description=__doc__.splitlines()[0]
    )
    p.add_argument("--src", action="append", default=[], help="directory of text files (repeatable)")
    p.add_argument("--out", required=True, help="output directory or gs:// prefix")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--format", default="arrayrecord", choices=FORMATS)
    p.add_argument("--max-docs", type=int, default=0, help="keep this many documents (0: all)")
    p.add_argument("--shard-docs", type=int, default=512, help="documents per shard")
    p.add_argument("--train-mb", type=float, default=8.0, help="text the tokenizer is trained on")
    a = p.parse_args(argv)
    try:
        meta = build(a.out, a.src, a.vocab, a.format, a.max_docs, a.shard_docs, int(a.train_mb * 2**20))
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    q = meta["length_quantiles"]
    print(
        f"{meta['documents']} documents, {meta['tokens']:,} tokens (p50 {q['p50']:.0f}, p99 {q['p99']:.0f}, "
        f"max {q['max']}), vocab {meta['vocab_size']}, {len(meta['shards'])} shards in {a.out}"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    raise SystemExit(main())
