"""A corpus the project knows how to build is built on first use, with its progress and size, and kept; a missing
source a user named is still one error line and exit code 2, nothing built."""

from __future__ import annotations

import pytest

from jobs.data.documents import corpus
from orchestrator.__main__ import main
from orchestrator.config import data

# the standard library's own files as data/stdlib builds them, but a few of them, so the test takes seconds
SMALL = {"data/stdlib": {"vocab": 300, "max_docs": 60, "train_bytes": 1 << 18}}
POINT = ["train.data.kind=documents", "model.vocab=300", "context_length=1024", "dry_run=true", "output=json"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corpus, "KNOWN", SMALL)
    data._documents_problem.cache_clear()
    yield tmp_path
    data._documents_problem.cache_clear()


def test_the_known_corpus_is_built_once_then_read(here, capsys):
    assert main([*POINT, "train.data.sources=[data/stdlib]"]) == 0
    err = capsys.readouterr().err
    meta = here / "data" / "stdlib" / "meta.json"
    assert meta.exists() and "built data/stdlib: 60 documents" in err and " MB in " in err
    assert "tokenizing documents" in err  # the bar's stages (plain lines off a terminal)
    before = meta.stat().st_mtime_ns
    data._documents_problem.cache_clear()
    assert main([*POINT, "train.data.sources=[data/stdlib]"]) == 0
    assert "built" not in capsys.readouterr().err and meta.stat().st_mtime_ns == before  # kept, not rebuilt


def test_a_missing_source_the_user_named_is_an_error(here, capsys):
    assert main([*POINT, "train.data.sources=[data/mine]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train.data.sources") and "data/mine" in err[0]
    assert not (here / "data").exists()
