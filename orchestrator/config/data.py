"""Whether a grid point's data can be read, before launch: its token file (local or gs://) or its packed-document
shards, and whether Google Cloud credentials are at hand for gs:// paths (the one probe: launch/preflight.py
asks it too).

Run per grid point once its keys are good (config.keys.check_point), each distinct path or source set once.
"""

from __future__ import annotations

import os
from functools import lru_cache

from jobs.spec import DataSpec
from orchestrator.config.schema import Problem

# gcloud's application-default credentials, as `gcloud auth application-default login` writes them
ADC_FILE = os.path.join("~", ".config", "gcloud", "application_default_credentials.json")


def gcs_credentials(metadata_server: bool = False) -> bool:
    """Whether gs:// paths have credentials: an emulator (STORAGE_EMULATOR_HOST), else what google.auth finds.
    Without `metadata_server` only a key file or gcloud's ADC file count, found without a network round trip:
    off GCP the metadata server lookup stalls, and a laptop planning a TPU sweep has none."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return True
    if not metadata_server:
        return bool(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")) or os.path.exists(
            os.path.expanduser(ADC_FILE)
        )
    import google.auth  # a dependency of google-cloud-storage
    from google.auth.exceptions import DefaultCredentialsError

    try:  # off GCP the metadata lookup gives up after GCE_METADATA_TIMEOUT (3 s by default)
        google.auth.default()
    except DefaultCredentialsError:
        return False
    return True


def _gcs_missing(path: str) -> bool:
    """True only when the store answered that the object is not there; any other outcome leaves it to the job."""
    if not gcs_credentials():
        return False
    from jobs import storage  # google-cloud-storage: imported only for a gs:// data path

    try:
        return not storage.exists(path)
    except Exception:  # noqa: BLE001 - no answer is not a "no": the job reports a real failure itself
        return False


@lru_cache(maxsize=256)
def path_problem(path: str) -> str | None:
    """Why a data path cannot be read (None: fine). A gs:// object is looked up when credentials allow."""
    if path.startswith("gs://"):
        bucket, _, name = path[len("gs://") :].partition("/")
        if not (bucket and name):
            return "is not a gs://bucket/object"
        return "does not exist in the bucket" if _gcs_missing(path) else None
    if "://" in path:
        return "is neither a local file nor a gs:// object"
    if not os.path.exists(path):
        return "does not exist"
    return None if os.path.isfile(path) else "is not a file"


def problems(d: dict) -> list[Problem]:
    """train.data, its keys known good: a readable local file or gs:// object at `path`, when set; packed
    documents: their sources and options, by a peek at each source's first record."""
    data = d["train"].get("data") or {}
    if data.get("kind") == "documents":
        spec = DataSpec.from_dict(data)
        if why := _documents_problem(
            spec, int(d["context_length"]), int(d["train"]["batch"]), int(d["model"]["vocab"])
        ):
            return [
                Problem(
                    "train.data.sources",
                    list(spec.sources) or spec.path,
                    why,
                    "readable document shards (python -m jobs.data.documents.corpus writes them)",
                    "fix the source or the option the message names",
                )
            ]
        return []
    path = data.get("path")
    if path and (why := path_problem(path)):
        return [
            Problem(
                "train.data.path",
                path,
                why,
                "an existing local file or gs://bucket/object",
                "fix the path, or drop it (train.data.path='') for the recall task",
            )
        ]
    return []


@lru_cache(maxsize=64)
def _documents_problem(spec: DataSpec, length: int, batch: int, vocab: int) -> str | None:
    """Why a documents trial's data cannot be read (None: fine): jobs.data.documents.check, once per distinct set."""
    from jobs import data
    from jobs.data import documents  # grain: imported only for a documents trial

    o = data.document_options(spec, length, batch, vocab)
    if not o.sources:
        return "is empty: train.data.kind=documents reads train.data.sources (or train.data.path)"
    from jobs.data.documents import corpus

    for source in o.sources:  # a corpus the project knows how to build: built on first use, then kept
        if corpus.known(source) and not corpus.built(source):
            build_corpus(source)
    try:
        documents.check(o, data.default_cache())
    except (ValueError, OSError) as e:
        return str(e).splitlines()[0]
    return None


# Stages of jobs.data.documents.corpus.build, in order, and where each ends on the bar (it starts where the one
# before ended)
_ENDS = {
    "reading text files": 5,
    "training the tokenizer": 35,
    "tokenizing documents": 90,
    "writing shards": 100,
    "done": 100,
}
_STARTS = (0, *list(_ENDS.values())[:-1])
STAGES = {stage: (start, end) for (stage, end), start in zip(_ENDS.items(), _STARTS, strict=True)}


def build_corpus(source: str) -> None:
    """Build a missing corpus jobs.data.documents.corpus knows (KNOWN: the standard library's files at
    data/stdlib), with a progress bar on stderr and one line saying what was built, how big, and how long."""
    import time

    from rich.console import Console

    from jobs import storage
    from jobs.data.documents import corpus
    from orchestrator.ui.progress import Bar

    t0, said = time.monotonic(), {}
    with Bar(f"building {source}", "corpus", total=100, console=Console(stderr=True)) as bar:

        def step(stage: str, done: int, total: int) -> None:
            lo, hi = STAGES.get(stage, (0, 100))
            bar.progress.update(bar.bar, completed=lo + (hi - lo) * done / max(total, 1), counts=stage)
            if stage not in said:
                said[stage] = True
                bar.say(stage)

        meta = corpus.build(source, **corpus.known(source), progress=step)
    fs = storage.filesystem(source)
    size = sum(fs.size(storage.join(source, name)) for name in meta["shards"])
    Console(stderr=True).print(
        f"built {source}: {meta['documents']:,} documents, {meta['tokens']:,} tokens, {size / 1e6:,.0f} MB in "
        f"{time.monotonic() - t0:.0f} s (kept: the next run reads it)",
        markup=False,
        highlight=False,
    )
