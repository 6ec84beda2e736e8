"""Local directories or `gs://bucket/prefix` behind one small interface (google-cloud-storage client).

Pure Python (no jax, ray or mlflow): both planes use it. STORAGE_EMULATOR_HOST is honoured by the
client, so tests run against a local GCS emulator with the real library.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def split(uri: str) -> tuple[str, str]:
    """gs://bucket/a/b -> ("bucket", "a/b")."""
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    return bucket, prefix.strip("/")


@lru_cache(maxsize=1)
def client():
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test"), credentials=AnonymousCredentials()
        )
    return storage.Client()


def exists(uri: str) -> bool:
    if not is_gcs(uri):
        return os.path.exists(uri)
    bucket, name = split(uri)
    b = client().bucket(bucket)
    return b.blob(name).exists() or any(
        True for _ in client().list_blobs(bucket, prefix=name + "/", max_results=1)
    )


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file: locally through a temporary name and a rename, so a reader sharing the directory
    (another process, another user) never sees half of it; a gs:// object appears whole by itself."""
    if is_gcs(uri):
        bucket, name = split(uri)
        client().bucket(bucket).blob(name).upload_from_string(data)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)


def join(uri: str, name: str) -> str:
    """`name` inside directory or gs:// prefix `uri` (os.path.join would not do for gs://)."""
    return f"{uri.rstrip('/')}/{name}" if is_gcs(uri) else os.path.join(uri, name)


def read_text(uri: str) -> str | None:
    """A file's or gs:// object's text; None when there is none (one request, no separate exists())."""
    if not is_gcs(uri):
        try:
            return Path(uri).read_text()
        except FileNotFoundError:
            return None
    from google.api_core.exceptions import NotFound

    bucket, name = split(uri)
    try:
        return client().bucket(bucket).blob(name).download_as_text()
    except NotFound:
        return None


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


def list_names(uri: str, prefix: str = "") -> list[str]:
    """Names of the files directly in directory `uri` (objects directly under gs://bucket/prefix) that start
    with `prefix`, sorted; [] when there is no such directory."""
    if not is_gcs(uri):
        try:
            return sorted(e.name for e in os.scandir(uri) if e.name.startswith(prefix) and e.is_file())
        except FileNotFoundError:
            return []
    bucket, base = split(uri)
    start = f"{base}/" if base else ""
    names = (b.name[len(start) :] for b in client().list_blobs(bucket, prefix=start + prefix))
    return sorted(n for n in names if n and "/" not in n)


def fetch(uri: str, cache_dir: str) -> str:
    """A local path for `uri`: the path itself, or a cached download of the gs:// object."""
    if not is_gcs(uri):
        if not os.path.exists(uri):
            raise FileNotFoundError(f"data file {uri} does not exist; check train.data.path")
        return uri
    bucket, name = split(uri)
    local = Path(cache_dir) / bucket / name
    if not local.exists():
        blob = client().bucket(bucket).blob(name)
        if not blob.exists():
            raise FileNotFoundError(f"data file {uri} does not exist; check train.data.path")
        local.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(local) + ".part")
        os.replace(str(local) + ".part", local)
    return str(local)


def upload_dir(local_dir: str, uri: str) -> int:
    """Mirror a local directory tree under gs://bucket/prefix (or another local dir); returns files copied."""
    n = 0
    for path in Path(local_dir).rglob("*"):
        if path.is_file():
            rel = path.relative_to(local_dir).as_posix()
            if is_gcs(uri):
                bucket, prefix = split(uri)
                client().bucket(bucket).blob(f"{prefix}/{rel}".lstrip("/")).upload_from_filename(str(path))
            else:
                dst = Path(uri) / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dst)
            n += 1
    return n


def download_dir(uri: str, local_dir: str) -> int:
    """Fetch every object under gs://bucket/prefix into local_dir; returns files fetched."""
    bucket, prefix = split(uri)
    n = 0
    for blob in client().list_blobs(bucket, prefix=prefix + "/" if prefix else None):
        rel = blob.name[len(prefix) :].lstrip("/")
        if not rel:
            continue
        dst = Path(local_dir) / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(dst))
        n += 1
    return n


def delete_prefix(uri: str, keep: set[str] | None = None) -> None:
    """Remove step directories (numeric first path component) under a gs:// prefix that are not in `keep`."""
    bucket, prefix = split(uri)
    for blob in client().list_blobs(bucket, prefix=prefix + "/" if prefix else None):
        top = blob.name[len(prefix) :].lstrip("/").split("/", 1)[0]
        if top.isdigit() and (keep is None or top not in keep):
            blob.delete()
