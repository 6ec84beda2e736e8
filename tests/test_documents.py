"""Packed documents (jobs/data/documents/): packers, sources, mixture, iterator state, corpus builder, bad input."""

import dataclasses
import json
import os
import re

import grain
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from jobs import storage
from jobs.data import Batches, layout
from jobs.data.documents import DocumentIterator, Options, check, corpus, encode_record
from jobs.data.documents.pack import finish_rows, pack
from jobs.spec import DataSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec

VOCAB = 1000


def random_docs(n: int, lo: int = 1, hi: int = 60, seed: int = 0) -> list[np.ndarray]:
    """Documents whose tokens are distinct across the set (a running count from 1): a token names its place."""
    lengths = np.random.default_rng(seed).integers(lo, hi, size=n)
    starts = 1 + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [np.arange(s, s + k, dtype=np.int32) for s, k in zip(starts, lengths, strict=True)]


def write_arrayrecord(path, docs) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = ArrayRecordWriter(str(path), "group_size:1")
    for t in docs:
        w.write(encode_record(t))
    w.close()
    return str(path)


def write_parquet(path, docs, column: str = "tokens") -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({column: pa.array([d.astype(np.uint32) for d in docs])}), path, row_group_size=7)
    return str(path)


def rows_of(docs, length, packer, long_docs="split") -> list[dict]:
    ds = grain.MapDataset.source(docs).to_iter_dataset()
    return [finish_rows(r) for r in pack(ds, length, packer, long_docs)]


def segments(row) -> list[np.ndarray]:
    seg = row["segment_ids"]
    return [row["tokens"][seg == k] for k in range(1, seg.max() + 1)]


def check_row_invariants(row):
    tok, seg, pos, tgt, mask = (row[k] for k in ("tokens", "segment_ids", "positions", "targets", "mask"))
    n = seg.max()
    assert (np.diff(seg[seg > 0]) >= 0).all() and set(seg[seg > 0]) == set(range(1, n + 1))  # contiguous
    assert not (np.diff((seg > 0).astype(int)) > 0).any()  # padding only at the end
    for k in range(1, n + 1):
        where = np.flatnonzero(seg == k)
        assert (pos[where] == np.arange(len(where))).all()  # positions restart in each document
        assert (tgt[where[:-1]] == tok[where[1:]]).all()  # next token of the same document
        assert (mask[where[:-1]] == 1).all() and mask[where[-1]] == 0 and tgt[where[-1]] == 0
    assert (mask[seg == 0] == 0).all() and (tok[seg == 0] == 0).all() and mask.dtype == np.float32
    assert tok.shape == seg.shape == pos.shape == tgt.shape == mask.shape == (len(tok),)


def test_finish_rows_values():
    seg, pos = np.array([[1, 1, 2, 2, 2, 0]], np.int32), np.array([[0, 1, 0, 1, 2, 0]], np.int32)
    out = finish_rows({"tokens": np.array([[5, 6, 7, 8, 9, 0]]), "segment_ids": seg, "positions": pos})
    assert out["targets"].tolist() == [[6, 0, 8, 9, 0, 0]]
    assert out["mask"].tolist() == [[1, 0, 1, 1, 0, 0]]


def test_concat_packs_every_token_once_in_order():
    docs = random_docs(50, 1, 70)
    rows = rows_of(docs, 32, "concat")
    flat = np.concatenate([r["tokens"] for r in rows])
    total = sum(len(d) for d in docs)
    assert len(rows) == -(-total // 32)
    assert (flat[:total] == np.concatenate(docs)).all() and (flat[total:] == 0).all()  # one row's end pad
    for r in rows:
        check_row_invariants(r)
    assert all((r["segment_ids"] > 0).all() for r in rows[:-1])  # no padding under concat but at the end


def test_first_fit_keeps_documents_whole():
    docs = random_docs(60, 1, 30)
    rows = rows_of(docs, 32, "first_fit")
    got = sorted(tuple(s) for r in rows for s in segments(r))
    assert got == sorted(tuple(d) for d in docs)  # every document once, uncut
    for r in rows:
        check_row_invariants(r)
    pad = np.mean([(r["segment_ids"] == 0).mean() for r in rows])
    assert pad < 0.25, pad


@pytest.mark.parametrize("packer", ["first_fit", "concat"])
def test_long_documents_split_or_truncate(packer):
    docs = [np.arange(1, 81, dtype=np.int32), np.arange(100, 105, dtype=np.int32)]  # 80 = 2.5 rows of 32
    split = [tuple(s) for r in rows_of(docs, 32, packer, "split") for s in segments(r)]
    trunc = [tuple(s) for r in rows_of(docs, 32, packer, "truncate") for s in segments(r)]
    assert sorted(np.concatenate(split).tolist()) == list(range(1, 81)) + list(range(100, 105))
    assert max(map(len, split)) == 32 and tuple(range(1, 33)) in split and tuple(range(33, 65)) in split
    assert sorted(np.concatenate(trunc).tolist()) == list(range(1, 33)) + list(range(100, 105))


def options(sources, **kw) -> Options:
    return Options(sources=tuple(sources), **{"context_length": 64, "batch": 2, "vocab": VOCAB, **kw})


def take(it, n) -> list[dict]:
    return [next(it) for _ in range(n)]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x) for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """One document set as ArrayRecord (two shards) and as Parquet; a second set with other token ids."""
    d = tmp_path_factory.mktemp("docs")
    # token ids: this set's in [1, 400], the other's in [500, 899], so a token names its source
    docs = [t % 400 + 1 for t in random_docs(120, 1, 90)]
    other = [t % 400 + 500 for t in random_docs(120, 1, 90, seed=1)]
    write_arrayrecord(d / "ar" / "a-0.arrayrecord", docs[:70])
    write_arrayrecord(d / "ar" / "a-1.arrayrecord", docs[70:])
    write_parquet(d / "pq" / "a.parquet", docs)
    write_arrayrecord(d / "other" / "b.arrayrecord", other)
    return {"dir": d, "docs": docs, "ar": str(d / "ar"), "pq": str(d / "pq"), "other": str(d / "other")}


def test_batches_shapes_and_both_formats_agree(shards, tmp_path):
    for packer in ("first_fit", "concat"):
        ar = take(DocumentIterator(options([shards["ar"]], pack=packer), str(tmp_path)), 4)
        pq = take(DocumentIterator(options([shards["pq"]], pack=packer), str(tmp_path)), 4)
        assert same(ar, pq)
        b = ar[0]
        assert set(b) == {"tokens", "targets", "segment_ids", "positions", "mask"}
        assert all(v.shape == (2, 64) for v in b.values())
        for row in range(2):
            check_row_invariants({k: v[row] for k, v in b.items()})
        assert b["tokens"].dtype == b["segment_ids"].dtype == b["positions"].dtype == np.int32


@pytest.mark.parametrize("packer", ["first_fit", "concat"])
def test_state_round_trip_token_for_token(shards, tmp_path, packer):
    o = options([shards["ar"], shards["other"]], weights=(2.0, 1.0), pack=packer, seed=3, batch=4)
    it = DocumentIterator(o, str(tmp_path))
    take(it, 5)  # 20 rows: inside first-fit's third round of 8 bins
    state = json.loads(json.dumps(it.get_state()))  # as a checkpoint keeps it
    ref = take(it, 40)
    firsts = sum(int(b["segment_ids"].max(axis=1).sum()) for b in ref)
    assert firsts > 1.5 * 120, firsts  # past an epoch of the first source: its reshuffle is in the state too
    resumed = DocumentIterator(o, str(tmp_path))
    resumed.set_state(state)
    assert resumed.batches == 5 and same(take(resumed, 40), ref)
    assert same(take(DocumentIterator(o, str(tmp_path)), 5 + 40)[5:], ref)  # and equal to a fresh run


def test_mixture_is_deterministic_with_the_weights_asked(shards, tmp_path):
    o = options([shards["ar"], shards["other"]], weights=(3.0, 1.0), context_length=256, batch=4)
    a = take(DocumentIterator(o, str(tmp_path)), 12)
    assert same(a, take(DocumentIterator(o, str(tmp_path)), 12))
    assert not same(a, take(DocumentIterator(dataclasses.replace(o, seed=1), str(tmp_path)), 12))
    # mixing is per document: the first token of each document (segment) names its source
    firsts = [d[0] for b in a for i in range(4) for d in segments({k: v[i] for k, v in b.items()})]
    from_other = np.mean([t >= 500 for t in firsts])
    assert len(firsts) > 200 and abs(from_other - 0.25) < 0.03, (len(firsts), from_other)


def test_gcs_source_on_the_emulator(shards, gcs, tmp_path):
    assert storage.upload_dir(shards["ar"], f"{gcs}/corpus/ar") == 2
    o = options([f"{gcs}/corpus/ar"], pack="concat")
    assert check(o, str(tmp_path / "peek")) == {f"{gcs}/corpus/ar": 2}
    # the peek fetched one shard, not the corpus
    assert sorted(p.name for p in (tmp_path / "peek").rglob("*.arrayrecord")) == ["a-0.arrayrecord"]
    local = dataclasses.replace(o, sources=(shards["ar"],))
    assert same(take(DocumentIterator(o, str(tmp_path / "c")), 3), take(DocumentIterator(local, "."), 3))
    with pytest.raises(ValueError, match="does not exist or is empty"):
        check(options([f"{gcs}/nothing/here"]), str(tmp_path))


def trial(data: DataSpec, context=1, vocab=VOCAB, length=64) -> TrialSpec:
    return TrialSpec(
        ModelSpec("tiny", vocab, 64, 2, 4, 2, 16, 128),
        MeshSpec(context=context),
        StrategySpec(),
        length,
        TrainSpec(batch=2, data=data),
    )


def test_spec_ids_unchanged_and_documents_round_trip():
    base = dataclasses.replace(trial(DataSpec(), context=4, vocab=256, length=1024), train=TrainSpec())
    assert base.trial_id == "3239529e9f9071a5"  # computed before DataSpec had the documents fields
    with_data = lambda d: dataclasses.replace(base, train=dataclasses.replace(base.train, data=d))
    assert with_data(DataSpec("tokens", "x.bin")).trial_id == "dc339afc20ed6ca6"
    docs = DataSpec(
        "documents", sources=("a", "gs://b/c"), weights=(1.0, 3.0), pack="concat", long_docs="truncate"
    )
    spec = with_data(docs)
    back = TrialSpec.from_json(spec.to_json())
    assert back == spec and back.train.data.sources == ("a", "gs://b/c") and back.trial_id == spec.trial_id
    assert spec.trial_id != base.trial_id != with_data(dataclasses.replace(docs, pack="first_fit")).trial_id


def test_batches_documents_state_restore_and_zigzag(shards):
    spec = trial(DataSpec("documents", sources=(shards["ar"], shards["other"])), context=2)
    a, b = Batches(spec), Batches(spec)
    ref = [a(s) for s in range(8)]
    state = json.loads(json.dumps(a.state(5)))
    assert state["step"] == 5
    b.restore(state)
    assert same([b(s) for s in range(5, 8)], ref[5:])
    assert same([a(2)], [ref[2]]) and same([a(3)], [ref[3]])  # out of order: replayed from the start
    # the zigzag layout permutes every key together: unpermuted, a row is a valid packed row
    plain = Batches(dataclasses.replace(spec, strategy=StrategySpec(layout="contiguous")))
    first = plain(0)
    assert same([layout(spec, first)], [ref[0]])
    check_row_invariants({k: v[0] for k, v in first.items()})
    assert Batches(trial(DataSpec())).state(4) == {"kind": "recall", "step": 4}
    with pytest.raises(ValueError, match="precedes"):
        b(2)


def test_corpus_builder_small_subset(tmp_path):
    from tokenizers import Tokenizer

    from jobs.data.documents.sources import TokenSource

    src, out = corpus.stdlib_dir(), tmp_path / "c"
    args = ["--src", src, "--vocab", "512", "--max-docs", "24", "--format", "both", "--shard-docs", "10"]
    assert corpus.main([*args, "--out", str(out)]) == 0
    meta, lengths = json.loads((out / "meta.json").read_text()), np.load(out / "lengths.npy")
    assert meta["documents"] == 24 == len(lengths) and lengths.dtype == np.int64
    assert meta["tokens"] == lengths.sum() and meta["vocab_size"] == 512 and meta["pad_id"] == 0
    assert len(meta["shards"]) == 6  # 3 shards of <= 10 documents, each format
    tok, texts = Tokenizer.from_file(str(out / "tokenizer.json")), corpus.collect([src], 24)
    for fmt in ("arrayrecord", "parquet"):
        sources = [TokenSource(str(out / n), 512, ".") for n in meta["shards"] if n.endswith(fmt)]
        docs = [s[i] for s in sources for i in range(len(s))]
        assert [len(d) for d in docs] == lengths.tolist()  # dataset order
        assert tok.decode(docs[7].tolist()) == texts[7]  # byte-level BPE: the text comes back exactly
    assert corpus.main([*args, "--out", str(tmp_path / "d")]) == 0  # deterministic: byte-identical again
    for name in ("tokenizer.json", "lengths.npy", "documents-00001-of-00003.parquet"):
        assert (out / name).read_bytes() == (tmp_path / "d" / name).read_bytes(), name


def test_bad_input_is_one_clear_line(shards, tmp_path):
    def file(name: str, data: bytes) -> str:  # a directory holding one file
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
        return str((tmp_path / name).parent)

    w = ArrayRecordWriter(str(tmp_path / "text.arrayrecord"), "group_size:1")
    w.write(b"plain text, not tokens")
    w.close()
    no_column = write_parquet(str(tmp_path / "p" / "x.parquet"), [np.arange(3)], "ids")
    cases = {
        "does not exist or is empty": options([str(tmp_path / "missing")]),
        "missing.arrayrecord does not exist; check": options([str(tmp_path / "missing.arrayrecord")]),
        "has no *.arrayrecord or *.parquet shards": options([file("txt/a.txt", b"hello")]),
        "not a token record": options([str(tmp_path / "text.arrayrecord")]),
        "has no `tokens` column (columns: ids)": options([no_column]),
        "is not a readable Parquet file": options([file("junk/x.parquet", b"not parquet")]),
        "is not readable ArrayRecord": options([file("junk2/x.arrayrecord", b"not array record")]),
        "outside the model's vocab [0, 500)": options([shards["other"]], vocab=500),
        "context_length=1 leaves": options([shards["ar"]], context_length=1),
        "pack='best'": options([shards["ar"]], pack="best"),
        "long_docs='drop'": options([shards["ar"]], long_docs="drop"),
        "2 entries for 1 sources": options([shards["ar"]], weights=(1.0, 2.0)),
        "non-negative": options([shards["ar"], shards["other"]], weights=(1.0, -1.0)),
        "needs train.data.sources": options([]),
    }
    for want, o in cases.items():
        with pytest.raises(ValueError, match=re.escape(want)) as e:
            check(o, str(tmp_path))
        assert "\n" not in str(e.value), str(e.value)
    # a bad token past the first record surfaces while iterating, with the record named
    docs = [np.arange(1, 9)] * 5 + [np.array([1, 2, 5000])]
    o = options([write_arrayrecord(tmp_path / "late" / "x.arrayrecord", docs)], context_length=8)
    check(o, str(tmp_path))  # the peek sees only record 0
    with pytest.raises(ValueError, match="record 5 of .* token id 5000"):
        take(DocumentIterator(o, str(tmp_path)), 10)
